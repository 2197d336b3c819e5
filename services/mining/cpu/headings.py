"""A heading above a panel stays out of its box, as the annotation conventions have it.

Ownership leaves out the headers round a part made of pictures, and a centred one-line title
over other content. A heading printed flush left or right over a blot, a rendering or a plot
("northern", "HeLa/TO-RIPK3" above its lanes or bars, a structure's name over one of two views)
was left in. What marks it: the panel's top band is one line of text, one phrase (no blank inside
it wider than a few letters, unlike a row of column headers or lane labels spread over the
width), not spanning the whole panel, set apart from what follows by a blank, over content
several times its height. A plot's top band is as often its legend, which the conventions keep
in: there the band must also be plain text, without colour or a legend's swatch or line sample.
"""

from __future__ import annotations

from collections.abc import Sequence

import cv2
import numpy as np

from p2p.mining.cpu.imaging import ink_mask, tight_box
from p2p.mining.params import HeadingParams
from p2p.shared.geometry import Box

COLOURED = 60  # channel spread of a coloured pixel (black, grey and anti-aliased text stay below)
SWATCH_SOLID = 0.9  # of the middle of a legend's square or dot that is ink


def without_top_heading(
    image: np.ndarray,
    box: Box,
    text_height: float,
    *,
    params: HeadingParams,
    plot: bool = False,
    labels: Sequence[Box] = (),
) -> Box | None:
    """``box`` (figure pixels) without a heading along its top, or None when it has none.
    ``labels``: the panel labels' boxes. Their glyphs are no part of a heading's line; a label
    that is the top band's only ink (left in the box) goes out as a heading would."""
    x1, y1 = max(0, int(box[0])), max(0, int(box[1]))
    x2, y2 = min(image.shape[1], int(np.ceil(box[2]))), min(image.shape[0], int(np.ceil(box[3])))
    if x2 - x1 < 8 or y2 - y1 < 8 or text_height <= 0:
        return None
    rgb = np.ascontiguousarray(image[y1:y2, x1:x2, :3])
    ink = ink_mask(rgb)
    text = ink.copy()
    for label in labels:
        lx1, ly1 = max(0, int(label[0]) - x1), max(0, int(label[1]) - y1)
        text[ly1 : max(0, int(np.ceil(label[3])) + 1 - y1), lx1 : max(0, int(np.ceil(label[2])) + 1 - x1)] = (
            False
        )
    legends = rgb if plot else None
    rest_top = _heading_end(text, text_height, params, legends=legends)
    if rest_top is None:
        rest_top = _heading_end(ink, text_height, params, legends=legends)
    if rest_top is None:
        return None
    if plot and _legend_like(rgb[:rest_top], ink[:rest_top], text_height):
        return None
    rest = tight_box(ink, (0, rest_top, x2 - x1, y2 - y1))
    if rest is None:
        return None
    return (float(x1 + rest[0]), float(y1 + rest[1]), float(x1 + rest[2]), float(y1 + rest[3]))


def _heading_end(
    ink: np.ndarray, text_height: float, params: HeadingParams, *, legends: np.ndarray | None
) -> int | None:
    """The first row of content under a heading band at the top of ``ink``, if it has one.
    ``legends``: a plot's pixels, where the line under the band may be a legend's entry."""
    bands = _bands(ink)
    if len(bands) < 2:
        return None
    band_top, band_end = bands[0]
    cols = np.flatnonzero(ink[band_top:band_end].any(axis=0))
    below = 1
    if _underline(ink, bands[1], cols, text_height, params.bracket_line):
        if len(bands) < 3:
            return None
        below = 2
    rest_top = bands[below][0]
    band = band_end - band_top
    if not 0.5 * text_height <= band <= params.line * text_height:
        return None
    if (
        rest_top - bands[below - 1][1] < max(2.0, params.min_gap * text_height)
        or bands[-1][1] - rest_top < params.min_rest * band
    ):
        return None
    if cols[-1] - cols[0] + 1 > params.span * ink.shape[1]:
        return None
    if cols.size > 1 and int(np.diff(cols).max()) - 1 > params.word_gap * band:
        return None
    if _is_rule(ink, bands[below], text_height, params.bracket_line, at_least=(int(cols[0]), int(cols[-1]))):
        return None  # a header over a group of columns (lanes under a tissue's name): kept with a blot
    if below == 1 and _first_line_of_text(ink, bands, int(cols[0]), text_height, legends):
        return None  # the first line of a block of text (a schematic's note), not a heading
    return rest_top


