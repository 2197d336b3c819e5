"""A colour bar beside an image panel stays out of its box, as the annotation conventions have it.

Ownership leaves a bar out where it finds the part's pictures (a bar is too narrow to be one),
but a panel the segmenter's piece gives, as cut, keeps the bar and its tick labels at its right.
What marks a colour bar: a narrow, tall strip set apart from the image by a blank gutter, each of
whose rows is one colour, changing smoothly from row to row over a wide range. A micrograph's
edge strip has grain across its rows; a plot's colour bar is left alone (only image panels are
looked at).
"""

from __future__ import annotations

import numpy as np

from p2p.mining.cpu.imaging import INK_THRESHOLD, tight_box
from p2p.shared.geometry import Box

BAR_WIDTH = 0.12  # of the panel's width: a colour bar is no wider
BAR_HEIGHT = 0.4  # of the panel's height: and at least this tall
BAR_START = 0.6  # of the panel's width: the gutter before the bar starts right of this
GUTTER_FILL = 0.3  # of the panel's height: a column inked less is part of the gutter
ROW_SPREAD = 12.0  # grey levels: the most a bar's row varies across its width (median row)
COLOUR_RANGE = 60.0  # grey levels: the least a bar's colours span along it (in any channel)
STEP = 0.25  # of the bar's colour range: the most its colour changes from one row to the next


def without_colour_bar(image: np.ndarray, box: Box) -> Box | None:
    """``box`` (figure pixels) without a colour bar and its ticks along its right side, or None
    when it has none."""
    height, width = image.shape[:2]
    x1, y1 = max(0, int(box[0])), max(0, int(box[1]))
    x2, y2 = min(width, int(np.ceil(box[2]))), min(height, int(np.ceil(box[3])))
    if x2 - x1 < 20 or y2 - y1 < 20:
        return None
    rgb = np.ascontiguousarray(image[y1:y2, x1:x2, :3])
    ink = rgb.min(axis=2) < INK_THRESHOLD
    fill = ink.mean(axis=0)
    tall = np.flatnonzero(fill >= BAR_HEIGHT)
    if tall.size == 0:
        return None
    # the rightmost run of tall columns is the bar; its tick labels to its right are short
    bar_end = int(tall[-1]) + 1
    bar_start = bar_end - 1
    while bar_start > 0 and fill[bar_start - 1] >= BAR_HEIGHT:
        bar_start -= 1
    # a gutter, nearly blank (a heading or a label may cross it), sets the bar apart
    gutter = bar_start
    while gutter > 0 and fill[gutter - 1] < GUTTER_FILL:
        gutter -= 1
    if gutter == bar_start or gutter < BAR_START * (x2 - x1) or bar_end - bar_start > BAR_WIDTH * (x2 - x1):
        return None
    rows = np.flatnonzero(ink[:, bar_start:bar_end].all(axis=1))
    if rows.size < BAR_HEIGHT * (y2 - y1) or not _gradient(rgb[rows[0] : rows[-1] + 1, bar_start:bar_end]):
        return None
    rest = tight_box(ink, (0, 0, gutter, y2 - y1))
    if rest is None:
        return None
    return (float(x1 + rest[0]), float(y1 + rest[1]), float(x1 + rest[2]), float(y1 + rest[3]))


def _gradient(strip: np.ndarray) -> bool:
    """Whether each row of ``strip`` is one colour and the colours run smoothly over a wide
    range from one end to the other (a colour map), not an image's grain."""
    if strip.shape[0] < 8 or strip.shape[1] < 2:
        return False
    values = strip.astype(np.float32)
    inner = values[2:-2, 1:-1] if strip.shape[1] > 3 else values[2:-2]  # the bar's outline aside
    if float(np.median(inner.std(axis=1).max(axis=1))) > ROW_SPREAD:
        return False
    means = inner.mean(axis=1)  # one colour per row
    colour_range = float(np.ptp(means, axis=0).max())
    step = float(np.abs(np.diff(means, axis=0)).max())
    return colour_range >= COLOUR_RANGE and step <= STEP * colour_range
