"""Caption-guided panel count: the caption says how many panels the figure has.

A caption that labels ten panels ("(a) ... (j) ...") over a figure the segmenter returned as two
boxes says that touching panels were left together. The seam splitter (``seams``) cuts a box only
when its line scorer is sure on its own; here the caption's count is the evidence instead, so the
likeliest seam of all boxes is cut, one at a time, until the count is reached or no line looks
like a seam at all (``CountParams.min_score``).

The other way round, more boxes than named panels means a panel came apart (a plot's colour bar
or legend, an image cut along a false seam). Two boxes are joined only when together they fill
their joint box (``CountParams.merge_fill``: the halves of one rectangle, not two panels side by side with a
gap or offset) and that box reaches into no other. Which pair goes first is the panel-boundary
network's call (``seam_net``): the pair whose junction it least believes in, a gutter between
them counting against; a pair it is sure of stays apart whatever the count. By fill alone, two
panels across a 3 px gutter (0.99) went before the four pieces of a text strip cut apart (0.98).
"""

from __future__ import annotations

import itertools

import numpy as np

from p2p.mining.cpu.imaging import without_sliver
from p2p.mining.cpu.segmentation import seam_net
from p2p.mining.cpu.segmentation.seams import IntBox, SeamModel, best_seam, cut_parts, default_model
from p2p.mining.params import CountParams, load_params
from p2p.shared.geometry import area, intersection


def split_to_count(
    rgb: np.ndarray,
    ink: np.ndarray,
    boxes: list[IntBox],
    confidence: list[float],
    named: int,
    *,
    model: SeamModel | None = None,
    params: CountParams | None = None,
    maps: seam_net.BoundaryMaps | None = None,
) -> tuple[list[IntBox], list[float]]:
    """``boxes`` (with their ``confidence``) with their likeliest seams cut until there are
    ``named`` of them (the number of panels the caption names), or until no line scores
    ``params.min_score``. ``ink``: the figure's content mask, which the parts are tightened to;
    ``maps``: the figure's boundary maps when the caller already has them."""
    p = params or load_params().count_guided
    if not boxes or named <= len(boxes) or named > p.max_named:
        return boxes, confidence
    model = model or default_model()
    boxes, confidence = list(boxes), list(confidence)
    if maps is None:
        maps = seam_net.boundary_maps(rgb)
    spent: set[IntBox] = set()  # boxes with no usable cut left
    while len(boxes) < named:
        best: tuple[float, int, int, list[IntBox]] | None = None  # score, box index, axis, parts
        for k, box in enumerate(boxes):
            if box in spent:
                continue
            seam = best_seam(rgb, box, boxes, model, maps)
            if seam is None or seam.score < p.min_score:
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
        parts = [without_sliver(ink, parts[0], axis, True), without_sliver(ink, parts[1], axis, False)]
        boxes[k] = parts[0]
        boxes.append(parts[1])
        confidence[k] = min(confidence[k], p.split_confidence)
        confidence.append(p.split_confidence)
    return boxes, confidence


def merge_to_count(
    boxes: list[IntBox],
    confidence: list[float],
    named: int,
    *,
    maps: seam_net.BoundaryMaps,
    params: CountParams | None = None,
) -> tuple[list[IntBox], list[float]]:
    """``boxes`` (with their ``confidence``) with pairs joined until there are ``named`` of them.
    Only a pair that fills ``params.merge_fill`` of its joint box without reaching into another box is
    joined; the pair whose junction looks least like a panel boundary first (the figure's
    boundary ``maps``), and none whose junction is a sure boundary."""
    p = params or load_params().count_guided
    if named < 1 or len(boxes) <= named:
        return boxes, confidence
    boxes, confidence = list(boxes), list(confidence)
    while len(boxes) > named:
        best: tuple[float, int, int] | None = None  # doubt, the two boxes
        for i, j in itertools.combinations(range(len(boxes)), 2):
            joint, fill = _joint_fill(boxes[i], boxes[j])
            if fill < p.merge_fill:
                continue
            doubt = _junction(maps, boxes[i], boxes[j], joint) + p.gap_weight * (1.0 - fill)
            if doubt > p.max_doubt or (best is not None and doubt >= best[0]):
                continue
            if not _reaches_into_another(boxes, i, j, joint):
                best = (doubt, i, j)
        if best is None:
            break
        _, i, j = best
        boxes[i] = _joint(boxes[i], boxes[j])
        confidence[i] = min(confidence[i], confidence[j], p.split_confidence)
        del boxes[j], confidence[j]
    return boxes, confidence


