"""Panels as the paper defines them: what one printed label owns.

The segmenter cuts wherever it sees a gutter, so on real figures a grid of micrographs under one
letter, two charts under one letter or a blot with its quantification come back as several boxes,
most of them unlabelled. Once labels are read, the labels decide instead:

- Labels are the printed series (``labels.series``), letters it lacks looked for again.
- The figure is cut along its blank gutters, but only where both sides keep a label heading
  content of their own (little content left of or above the side's labels). Label glyphs do not
  block a gutter; a label standing in one, or hanging just before it, goes with the content after
  it, and a gutter a label heads is cut before a wider blank no label heads.
- A part holding one label is that label's panel, whatever gutters run inside it: every piece of
  content in it is the label's, and nothing is left as an unlabelled panel beside it. Labels that
  share a part no gutter divides share out its content piece by piece, each piece to the label
  heading it (``_shared_part``).
- Its box follows the annotation conventions: a part that is mostly pictures is the union of
  the pictures (headers, row labels and titles printed round them stay out); otherwise a
  centred one-line heading above the content stays out. What stays out is in the outer box.
- While a label the caption or the series names is still unread, its panel would be swallowed
  by a neighbour: the segmenter's pieces stand, and a note says why.
- A figure that prints no labels is cut only where blank space sets panels apart
  (``separate_parts``): a single diagram or image stays whole, and pieces strokes join are one
  drawing (``connectors``). A gutter that nearly qualifies makes the layout ambiguous: a note,
  and a lower panel confidence.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import cv2
import numpy as np

from p2p.mining.cpu.connectors import stroke_groups
from p2p.mining.cpu.imaging import INK_THRESHOLD, ink_mask, tight_box
from p2p.mining.cpu.labels.series import (
    expected_letters,
    next_letter,
    past_gap,
    series_labels,
    unread_labels,
)
from p2p.mining.cpu.panel_type import default_classifier
from p2p.mining.label_repair import alike_in_area
from p2p.mining.types import LabelDetection, PanelCandidate
from p2p.shared import geometry
from p2p.shared.geometry import Box, union_box

# Tuned on real-dev "tune" only (bench/README.md, real figures); every value is a general rule.
FAINT_THRESHOLD = 240  # ... and for a panel's extent, where pale renderings count
GREY_SPREAD = 12  # channel spread of a grey picture's median pixel: a blot has no colour
DENSE_KERNEL = 0.012  # of the part's longer side: a square pictures fill and text does not
MIN_PICTURE_SHARE = 0.01  # of the content box: a smaller dense block is a bar or a glyph
PICTURE_SHARE = 0.6  # of the content box the pictures must fill for the part to be pictures
MAX_PICTURE_ASPECT = 4.0  # a blot strip is longer than this
SOLID_FILL = 0.5  # of a row or column a picture block fills (sparser edge rows are header text)
HEADING_LINES = 1.5  # label heights: how tall a heading band may be
HEADING_WIDTH = 0.7  # of the content width a heading may span
HEADING_OFFSET = 0.1  # of the content width a heading's centre may be off the content's
SEPARATE_RATIO = 1.5  # unlabelled figures: panel gutter / widest gap inside the panels
MIN_SEPARATE_GAP = 0.01  # of the figure's longer side: narrower gutters never separate panels
MIN_SIDE_INK = 0.03  # of the content's ink: less is a note or a scale bar, not a panel
REPEAT_AREA_RATIO = 2.5  # largest / smallest piece of a row or grid of panels
UNLABELLED_CONFIDENCE = 0.7
AMBIGUOUS_FACTOR = 0.6  # share of the confidence kept when the layout is ambiguous
HANG_SLACK = 0.5  # label heights: a label ending this near a gutter's start hangs before it
CUT_SEARCH_BUDGET = 200  # cuts tried in all while looking for an order that gives each label a part
HEAD_TOLERANCE = 1.5  # label heights a panel's content may start left of or above its label
MAX_BEFORE_SHARE = 0.1  # of a part's content: more left of or above its labels is a neighbour's
WORK_SIDE = 1200  # gutters are looked for at most this large (longest side)
MIN_CONTENT_SHARE = 0.002  # of a part's area: the ink beside its labels that makes it content
OWNED_CONFIDENCE = 0.8  # a panel assembled from pieces under its label
SHARED_JOIN = 0.2  # label heights: ink this close is one piece of a part labels share
SHARED_BODY = 0.02  # of a shared part's ink: a piece this large is a panel's body
SHARED_CONFIDENCE = 0.6  # a panel given its pieces in a part without gutters

IntBox = tuple[int, int, int, int]


@dataclass(frozen=True)
class Anchor:
    text: str
    box: IntBox  # working-scale pixels, x2/y2 exclusive

    @property
    def center(self) -> tuple[float, float]:
        return ((self.box[0] + self.box[2]) / 2, (self.box[1] + self.box[3]) / 2)


def working_ink(image: np.ndarray, threshold: int = INK_THRESHOLD) -> tuple[np.ndarray, int]:
    """The figure's ink at working scale (a block is ink if any pixel in it is) and the factor."""
    return FigureInk(image).working(threshold)