def _first_line_of_text(
    ink: np.ndarray,
    bands: list[tuple[int, int]],
    left: int,
    text_height: float,
    legends: np.ndarray | None,
) -> bool:
    """Whether the top band is the first line of a block of text. Over a plot (``legends``), a
    legend's entry is no second line of a heading, however it lines up: on a small copy the two
    lines' heights blur together."""
    if not _next_line_of_text(ink, bands[0], bands[1], left):
        return False
    following = slice(*bands[1])
    return legends is None or not _legend_like(legends[following], ink[following], text_height)


def _next_line_of_text(ink: np.ndarray, band: tuple[int, int], following: tuple[int, int], left: int) -> bool:
    """Whether ``following`` is the next line of the same text as ``band``: as tall (within a
    quarter), close under it, starting where it starts."""
    height, next_height = band[1] - band[0], following[1] - following[0]
    if abs(next_height - height) > 0.25 * height or following[0] - band[1] > 0.75 * height:
        return False
    next_cols = np.flatnonzero(ink[following[0] : following[1]].any(axis=0))
    return abs(int(next_cols[0]) - left) <= 0.5 * height


def _bands(ink: np.ndarray) -> list[tuple[int, int]]:
    """The runs of inked rows, as (first row, row after the last)."""
    rows = np.flatnonzero(ink.any(axis=1))
    if rows.size == 0:
        return []
    breaks = np.flatnonzero(np.diff(rows) > 1)
    tops = [int(rows[0])] + [int(rows[b + 1]) for b in breaks]
    ends = [int(rows[b]) + 1 for b in breaks] + [int(rows[-1]) + 1]
    return list(zip(tops, ends, strict=True))


def _is_rule(
    ink: np.ndarray, band: tuple[int, int], text_height: float, thickness: float, *, at_least: tuple[int, int]
) -> bool:
    """Whether ``band`` is a thin rule spanning at least the columns ``at_least``."""
    if band[1] - band[0] > thickness * text_height:
        return False
    span = np.flatnonzero(ink[band[0] : band[1]].any(axis=0))
    return span.size > 0 and span[0] <= at_least[0] and span[-1] >= at_least[1]


def _underline(
    ink: np.ndarray, band: tuple[int, int], cols: np.ndarray, text_height: float, thickness: float
) -> bool:
    """Whether ``band`` underlines the text in ``cols``: a thin rule no wider than the text (a
    bracket over a group of lanes runs past its header)."""
    width = int(cols[-1] - cols[0] + 1)
    slack = max(2, width // 10)
    inner = (int(cols[0]) + slack, int(cols[-1]) - slack)
    if not _is_rule(ink, band, text_height, thickness, at_least=inner):
        return False
    span = np.flatnonzero(ink[band[0] : band[1]].any(axis=0))
    return bool(span[0] >= cols[0] - slack and span[-1] <= cols[-1] + slack)


def _legend_like(rgb: np.ndarray, ink: np.ndarray, text_height: float) -> bool:
    """Whether a band over a plot reads as a legend entry: coloured ink (a swatch's worth), a
    solid square or dot about a letter's size, or a line sample wider than a letter is tall."""
    pixels = rgb[ink].astype(np.int16)
    if int((np.ptp(pixels, axis=1) > COLOURED).sum()) >= 0.1 * text_height**2:
        return True
    _, components, stats, _ = cv2.connectedComponentsWithStats(ink.astype(np.uint8), connectivity=8)
    for k, (x, y, width, height, _) in enumerate(stats[1:], start=1):
        if width >= text_height and height <= 0.25 * text_height:
            return True
        if not (0.6 <= width / height <= 1.7 and min(width, height) >= 0.3 * text_height):
            continue
        # a swatch's middle is solid; a letter's (H, O, R, bold or not) has a counter or a bar
        middle = components[
            y + height // 4 : y + height - height // 4, x + width // 4 : x + width - width // 4
        ]
        if middle.size and float((middle == k).mean()) >= SWATCH_SOLID:
            return True
    return False
