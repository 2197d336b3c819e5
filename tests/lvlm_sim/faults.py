"""Imperfections of the simulated model server: configuration and the helpers that apply them.

All rates are probabilities in [0, 1] and default to 0 (a perfect model). A :class:`SimFaults`
object is shared with the running server, so a test may change its fields at run time.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, fields
from typing import Any

Box = tuple[float, float, float, float]

MALFORMED_KINDS = ("fenced", "trailing_prose", "single_quotes", "truncated", "empty", "garbage")


@dataclass
class SimFaults:
    seed: int = 0
    # answer content
    jitter_rate: float = 0.0  # fraction of boxes jittered
    jitter_scale: float = 0.0  # each edge moves by up to this fraction of the box width / height
    miss_rate: float = 0.0  # drop panels / markers / objects / verdicts
    hallucinate_rate: float = 0.0  # per answer: add one made-up panel / marker / object
    hallucinate_tasks: tuple[str, ...] = ("panels", "markers", "objects")  # which answers may get one
    wrong_label_rate: float = 0.0  # per panel: panel_id swapped to another letter
    malformed_rate: float = 0.0  # per answer: the text is damaged (see MALFORMED_KINDS)
    malformed_kinds: tuple[str, ...] = MALFORMED_KINDS
    wrong_frame_rate: float = 0.0  # per answer: boxes in original-figure pixels
    normalized_rate: float = 0.0  # per answer: boxes as fractions 0..1 of the image received
    inverted_rate: float = 0.0  # per box: corners swapped (x2 < x1, y2 < y1)
    outside_rate: float = 0.0  # per box: stretched past the image (negative and too-large coordinates)
    # transport
    latency_s: float = 0.0
    latency_jitter_s: float = 0.0  # uniform extra 0..latency_jitter_s
    error_rate: float = 0.0  # HTTP 500 / 503 with an OpenAI-style error body
    rate_limit_rate: float = 0.0  # HTTP 429 with Retry-After: 1
    down: bool = False  # /health 503 and every request 503
    die_after: int | None = None  # counts down per completion answered; at 0 the server "dies"

    def reset(self) -> None:
        """Back to a perfect model (the seed is kept)."""
        for f in fields(self):
            if f.name != "seed":
                setattr(self, f.name, f.default)


def chance(rng: random.Random, rate: float) -> bool:
    return rate > 0 and rng.random() < rate


def jitter_box(box: Box, scale: float, rng: random.Random) -> Box:
    x1, y1, x2, y2 = box
    w, h = max(1.0, x2 - x1), max(1.0, y2 - y1)
    x1 += rng.uniform(-scale, scale) * w
    x2 += rng.uniform(-scale, scale) * w
    y1 += rng.uniform(-scale, scale) * h
    y2 += rng.uniform(-scale, scale) * h
    return (min(x1, x2), min(y1, y2), max(x1, x2), max(y1, y2))


def other_label(label: str | None, labels: list[str], rng: random.Random) -> str:
    """A panel label that is not ``label``: another label of the figure, or a neighbouring letter."""
    choices = [lab for lab in labels if lab != label]
    if choices:
        return rng.choice(choices)
    if label and len(label) == 1 and label.isalpha():
        nxt = chr(ord(label) + 1)
        return nxt if nxt.isalpha() else "A"
    return "Z"


def damage_text(text: str, kinds: tuple[str, ...], rng: random.Random) -> tuple[str, str]:
    """(damaged text, kind) — never valid JSON."""
    kind = rng.choice(kinds or MALFORMED_KINDS)
    if kind == "fenced":
        damaged = (
            f"Sure! Here is the JSON you asked for:\n```json\n{text}\n```\nLet me know if you need more."
        )
    elif kind == "trailing_prose":
        damaged = f"{text}\nThese are all the items I could identify in the image."
    elif kind == "single_quotes":
        damaged = text.replace('"', "'")
    elif kind == "truncated":
        damaged = text[: max(1, len(text) // 2)]
    elif kind == "empty":
        damaged = ""
    else:
        kind = "garbage"
        damaged = "I'm sorry, but I can't determine that from the image provided. <|im_end|>"
    if _is_json(damaged):  # e.g. a truncated "{}": make sure it is broken
        damaged = damaged + " ..."
    return damaged, kind


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def dump(answer: dict[str, Any]) -> str:
    return json.dumps(answer, ensure_ascii=False)
