"""Which of the segmenter's pieces of an unlabelled figure are parts of one drawing.

A workflow or a reaction scheme is steps joined by arrows. The segmenter cuts it where blank
space or a seam runs between the steps, and its pieces can look like a row of alike panels or
hold a picture, which would keep them apart. What joins them is a stroke: one drawn line that runs
from one piece into the next (the cut went through an arrow), or a thin stroke outside every piece
whose two ends reach two of them (an arrow across the gap). Pictures that touch are one dense
component across their seam too; a stroke is thin, which a picture is not.
"""

from __future__ import annotations

import math

import cv2
import numpy as np

from p2p.mining.grouping import connected_groups
from p2p.shared.geometry import Box

MAX_FILL = 0.25  # of its box a free-standing stroke covers at most
MAX_SPAN_FILL = 0.6  # of its box a drawing running across pieces covers at most (pictures fill theirs)
MIN_STROKE = 0.03  # of the figure's longer side: shorter strokes are specks or letters
MIN_ASPECT = 4.0  # a free-standing arrow is this much longer than wide
REACH = 0.06  # of the figure's longer side: an arrow's end this near a piece points at it
REACH_OF_LENGTH = 0.5  # ... or this share of the arrow's own length
MIN_INSIDE = 3  # pixels of a stroke inside a piece for it to run into that piece


def stroke_groups(ink: np.ndarray, factor: int, boxes: list[Box]) -> list[list[int]]:
    """``boxes`` (figure pixels; ``ink`` at working scale) grouped by the strokes that join them:
    indices, each group in order, groups by their first index."""
    return connected_groups(len(boxes), _joins(ink, factor, boxes))


def _joins(ink: np.ndarray, factor: int, boxes: list[Box]) -> list[tuple[int, int]]:
    """Pairs of boxes a stroke joins."""
    if len(boxes) < 2:
        return []
    work = [
        (int(b[0]) // factor, int(b[1]) // factor, math.ceil(b[2] / factor), math.ceil(b[3] / factor))
        for b in boxes
    ]
    count, comp, stats, _ = cv2.connectedComponentsWithStats(ink.astype(np.uint8), connectivity=8)
    side = max(ink.shape)
    fill = stats[:, 4] / np.maximum(stats[:, 2] * stats[:, 3], 1)
    drawn = [i for i in range(1, count) if max(stats[i, 2], stats[i, 3]) >= MIN_STROKE * side]
    inside = np.zeros((count, len(work)), dtype=np.int64)
    for k, (x1, y1, x2, y2) in enumerate(work):
        inside[:, k] = np.bincount(comp[y1:y2, x1:x2].ravel(), minlength=count)
    pairs: list[tuple[int, int]] = []
    for i in drawn:
        pieces = [int(k) for k in np.flatnonzero(inside[i] >= MIN_INSIDE)]
        if len(pieces) >= 2 and fill[i] <= MAX_SPAN_FILL:
            pairs.extend((pieces[0], k) for k in pieces[1:])
        elif not pieces and fill[i] <= MAX_FILL:
            pairs.extend(_arrow_between(stats[i], work, REACH * side))
    return pairs


def _arrow_between(
    stat: np.ndarray, boxes: list[tuple[int, int, int, int]], reach: float
) -> list[tuple[int, int]]:
    """The pieces a thin stroke outside every piece joins: one near each of its ends."""
    x, y, w, h = (int(v) for v in stat[:4])
    if max(w, h) < MIN_ASPECT * max(1, min(w, h)):
        return []
    ends = ((x, y + h / 2), (x + w, y + h / 2)) if w >= h else ((x + w / 2, y), (x + w / 2, y + h))
    reach = max(reach, REACH_OF_LENGTH * max(w, h))
    near = [
        min(range(len(boxes)), key=lambda k, e=end: _distance(boxes[k], e))  # type: ignore[misc]
        for end in ends
    ]
    if near[0] == near[1] or any(_distance(boxes[k], e) > reach for k, e in zip(near, ends, strict=True)):
        return []
    return [(near[0], near[1])]


def _distance(box: tuple[int, int, int, int], point: tuple[float, float]) -> float:
    dx = max(box[0] - point[0], 0.0, point[0] - box[2])
    dy = max(box[1] - point[1], 0.0, point[1] - box[3])
    return math.hypot(dx, dy)
