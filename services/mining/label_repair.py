"""Caption-driven label repair: the caption names the labels (A, B, C...), the image has panels in
reading order, OCR read some of the labels. Gaps between trusted readings are filled from the
caption's sequence when the counts agree exactly.

Reading order and label order agree in most figures but not all (a column read before the next
row), so nothing is filled across an anchor pair whose panel gap and label gap differ, and a
reading that is not in the caption, repeats a label, or breaks the order of its neighbours is
replaced only when the gap it sits in is filled.

A reading the caption names only in the other case ("c" for C) is the caption's label, for
letters whose cases look alike (not "e" for E: that is more often a misread "C"). When no
reading is a caption label at all (all misread) and the figure has as many panels as the caption
has labels, the caption's labels go to the panels in reading order.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

# letters whose two cases differ mostly in size: "e" is no misread "E", but often one of "C"
_LOOK_ALIKE = frozenset("cCkKoOpPsSuUvVwWxXyYzZ")


def _increasing_anchors(points: list[tuple[int, int]]) -> set[int]:
    """Ranks of the longest chain of (rank, index) points increasing in both (ranks ascending)."""
    best: list[int] = []  # best[k]: chain length ending at points[k]
    back: list[int] = []
    for k, (_, s) in enumerate(points):
        length, prev = 1, -1
        for j in range(k):
            if points[j][1] < s and best[j] + 1 > length:
                length, prev = best[j] + 1, j
        best.append(length)
        back.append(prev)
    if not best:
        return set()
    k = max(range(len(best)), key=lambda i: best[i])
    chain: set[int] = set()
    while k >= 0:
        chain.add(points[k][0])
        k = back[k]
    return chain


def repair_with_caption(labels: Sequence[str | None], sequence: Sequence[str]) -> list[str | None]:
    """``labels``: one per panel in reading order (None = not read); ``sequence``: the caption's
    labels in order. Returns the labels with gaps filled where the caption settles them."""
    out = list(labels)
    n, m = len(out), len(sequence)
    if n < 2 or m < 2 or len(set(sequence)) != m:
        return out
    where = {label: s for s, label in enumerate(sequence)}
    # OCR confuses the case of letters that look alike in both ("c"/"C", "s"/"S"): a reading that
    # the caption names only in the other case is that label
    folded: dict[str, list[str]] = {}
    for name in sequence:
        folded.setdefault(name.casefold(), []).append(name)
    out = [
        label
        if label is None
        or label in where
        or label not in _LOOK_ALIKE
        or len(folded.get(label.casefold(), [])) != 1
        else folded[label.casefold()][0]
        for label in out
    ]
    seen: set[str] = set()
    points: list[tuple[int, int]] = []
    for r, label in enumerate(out):
        if label is not None and label in where and label not in seen:
            seen.add(label)
            points.append((r, where[label]))
    if not points:
        read = any(label is not None for label in out)
        if read and n == m and all(len(label) <= 4 for label in sequence):  # not "left", "top"
            # every reading is one the caption does not name (misread): as many panels as the
            # caption has labels, in reading order, like a figure whose labels were not read
            return list(sequence)
        return out  # nothing to align with (the pipeline assigns caption labels in reading order)
    chain = sorted(p for p in points if p[0] in _increasing_anchors(points))
    # Virtual anchors just outside the figure: the run before the first and after the last anchor
    # is filled only when it holds exactly the labels the caption has left at that end.
    bounds = [(-1, -1), *chain, (n, m)]
    for (r1, s1), (r2, s2) in itertools.pairwise(bounds):
        if r2 - r1 < 2 or r2 - r1 != s2 - s1:
            continue
        for k in range(1, r2 - r1):
            out[r1 + k] = sequence[s1 + k]
    # A reading outside the chain that a filled gap did not replace stays if it is unique.
    final: list[str | None] = []
    used: set[str] = set()
    for label in out:
        if label is not None and label in used:
            final.append(None)
            continue
        if label is not None:
            used.add(label)
        final.append(label)
    return final


def repair_with_series(
    labels: Sequence[str | None], areas: Sequence[float], *, grid_ratio: float
) -> list[str | None]:
    """Labels completed from the figure's own printed series when the caption names none.

    The readings must be single letters of one case; the series runs from "a" to the last letter
    read and gaps are filled as from a caption's sequence. Past the last reading the series goes
    on only in a regular grid (every panel's area within ``grid_ratio`` of every other's) whose
    readings all stand at their letter's place in reading order: A first, D fourth."""
    read = [label for label in labels if label is not None]
    if len(read) < 2 or not all(len(label) == 1 and label.isalpha() for label in read):
        return list(labels)
    upper = read[0].isupper()
    if any(label.isupper() != upper for label in read):
        return list(labels)
    places = {r: ord(label.lower()) - ord("a") for r, label in enumerate(labels) if label is not None}
    count = max(places.values()) + 1
    if (
        len(labels) > count
        and all(r == place for r, place in places.items())
        and alike_in_area(areas, grid_ratio)
    ):
        count = len(labels)
    if count > 26:
        return list(labels)
    sequence = [chr(ord("a") + k) for k in range(count)]
    return repair_with_caption(labels, [s.upper() for s in sequence] if upper else sequence)


def alike_in_area(areas: Sequence[float], ratio: float) -> bool:
    """Whether there are several areas, none empty, the largest at most ``ratio`` times the
    smallest: panels repeated across a row or grid."""
    return len(areas) >= 2 and min(areas) > 0 and max(areas) <= ratio * min(areas)
