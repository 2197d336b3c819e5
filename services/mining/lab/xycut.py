"""The naive reference segmenter: recursive XY-cut on near-white gutters, nothing else.

It is the benchmark's baseline and is kept deliberately simple: no label handling, no merging of
plot parts, no splitting of touching panels. Boxes are tight around the ink of each leaf block, so
they swallow panel letters, neighbouring axis text or caption strips whenever no gutter separates
them. ``p2p.mining.cpu.segmentation.segment.segment_panels`` is the refined segmenter.
"""

from __future__ import annotations

import numpy as np

from p2p.mining.types import PanelCandidate

INK_THRESHOLD = 225  # a pixel is ink when its darkest channel is below this
MIN_GAP_FRACTION = 0.012  # a gutter is at least this fraction of the figure's shorter side ...
MIN_GAP_PX = 3  # ... and at least this many pixels
MIN_LEAF_FRACTION = 0.08  # leaves narrower/shorter than this fraction of the figure are dropped
MAX_DEPTH = 12


def ink_mask(image: np.ndarray, threshold: int = INK_THRESHOLD) -> np.ndarray:
    """Boolean mask of pixels darker than near-white (any channel below ``threshold``)."""
    if image.ndim == 2:
        return np.asarray(image < threshold)
    return np.asarray(image[..., :3].min(axis=2) < threshold)


def _gaps(profile: np.ndarray, min_gap: int) -> list[tuple[int, int]]:
    """Runs [start, end) of empty entries at least ``min_gap`` long, strictly inside the profile."""
    empty = ~profile
    if not empty.any():
        return []
    padded = np.concatenate(([False], empty, [False]))
    edges = np.flatnonzero(np.diff(padded.astype(np.int8)))
    starts, ends = edges[0::2], edges[1::2]
    return [
        (int(s), int(e))
        for s, e in zip(starts, ends, strict=True)
        if e - s >= min_gap and s > 0 and e < len(profile)
    ]


def _cut(
    mask: np.ndarray, x0: int, y0: int, min_gap: int, depth: int, out: list[tuple[int, int, int, int]]
) -> None:
    rows = np.asarray(mask.any(axis=1), dtype=bool)
    cols = np.asarray(mask.any(axis=0), dtype=bool)
    if not rows.any():
        return
    top, bottom = int(np.argmax(rows)), len(rows) - int(np.argmax(rows[::-1]))
    left, right = int(np.argmax(cols)), len(cols) - int(np.argmax(cols[::-1]))
    mask = mask[top:bottom, left:right]
    x0, y0 = x0 + left, y0 + top
    if depth >= MAX_DEPTH:
        out.append((x0, y0, x0 + mask.shape[1], y0 + mask.shape[0]))
        return
    for axis in (0, 1):  # 0: horizontal gutters (split rows), 1: vertical gutters (split columns)
        profile = np.asarray(mask.any(axis=1 - axis), dtype=bool)
        gaps = _gaps(profile, min_gap)
        if not gaps:
            continue
        bounds = [0] + [g for gap in gaps for g in gap] + [len(profile)]
        for start, end in zip(bounds[0::2], bounds[1::2], strict=True):
            if axis == 0:
                _cut(mask[start:end], x0, y0 + start, min_gap, depth + 1, out)
            else:
                _cut(mask[:, start:end], x0 + start, y0, min_gap, depth + 1, out)
        return
    out.append((x0, y0, x0 + mask.shape[1], y0 + mask.shape[0]))


def naive_xycut(image: np.ndarray) -> list[PanelCandidate]:
    """Recursive XY-cut on near-white gutters; one tight box per leaf block that is not tiny."""
    if image.size == 0:
        return []
    mask = ink_mask(image)
    height, width = mask.shape[:2]
    min_gap = max(MIN_GAP_PX, round(MIN_GAP_FRACTION * min(height, width)))
    leaves: list[tuple[int, int, int, int]] = []
    _cut(mask, 0, 0, min_gap, 0, leaves)
    min_w, min_h = MIN_LEAF_FRACTION * width, MIN_LEAF_FRACTION * height
    return [
        PanelCandidate(box=(float(x1), float(y1), float(x2), float(y2)), confidence=0.5)
        for x1, y1, x2, y2 in leaves
        if x2 - x1 >= min_w and y2 - y1 >= min_h
    ]
