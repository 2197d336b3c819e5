"""Axis-aligned boxes in pixel coordinates, shared by mining, evaluation and retrieval.

A ``Box`` is ``(x1, y1, x2, y2)`` with x2/y2 exclusive (a box of one pixel at (3, 4) is
``(3, 4, 4, 5)``). Annotation files that use inclusive corners convert with ``from_inclusive``.
"""

from __future__ import annotations

from collections.abc import Sequence

Box = tuple[float, float, float, float]


def from_inclusive(box: Sequence[float]) -> Box:
    x1, y1, x2, y2 = box
    return (float(x1), float(y1), float(x2) + 1.0, float(y2) + 1.0)


def width(box: Box) -> float:
    return max(0.0, box[2] - box[0])


def height(box: Box) -> float:
    return max(0.0, box[3] - box[1])


def area(box: Box) -> float:
    return width(box) * height(box)


def center(box: Box) -> tuple[float, float]:
    return ((box[0] + box[2]) / 2.0, (box[1] + box[3]) / 2.0)


def intersection(a: Box, b: Box) -> float:
    w = min(a[2], b[2]) - max(a[0], b[0])
    h = min(a[3], b[3]) - max(a[1], b[1])
    return w * h if w > 0 and h > 0 else 0.0


def iou(a: Box, b: Box) -> float:
    inter = intersection(a, b)
    if inter == 0.0:
        return 0.0
    return inter / (area(a) + area(b) - inter)


def union_box(a: Box, b: Box) -> Box:
    return (min(a[0], b[0]), min(a[1], b[1]), max(a[2], b[2]), max(a[3], b[3]))


def clip(box: Box, image_width: float, image_height: float) -> Box:
    return (
        min(max(box[0], 0.0), image_width),
        min(max(box[1], 0.0), image_height),
        min(max(box[2], 0.0), image_width),
        min(max(box[3], 0.0), image_height),
    )


def contains_point(box: Box, x: float, y: float, margin: float = 0.0) -> bool:
    return box[0] - margin <= x < box[2] + margin and box[1] - margin <= y < box[3] + margin


def translate(box: Box, dx: float, dy: float) -> Box:
    return (box[0] + dx, box[1] + dy, box[2] + dx, box[3] + dy)


def scale(box: Box, sx: float, sy: float) -> Box:
    return (box[0] * sx, box[1] * sy, box[2] * sx, box[3] * sy)


def nms(boxes: Sequence[Box], scores: Sequence[float], iou_threshold: float) -> list[int]:
    """Indices kept by greedy non-maximum suppression, best score first."""
    order = sorted(range(len(boxes)), key=lambda i: scores[i], reverse=True)
    kept: list[int] = []
    for i in order:
        if all(iou(boxes[i], boxes[j]) <= iou_threshold for j in kept):
            kept.append(i)
    return kept


def match_greedy(
    predicted: Sequence[Box], truth: Sequence[Box], threshold: float
) -> list[tuple[int, int, float]]:
    """One-to-one matches (pred index, truth index, IoU) with IoU >= threshold, highest IoU first."""
    pairs = sorted(
        ((iou(p, t), i, j) for i, p in enumerate(predicted) for j, t in enumerate(truth)),
        reverse=True,
    )
    used_p: set[int] = set()
    used_t: set[int] = set()
    matches: list[tuple[int, int, float]] = []
    for value, i, j in pairs:
        if value < threshold:
            break
        if i in used_p or j in used_t:
            continue
        used_p.add(i)
        used_t.add(j)
        matches.append((i, j, value))
    return matches
