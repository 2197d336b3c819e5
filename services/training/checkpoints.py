"""Training checkpoints in the object store, committed atomically by a pointer.

Layout under ``prefix``::

    step-00000120.pt   one training checkpoint (model incl. ROI head and logit scales, optimizer,
                       scheduler, step, epoch, position in the epoch's data, RNG states, config, snapshot)
    latest.json        {"key": ".../step-00000120.pt", "step": 120, "sha256": ..., "size": ...}
    final-model.pt     the CLIP weights alone, as an embedding-API checkpoint (``modeling.save_checkpoint``)

Saving writes the checkpoint to a local staging file (one folder per run, cleared by the next save
of the same run, so a kill during a save leaks nothing for long), uploads it (the store checks the
size and sha256 of what it received), verifies the stored object, and only then writes
``latest.json``: the pointer is the commit. A crash before the pointer leaves an unreferenced step
file that is never read and is removed by the next save; the previous checkpoint stays the latest.
The last ``keep`` committed checkpoints are kept.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from p2p.models.modeling import save_checkpoint as save_embedding_checkpoint
from p2p.shared.storage import ObjectNotFound, ObjectStore, put_bytes, put_file
from p2p.training.config import TrainConfig

CHECKPOINT_FORMAT = "p2p-train-checkpoint/1"
LATEST = "latest.json"
FINAL_MODEL = "final-model.pt"
_STEP_RE = re.compile(r"step-(\d{8})\.pt$")
# Fields that may change between a run and its resumption: they change neither the model nor the data order.
RESUMABLE_FIELDS = frozenset({"epochs", "max_steps", "device"})


class CheckpointError(RuntimeError):
    """A checkpoint cannot be written, read or used for this run."""


class CheckpointMismatch(CheckpointError):
    """The latest checkpoint belongs to another model, config or data snapshot."""


@dataclass
class TrainState:
    """Everything a run needs to continue exactly where a checkpoint left it."""

    step: int  # optimisation steps done
    epoch: int  # the epoch the next step belongs to
    consumed: int  # samples of that epoch's stream already used
    model: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    scheduler: dict[str, Any]
    rng: dict[str, Any]
    config: dict[str, Any]
    snapshot: str
    key: str = ""  # where it was read from / written to
    text_cache: dict[str, Any] | None = None  # frozen text tower embeddings (HierarchicalCLIP)


def _prefix(prefix: str) -> str:
    return prefix.strip("/")


def step_key(prefix: str, step: int) -> str:
    return f"{_prefix(prefix)}/step-{step:08d}.pt"


def latest_key(prefix: str) -> str:
    return f"{_prefix(prefix)}/{LATEST}"


def final_model_key(prefix: str) -> str:
    return f"{_prefix(prefix)}/{FINAL_MODEL}"


# ------------------------------------------------------------------------------------------- RNG


def rng_state(generator: torch.Generator | None = None) -> dict[str, Any]:
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    if generator is not None:
        state["generator"] = generator.get_state()
    return state


def restore_rng(state: dict[str, Any], generator: torch.Generator | None = None) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if generator is not None and "generator" in state:
        generator.set_state(state["generator"])


# ------------------------------------------------------------------------------------------ I/O


def _upload(store: ObjectStore, key: str, path: Path, content_type: str) -> tuple[str, int]:
    """Upload a file (the store checks size and sha256) and verify the stored object's size."""
    sha, size = put_file(store, key, path, content_type)
    stored = store.size(key)
    if stored != size:
        raise CheckpointError(f"checkpoint upload {key}: stored {stored} bytes, expected {size}")
    return sha, size


def _put_json(store: ObjectStore, key: str, doc: dict[str, Any]) -> None:
    put_bytes(store, key, json.dumps(doc, indent=2, sort_keys=True).encode(), "application/json")


def staging_dir(prefix: str) -> Path:
    """The local folder where checkpoints of the run at ``prefix`` are written before upload.

    One folder per run prefix (a run owns its prefix: the service holds a lock on it), so a save
    can remove what a killed save of the same run left behind instead of leaking it in /tmp.
    """
    digest = hashlib.sha256(_prefix(prefix).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / "p2p-checkpoint-staging" / digest


def _fresh_staging_path(prefix: str, name: str) -> Path:
    folder = staging_dir(prefix)
    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.glob(".step-*.tmp"):
        stale.unlink(missing_ok=True)
    fd, name_ = tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=".tmp")
    os.close(fd)
    return Path(name_)


def save_checkpoint(store: ObjectStore, prefix: str, state: TrainState, *, keep: int = 3) -> str:
    """Write ``state`` as ``step-{n:08d}.pt``, commit it in ``latest.json``, keep the last ``keep``."""
    if keep < 1:
        raise ValueError(f"keep must be at least 1, got {keep}")
    key = step_key(prefix, state.step)
    payload = {
        "format": CHECKPOINT_FORMAT,
        "step": state.step,
        "epoch": state.epoch,
        "consumed": state.consumed,
        "model": {k: v.detach().cpu() for k, v in state.model.items()},
        "optimizer": state.optimizer,
        "scheduler": state.scheduler,
        "rng": state.rng,
        "config": state.config,
        "snapshot": state.snapshot,
        "text_cache": state.text_cache,
    }
    path = _fresh_staging_path(prefix, f"step-{state.step:08d}.pt")
    try:
        with path.open("wb") as fh:
            torch.save(payload, fh)
            fh.flush()
            os.fsync(fh.fileno())
        sha, size = _upload(store, key, path, "application/octet-stream")
    finally:
        path.unlink(missing_ok=True)
    _put_json(  # the commit
        store,
        latest_key(prefix),
        {"key": key, "step": state.step, "epoch": state.epoch, "sha256": sha, "size": size},
    )
    state.key = key
    _prune(store, prefix, state.step, keep)
    return key


