"""A heading above a panel stays out of its box, as the annotation conventions have it.

Ownership leaves out the headers round a part made of pictures, and a centred one-line title
over other content. A heading printed flush left or right over a blot or a rendering ("northern",
"HeLa/TO-RIPK3" above its lanes, a structure's name over one of two views) was left in. What
marks it: the panel's top band is one line of text, one phrase (no blank inside it wider than a
few letters, unlike a row of column headers or lane labels spread over the width), narrower than
half the panel, set apart from what follows by a blank, over content several times its height.
Plots keep their top band: there it is as often a legend, which the conventions keep in.
"""

from __future__ import annotations

import numpy as np

from p2p.mining.cpu.imaging import ink_mask, tight_box
from p2p.shared.geometry import Box

HEADING_LINE = 1.6  # text heights a heading band may be tall (an underline included)
HEADING_SPAN = 0.5  # of the panel's width a heading may span
WORD_GAP = 1.5  # text heights: a wider blank inside the band parts a row of headers
MIN_GAP = 0.2  # text heights of blank between the heading and the content
BRACKET_LINE = 0.3  # text heights: a rule under a header is no thicker
MIN_REST = 3.0  # the content under the heading is this many times the band's height


def without_top_heading(image: np.ndarray, box: Box, text_height: float) -> Box | None:
    """``box`` (figure pixels) without a heading along its top, or None when it has none."""
    x1, y1 = max(0, int(box[0])), max(0, int(box[1]))
    x2, y2 = min(image.shape[1], int(np.ceil(box[2]))), min(image.shape[0], int(np.ceil(box[3])))
    if x2 - x1 < 8 or y2 - y1 < 8 or text_height <= 0:
        return None
    ink = ink_mask(np.ascontiguousarray(image[y1:y2, x1:x2, :3]))
    rest_top = _heading_end(ink, text_height)
    if rest_top is None:
        return None
    rest = tight_box(ink, (0, rest_top, x2 - x1, y2 - y1))
    if rest is None:
        return None
    return (float(x1 + rest[0]), float(y1 + rest[1]), float(x1 + rest[2]), float(y1 + rest[3]))


def _heading_end(ink: np.ndarray, text_height: float) -> int | None:
    """The first row of content under a heading band at the top of ``ink``, if it has one."""
    rows = np.flatnonzero(ink.any(axis=1))
    breaks = np.flatnonzero(np.diff(rows) > 1)
    if breaks.size == 0:
        return None
    band_top, band_end = int(rows[0]), int(rows[breaks[0]]) + 1
    rest_top = int(rows[breaks[0] + 1])
    band = band_end - band_top
    if not 0.5 * text_height <= band <= HEADING_LINE * text_height:
        return None
    if (
        rest_top - band_end < max(2.0, MIN_GAP * text_height)
        or int(rows[-1]) + 1 - rest_top < MIN_REST * band
    ):
        return None
    cols = np.flatnonzero(ink[band_top:band_end].any(axis=0))
    if cols[-1] - cols[0] + 1 > HEADING_SPAN * ink.shape[1]:
        return None
    if cols.size > 1 and int(np.diff(cols).max()) - 1 > WORD_GAP * text_height:
        return None
    if _bracket_below(ink, rows, breaks, cols, text_height):
        return None
    return rest_top


def _bracket_below(
    ink: np.ndarray, rows: np.ndarray, breaks: np.ndarray, cols: np.ndarray, text_height: float
) -> bool:
    """Whether a thin rule as wide as the band runs right under it: a header over a group of
    columns (lanes under a tissue's name), which the conventions keep with a blot."""
    start = int(rows[breaks[0] + 1])
    end = int(rows[breaks[1]]) + 1 if breaks.size > 1 else int(rows[-1]) + 1
    if end - start > BRACKET_LINE * text_height:
        return False
    span = np.flatnonzero(ink[start:end].any(axis=0))
    return span.size > 0 and span[-1] - span[0] + 1 >= cols[-1] - cols[0] + 1
