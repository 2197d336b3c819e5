"""Deterministic train/val/test assignment by article.

Every figure of one article lands in the same split, so no paper leaks from training into
evaluation. The group of a figure is its article (pmcid, else doi, else pmid, else the article's
row id); a figure without an article is a group of its own. The split follows from a salted sha256
of the group, so it never changes between exports and needs no state.
"""

from __future__ import annotations

import hashlib
import math
import uuid
from dataclasses import asdict, dataclass
from typing import Any

SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class SplitConfig:
    train: float = 0.8
    val: float = 0.1
    test: float = 0.1
    salt: str = "panel2patch-split-v1"

    def __post_init__(self) -> None:
        fractions = (self.train, self.val, self.test)
        if any(not math.isfinite(f) or f < 0 for f in fractions):
            raise ValueError(f"split fractions must be finite and non-negative, got {fractions}")
        if not math.isclose(sum(fractions), 1.0, abs_tol=1e-9):
            raise ValueError(f"split fractions must sum to 1, got {fractions} (sum {sum(fractions)})")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def group_key(
    *,
    figure_id: uuid.UUID | str,
    article_id: uuid.UUID | str | None = None,
    pmcid: str | None = None,
    doi: str | None = None,
    pmid: str | None = None,
) -> str:
    """The unit that is never split: the article by its most stable identifier, else the figure."""
    if pmcid:
        return f"pmcid:{pmcid.strip().upper()}"
    if doi:
        return f"doi:{doi.strip().lower()}"
    if pmid:
        return f"pmid:{pmid.strip()}"
    if article_id is not None:
        return f"article:{article_id}"
    return f"figure:{figure_id}"


def unit_interval(salt: str, value: str) -> float:
    """A uniform number in [0, 1) that depends only on (salt, value)."""
    digest = hashlib.sha256(f"{salt}\x00{value}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def assign_split(group: str, config: SplitConfig | None = None) -> str:
    config = config or SplitConfig()
    point = unit_interval(config.salt, group)
    if point < config.train:
        return "train"
    if point < config.train + config.val:
        return "val"
    # Fractions may leave test empty (e.g. 0.9/0.1/0): a rounding remainder then goes to val.
    return "test" if config.test > 0 else ("val" if config.val > 0 else "train")