def _prune(store: ObjectStore, prefix: str, latest_step: int, keep: int) -> None:
    """Keep the ``keep`` newest committed steps; drop older ones and uncommitted ones after the latest."""
    steps = []
    for key in list(store.list(f"{_prefix(prefix)}/")):
        match = _STEP_RE.search(key)
        if match and key.rsplit("/", 1)[0] == _prefix(prefix):
            steps.append((int(match.group(1)), key))
    kept = sorted(s for s, _ in steps if s <= latest_step)[-keep:]
    for step, key in steps:
        if step not in kept:
            store.delete(key)


def read_pointer(store: ObjectStore, prefix: str) -> dict[str, Any] | None:
    try:
        pointer: dict[str, Any] = json.loads(store.get_bytes(latest_key(prefix)))
    except ObjectNotFound:
        return None
    return pointer


def load_latest(store: ObjectStore, prefix: str) -> TrainState | None:
    """The committed checkpoint ``latest.json`` points at, or None when there is none."""
    pointer = read_pointer(store, prefix)
    if pointer is None:
        return None
    key = str(pointer["key"])
    try:
        data = store.get_bytes(key)
    except ObjectNotFound as exc:
        raise CheckpointError(f"{latest_key(prefix)} points at {key}, which is missing") from exc
    if "sha256" in pointer and hashlib.sha256(data).hexdigest() != pointer["sha256"]:
        raise CheckpointError(f"checkpoint {key} does not match the sha256 recorded in {LATEST}")
    try:
        obj = torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)
    except Exception as exc:
        raise CheckpointError(f"checkpoint {key} is not a readable torch file: {exc}") from exc
    if not isinstance(obj, dict) or obj.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{key} is not a training checkpoint ({CHECKPOINT_FORMAT})")
    return TrainState(
        step=int(obj["step"]),
        epoch=int(obj["epoch"]),
        consumed=int(obj["consumed"]),
        model=obj["model"],
        optimizer=obj["optimizer"],
        scheduler=obj["scheduler"],
        rng=obj["rng"],
        config=obj["config"],
        snapshot=str(obj["snapshot"]),
        key=key,
        text_cache=obj.get("text_cache"),
    )


# -------------------------------------------------------------------------------- compatibility


def _diff(a: Any, b: Any, path: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out: list[str] = []
        for k in sorted(set(a) | set(b)):
            sub = f"{path}.{k}" if path else str(k)
            out.extend(_diff(a.get(k), b.get(k), sub))
        return out
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        a, b = list(a), list(b)
    return [] if a == b else [f"{path}: run {a!r} vs checkpoint {b!r}"]


def config_dict(config: TrainConfig) -> dict[str, Any]:
    return config.model_dump(mode="json")


def check_compatible(state: TrainState, config: TrainConfig, snapshot: str) -> None:
    """Raise :class:`CheckpointMismatch` unless ``state`` can resume a run of ``config`` on ``snapshot``."""
    ours = {k: v for k, v in config_dict(config).items() if k not in RESUMABLE_FIELDS}
    theirs = {k: v for k, v in state.config.items() if k not in RESUMABLE_FIELDS}
    problems = _diff(ours, theirs)
    if state.snapshot != snapshot:
        problems.append(f"data snapshot: run {snapshot!r} vs checkpoint {state.snapshot!r}")
    if problems:
        shown = "; ".join(problems[:6]) + (f" (+{len(problems) - 6} more)" if len(problems) > 6 else "")
        raise CheckpointMismatch(
            f"checkpoint {state.key} was written by another run configuration and cannot be resumed: "
            f"{shown}. Use a new output prefix or the original config."
        )


def load_model_state(model: torch.nn.Module, state: TrainState) -> None:
    """Load the checkpoint's weights; a different architecture is a :class:`CheckpointMismatch`."""
    own = model.state_dict()
    missing = [k for k in own if k not in state.model]
    unexpected = [k for k in state.model if k not in own]
    shapes = [
        f"{k}: checkpoint {tuple(state.model[k].shape)} vs model {tuple(own[k].shape)}"
        for k in own
        if k in state.model and state.model[k].shape != own[k].shape
    ]
    if missing or unexpected or shapes:
        details = [
            *shapes[:3],
            *(f"missing {k}" for k in missing[:3]),
            *(f"unexpected {k}" for k in unexpected[:3]),
        ]
        raise CheckpointMismatch(f"checkpoint {state.key} holds another architecture: {'; '.join(details)}")
    model.load_state_dict(state.model, strict=True)


# ---------------------------------------------------------------------------------- final model


def export_final_model(store: ObjectStore, prefix: str, clip: torch.nn.Module, config: TrainConfig) -> str:
    """The CLIP weights as an embedding-API checkpoint (``modeling.save_checkpoint``), ``final-model.pt``."""

    key = final_model_key(prefix)
    with tempfile.TemporaryDirectory(prefix="p2p-final-") as tmp:
        path = save_embedding_checkpoint(clip, Path(tmp) / FINAL_MODEL, spec=config.model.to_spec())
        _upload(store, key, path, "application/octet-stream")
    return key


__all__ = [
    "CheckpointError",
    "CheckpointMismatch",
    "TrainState",
    "check_compatible",
    "export_final_model",
    "final_model_key",
    "latest_key",
    "load_latest",
    "load_model_state",
    "read_pointer",
    "restore_rng",
    "rng_state",
    "save_checkpoint",
    "staging_dir",
    "step_key",
]
