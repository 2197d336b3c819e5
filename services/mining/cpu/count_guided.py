"""Caption-guided splitting: when the caption names more panels than the segmenter found.

A caption that labels ten panels ("(a) ... (j) ...") over a figure the segmenter returned as two
boxes says that touching panels were left together. The seam splitter (``seams``) cuts a box only
when its line scorer is sure on its own; here the caption's count is the evidence instead, so the
likeliest seam of all boxes is cut, one at a time, until the count is reached or no line looks
like a seam at all (``MIN_SCORE``). The count is never exceeded, and boxes are never merged: a
caption naming fewer panels than were found says nothing about which ones to join.
"""

from __future__ import annotations

import numpy as np

from p2p.mining.cpu.seams import IntBox, SeamModel, best_seam, cut_parts, default_model
from p2p.mining.cpu.segment import _without_sliver

MIN_SCORE = 0.001  # line score below which a line is an edge inside a picture, whatever the count
MAX_NAMED = 30  # a caption naming more panels than this is not a count to split towards
SPLIT_CONFIDENCE = 0.6  # parts found this way are less sure than the rules' panels


def split_to_count(
    rgb: np.ndarray,
    ink: np.ndarray,
    boxes: list[IntBox],
    confidence: list[float],
    named: int,
    *,
    model: SeamModel | None = None,
    min_score: float = MIN_SCORE,
) -> tuple[list[IntBox], list[float]]:
    """``boxes`` (with their ``confidence``) with their likeliest seams cut until there are
    ``named`` of them (the number of panels the caption names), or until no line scores
    ``min_score``. ``ink``: the figure's content mask, which the parts are tightened to."""
    if not boxes or named <= len(boxes) or named > MAX_NAMED:
        return boxes, confidence
    model = model or default_model()
    boxes, confidence = list(boxes), list(confidence)
    spent: set[IntBox] = set()  # boxes with no usable cut left
    while len(boxes) < named:
        best: tuple[float, int, int, list[IntBox]] | None = None  # score, box index, axis, parts
        for k, box in enumerate(boxes):
            if box in spent:
                continue
            seam = best_seam(rgb, box, boxes, model)
            if seam is None or seam.score < min_score:
                spent.add(box)
                continue
            axis, _, parts = cut_parts(rgb, ink, box, seam.axis, seam.offset)
            if len(parts) < 2:
                spent.add(box)
                continue
            if best is None or seam.score > best[0]:
                best = (seam.score, k, axis, parts)
        if best is None:
            break
        _, k, axis, parts = best
        parts = [_without_sliver(ink, parts[0], axis, True), _without_sliver(ink, parts[1], axis, False)]
        boxes[k] = parts[0]
        boxes.append(parts[1])
        confidence[k] = min(confidence[k], SPLIT_CONFIDENCE)
        confidence.append(SPLIT_CONFIDENCE)
    return boxes, confidence
