"""A plot's y-axis text handed back from the panel on its left.

Between a picture and the plot to its right, the plot's tick labels and axis title stand in the
gutter, left of the plot's axis line. The segmenter (its gutters blocked by a label above them, or
its seam cut made at the axis line, the strongest line there) often gives that text to the picture,
whose box then reaches over the gutter (the picture's right side 20-60 px too far, the plot's left
side as far short). The text is told apart by where it stands: a strip of ink at the right of the
left panel, apart from the panel's own content by blank columns, lying within the rows of the plot,
right against the plot's axis line (a dark line down the plot's left side). It goes to the plot.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from p2p.mining.cpu.imaging import Analysis, IntBox, ink_mask, tight_box
from p2p.mining.params import AxisStripParams, load_params
from p2p.mining.types import LabelDetection, PanelCandidate


def return_axis_strips(
    image: np.ndarray,
    panels: Sequence[PanelCandidate],
    labels: Sequence[LabelDetection],
    *,
    analysis: Analysis | None = None,
    params: AxisStripParams | None = None,
) -> list[PanelCandidate]:
    """``panels`` with each plot's y-axis text moved from the panel on its left into the plot.
    The ``labels`` read are no content: a plot's label above its axis text bridges the gutter.
    ``analysis``: the segmenter's look at this figure (its content mask)."""
    p = params or load_params().axis_strips
    panels = list(panels)
    if len(panels) < 2:
        return panels
    rgb = np.ascontiguousarray(image[..., :3])
    if analysis is not None and analysis.ink is not None and analysis.ink.shape == rgb.shape[:2]:
        ink = analysis.ink.copy()
    else:
        ink = ink_mask(rgb)
    for label in labels:
        lx1, ly1, lx2, ly2 = _int_box(label.box)
        ink[max(0, ly1) : ly2, max(0, lx1) : lx2] = False
    boxes = [_int_box(p.box) for p in panels]
    for j, plot in enumerate(boxes):
        if not _axis_line(ink, plot, p):
            continue
        for i, left in enumerate(boxes):
            if i == j or not 0 <= plot[0] - left[2] <= p.touch or not _rows_shared(left, plot):
                continue
            moved = _strip(ink, left, plot, p)
            if moved is None:
                continue
            boxes[i], boxes[j] = moved
            panels[i] = PanelCandidate(box=_float_box(moved[0]), confidence=panels[i].confidence)
            panels[j] = PanelCandidate(box=_float_box(moved[1]), confidence=panels[j].confidence)
            break
    return panels


def _axis_line(ink: np.ndarray, box: IntBox, p: AxisStripParams) -> bool:
    """A line of ink runs down most of the box at its left side (a plot's y axis: thin, often
    grey once JPEG has blurred it, so ink rather than dark)."""
    x1, y1, x2, y2 = box
    band = ink[y1:y2, x1 : min(x2, x1 + p.axis_width)]
    if band.size == 0 or y2 - y1 < 8:
        return False
    return bool((band.sum(axis=0) >= p.axis_share * (y2 - y1)).any())


def _rows_shared(left: IntBox, plot: IntBox) -> bool:
    shared = min(left[3], plot[3]) - max(left[1], plot[1])
    return shared >= 0.5 * (plot[3] - plot[1])


def _strip(ink: np.ndarray, left: IntBox, plot: IntBox, p: AxisStripParams) -> tuple[IntBox, IntBox] | None:
    """(the left panel without the strip, the plot with it), or None when the left panel ends
    in no such strip: blank columns before it, its ink within the plot's rows."""
    x1, y1, x2, y2 = left
    columns: np.ndarray = np.asarray(ink[y1:y2, x1:x2].any(axis=0))
    width = x2 - x1
    limit = max(1, width - round(p.max_strip * width))
    # the blank run nearest the panel's own content: the strip may hold several (tick labels,
    # then the axis title)
    start = None
    k = limit
    while k < width:
        if columns[k]:
            k += 1
            continue
        run = k
        while k < width and not columns[k]:
            k += 1
        if k - run >= p.min_gap and k < width and columns[:run].any():
            start = k
            break
    if start is None:
        return None
    strip = ink[y1:y2, x1 + start : x2]
    rows = np.flatnonzero(strip.any(axis=1))
    if y1 + rows[0] < plot[1] - p.row_slack or y1 + rows[-1] + 1 > plot[3] + p.row_slack:
        return None  # ink above or below the plot: the panel's own (a colour bar, a legend)
    rest = tight_box(ink, (x1, y1, x1 + start, y2))
    if rest is None:
        return None
    top, bottom = y1 + int(rows[0]), y1 + int(rows[-1]) + 1
    return rest, (x1 + start, min(plot[1], top), plot[2], max(plot[3], bottom))


def _int_box(box: tuple[float, float, float, float]) -> IntBox:
    return (int(box[0]), int(box[1]), round(box[2]), round(box[3]))


def _float_box(box: IntBox) -> tuple[float, float, float, float]:
    return (float(box[0]), float(box[1]), float(box[2]), float(box[3]))