class FigureInk:
    """A figure's ink masks, each made once: ownership reads the same masks at two thresholds,
    at full size and at working scale. Every mask handed out is the caller's own copy.

    ``faint``: ink down to faint greys; light renderings (a grey body outline, a pale stain) are
    content a reader sees, and the segmenter's threshold leaves them out."""

    def __init__(self, image: np.ndarray) -> None:
        rgb = np.ascontiguousarray(image[..., :3])
        self._darkest = np.minimum(np.minimum(rgb[:, :, 0], rgb[:, :, 1]), rgb[:, :, 2])
        mask = ink_mask(rgb)
        self._canvas = mask if mask.mean() > 0.5 else None  # a dark canvas: its own reading stands
        self._faint: dict[int, np.ndarray] = {}
        self._working: dict[int, tuple[np.ndarray, int]] = {}

    def faint(self, threshold: int) -> np.ndarray:
        if threshold not in self._faint:
            canvas = self._canvas
            self._faint[threshold] = canvas if canvas is not None else np.asarray(self._darkest < threshold)
        return self._faint[threshold].copy()

    def working(self, threshold: int = INK_THRESHOLD) -> tuple[np.ndarray, int]:
        if threshold not in self._working:
            self._working[threshold] = _at_working_scale(self.faint(threshold))
        mask, factor = self._working[threshold]
        return mask.copy(), factor