def join_unlabelled(
    boxes: list[IntBox], labels: list[str | None], named: list[str], *, params: CountParams | None = None
) -> tuple[list[IntBox], list[str | None]]:
    """``boxes`` with their ``labels``, each box without a label joined to a labelled neighbour
    while there are more boxes than the caption's ``named`` labels and every one of those labels
    is on a box already: then the boxes without one are pieces of panels (a plot cut at its axis,
    a picture at a bright edge), not panels whose label went unread. A piece joins the neighbour
    it lies beside (across at most ``params.join_gap`` of the figure's size, along at least half its
    own side) whose joint box fills most of it and reaches into no other box."""
    p = params or load_params().count_guided
    have = {label.casefold() for label in labels if label}
    if len(named) < 2 or len(boxes) <= len(named) or any(n.casefold() not in have for n in named):
        return boxes, labels
    boxes, labels = list(boxes), list(labels)
    reach = p.join_gap * max(max(b[2] for b in boxes), max(b[3] for b in boxes))
    while len(boxes) > len(named):
        best: tuple[float, int, int] | None = None  # fill, piece, panel
        for i in (i for i, label in enumerate(labels) if not label):
            for j in (j for j, label in enumerate(labels) if label):
                if not _beside(boxes[i], boxes[j], reach):
                    continue
                joint, fill = _joint_fill(boxes[i], boxes[j])
                if fill < p.join_fill or (best is not None and fill <= best[0]):
                    continue
                if not _reaches_into_another(boxes, i, j, joint):
                    best = (fill, i, j)
        if best is None:
            break
        _, i, j = best
        boxes[j] = _joint(boxes[i], boxes[j])
        del boxes[i], labels[i]
    return boxes, labels


def _beside(a: IntBox, b: IntBox, reach: float) -> bool:
    """``a`` lies next to ``b`` (a gap of at most ``reach``), sharing half of its own side."""
    for axis in (0, 1):
        gap = max(b[axis] - a[axis + 2], a[axis] - b[axis + 2])
        other = 1 - axis
        shared = min(a[other + 2], b[other + 2]) - max(a[other], b[other])
        if -2 <= gap <= reach and shared >= 0.5 * (a[other + 2] - a[other]):
            return True
    return False


def _junction(maps: seam_net.BoundaryMaps, a: IntBox, b: IntBox, joint: IntBox) -> float:
    """The boundary network's mean probability along the line between ``a`` and ``b``."""
    if max(b[0] - a[2], a[0] - b[2]) >= max(b[1] - a[3], a[1] - b[3]):  # side by side
        x = (min(a[2], b[2]) + max(a[0], b[0])) / 2.0
        return float(maps.line_strength(joint, 0, np.array([x - joint[0]]))[0])
    y = (min(a[3], b[3]) + max(a[1], b[1])) / 2.0
    return float(maps.line_strength(joint, 1, np.array([y - joint[1]]))[0])


def _joint_fill(a: IntBox, b: IntBox) -> tuple[IntBox, float]:
    """The joint box of ``a`` and ``b`` and the share of it they cover."""
    joint = _joint(a, b)
    return joint, (area(a) + area(b)) / max(area(joint), 1.0)


def _reaches_into_another(boxes: list[IntBox], i: int, j: int, joint: IntBox) -> bool:
    return any(_share_inside(boxes[k], joint) > 0.1 for k in range(len(boxes)) if k not in (i, j))


def _joint(a: IntBox, b: IntBox) -> IntBox:
    return (min(a[0], b[0]), min(a[1], b[1]), max(a[2], b[2]), max(a[3], b[3]))


def _share_inside(box: IntBox, other: IntBox) -> float:
    """Share of ``box``'s area inside ``other``."""
    return intersection(box, other) / max(area(box), 1.0)
