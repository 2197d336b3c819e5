"""Named starting points for a training config; a run's own keys are merged over its preset.

``paper`` is the paper's recipe: a pretrained ViT-L/14 fine-tuned with small learning rates, 1,000
warmup steps, the last 5 vision blocks trainable, bf16 on a GPU node. The paper starts from
BIOMEDICA's BMC-CLIP weights; the preset names open_clip's ``openai`` tag, which needs a network
(point ``model.source`` at an ``s3:`` or ``hf-hub:`` checkpoint instead). ``small`` is the CPU
configuration of this repository: the
default model (frozen MiniLM text tower, small ViT trained from scratch, so larger learning rates),
batches that fit two cores, a short warmup and a step budget that trains on the demo corpus in a
few minutes.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any

from p2p.training.config import TrainConfig, TrainConfigError, load_config

PRESETS: dict[str, dict[str, Any]] = {
    "paper": {
        "model": {"name": "vit-l-14", "architecture": "ViT-L-14", "source": "pretrained:openai"},
        "precision": "bf16",
        "device": "cuda",
        "epochs": 10,
    },
    "small": {
        # Every level in every step: at the demo's step budget the mixed schedule beat the
        # alternating one on 7 of 8 metrics of the ablation and tied on the 8th (bench/README.md).
        "schedule": "mixed",
        "batch_sizes": {"figure": 8, "panel": 32, "region": 32},
        "epochs": 100,
        "max_steps": 240,
        "warmup_steps": 12,
        "min_lr_ratio": 0.1,
        "lr": {"shared": 5e-4, "bbox_head": 2.5e-4, "fine": 5e-4, "coarse": 5e-4},
        "train_last_vision_blocks": -1,
    },
}
DEFAULT_PRESET = "small"


def merge(base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``overrides`` over ``base``, nested mappings merged key by key."""
    merged = copy.deepcopy(dict(base))
    for key, value in overrides.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def resolve(preset: str | None, overrides: Mapping[str, Any] | None = None) -> TrainConfig:
    """The validated config of ``preset`` (default ``small``) with ``overrides`` merged over it."""
    name = DEFAULT_PRESET if preset is None else preset
    if name not in PRESETS:
        raise TrainConfigError(f"unknown preset {name!r}; known presets: {', '.join(sorted(PRESETS))}")
    return load_config(merge(PRESETS[name], overrides or {}))


def parse_assignment(text: str) -> tuple[list[str], Any]:
    """``a.b=value`` -> (["a", "b"], value); the value is read as JSON when it parses, else a string."""

    key, sep, raw = text.partition("=")
    path = [part for part in key.strip().split(".") if part]
    if not sep or not path:
        raise TrainConfigError(f"expected KEY=VALUE (dotted keys for sections), got {text!r}")
    try:
        value: Any = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    return path, value


def overrides_from_assignments(assignments: list[str]) -> dict[str, Any]:
    """``["lr.shared=1e-4", "levels=panel"]`` -> ``{"lr": {"shared": 1e-4}, "levels": "panel"}``."""
    out: dict[str, Any] = {}
    for text in assignments:
        path, value = parse_assignment(text)
        node = out
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise TrainConfigError(f"{text!r}: {part} is both a value and a section")
            node = child
        node[path[-1]] = value
    return out