def _at_working_scale(mask: np.ndarray) -> tuple[np.ndarray, int]:
    height, width = mask.shape
    factor = max(1, math.ceil(max(height, width) / WORK_SIDE))
    if factor > 1:
        ph, pw = -height % factor, -width % factor
        padded = np.pad(mask, ((0, ph), (0, pw)))
        blocks = padded.reshape(padded.shape[0] // factor, factor, padded.shape[1] // factor, factor)
        mask = np.asarray(blocks.any(axis=(1, 3)), dtype=bool)
    # lone specks (JPEG ringing) would bridge gutters
    _, labels, stats, _ = cv2.connectedComponentsWithStats(mask.astype(np.uint8), connectivity=8)
    specks = stats[:, cv2.CC_STAT_AREA] <= 2
    specks[0] = False
    if specks.any():
        mask = mask & ~specks[labels]
    return np.asarray(mask, dtype=bool), factor


def _gaps(profile: np.ndarray | np.bool_) -> list[tuple[int, int]]:
    """Blank runs strictly between the first and last inked positions: (start, end)."""
    profile = np.asarray(profile, dtype=bool)
    inked = np.flatnonzero(profile)
    if inked.size < 2:
        return []
    runs: list[tuple[int, int]] = []
    start = None
    for pos in range(int(inked[0]), int(inked[-1]) + 1):
        if not profile[pos]:
            if start is None:
                start = pos
        elif start is not None:
            runs.append((start, pos))
            start = None
    return runs


def _content(ink: np.ndarray, box: IntBox, anchors: list[Anchor]) -> int:
    """Ink in ``box`` outside the label glyphs (grown a little)."""
    x1, y1, x2, y2 = box
    crop = ink[y1:y2, x1:x2].copy()
    for a in anchors:
        gx1, gy1, gx2, gy2 = a.box
        pad = max(1, (gy2 - gy1) // 3)
        crop[
            max(0, gy1 - pad - y1) : max(0, gy2 + pad - y1), max(0, gx1 - pad - x1) : max(0, gx2 + pad - x1)
        ] = False
    return int(crop.sum())


def _inside(anchor: Anchor, box: IntBox) -> bool:
    cx, cy = anchor.center
    return box[0] <= cx < box[2] and box[1] <= cy < box[3]


Sides = tuple[tuple[IntBox, list[Anchor]], tuple[IntBox, list[Anchor]]]


def label_parts(ink: np.ndarray, anchors: list[Anchor]) -> list[tuple[IntBox, list[Anchor]]]:
    """The figure cut along gutters into parts, each with the labels inside it; a cut is made
    only where both sides keep a label and content besides their labels.

    Where several cuts are open, the widest one headed by a label goes first, unless another
    order of cuts leaves fewer labels sharing a part: a narrow gutter between a panel and the
    strips under it can open before the wider one that frees the panel's whole column."""
    height, width = ink.shape
    return _partition(ink, (0, 0, width, height), anchors, [CUT_SEARCH_BUDGET])


def _partition(
    ink: np.ndarray, box: IntBox, inside: list[Anchor], budget: list[int]
) -> list[tuple[IntBox, list[Anchor]]]:
    """``box`` cut into parts by the order of cuts that leaves the fewest of its labels without
    a part of their own. ``budget`` bounds the cuts tried over the whole search; once spent, the
    preferred cut wins."""
    if len(inside) < 2:
        return [(box, inside)]
    best: tuple[list[tuple[IntBox, list[Anchor]]], int] | None = None
    for sides in _cuts(ink, box, inside):
        budget[0] -= 1
        parts = [
            part for side_box, side_labels in sides for part in _partition(ink, side_box, side_labels, budget)
        ]
        unowned = len(inside) - sum(len(owners) == 1 for _, owners in parts)  # sharing, or lost by a cut
        if best is None or unowned < best[1]:
            best = (parts, unowned)
        if best[1] == 0 or budget[0] <= 0:
            break
    return [(box, inside)] if best is None else best[0]


def _sides(parts: tuple[IntBox, IntBox], inside: list[Anchor], hanging: list[Anchor]) -> Sides:
    """Each side of a cut with its labels; labels hanging before the gutter go after it."""
    first, second = parts
    return (
        (first, [a for a in inside if _inside(a, first) and a not in hanging]),
        (second, [a for a in inside if _inside(a, second) or a in hanging]),
    )


def _cuts(ink: np.ndarray, box: IntBox, inside: list[Anchor]) -> list[Sides]:
    """The gutters across ``box`` that leave each side a label heading its content, as the two
    sides of each, preferred first: headed by a label (``_heads_gutter``), then the widest.
    Label glyphs do not block a gutter (a label often stands in the gutter above its panel);
    a label standing in the gutter goes with the content after it (below, or to the right)."""
    x1, y1, x2, y2 = box
    crop = ink[y1:y2, x1:x2].copy()
    for a in inside:
        crop[max(0, a.box[1] - y1) : max(0, a.box[3] - y1), max(0, a.box[0] - x1) : max(0, a.box[2] - x1)] = (
            False
        )
    options: list[tuple[bool, int, Sides]] = []
    for axis in (0, 1):  # 0: a horizontal gutter (rows), 1: a vertical one (columns)
        profile = crop.any(axis=1 - axis)
        origin = y1 if axis == 0 else x1
        for start, end in _gaps(profile):
            within = [
                a.box[1] if axis == 0 else a.box[0]
                for a in inside
                if start <= (a.center[1] if axis == 0 else a.center[0]) - origin < end
            ]
            cut = min(within) - origin if within else (start + end) // 2
            cut = max(start, min(cut, end))
            hanging = [] if within else _hanging(inside, axis, origin + start)
            if axis == 0:
                parts = ((x1, y1, x2, y1 + cut), (x1, y1 + cut, x2, y2))
            else:
                parts = ((x1, y1, x1 + cut, y2), (x1 + cut, y1, x2, y2))
            sides = _sides(parts, inside, hanging)
            if all(_owns(ink, part, owners) for part, owners in sides):
                headed = _heads_gutter(inside, axis, origin + start, origin + end)
                options.append((headed, end - start, sides))
    options.sort(key=lambda o: o[:2], reverse=True)
    return [sides for _, _, sides in options]


def _hanging(anchors: list[Anchor], axis: int, start: int) -> list[Anchor]:
    """Labels that end where a gutter starts: their panel's content lies past the gutter (the
    neighbour's tick labels, further down, fill the label's columns, so the gutter starts after
    the label)."""
    hanging = []
    for a in anchors:
        lead, trail = (a.box[1], a.box[3]) if axis == 0 else (a.box[0], a.box[2])
        if lead < start and abs(trail - start) <= HANG_SLACK * (a.box[3] - a.box[1]):
            hanging.append(a)
    return hanging


def _heads_gutter(anchors: list[Anchor], axis: int, start: int, end: int) -> bool:
    """Whether a label stands in the gutter or just after it (within its own size): a panel's
    boundary. A wider blank inside a panel (between a rendering and its key) has none."""
    for a in anchors:
        lead = a.box[1] if axis == 0 else a.box[0]
        size = a.box[3] - a.box[1]
        if start - size <= lead <= end + size:
            return True
    return False


def _owns(ink: np.ndarray, part: IntBox, anchors: list[Anchor]) -> bool:
    """A part can stand alone when it keeps a label and content besides, and its labels head
    that content: little of it lies left of or above them (labels are printed at a panel's top
    left; a part whose label sits mid-way across holds a neighbour's content)."""
    if not anchors:
        return False
    area = max(1, (part[2] - part[0]) * (part[3] - part[1]))
    content = _content(ink, part, anchors)
    if content < max(4, MIN_CONTENT_SHARE * area):
        return False
    tol = max(a.box[3] - a.box[1] for a in anchors) * HEAD_TOLERANCE
    left = int(min(a.box[0] for a in anchors) - tol)
    top = int(min(a.box[1] for a in anchors) - tol)
    before_left = _content(ink, (part[0], part[1], max(part[0], left), part[3]), anchors)
    before_top = _content(ink, (part[0], part[1], part[2], max(part[1], top)), anchors)
    return max(before_left, before_top) <= MAX_BEFORE_SHARE * content


def _clip(box: Box, part: IntBox, factor: int) -> Box | None:
    x1 = max(box[0], part[0] * factor)
    y1 = max(box[1], part[1] * factor)
    x2 = min(box[2], part[2] * factor)
    y2 = min(box[3], part[3] * factor)
    if x2 <= x1 or y2 <= y1:
        return None
    return (x1, y1, x2, y2)


def _owned_box(
    image: np.ndarray,
    ink: np.ndarray,
    full: np.ndarray,
    factor: int,
    part: IntBox,
    owner: Anchor,
    text_height: float,
) -> tuple[Box, Box | None] | None:
    """The part's content without its label glyph, in figure pixels: found at working scale
    (specks gone), then tightened to the figure's own ink inside it. With it the outer box (all
    the label owns, headings and outside text included) when the conventions leave some out."""
    x1, y1, x2, y2 = part
    local = ink[y1:y2, x1:x2].copy()
    gx1, gy1, gx2, gy2 = owner.box
    pad = max(1, (gy2 - gy1) // 4)
    local[
        max(0, gy1 - pad - y1) : max(0, gy2 + pad - y1), max(0, gx1 - pad - x1) : max(0, gx2 + pad - x1)
    ] = False
    content = tight_box(local, (0, 0, x2 - x1, y2 - y1))
    if content is None:
        return None
    box = content
    pictures = image_extents(local, box)
    if pictures is not None and _chart(
        image, factor, (pictures[0] + x1, pictures[1] + y1, pictures[2] + x1, pictures[3] + y1)
    ):
        pictures = None
    box = pictures if pictures is not None else without_heading(local, box, text_height)
    glyph = ((gx1 - pad) * factor, (gy1 - pad) * factor, (gx2 + pad) * factor, (gy2 + pad) * factor)
    tight = _in_figure(full, factor, (box[0] + x1, box[1] + y1, box[2] + x1, box[3] + y1), glyph)
    if tight is None:
        return None
    if box == content:
        return tight, None
    outer = _in_figure(
        full, factor, (content[0] + x1, content[1] + y1, content[2] + x1, content[3] + y1), glyph
    )
    return tight, outer


def picture_boxes(image: np.ndarray, boxes: list[Box]) -> list[Box | None]:
    """For each box (figure pixels) that is mostly pictures (``image_extents``): the union of
    its pictures, tightened to the figure's ink, where that leaves text printed round them out
    (row labels, column headers); None for the others, and for grey pictures, which may be a
    blot whose strips close up into one block on a small copy."""
    if not boxes:
        return []  # no masks to make: most figures have no such panel
    masks = FigureInk(image)
    faint, factor = masks.working(FAINT_THRESHOLD)
    full = masks.faint(FAINT_THRESHOLD)
    out: list[Box | None] = []
    for box in boxes:
        content = tight_box(faint, _working_box(box, factor))
        pictures = image_extents(faint, content) if content is not None else None
        if (
            pictures is None
            or pictures == content
            or _chart(image, factor, pictures)
            or _grey(image, factor, pictures)
        ):
            out.append(None)
            continue
        tight = _in_figure(full, factor, pictures, (0, 0, 0, 0))
        out.append(
            None
            if tight is None
            else (max(tight[0], box[0]), max(tight[1], box[1]), min(tight[2], box[2]), min(tight[3], box[3]))
        )
    return out


def _grey(image: np.ndarray, factor: int, block: IntBox) -> bool:
    """Whether pictures (working scale) are grey: a blot's strips are, and a blot's lane and band
    labels are its own (so are a grey micrograph's, left as they are)."""
    x1, y1, x2, y2 = (v * factor for v in block)
    rgb = image[y1:y2, x1:x2, :3].astype(np.int16)
    return rgb.size > 0 and float(np.median(rgb.max(axis=2) - rgb.min(axis=2))) <= GREY_SPREAD


def _chart(image: np.ndarray, factor: int, block: IntBox) -> bool:
    """Whether a dense block (working scale) is a chart, a heat map's cells: dense like a
    picture, but a plot, whose tick labels and colour bar belong in its box."""
    x1, y1, x2, y2 = (v * factor for v in block)
    kind, _ = default_classifier().classify(np.ascontiguousarray(image[y1:y2, x1:x2, :3]))
    return kind == "plot"


def _in_figure(full: np.ndarray, factor: int, box: IntBox, glyph: IntBox) -> Box | None:
    """A working-scale box in figure pixels, tightened to the figure's ink with the label
    glyph (figure pixels) left out, where it shares a block with content."""
    wx1, wy1, wx2, wy2 = (v * factor for v in box)
    height, width = full.shape
    fine = full[wy1 : min(wy2, height), wx1 : min(wx2, width)].copy()
    fine[max(0, glyph[1] - wy1) : max(0, glyph[3] - wy1), max(0, glyph[0] - wx1) : max(0, glyph[2] - wx1)] = (
        False
    )
    tight = tight_box(fine, (0, 0, fine.shape[1], fine.shape[0]))
    if tight is None:
        return None
    return (float(wx1 + tight[0]), float(wy1 + tight[1]), float(wx1 + tight[2]), float(wy1 + tight[3]))


def _solid_core(mask: np.ndarray) -> IntBox | None:
    """The block's box without sparse edge rows or columns: text blobs of a framed header that
    survived the opening hang on a picture grid's edge, thinly; the pictures fill their rows."""
    rows = mask.mean(axis=1) >= SOLID_FILL
    cols = mask.mean(axis=0) >= SOLID_FILL
    if not rows.any() or not cols.any():
        return None
    r, c = np.flatnonzero(rows), np.flatnonzero(cols)
    return (int(c[0]), int(r[0]), int(c[-1]) + 1, int(r[-1]) + 1)


def image_extents(faint: np.ndarray, box: IntBox) -> IntBox | None:
    """For a part that is mostly pictures (micrographs, photographs, a grid of them): the union
    of the pictures, leaving out the text printed around them (headers, row labels, titles).
    None when the part is not mostly pictures: a plot's bars, a blot's strips and a heat map's
    cells are dense too, but narrow, small or a minor share of the content."""
    x1, y1, x2, y2 = box
    crop = faint[y1:y2, x1:x2].astype(np.uint8)
    if crop.size == 0:
        return None
    side = max(crop.shape)
    k = max(5, round(DENSE_KERNEL * side))
    # blank margins: OpenCV's erosion counts outside the crop as ink, so a frame line along the
    # crop's edge (a header table's border) would pass for a picture's edge
    padded = np.pad(crop, k)
    closed = cv2.morphologyEx(padded, cv2.MORPH_CLOSE, np.ones((3, 3), np.uint8))
    opened = cv2.morphologyEx(closed, cv2.MORPH_OPEN, np.ones((k, k), np.uint8))
    dense = np.ascontiguousarray(opened[k:-k, k:-k])
    count, comp, stats, _ = cv2.connectedComponentsWithStats(dense, connectivity=8)
    area = crop.shape[0] * crop.shape[1]
    kept = []
    for i in range(1, count):
        x, y, w, h, a = (int(v) for v in stats[i])
        if a < MIN_PICTURE_SHARE * area or a < 0.7 * w * h or max(w, h) > MAX_PICTURE_ASPECT * min(w, h):
            continue
        trimmed = _solid_core(comp[y : y + h, x : x + w] == i)
        if trimmed is None:
            continue
        tx1, ty1, tx2, ty2 = trimmed
        kept.append((x + tx1, y + ty1, x + tx2, y + ty2, a))
    if not kept or sum(k[4] for k in kept) < PICTURE_SHARE * area:
        return None
    return _union(kept, x1, y1)


def _union(blocks: list[tuple[int, int, int, int, int]], x: int, y: int) -> IntBox:
    return (
        x + min(k[0] for k in blocks),
        y + min(k[1] for k in blocks),
        x + max(k[2] for k in blocks),
        y + max(k[3] for k in blocks),
    )


def without_heading(faint: np.ndarray, box: IntBox, text_height: float) -> IntBox:
    """``box`` without a heading above its content: a top band one text line tall, centred over
    the content and narrower than it, set apart by a blank gutter (a chart title, a column of
    schematics' title). A legend at the top is wider or off centre and stays."""
    x1, y1, x2, y2 = box
    rows = faint[y1:y2, x1:x2].any(axis=1)
    gaps = _gaps(rows)
    if not gaps:
        return box
    end = gaps[0][0]
    below = y2 - y1 - gaps[0][1]
    if end > HEADING_LINES * text_height or below < 3 * end:
        return box
    cols = np.flatnonzero(faint[y1 : y1 + end, x1:x2].any(axis=0))
    if cols.size == 0:
        return box
    width = x2 - x1
    band_center = (cols[0] + cols[-1]) / 2
    if cols[-1] - cols[0] > HEADING_WIDTH * width or abs(band_center - width / 2) > HEADING_OFFSET * width:
        return box
    rest = tight_box(faint, (x1, y1 + gaps[0][1], x2, y2))
    return rest or box


def _widest_gap(ink: np.ndarray, box: IntBox) -> int:
    tight = tight_box(ink, box)
    if tight is None:
        return 0
    x1, y1, x2, y2 = tight
    crop = ink[y1:y2, x1:x2]
    widths = [
        end - start for profile in (crop.any(axis=1), crop.any(axis=0)) for start, end in _gaps(profile)
    ]
    return max(widths, default=0)


def separate_parts(ink: np.ndarray, box: IntBox) -> tuple[list[IntBox], bool]:
    """A figure without labels cut only where blank space sets panels apart: a gutter wider by
    ``SEPARATE_RATIO`` than any gap inside the content on either side of it (a row of charts
    with room between them, not the rows of one diagram). Returns the parts (tight to their
    ink) and whether a gutter came close to that without reaching it (an ambiguous figure)."""
    tight = tight_box(ink, box)
    if tight is None:
        return [], False
    best, close = _separating_gutter(ink, tight)
    if best is None:
        return [tight], close
    parts: list[IntBox] = []
    for side in best:
        sub, sub_close = separate_parts(ink, side)
        parts.extend(sub)
        close = close or sub_close
    return parts, close


def _separating_gutter(ink: np.ndarray, tight: IntBox) -> tuple[tuple[IntBox, IntBox] | None, bool]:
    """The widest gutter across ``tight`` that sets two parts apart (``separate_parts``), as the
    two sides, and whether one came close."""
    min_gap = max(2, round(MIN_SEPARATE_GAP * max(ink.shape)))
    x1, y1, x2, y2 = tight
    crop = ink[y1:y2, x1:x2]
    total = int(crop.sum())
    best: tuple[int, tuple[IntBox, IntBox]] | None = None
    close = False
    for axis in (0, 1):
        for start, end in _gaps(crop.any(axis=1 - axis)):
            if axis == 0:
                sides = ((x1, y1, x2, y1 + start), (x1, y1 + end, x2, y2))
            else:
                sides = ((x1, y1, x1 + start, y2), (x1 + end, y1, x2, y2))
            if (
                end - start < min_gap
                or min(int(ink[s[1] : s[3], s[0] : s[2]].sum()) for s in sides) < MIN_SIDE_INK * total
            ):
                continue
            inner = max(_widest_gap(ink, s) for s in sides)
            if end - start < SEPARATE_RATIO * inner:
                close = close or end - start >= inner
            elif best is None or end - start > best[0]:
                best = (end - start, sides)
    return (best[1] if best else None), close


def repeated(candidates: list[PanelCandidate]) -> bool:
    """Whether the pieces are panels repeated across the figure (a row or grid of pictures or
    charts): several, alike in area. A diagram comes apart into pieces of any size."""
    return alike_in_area([geometry.area(c.box) for c in candidates], REPEAT_AREA_RATIO)


def _working_box(box: Box, factor: int) -> IntBox:
    """A box in figure pixels at working scale, grown to whole blocks."""
    return (
        int(box[0]) // factor,
        int(box[1]) // factor,
        math.ceil(box[2] / factor),
        math.ceil(box[3] / factor),
    )


def _picture(ink: np.ndarray, factor: int, box: Box) -> bool:
    """Whether a piece (figure pixels) is mostly pictures (``image_extents``)."""
    tight = tight_box(ink, _working_box(box, factor))
    return tight is not None and image_extents(ink, tight) is not None


def whole_unlabelled(
    image: np.ndarray, candidates: list[PanelCandidate]
) -> tuple[list[PanelCandidate], list[str]]:
    """Panels of a figure that prints no labels: the visually separate parts
    (``separate_parts``), so a single diagram stays whole. Pieces alike in size (``repeated``)
    are a row or grid of panels, and a picture among them stands apart from whatever is beside
    it: then the pieces stay as the segmenter found them. Pieces that strokes join (one
    drawing's steps and its arrows, ``stroke_groups``) are one piece first."""
    masks = FigureInk(image)
    ink, factor = masks.working()
    # steps of one drawing joined by arrows are one panel, however alike or pictorial they are
    pieces = len(candidates)
    candidates = _joined(ink, factor, candidates)
    notes = (
        []
        if len(candidates) == pieces
        else [f"no panel labels: strokes join {pieces} pieces into {len(candidates)}"]
    )
    if repeated(candidates):
        return candidates, notes
    if len(candidates) > 1 and any(_picture(ink, factor, c.box) for c in candidates):
        return candidates, notes
    faint, _ = masks.working(FAINT_THRESHOLD)
    full = masks.faint(FAINT_THRESHOLD)
    parts, close = separate_parts(ink, (0, 0, ink.shape[1], ink.shape[0]))
    if not parts:
        return candidates, notes
    confidence = UNLABELLED_CONFIDENCE * (AMBIGUOUS_FACTOR if close else 1.0)
    out = []
    for part in parts:
        box = _refine(faint, full, factor, part)
        if box is not None:
            out.append(PanelCandidate(box=box, confidence=confidence))
    if len(out) != len(candidates):
        notes.append(
            f"no panel labels: {len(out)} visually separate part(s) kept, not {len(candidates)} pieces"
        )
    if close:
        notes.append("ambiguous layout: a gutter nearly as wide as the gaps inside the panels")
    return out or candidates, notes


def _joined(ink: np.ndarray, factor: int, candidates: list[PanelCandidate]) -> list[PanelCandidate]:
    """The pieces with those strokes join merged (``stroke_groups``)."""
    groups = stroke_groups(ink, factor, [c.box for c in candidates])
    if len(groups) == len(candidates):
        return candidates
    return [
        PanelCandidate(
            box=functools.reduce(union_box, (candidates[k].box for k in group)),
            confidence=min(candidates[k].confidence for k in group),
        )
        for group in groups
    ]


def _refine(
    faint: np.ndarray, full: np.ndarray, factor: int, part: IntBox
) -> tuple[float, float, float, float] | None:
    """A working-scale box in figure pixels, tightened to the figure's own faint ink."""
    box = tight_box(faint, part)
    if box is None:
        return None
    wx1, wy1, wx2, wy2 = (v * factor for v in box)
    tight = tight_box(full, (wx1, wy1, min(wx2, full.shape[1]), min(wy2, full.shape[0])))
    if tight is None:
        return None
    return (float(tight[0]), float(tight[1]), float(tight[2]), float(tight[3]))


def own_panels(
    image: np.ndarray,
    candidates: list[PanelCandidate],
    labels: list[str | None],
    detections: list[LabelDetection],
    *,
    named: list[str],
) -> tuple[list[PanelCandidate], list[str | None], list[str]]:
    """Candidates regrouped so that each read label owns one panel: the union of the pieces in
    its part of the figure. Returns the panels, their labels and notes."""
    series = series_labels(detections, named)
    if not candidates:
        return candidates, labels, []
    if not series and len(named) < 2:
        whole, whole_notes = whole_unlabelled(image, candidates)
        return whole, [None] * len(whole), whole_notes
    if not series or (len(series) < 2 and len(named) < 2):
        return candidates, labels, []
    masks = FigureInk(image)
    ink, factor = masks.working()
    upto = None if named else past_gap(detections, series) or next_letter(series)
    found = unread_labels(image, ink, factor, series, named, upto)
    # with the letters between found, a letter read past the gap joins the series
    series = series_labels(detections + found, named) if upto else series + found
    if len(series) < 2:
        return candidates, labels, []
    anchors = [
        Anchor(
            text=d.text,
            box=(
                int(d.box[0] // factor),
                int(d.box[1] // factor),
                math.ceil(d.box[2] / factor),
                math.ceil(d.box[3] / factor),
            ),
        )
        for d in series
    ]
    parts = label_parts(ink, anchors)
    if len(parts) < 2 and len(parts[0][1]) < 2:
        return candidates, labels, []
    out, out_labels, notes = _panels_of_parts(image, masks, ink, factor, parts, candidates, labels)
    if not out:
        return candidates, labels, []
    expected = max(len(named), len(expected_letters(series, named)), len(series))
    read = {d.text.lower() for d in series}
    unread = [c for c in expected_letters(series, named) if c.lower() not in read]
    if (len(out) < expected or unread) and len(out) < len(candidates):
        # labels the caption or the series names went unread: their panels would be swallowed
        missing = ", ".join(unread) if unread else f"{expected - len(out)} panels"
        return candidates, labels, [f"labels unread ({missing}): panels left as segmented"]
    return out, out_labels, notes


def _panels_of_parts(
    image: np.ndarray,
    masks: FigureInk,
    ink: np.ndarray,
    factor: int,
    parts: list[tuple[IntBox, list[Anchor]]],
    candidates: list[PanelCandidate],
    labels: list[str | None],
) -> tuple[list[PanelCandidate], list[str | None], list[str]]:
    """One panel per part with one label. A part several labels share keeps the segmenter's
    pieces inside it where they give each label one piece; otherwise its content is shared out
    piece by piece (``_shared_part``), or, when that fails, the pieces stay as they are."""
    faint, _ = masks.working(FAINT_THRESHOLD)
    full = masks.faint(FAINT_THRESHOLD)
    for a in (a for _, owners in parts for a in owners):
        # a label glyph is no panel's content, whichever part it stands in (one hanging
        # before a gutter stands in its neighbour's)
        pad = max(1, (a.box[3] - a.box[1]) // 4)
        gx1, gy1, gx2, gy2 = max(0, a.box[0] - pad), max(0, a.box[1] - pad), a.box[2] + pad, a.box[3] + pad
        faint[gy1:gy2, gx1:gx2] = False
        full[gy1 * factor : gy2 * factor, gx1 * factor : gx2 * factor] = False
    text_height = float(np.median([a.box[3] - a.box[1] for _, owners in parts for a in owners]))
    out: list[PanelCandidate] = []
    out_labels: list[str | None] = []
    notes: list[str] = []
    for part, owners in parts:
        if len(owners) == 1:
            owned = _owned_box(image, faint, full, factor, part, owners[0], text_height)
            if owned is not None:
                out.append(PanelCandidate(box=owned[0], confidence=OWNED_CONFIDENCE, outer_box=owned[1]))
                out_labels.append(owners[0].text)
            continue
        pieces = _pieces_in(part, factor, candidates, labels)
        one_each = sorted(str(label) for _, label in pieces) == sorted(a.text for a in owners)
        shared = None if one_each else _shared_part(image, faint, full, factor, part, owners, text_height)
        if shared is not None:
            notes.append(
                "labels " + ", ".join(a.text for a in owners) + " share a part with no gutter between "
                "them: each piece of content went to the label heading it"
            )
            out.extend(shared)
            out_labels.extend(a.text for a in owners)
            continue
        notes.append(
            "labels " + ", ".join(a.text for a in owners) + " share a part with no gutter between them"
        )
        for piece, label in pieces:
            out.append(piece)
            out_labels.append(label)
    return out, out_labels, notes


def _pieces_in(
    part: IntBox, factor: int, candidates: list[PanelCandidate], labels: list[str | None]
) -> list[tuple[PanelCandidate, str | None]]:
    """The segmenter's pieces mostly inside ``part``, clipped to it, with their labels."""
    pieces = []
    for cand, label in zip(candidates, labels, strict=True):
        clipped = _clip(cand.box, part, factor)
        cand_area = max(1e-9, (cand.box[2] - cand.box[0]) * (cand.box[3] - cand.box[1]))
        if clipped is not None and (clipped[2] - clipped[0]) * (clipped[3] - clipped[1]) >= 0.5 * cand_area:
            pieces.append((PanelCandidate(box=clipped, confidence=cand.confidence), label))
    return pieces


def _shared_part(
    image: np.ndarray,
    faint: np.ndarray,
    full: np.ndarray,
    factor: int,
    part: IntBox,
    owners: list[Anchor],
    text_height: float,
) -> list[PanelCandidate] | None:
    """Panels of labels that share a part no straight gutter divides (staggered diagrams, a
    network's edges reaching past its neighbour's corner): each connected piece of content goes
    to the label heading it, by the votes of its pixels for the nearest label above and left of
    them. None when a label gets no content of its own. ``faint`` has the label glyphs blanked
    (``_panels_of_parts``)."""
    x1, y1, x2, y2 = part
    local = faint[y1:y2, x1:x2]
    k = max(3, round(SHARED_JOIN * text_height))
    joined = cv2.morphologyEx(local.astype(np.uint8), cv2.MORPH_CLOSE, np.ones((k, k), np.uint8))
    count, comp, stats, _ = cv2.connectedComponentsWithStats(joined, connectivity=8)
    if count < 2:
        return None
    tol = HEAD_TOLERANCE * text_height
    heads = [(a.box[0] - x1, a.box[1] - y1) for a in owners]
    # each pixel votes for the nearest label heading it (above and left); a piece goes whole
    # to the label most of its pixels vote for
    nearest, headed = _nearest_heads(heads, tol, local.shape)
    inked = joined > 0
    pairs = np.asarray(comp[inked], dtype=np.int64) * len(owners) + nearest[inked]
    votes = np.bincount(pairs, minlength=count * len(owners)).reshape(count, len(owners))
    owner_of = votes.argmax(axis=1)
    total = int(local.sum())
    areas = stats[:, cv2.CC_STAT_AREA].astype(np.int64)
    bodies = [i for i in range(1, count) if areas[i] >= SHARED_BODY * total]
    headed_share = np.bincount(comp[inked], weights=headed[inked], minlength=count) / np.maximum(areas, 1)
    if any(headed_share[i] < 0.5 for i in bodies):
        return None  # a body no label here heads: the part was cut through another label's panel
    # small pieces (a node's name, a tick label) go with the body nearest them, not the vote:
    # text at a diagram's edge stands nearer the next label's corner than its own label's
    if {int(owner_of[i]) for i in bodies} == set(range(len(owners))):
        for i in range(1, count):
            if areas[i] < SHARED_BODY * total:
                owner_of[i] = owner_of[min(bodies, key=lambda b: _box_gap(stats[i], stats[b]))]
    panels: list[PanelCandidate] = []
    for j, owner in enumerate(owners):
        mine = (owner_of[comp] == j) & local
        if mine.sum() < MIN_SIDE_INK * total:
            return None
        masked = faint.copy()
        masked[y1:y2, x1:x2] = mine
        owned = _owned_box(image, masked, full, factor, part, owner, text_height)
        if owned is None:
            return None
        panels.append(PanelCandidate(box=owned[0], confidence=SHARED_CONFIDENCE, outer_box=owned[1]))
    return panels


def _nearest_heads(
    heads: list[tuple[int, int]], tol: float, shape: tuple[int, ...]
) -> tuple[np.ndarray, np.ndarray]:
    """For each pixel of an array of ``shape`` (h, w): the index of the nearest label head above
    and left of it (the nearest head of any where none is), and whether one was."""
    h, w = shape[:2]
    xs = np.arange(w, dtype=np.float32)[None, :]
    ys = np.arange(h, dtype=np.float32)[:, None]
    best = np.full((h, w), np.inf, dtype=np.float32)
    anywhere = np.full((h, w), np.inf, dtype=np.float32)
    index = np.zeros((h, w), dtype=np.int64)
    fallback = np.zeros((h, w), dtype=np.int64)
    for j, (hx, hy) in enumerate(heads):
        dist = np.hypot(xs - hx, ys - hy)
        ok = (xs + tol >= hx) & (ys + tol >= hy)
        closer = ok & (dist < best)
        best[closer], index[closer] = dist[closer], j
        near = dist < anywhere
        anywhere[near], fallback[near] = dist[near], j
    headed = np.isfinite(best)
    return np.where(headed, index, fallback), headed


def _box_gap(a: np.ndarray, b: np.ndarray) -> int:
    """Blank distance between two component boxes (x, y, w, h), along the larger axis gap."""
    dx = max(int(a[0]) - int(b[0] + b[2]), int(b[0]) - int(a[0] + a[2]), 0)
    dy = max(int(a[1]) - int(b[1] + b[3]), int(b[1]) - int(a[1] + a[3]), 0)
    return max(dx, dy)
