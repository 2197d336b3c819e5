"""Compound-figure panel segmentation on the CPU (no model, no download).

``segment_panels`` turns a figure into tight panel boxes:

1. ink mask (darkest channel below near-white; figures on a flat dark canvas the other way
   round, unless a light gutter runs right across them), a frame drawn around the whole figure
   and JPEG specks removed, and a text unit ``u`` (median glyph height) that scales every
   threshold below;
2. panel-label glyphs are guessed from connected components alone (small groups of at most four
   glyphs with nothing to their left or above, circled labels included) and taken out of the
   content, so boxes never swallow them;
3. the remaining ink forms parts (blobs bridging 1-2 px gaps, overlapping boxes merged); images,
   and big blobs of touching panels, are split along straight full-length boundaries: first a
   line of background colour on either axis (in any big blob: a line with no ink at all between
   panel-sized sides, or a near-blank line between two image edges, as left by 1-2 px gutters
   with JPEG specks), then, of the two axes, the colour step present along more of its line that
   stands out from the texture beside it and is not one of many parallel ones (stripes,
   fringes), then a change of texture; a piece cut off beside an image leaves behind the 1-2
   px of that image's blurred edge it kept;
4. labels printed against an image's edge (fused to it across a 0-2 px gutter) are trimmed off
   it as label guesses (joining the guess beside them on their line: the "g" of "(g)" between
   its parentheses), and a guess reaching into an image ends at its edge; each label marks one
   panel, so an image part headed by a label at its top-left corner and by more of that size along
   its top or down its left side (in the gutter, or printed inside the images where a seam runs)
   is cut into as many images (mirrored for labels at the bottom right of each image); the
   pieces are split again along gutters and seams, which may run the length of one row only;
5. a label guess is kept when it heads a panel-sized part at its lower right (tick labels in a
   right-aligned column and text inside panels are not labels), or, alone on its line, a block of
   text rows below it (a table: all its rows are headed by it); images carrying a label-like glyph
   in the same corner inside (the commonest corner of the figure) head their own panel too, and
   so does an image showing a glyph of their height just where the others' labels sit in theirs
   (a label the corner search missed beside bright dots, or fused to its circle);
6. parts are clustered bottom-up by gap: text (tick labels, axis titles, legends) joins the
   nearest panel; parts headed by different labels never merge; in a labelled figure images join
   only when (nearly) touching (sub-images under one label, read or not), and never one that
   lies before a labelled image (on its label's sides: left of or above it with labels at the
   top left, left of or below it at the bottom left, and so on); unlabelled drawing pieces join
   a labelled drawing nearby; without labels only a much smaller part (legend, colour bar)
   beside a neighbour joins it, and so do images in line closer than the figure's gutters (the
   sub-images of one panel); a merge may not swallow a panel it could not have merged with;
7. boxes are tightened to the ink; an unlabelled panel loses a label-sized glyph group standing at
   its top-left corner above the rest (the label of a table or diagram); clusters without
   panel-sized content (stray text, caption strips) are dropped; a figure that is one panel
   yields one box, an empty one none.

Optional ``labels`` (e.g. from OCR) replace step 2's guesses. ``segment_figure`` also returns the
analysis (ink, glyphs, text unit, boundary maps), which the miner hands to the label stages so that
they do not redo it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

import cv2
import numpy as np

from p2p.mining.cpu.imaging import (
    MIN_SIDE,
    Analysis,
    CornerGlyph,
    IntBox,
    as_rgb,
    corner_glyphs,
    downscale_max,
    float_box,
    in_series,
    ink_mask,
    label_candidates,
    line_mates,
    overlaps,
    remove_border_rules,
    standout_group,
    text_unit,
    tight_box,
    without_sliver,
    without_specks,
)
from p2p.mining.cpu.segmentation.count_guided import merge_to_count, split_to_count
from p2p.mining.cpu.segmentation.seam_net import BoundaryMaps, boundary_maps
from p2p.mining.cpu.segmentation.seams import split_boxes
from p2p.mining.params import CountParams, SeamParams, SegmentParams, load_params
from p2p.mining.types import LabelDetection, PanelCandidate


@dataclass
class _Cluster:
    box: list[int]
    major: bool  # holds a panel-sized part
    area: int  # sum of member part box areas (for size comparisons)
    anchor: int = -1  # index of the label that heads this cluster, -1 = none
    dense: bool = False  # its largest part is an image (ink fills its box)
    largest: int = 0  # area of its largest major part
    alive: bool = True


# --------------------------------------------------------------------------------------------
# input handling and ink


def _box_gap(a: IntBox | list[int], b: IntBox | list[int]) -> float:
    dx = max(0, max(a[0], b[0]) - min(a[2], b[2]))
    dy = max(0, max(a[1], b[1]) - min(a[3], b[3]))
    return float(max(dx, dy) + 0.5 * min(dx, dy))


# --------------------------------------------------------------------------------------------
# text unit and label glyphs


@dataclass
class Segmentation:
    """The panels found, with the analysis behind them when it was made at the figure's own size
    (a downscaled one has other coordinates, and the later stages make their own)."""

    panels: list[PanelCandidate]
    analysis: Analysis | None = None


# --------------------------------------------------------------------------------------------
# parts


def _merge_overlapping(boxes: np.ndarray) -> np.ndarray:
    """Union boxes that overlap, until no two overlap. ``boxes`` is (n, 4) int, exclusive."""
    boxes = boxes.copy()
    alive = np.ones(len(boxes), dtype=bool)
    changed = True
    while changed:
        changed = False
        for i in range(len(boxes)):
            if not alive[i]:
                continue
            while True:
                b = boxes[i]
                hit = (
                    alive
                    & (boxes[:, 0] < b[2])
                    & (boxes[:, 2] > b[0])
                    & (boxes[:, 1] < b[3])
                    & (boxes[:, 3] > b[1])
                )
                hit[i] = False
                if not hit.any():
                    break
                group = boxes[hit]
                boxes[i] = (
                    min(b[0], group[:, 0].min()),
                    min(b[1], group[:, 1].min()),
                    max(b[2], group[:, 2].max()),
                    max(b[3], group[:, 3].max()),
                )
                alive[hit] = False
                changed = True
    return boxes[alive]


class _EdgeMaps:
    """Colour steps across two pixels (dx: horizontal, dy: vertical) and running sums of them and
    of the ink mask, so that any box's column/row profiles cost O(box side)."""

    def __init__(self, rgb: np.ndarray, mask: np.ndarray) -> None:
        self.rgb = rgb
        self.mask = mask
        self._cache: dict[str, np.ndarray] = {}

    @staticmethod
    def _steps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        d = cv2.absdiff(a, b)
        return np.maximum(np.maximum(d[:, :, 0], d[:, :, 1]), d[:, :, 2])

    def steps(self, axis: int) -> np.ndarray:
        key = f"d{axis}"
        if key not in self._cache:
            out = np.zeros(self.rgb.shape[:2], dtype=np.uint8)
            if axis == 0:
                out[:, 1:-1] = self._steps(self.rgb[:, 2:], self.rgb[:, :-2])
            else:
                out[1:-1, :] = self._steps(self.rgb[2:], self.rgb[:-2])
            self._cache[key] = out
        return self._cache[key]

    def _integral(self, key: str) -> np.ndarray:
        if key not in self._cache:
            if key.startswith("step"):
                values = self.steps(int(key[-1]))
            elif key.startswith("steady"):
                values = (self.steps(int(key[-1])) >= 24).astype(np.uint8)
            else:
                values = self.mask.astype(np.uint8)
            self._cache[key] = cv2.integral(values)
        return self._cache[key]

    def integral_of(self, kind: str) -> np.ndarray:
        """Running sums of one colour channel ("red", "green", "blue") or of the colour step
        across either axis ("energy", texture strength), float64, shape (h + 1, w + 1)."""
        key = f"int_{kind}"
        if key not in self._cache:
            if kind in ("red", "green", "blue"):
                values = np.ascontiguousarray(self.rgb[:, :, ("red", "green", "blue").index(kind)])
            else:
                values = np.maximum(self.steps(0), self.steps(1))
            self._cache[key] = cv2.integral(values, sdepth=cv2.CV_64F)
        return self._cache[key]

    def profile(self, kind: str, box: IntBox, axis: int) -> np.ndarray:
        """Mean over the box of ``kind`` ("step", "steady", "ink") per column (axis 0) or row."""
        x1, y1, x2, y2 = box
        run = self._integral(kind if kind == "ink" else f"{kind}{axis}")
        if axis == 0:
            cols = (run[y2, x1 : x2 + 1] - run[y1, x1 : x2 + 1]).astype(np.float64)
            return np.diff(cols) / float(max(1, y2 - y1))
        rows = (run[y1 : y2 + 1, x2] - run[y1 : y2 + 1, x1]).astype(np.float64)
        return np.diff(rows) / float(max(1, x2 - x1))


def _gutter_split(edges: _EdgeMaps, box: IntBox, u: float, axis: int) -> int | None:
    """Offset of a line of background colour through the whole part (0: vertical line, 1:
    horizontal): the surest boundary, so it is looked for on both axes before any seam."""
    x1, y1, x2, y2 = box
    length = (x2 - x1) if axis == 0 else (y2 - y1)
    margin = max(3, round(3 * u))
    if length < 2 * margin + 3:
        return None
    ink = edges.profile("ink", box, axis)
    white = 1.0 - ink
    dense_part = float(ink.mean()) >= 0.85
    if dense_part:  # inside an image, a line of background colour separates two
        inner_white = white[margin : length - margin]
        separators = np.flatnonzero(inner_white >= 0.9)
        if separators.size:
            # the whitest line: in a gutter holding labels, the cut passes beside the labels,
            # not through them
            best = separators[inner_white[separators] >= float(inner_white[separators].max()) - 1e-9]
            return int(best[best.size // 2]) + margin
    else:
        # a blob bridged only across a narrow gutter (1-2 px, or JPEG specks in it): a line with
        # no ink at all through the whole part cannot cross a panel (its axes or image would)
        # either, the thin line of background between two image edges (a few JPEG specks in it)
        # (not a gap between an axis title or tick labels and their plot: both sides panel-sized)
        across = (y2 - y1) if axis == 0 else (x2 - x1)
        wide = max(margin, round(6 * u))
        blank = np.flatnonzero(ink[wide : length - wide] * across < 0.5)
        if blank.size:
            return int(blank[blank.size // 2]) + wide
        inner_ink = ink[margin : length - margin]
        for offset in np.flatnonzero(inner_ink <= 0.01):
            c = int(offset) + margin
            lo, hi = c - 1, c + 1
            while lo > 0 and ink[lo] <= 0.01:
                lo -= 1
            while hi < length - 1 and ink[hi] <= 0.01:
                hi += 1
            if hi - lo <= 4 and ink[lo] >= 0.9 and ink[hi] >= 0.9:
                return c
    return None


def _seam_split(
    mask: np.ndarray, edges: _EdgeMaps, box: IntBox, u: float, axis: int, p: SegmentParams, *, texture: bool
) -> tuple[int, float] | None:
    """Offset of a colour step present in most rows that stands far above the steps next to it,
    or (``texture``) of a change of texture (two images touching, 0-px gutter), with the share
    of the line that shows it."""
    x1, y1, x2, y2 = box
    length = (x2 - x1) if axis == 0 else (y2 - y1)
    margin = max(3, round(3 * u))
    if length < 2 * margin + 3:
        return None
    dense_part = float(edges.profile("ink", box, axis).mean()) >= 0.85
    if texture:
        # A seam only texture shows is looked for in big blocks of images only: touching panels
        # that merged into one (0-px gutters). Within one panel-sized image, a straight change
        # of texture is as often content (a heat map's column, a group's sub-images) as a seam.
        big = (x2 - x1) * (y2 - y1) >= p.texture_min_area * mask.size
        return _texture_split(edges, box, u, axis, p) if dense_part and big else None
    strength = edges.profile("step", box, axis)
    inner = strength[margin : length - margin]
    if inner.size == 0 or float(inner.max()) < 20.0:
        return None
    steady = edges.profile("steady", box, axis)
    d = edges.steps(axis)[y1:y2, x1:x2]
    lines = d.T if axis == 0 else d  # one row per candidate line position
    for offset in np.argsort(-inner)[:6]:
        c = int(offset) + margin
        if strength[c] < 20.0:
            break
        # the step must stand out from the steps parallel to it, line position by position
        step = lines[c - 1 : c + 2].max(axis=0).astype(np.float32)
        context = np.concatenate([lines[max(0, c - 10) : c - 3], lines[c + 4 : c + 11]]).astype(np.float32)
        local = np.median(context, axis=0) if context.size else np.zeros_like(step)
        contrast = float((step >= np.maximum(24.0, 2.0 * local + 8.0)).mean())
        if contrast < 0.6:
            continue
        # a repeated straight feature (stripes, lattice fringes, grids) is texture, not a boundary
        strong = np.flatnonzero((inner >= 0.5 * strength[c]) & (steady[margin : length - margin] >= 0.4))
        peaks = 1 + int(np.count_nonzero(np.diff(strong) > 3)) if strong.size else 0
        if peaks > 5:
            continue
        if not dense_part:
            # a blob of touching panels: along the line, an image lies on one side at least
            # (inside a plot, lines such as curves or grid lines have no image beside them)
            band = max(3, round(u))
            m = mask[y1:y2, x1:x2]
            mlines = m.T if axis == 0 else m
            before = mlines[max(0, c - band) : c].mean(axis=0)
            after = mlines[c + 1 : c + 1 + band].mean(axis=0)
            if float((np.maximum(before, after) >= 0.9).mean()) < 0.8:
                continue
        return c, contrast
    return None


def _texture_split(
    edges: _EdgeMaps, box: IntBox, u: float, axis: int, p: SegmentParams
) -> tuple[int, float] | None:
    """A straight line across which the picture changes along (nearly) its whole length: two
    images touching without a gutter whose seam is no stronger than their texture (a calm CT next
    to stripes or a field of dots, where the seam's step drowns among the texture's steps).

    Block by block along the line, the bands on either side are compared by mean colour and
    texture energy (mean colour step); one texture continuing across the line leaves most blocks
    alike, so stripes, fringes and gradients do not split.
    """
    x1, y1, x2, y2 = box
    band = p.texture_band
    length = (x2 - x1) if axis == 0 else (y2 - y1)
    across = (y2 - y1) if axis == 0 else (x2 - x1)
    margin = max(3, round(3 * u), band + 3)
    blocks = across // p.texture_block
    if length < 2 * margin + 1 or blocks < 4:
        return None
    channels = [edges.integral_of(c) for c in ("red", "green", "blue")]
    energy = edges.integral_of("energy")
    # line positions c (boundary between pixel c-1 and c, box-relative) and block edges
    cs = np.arange(margin, length - margin)
    edges_across = np.linspace(0, across, blocks + 1).round().astype(int)

    def band_means(run: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """Mean of the band [lo, hi) (line positions) per block: shape (len(cs), blocks)."""
        a, b = edges_across[:-1], edges_across[1:]
        if axis == 1:  # horizontal line: bands are rows, blocks run along x
            r1, r2 = (y1 + lo)[:, None], (y1 + hi)[:, None]
            c1, c2 = (x1 + a)[None, :], (x1 + b)[None, :]
        else:  # vertical line: bands are columns, blocks run along y
            c1, c2 = (x1 + lo)[:, None], (x1 + hi)[:, None]
            r1, r2 = (y1 + a)[None, :], (y1 + b)[None, :]
        total = run[r2, c2] - run[r1, c2] - run[r2, c1] + run[r1, c1]
        return total / np.maximum(1, (r2 - r1) * (c2 - c1))

    def differ(gap: int, width: int) -> tuple[np.ndarray, np.ndarray]:
        before = (cs - gap - width, cs - gap)
        after = (cs + gap, cs + gap + width)
        # colour, channel by channel: two dark fluorescence images differ in hue, not in grey
        level = np.max([np.abs(band_means(c, *before) - band_means(c, *after)) for c in channels], axis=0)
        e1, e2 = band_means(energy, *before), band_means(energy, *after)
        texture = (np.maximum(e1, e2) + 4.0) / (np.minimum(e1, e2) + 4.0)
        return (level > 12.0) | (texture > 2.0), level + 8.0 * np.log(texture)

    wide, _ = differ(1, band)
    agreement = wide.mean(axis=1)
    if float(agreement.max()) < p.texture_agreement:
        return None
    # The difference must be the line's: a little way off it, both bands lie on one side of
    # the seam and agree again. Inside one busy image, bands differ wherever they are put.
    away = 2 * band + 2
    off = np.full_like(agreement, 1.0)
    off[away:-away] = np.maximum(agreement[: -2 * away], agreement[2 * away :])
    seam = (agreement >= p.texture_agreement) & (off <= 0.35)
    if not seam.any():
        return None
    # the seam itself: where narrow bands right beside the line differ most
    _, sharp = differ(1, 2)
    score = np.where(seam, sharp.mean(axis=1), -np.inf)
    best = int(np.argmax(score))
    return int(cs[best]), float(agreement[best])


def _split_dense(
    mask: np.ndarray, edges: _EdgeMaps, box: IntBox, u: float, p: SegmentParams, depth: int = 0
) -> list[IntBox]:
    """Guillotine-split a part along straight boundaries: dense parts (images), and big parts of
    any kind (touching panels join plots and images into one blob)."""
    x1, y1, x2, y2 = box
    if depth > p.split_depth or min(x2 - x1, y2 - y1) < p.split_min_units * u:
        return [box]
    fill = float(mask[y1:y2, x1:x2].mean())
    if fill < p.split_fill and (x2 - x1) * (y2 - y1) < p.split_min_area * mask.size:
        return [box]
    # gutters on either axis first: a seam found first could cut across an image the gutter
    # would have left whole (a seam between two touching images below a wider one); of two
    # seams, the one along more of its line (the other may run along one row of images only)
    found: tuple[int, int] | None = None
    for axis in (0, 1):
        offset = _gutter_split(edges, box, u, axis)
        if offset is not None:
            found = (axis, offset)
            break
    for texture in (False, True):
        if found is not None:
            break
        seams = [
            (seam, axis)
            for axis in (0, 1)
            if (seam := _seam_split(mask, edges, box, u, axis, p, texture=texture))
        ]
        if seams:
            (offset, _), axis = max(seams, key=lambda item: item[0][1])
            found = (axis, offset)
    if found is not None:
        axis, offset = found
        if axis == 0:
            left, right = (x1, y1, x1 + offset, y2), (x1 + offset, y1, x2, y2)
        else:
            left, right = (x1, y1, x2, y1 + offset), (x1, y1 + offset, x2, y2)
        out: list[IntBox] = []
        for piece in (without_sliver(mask, left, axis, True), without_sliver(mask, right, axis, False)):
            tight = tight_box(mask, piece)
            if tight is not None:
                out.extend(_split_dense(mask, edges, tight, u, p, depth + 1))
        return out
    return [box]


# --------------------------------------------------------------------------------------------
# clustering


def _before(box: list[int], labelled: list[int], corner: str) -> bool:
    """``box`` lies wholly on the label's side of the labelled box: left of or above it for
    labels at the top left, right of or below it for labels at the bottom right, left of or
    below it at the bottom left, right of or above it at the top right."""
    if corner == "tl":
        return box[2] <= labelled[0] + 2 or box[3] <= labelled[1] + 2
    if corner == "br":
        return box[0] >= labelled[2] - 2 or box[1] >= labelled[3] - 2
    if corner == "bl":
        return box[2] <= labelled[0] + 2 or box[1] >= labelled[3] - 2
    if corner == "tr":
        return box[0] >= labelled[2] - 2 or box[3] <= labelled[1] + 2
    return False


def _facing(a: list[int], b: list[int]) -> bool:
    """The smaller box sits beside the other (a colour bar by its heat map, a legend by its
    plot) rather than off its corner: across the gap between them, the two overlap along at
    least half of the smaller box's side."""
    small, large = sorted((a, b), key=lambda box: (box[2] - box[0]) * (box[3] - box[1]))
    if small[2] <= large[0] or large[2] <= small[0]:  # side by side
        return min(small[3], large[3]) - max(small[1], large[1]) >= 0.5 * (small[3] - small[1])
    if small[3] <= large[1] or large[3] <= small[1]:  # one above the other
        return min(small[2], large[2]) - max(small[0], large[0]) >= 0.5 * (small[2] - small[0])
    return True


def _side_gap(a: list[int] | IntBox, b: list[int] | IntBox, tol: float) -> float | None:
    """The gap between two boxes side by side (or one above the other) whose facing sides span
    the same stretch (within ``tol``): two images of one row of a strip. None otherwise."""
    if abs(a[1] - b[1]) <= tol and abs(a[3] - b[3]) <= tol:
        gap = max(a[0], b[0]) - min(a[2], b[2])
    elif abs(a[0] - b[0]) <= tol and abs(a[2] - b[2]) <= tol:
        gap = max(a[1], b[1]) - min(a[3], b[3])
    else:
        return None
    return float(gap) if gap >= 0 else None


def _sub_image_gap(boxes: list[list[int]], u: float) -> float:
    """In a figure without labels, the gap below which two aligned images are one panel's
    sub-images: clearly narrower than the figure's gutters between panels (a group printed
    with its own narrow gaps). -1 when the figure shows no such two kinds of gap."""
    tol = max(2.0, 0.25 * u)
    gaps = []
    for a, b in itertools.combinations(boxes, 2):
        g = _side_gap(a, b, tol)
        if g is None or g > 8.0 * u:
            continue
        # neighbours: nothing else lies in the gap between them
        if a[2] <= b[0] or b[2] <= a[0]:  # side by side
            between = (min(a[2], b[2]), max(a[1], b[1]), max(a[0], b[0]), min(a[3], b[3]))
        else:
            between = (max(a[0], b[0]), min(a[3], b[3]), min(a[2], b[2]), max(a[1], b[1]))
        if g > 0 and any(c is not a and c is not b and overlaps(c, between) for c in boxes):
            continue
        gaps.append(g)
    if len(gaps) < 2:
        return -1.0
    narrow = min(gaps)
    wide = [g for g in gaps if g >= narrow + 3.0]
    if not wide:
        return -1.0
    # the panels' gutter: the narrowest of the wider gaps (gaps between image edges only grow
    # where an image fades into the background)
    typical = min(wide)
    return min(0.6 * typical, typical - 3.0)


def _cluster(
    parts: list[IntBox],
    major: list[bool],
    dense: list[bool],
    anchors: list[int],
    u: float,
    fig_area: float,
    label_corner: str = "tl",
) -> list[_Cluster]:
    clusters = []
    for b, m, d, a in zip(parts, major, dense, anchors, strict=True):
        area = (b[2] - b[0]) * (b[3] - b[1])
        clusters.append(
            _Cluster(box=list(b), major=m, area=area, anchor=a, dense=d and m, largest=area if m else 0)
        )
    n = len(clusters)
    if n <= 1:
        return clusters
    has_labels = sum(1 for a in anchors if a >= 0) >= 2
    text_gap = 3.0 * u
    title_gap = 5.0 * u  # a sideways y-axis title to its plot
    sub_gap = 4.0 * u  # unlabelled drawing pieces join a labelled neighbour
    touch_gap = max(2.0, 0.4 * u)  # unlabelled images join a labelled one only when nearly touching
    small_gap = 2.0 * u  # a much smaller part (legend, colour bar) joins a neighbour

    boxes = np.array([c.box for c in clusters], dtype=np.float64)
    sub_limit = -1.0 if has_labels else _sub_image_gap([c.box for c in clusters if c.dense], u)

    def gaps_to(i: int) -> np.ndarray:
        b = boxes[i]
        dx = np.maximum(0.0, np.maximum(boxes[:, 0], b[0]) - np.minimum(boxes[:, 2], b[2]))
        dy = np.maximum(0.0, np.maximum(boxes[:, 1], b[1]) - np.minimum(boxes[:, 3], b[3]))
        return np.maximum(dx, dy) + 0.5 * np.minimum(dx, dy)

    def upright_title(c: _Cluster) -> bool:
        """Text set sideways (a y-axis title): a narrow column of glyphs."""
        w, h = c.box[2] - c.box[0], c.box[3] - c.box[1]
        return not c.major and h >= 3.0 * w and w <= 2.5 * u

    def threshold(i: int, j: int) -> float:
        a, b = clusters[i], clusters[j]
        if a.anchor >= 0 and b.anchor >= 0 and a.anchor != b.anchor:
            return -1.0
        for title, other in ((a, b), (b, a)):
            if upright_title(title) and other.major:
                # a y-axis title belongs to the plot on its right, a little further off than tick
                # labels (rotated text stands clear of them), never to a picture beside it
                right = other.box[0] >= title.box[2] - 1
                return title_gap if right and not other.dense else -1.0
        if not a.major or not b.major:
            return text_gap
        if has_labels and a.dense and b.dense and (a.anchor >= 0) != (b.anchor >= 0):
            # a panel's label marks its first corner: an image before a labelled one (left of
            # or above it, with labels at the top left) is not in its panel
            labelled, other = (a, b) if a.anchor >= 0 else (b, a)
            if _before(other.box, labelled.box, label_corner):
                return -1.0
        small, large = sorted((a.largest, b.largest))
        if small < 0.3 * large and small < 0.05 * fig_area and _facing(a.box, b.box):
            return small_gap
        if a.dense and b.dense and sub_limit >= 0:
            # sub-images of one unlabelled panel: aligned, and closer than the panels' gutters
            side = _side_gap(a.box, b.box, max(2.0, 0.25 * u))
            if side is not None and side <= sub_limit:
                return sub_limit
        if has_labels:
            if a.dense or b.dense:
                # images (nearly) touching are sub-images of one panel, under its label or under
                # one that went unread; an image and a drawing are one panel only when touching
                return touch_gap
            return sub_gap
        return -1.0

    gap = np.full((n, n), np.inf)
    for i in range(n):
        gap[i] = gaps_to(i)
    gap[np.arange(n), np.arange(n)] = np.inf
    limit = np.full((n, n), -1.0)
    for i, j in np.argwhere(np.triu(gap <= text_gap + sub_gap, k=1)):
        limit[i, j] = limit[j, i] = threshold(int(i), int(j))
    alive = np.ones(n, dtype=bool)
    blocked = np.zeros((n, n), dtype=bool)
    # the closest mergeable pair, kept per row (each merge changes only the merged rows and
    # columns): linear work per merge instead of a scan of the whole matrix (a table's glyphs)
    best = _RowMinima(np.where((gap <= limit) & ~blocked, gap, np.inf))

    def candidates(rows: int | slice, cols: int | slice) -> np.ndarray:
        return np.where(
            (gap[rows, cols] <= limit[rows, cols]) & ~blocked[rows, cols], gap[rows, cols], np.inf
        )

    while True:
        i, j = best.closest()
        if i < 0:
            break
        # the union must not overlap clusters it may not absorb
        group = {i, j}
        anchor = clusters[i].anchor if clusters[i].anchor >= 0 else clusters[j].anchor
        ub = [
            min(boxes[i, 0], boxes[j, 0]),
            min(boxes[i, 1], boxes[j, 1]),
            max(boxes[i, 2], boxes[j, 2]),
            max(boxes[i, 3], boxes[j, 3]),
        ]
        ok = True
        while True:
            inside = (
                alive
                & (boxes[:, 0] < ub[2])
                & (boxes[:, 2] > ub[0])
                & (boxes[:, 1] < ub[3])
                & (boxes[:, 3] > ub[1])
            )
            extra = [int(k) for k in np.flatnonzero(inside) if int(k) not in group]
            if not extra:
                break
            for k in extra:
                ka = clusters[k].anchor
                if ka >= 0 and anchor >= 0 and ka != anchor:
                    ok = False
                    break
                # a panel-sized cluster is swallowed only if it could have merged on its own
                if clusters[k].major and threshold(i, k) < 0 and threshold(j, k) < 0:
                    ok = False
                    break
                if ka >= 0:
                    anchor = ka
                group.add(k)
                ub = [
                    min(ub[0], boxes[k, 0]),
                    min(ub[1], boxes[k, 1]),
                    max(ub[2], boxes[k, 2]),
                    max(ub[3], boxes[k, 3]),
                ]
            if not ok:
                break
        if not ok:
            blocked[i, j] = blocked[j, i] = True
            for r in (i, j):
                best.set_row(r, candidates(r, slice(None)))
            continue
        keep = i
        for k in group:
            if k == keep:
                continue
            clusters[keep].major = clusters[keep].major or clusters[k].major
            clusters[keep].area += clusters[k].area
            if clusters[k].largest > clusters[keep].largest:
                clusters[keep].largest = clusters[k].largest
                clusters[keep].dense = clusters[k].dense
            clusters[k].alive = False
            alive[k] = False
            gap[k, :] = np.inf
            gap[:, k] = np.inf
            limit[k, :] = -1.0
            limit[:, k] = -1.0
        clusters[keep].anchor = anchor
        clusters[keep].box = [int(v) for v in ub]
        boxes[keep] = ub
        kept = clusters[keep]
        bw, bh = ub[2] - ub[0], ub[3] - ub[1]
        if not kept.major and len(group) >= 2 and min(bw, bh) >= 4.0 * u and bw * bh >= 60.0 * u * u:
            # a block of text and rules (a table) is panel-sized content of its own
            kept.major, kept.largest, kept.dense = True, int(bw * bh), False
        row = gaps_to(keep)
        row[~alive] = np.inf
        row[keep] = np.inf
        gap[keep, :] = row
        gap[:, keep] = row
        blocked[keep, :] = False
        blocked[:, keep] = False
        for near in np.flatnonzero(alive & (row <= text_gap + sub_gap)):
            other = int(near)
            if other != keep:
                limit[keep, other] = limit[other, keep] = threshold(keep, other)
        changed = sorted(group)
        best.update(changed, keep, candidates(slice(None), keep), lambda r: candidates(r, slice(None)))
    return [c for c in clusters if c.alive]


class _RowMinima:
    """Each row's smallest value and its first column in a square matrix whose entries change
    only in a few rows and columns at a time; ``closest`` is the matrix's first smallest entry
    in row-major order (as ``np.argmin`` of the whole matrix)."""

    def __init__(self, matrix: np.ndarray) -> None:
        self.arg = np.argmin(matrix, axis=1)
        self.value = matrix[np.arange(matrix.shape[0]), self.arg]

    def closest(self) -> tuple[int, int]:
        i = int(np.argmin(self.value))
        if not np.isfinite(self.value[i]):
            return -1, -1
        return i, int(self.arg[i])

    def set_row(self, r: int, values: np.ndarray) -> None:
        self.arg[r] = int(np.argmin(values))
        self.value[r] = values[self.arg[r]]

    def update(
        self, changed: list[int], keep: int, column: np.ndarray, row_of: Callable[[int], np.ndarray]
    ) -> None:
        """Rows and columns ``changed`` were rewritten: of them only ``keep`` holds values
        still (``column`` is its column); the others are all inf."""
        gone = [k for k in changed if k != keep]
        self.value[gone] = np.inf
        # rows whose smallest entry sat in a changed column are searched again; the others
        # compare their entry in the kept column with their smallest (first column on ties)
        stale = np.isin(self.arg, changed) & np.isfinite(self.value)
        stale[keep] = True
        better = (column < self.value) | ((column == self.value) & (keep < self.arg))
        better &= ~stale
        self.value[better] = column[better]
        self.arg[better] = keep
        for r in np.flatnonzero(stale):
            self.set_row(int(r), row_of(int(r)))


# --------------------------------------------------------------------------------------------
# the segmenter


def segment_panels(
    image: np.ndarray,
    *,
    labels: list[LabelDetection] | None = None,
    seams: bool = True,
    named: int | None = None,
) -> list[PanelCandidate]:
    """Panel boxes (``segment_figure`` without the analysis), with the shipped parameters."""
    return segment_figure(image, labels=labels, seams=seams, named=named).panels


def segment_figure(
    image: np.ndarray,
    *,
    labels: list[LabelDetection] | None = None,
    seams: bool = True,
    named: int | None = None,
    params: SegmentParams | None = None,
    seam_params: SeamParams | None = None,
    count_params: CountParams | None = None,
) -> Segmentation:
    """Panel boxes (figure pixels, x2/y2 exclusive) with a confidence each.

    ``labels`` are optional known panel-label detections (figure coordinates); their glyphs are
    kept out of the boxes and each heads its own panel. Without them, label glyphs are guessed
    from connected components. ``seams``: boxes holding touching panels are cut by the learned
    seam splitter (``p2p.mining.cpu.segmentation.seams``; off only to train it on the rules' boxes).
    ``named``: how many panels the caption names; when more than were found, the likeliest
    seams are cut until that many, when fewer, boxes that are halves of one rectangle are
    joined (``p2p.mining.cpu.segmentation.count_guided``).
    """
    p = params or load_params().segment
    rgb = as_rgb(image)
    height, width = rgb.shape[:2]
    if height == 0 or width == 0:
        return Segmentation([])
    full_mask = ink_mask(rgb)
    if not full_mask.any():
        return Segmentation([])
    if height < MIN_SIDE or width < MIN_SIDE:
        box = tight_box(full_mask, (0, 0, width, height))
        return Segmentation([PanelCandidate(box=float_box(box), confidence=0.3)] if box else [])

    remove_border_rules(full_mask)
    factor = max(1, math.ceil(max(height, width) / p.max_analysis_side))
    if factor > 1:
        mask = downscale_max(full_mask, factor)
        small = cv2.resize(rgb, (mask.shape[1], mask.shape[0]), interpolation=cv2.INTER_AREA)
        edges = _EdgeMaps(small, mask)
    else:
        mask = full_mask
        edges = _EdgeMaps(rgb, mask)
    mh, mw = mask.shape
    mask_u8 = mask.astype(np.uint8)

    _, cc_labels, cc_stats, _ = cv2.connectedComponentsWithStats(mask_u8, connectivity=8)
    cleared, mask_u8 = without_specks(cc_labels, cc_stats, mask_u8)
    if cleared is not cc_labels:
        cc_labels = cleared
        mask = mask_u8.astype(bool)
        if factor == 1:
            full_mask = mask
    u = text_unit(cc_stats, mh, mw)
    glyphs = label_candidates(mask_u8, cc_labels, cc_stats, u)
    gray = cv2.cvtColor(edges.rgb, cv2.COLOR_RGB2GRAY)
    analysis = Analysis(gray=gray, mask=mask_u8, glyphs=glyphs, u=u)

    # label boxes: given, or guessed from components
    given: list[IntBox] = []
    if labels:
        for det in labels:
            x1, y1, x2, y2 = det.box
            given.append(
                (
                    max(0, int(x1 // factor)),
                    max(0, int(y1 // factor)),
                    min(mw, math.ceil(x2 / factor)),
                    min(mh, math.ceil(y2 / factor)),
                )
            )
    content = mask_u8.copy()
    candidate_boxes: list[IntBox] = []
    if given:
        for b in given:
            # a label printed on an image is part of the image's pixels: leave those alone
            rx1, ry1, rx2, ry2 = max(0, b[0] - 2), max(0, b[1] - 2), min(mw, b[2] + 2), min(mh, b[3] + 2)
            ring = int(mask_u8[ry1:ry2, rx1:rx2].sum()) - int(mask_u8[b[1] : b[3], b[0] : b[2]].sum())
            ring_area = (rx2 - rx1) * (ry2 - ry1) - (b[2] - b[0]) * (b[3] - b[1])
            if ring_area <= 0 or ring < 0.8 * ring_area:
                content[b[1] : b[3], b[0] : b[2]] = 0
        candidate_boxes = given
    else:
        for box, members in glyphs.words:
            x1, y1, x2, y2 = box
            region = glyphs.labels[y1:y2, x1:x2]
            content[y1:y2, x1:x2][np.isin(region, members)] = 0
            candidate_boxes.append(box)

    edges.mask = content.astype(bool)
    edges._cache.pop("ink", None)
    parts, major = _parts(edges.mask, edges, u, p)
    if not given:
        # labels printed against an image's edge (0-2 px gutters) are fused to it
        guessed = len(candidate_boxes)
        for k, part in enumerate(parts):
            if not major[k]:
                continue
            body, fringe = _trim_fringes(content, part, u)
            if not fringe:
                continue
            parts[k] = body
            for x1, y1, x2, y2 in fringe:
                content[y1:y2, x1:x2] = 0
                guessed = _add_fringe_glyphs(candidate_boxes, guessed, (x1, y1, x2, y2))
    if not given:
        candidate_boxes = [_clip_out_of_parts(mask, box, parts, major) for box in candidate_boxes]
    parts, major = _split_at_labels(content, edges, gray, parts, major, candidate_boxes, u, p)
    label_boxes, anchors = _anchor_labels(candidate_boxes, parts, major, glyphs.stats, u, trust=bool(given))
    # rejected guesses are ordinary content again
    rejected = rejected_guesses(candidate_boxes, label_boxes)
    if not given:
        for box in rejected:
            parts.append(box)
            major.append(False)
            anchors.append(-1)
    dense = [float(content[b[1] : b[3], b[0] : b[2]].mean()) >= p.dense_fill for b in parts]
    # image parts with a label printed inside a corner head their own panel too (one corner for
    # the whole figure, shared by most of its unlabelled images)
    outside = sum(1 for a in anchors if a >= 0)
    images = [k for k in range(len(parts)) if major[k] and dense[k] and anchors[k] < 0]
    hits: dict[str, list[int]] = {}
    found: dict[tuple[str, int], CornerGlyph] = {}
    for corners in (("tl",), ("tr", "bl", "br")):  # the usual corner first
        for k in images:
            for g in corner_glyphs(gray, parts[k], u, corners, otsu=False):
                if (g.corner, k) not in found:
                    found[g.corner, k] = g
                    hits.setdefault(g.corner, []).append(k)
        if len(hits.get("tl", [])) >= max(2, 0.5 * len(images)):
            break
    label_corner = "tl"
    if hits:
        corner = max(hits, key=lambda c: (len(hits[c]), c == "tl"))
        # beside labels in the gutters, a few images with corner text are overlays, not labels
        if len(hits[corner]) >= max(2 if outside < 2 else 3, 0.5 * len(images)):
            label_corner = corner
            next_anchor = len(label_boxes)
            for k in hits[corner]:
                anchors[k] = next_anchor
                next_anchor += 1
            # the images whose label the corner search missed (a label among bright dots, a
            # circled one beside a marker): each label sits where the others sit in their images
            labelled = [(parts[k], found[corner, k]) for k in hits[corner]]
            for k in images:
                if anchors[k] < 0 and _label_at_spot(gray, parts[k], labelled, corner):
                    anchors[k] = next_anchor
                    next_anchor += 1
    clusters = _cluster(parts, major, dense, anchors, u, float(mh * mw), label_corner)

    keep_mask = content.astype(bool)
    for x1, y1, x2, y2 in rejected:
        keep_mask[y1:y2, x1:x2] |= mask[y1:y2, x1:x2]
    results: list[PanelCandidate] = []
    min_major = p.min_panel_units * u
    heights = [b[3] - b[1] for b in label_boxes]
    for cluster in clusters:
        cb = cluster.box
        w, h = cb[2] - cb[0], cb[3] - cb[1]
        if not cluster.major and not (min(w, h) >= min_major and w * h >= p.min_panel_share * mh * mw):
            continue
        tight = tight_box(keep_mask, (cb[0], cb[1], cb[2], cb[3]))
        if tight is None:
            continue
        if cluster.anchor < 0 and heights:
            tight = _without_heading_label(keep_mask, tight, rejected, float(np.median(heights)), u)
        if factor > 1:
            x1, y1, x2, y2 = tight
            full_box = (x1 * factor, y1 * factor, min(width, x2 * factor), min(height, y2 * factor))
            refined = tight_box(full_mask, full_box)
            if refined is None:
                continue
            tight = refined
        confidence = (
            p.labelled_confidence
            if cluster.anchor >= 0
            else (p.major_confidence if cluster.major else p.minor_confidence)
        )
        results.append(PanelCandidate(box=float_box(tight), confidence=confidence))
    if seams and results:
        # parts are tightened to the content the rules kept (label glyphs in a gutter between
        # touching panels are not part of either)
        if factor > 1:
            kept = cv2.resize(keep_mask.astype(np.uint8), (width, height), interpolation=cv2.INTER_NEAREST)
            keep_ink = full_mask & kept.astype(bool)
        else:
            keep_ink = keep_mask
        maps = boundary_maps(rgb)  # one network pass serves the seam splitter and the count
        analysis.maps, analysis.ink = maps, keep_ink
        # a cut beside a panel's outline can leave a line of it as a "panel" of its own (1 px
        # tall); gone before the count is compared, the panels it was cut from may be cut right
        results = _without_lines(
            _split_seams(rgb, keep_ink, u * factor, results, maps, seam_params, p.major_confidence)
        )
        if named is not None and named != len(results):
            results = _without_lines(_to_count(rgb, keep_ink, results, named, maps, count_params))
    if not results:
        box = tight_box(full_mask, (0, 0, width, height))
        if box is not None:
            results.append(PanelCandidate(box=float_box(box), confidence=0.3))
    return Segmentation(results, analysis if factor == 1 else None)


def _without_lines(panels: list[PanelCandidate]) -> list[PanelCandidate]:
    return [p for p in panels if min(p.box[2] - p.box[0], p.box[3] - p.box[1]) >= MIN_SIDE]


def _int_boxes(panels: list[PanelCandidate]) -> list[IntBox]:
    return [(int(p.box[0]), int(p.box[1]), int(p.box[2]), int(p.box[3])) for p in panels]


def _split_seams(
    rgb: np.ndarray,
    ink: np.ndarray,
    u: float,
    panels: list[PanelCandidate],
    maps: BoundaryMaps,
    params: SeamParams | None,
    split_confidence: float,
) -> list[PanelCandidate]:
    """Boxes of touching panels the rules left whole, cut along their seams (``u``: the text
    unit, full size). A cut box's first part keeps its confidence; the parts split off it get
    ``split_confidence``, a rule box's confidence without a label (``split_boxes`` does not say
    whose part a new box is)."""
    boxes = _int_boxes(panels)
    split = split_boxes(rgb, boxes, ink=ink, u=u, maps=maps, params=params)
    if split == boxes:
        return panels
    confidences = [p.confidence for p in panels]
    # split_boxes keeps each box's index for its first part and appends the others
    return [
        PanelCandidate(box=float_box(b), confidence=confidences[k] if k < len(panels) else split_confidence)
        for k, b in enumerate(split)
    ]


def _to_count(
    rgb: np.ndarray,
    ink: np.ndarray,
    panels: list[PanelCandidate],
    named: int,
    maps: BoundaryMaps,
    params: CountParams | None,
) -> list[PanelCandidate]:
    """``panels`` cut or joined towards the ``named`` panels of the caption."""
    boxes = _int_boxes(panels)
    confidences = [p.confidence for p in panels]
    if named > len(boxes):
        boxes, confidences = split_to_count(rgb, ink, boxes, confidences, named, maps=maps, params=params)
    else:
        boxes, confidences = merge_to_count(boxes, confidences, named, maps=maps, params=params)
    return [PanelCandidate(box=float_box(b), confidence=c) for b, c in zip(boxes, confidences, strict=True)]


def _corner_frame(box: IntBox, inner: IntBox, corner: str) -> tuple[int, int, int, int]:
    """``inner``'s distances from ``box``'s ``corner``: to its near side across (x) and down
    (y), and to its far side down (as if the corner were the top left: a bottom label's far
    side is its top)."""
    dx = inner[0] - box[0] if corner[1] == "l" else box[2] - inner[2]
    if corner[0] == "t":
        near, far = inner[1] - box[1], inner[3] - box[1]
    else:
        near, far = box[3] - inner[3], box[3] - inner[1]
    return dx, near, far, inner[2] - inner[0]


def _label_at_spot(
    gray: np.ndarray, part: IntBox, labelled: list[tuple[IntBox, CornerGlyph]], corner: str
) -> bool:
    """An image's label found where the figure's other labels sit in their images: a glyph of
    their polarity and height, the same offset from the same corner, standing apart from the
    picture around it (a looser look than ``corner_glyphs``, trusted only at that spot)."""
    if len(labelled) < 2:
        return False
    frames = np.array([_corner_frame(p, g.box, corner) for p, g in labelled], dtype=np.float64)
    dx, near, far = (float(np.median(frames[:, i])) for i in range(3))
    heights = frames[:, 2] - frames[:, 1]
    gh = float(np.median(heights))
    # most labels must agree on their spot; else the position says nothing
    tol = max(2.0, 0.35 * gh)
    agree = (np.abs(frames[:, 0] - dx) <= tol) & (
        (np.abs(frames[:, 1] - near) <= tol) | (np.abs(frames[:, 2] - far) <= tol)
    )
    if gh < 5 or float(agree.mean()) < 0.6:
        return False
    x1, y1, x2, y2 = part
    reach_x, reach_y = round(dx + 3.5 * gh), round(near + 2.0 * gh)
    if reach_x >= x2 - x1 or reach_y >= y2 - y1:
        return False
    wx1 = x1 if corner[1] == "l" else x2 - reach_x
    wy1 = y1 if corner[0] == "t" else y2 - reach_y
    crop = gray[wy1 : wy1 + reach_y, wx1 : wx1 + reach_x]
    ground = float(np.median(crop))
    for text_mask in (
        crop >= min(230.0, max(185.0, ground + 0.7 * (255.0 - ground))),
        crop <= max(30.0, min(70.0, 0.3 * ground)),
    ):
        if _glyph_at(part, crop, text_mask, (wx1, wy1), corner, (dx, near, far, gh)):
            return True
    return False


def _glyph_at(
    part: IntBox,
    crop: np.ndarray,
    text_mask: np.ndarray,
    origin: tuple[int, int],
    corner: str,
    spot: tuple[float, float, float, float],
) -> bool:
    """A glyph of ``text_mask`` (a window of the figure at ``origin``) at the spot (offset
    across, near and far offsets down from ``part``'s ``corner``, height), alone and standing
    out from the ground around it."""
    dx, near, far, gh = spot
    tol = max(2.0, 0.35 * gh)
    n, cc, stats, _ = cv2.connectedComponentsWithStats(text_mask.astype(np.uint8), connectivity=8)
    for cid in range(1, n):
        bx, by, bw, bh, area = (int(v) for v in stats[cid])
        glyph = (origin[0] + bx, origin[1] + by, origin[0] + bx + bw, origin[1] + by + bh)
        gdx, gnear, gfar, _ = _corner_frame(part, glyph, corner)
        if 0.55 * gh <= bh <= 1.5 * gh and bw <= 1.6 * bh + 2 and area >= 0.12 * bw * bh:
            # the label's first glyph on its side, its baseline (or top) level with the others'
            level = abs(gnear - near) <= tol or abs(gfar - far) <= tol
            if abs(gdx - dx) > tol or not level:
                continue
        elif 1.1 * gh <= bh <= 2.4 * gh and 0.7 * bh <= bw <= 1.4 * bh and area < 0.45 * bw * bh:
            # a circle around the label, fused to its glyph (JPEG): the spot lies inside it
            if not (gdx < dx + 0.2 * gh and gnear < near + 0.2 * gh and gfar > far - 0.2 * gh):
                continue
            if gdx + bw < dx + 0.8 * gh:
                continue
        else:
            continue
        # alone: the ring around it holds little of its kind, and it stands out from the ground
        pad = max(2, round(0.3 * bh))
        rx1, ry1 = max(0, bx - pad), max(0, by - pad)
        rx2, ry2 = min(crop.shape[1], bx + bw + pad), min(crop.shape[0], by + bh + pad)
        region = cc[ry1:ry2, rx1:rx2]
        others = text_mask[ry1:ry2, rx1:rx2] & (region != cid)
        if float(others.sum()) > 0.15 * float((region != cid).sum()):
            continue
        glyph_px = crop[ry1:ry2, rx1:rx2][region == cid]
        ground_px = crop[ry1:ry2, rx1:rx2][~text_mask[ry1:ry2, rx1:rx2]]
        if ground_px.size < 4 or abs(float(np.median(glyph_px)) - float(np.median(ground_px))) < 70:
            continue
        return True
    return False


def _add_fringe_glyphs(candidates: list[IntBox], guessed: int, box: IntBox) -> int:
    """A glyph group trimmed off an image joins the label guesses (the first ``guessed`` of
    ``candidates``, found apart from any image) beside it on its line (the "g" of "(g)", whose
    descender touched the image, between parentheses guessed on their own): one label, one box,
    instead of a parenthesis heading the panel and the rest of the label restored as its
    content. Groups trimmed off images do not join each other (tick labels down a plot's axis
    fused to the image beside it). Returns the new count of guesses at the front."""
    joined = list(box)
    mates: list[int] = []
    for k in range(guessed - 1, -1, -1):
        other = candidates[k]
        tall = max(joined[3] - joined[1], other[3] - other[1])
        short = min(joined[3] - joined[1], other[3] - other[1])
        level = min(joined[3], other[3]) - max(joined[1], other[1]) >= 0.5 * short and short >= 0.5 * tall
        near = max(other[0], joined[0]) - min(other[2], joined[2]) <= 0.5 * tall
        # still label-sized once joined (not a line of text along the image's edge)
        wide = max(joined[2], other[2]) - min(joined[0], other[0]) <= 3 * tall
        if level and near and wide:
            joined = [
                min(joined[0], other[0]),
                min(joined[1], other[1]),
                max(joined[2], other[2]),
                max(joined[3], other[3]),
            ]
            mates.append(k)
    if not mates:
        candidates.append(box)
        return guessed
    for k in mates:  # descending: deleting keeps the smaller indices
        del candidates[k]
    candidates.insert(mates[-1], (joined[0], joined[1], joined[2], joined[3]))
    return guessed - len(mates) + 1


def _without_heading_label(
    keep: np.ndarray, box: IntBox, guesses: list[IntBox], typical: float, u: float
) -> IntBox:
    """A panel with no label of its own whose top-left corner is a label-like glyph group of the
    figure's label size, standing above (or left of) all the rest of the panel: the label of a
    table or a diagram (content no label guess could head) is not part of the panel."""
    x1, y1, x2, y2 = box
    for gx1, gy1, gx2, gy2 in guesses:
        gh = gy2 - gy1
        if not 0.6 * typical <= gh <= 1.7 * typical:
            continue
        if not (x1 <= gx1 <= x1 + 0.5 * gh and y1 <= gy1 <= y1 + 0.5 * gh and gx2 <= x2 and gy2 <= y2):
            continue
        rest = keep[y1:y2, x1:x2].copy()
        rest[gy1 - y1 : gy2 - y1, gx1 - x1 : gx2 - x1] = False
        inner = tight_box(rest, (0, 0, x2 - x1, y2 - y1))
        if inner is None:
            continue
        if inner[1] < gy2 - y1 and inner[0] < gx2 - x1:
            continue  # other content beside the glyphs on their line and column: text, not a label
        trimmed = (x1 + inner[0], y1 + inner[1], x1 + inner[2], y1 + inner[3])
        if min(trimmed[2] - trimmed[0], trimmed[3] - trimmed[1]) >= 4.0 * u:
            return trimmed
    return box


def rejected_guesses(candidates: list[IntBox], accepted: list[IntBox]) -> list[IntBox]:
    """The label guesses that are content after all: not accepted, nor a piece of an accepted
    label (the dot of an "i" guessed on its own, which would otherwise join the panel above)."""
    return [
        box
        for box in candidates
        if box not in accepted and not any(overlaps(box, label) for label in accepted)
    ]


def _parts(
    content: np.ndarray, edges: _EdgeMaps, u: float, p: SegmentParams
) -> tuple[list[IntBox], list[bool]]:
    """Blobs of content ink (1-2 px gaps bridged), overlapping boxes merged, dense ones split."""
    dilated = cv2.dilate(content.astype(np.uint8), np.ones((3, 3), np.uint8))
    n, _, stats, _ = cv2.connectedComponentsWithStats(dilated, connectivity=8)
    if n <= 1:
        return [], []
    raw = np.stack(
        [stats[1:, 0], stats[1:, 1], stats[1:, 0] + stats[1:, 2], stats[1:, 1] + stats[1:, 3]], axis=1
    ).astype(np.int64)
    # drop specks (JPEG noise): blobs whose dilated box is at most 3x3 px
    raw = raw[(raw[:, 2] - raw[:, 0] > 3) | (raw[:, 3] - raw[:, 1] > 3)]
    merged = _merge_overlapping(raw)
    parts: list[IntBox] = []
    major: list[bool] = []
    for row in merged:
        tight = tight_box(content, (int(row[0]), int(row[1]), int(row[2]), int(row[3])))
        if tight is None:
            continue
        for piece in _split_dense(content, edges, tight, u, p):
            parts.append(piece)
            major.append(_is_major(content, piece, u))
    return parts, major


def _clip_out_of_parts(mask: np.ndarray, box: IntBox, parts: list[IntBox], major: list[bool]) -> IntBox:
    """A label guess whose glyph touches the light edge pixels of an image above (beside) it
    reaches into that image: it ends at the image's edge (it would be too tall for a label)."""
    x1, y1, x2, y2 = box
    for part, is_major in zip(parts, major, strict=True):
        if not is_major or not overlaps((x1, y1, x2, y2), part):
            continue
        px1, py1, px2, py2 = part
        if px1 <= x1 and x2 <= px2:
            if py1 <= y1 < py2 < y2:
                y1 = py2
            elif y1 < py1 < y2 <= py2:
                y2 = py1
        elif py1 <= y1 and y2 <= py2:
            if px1 <= x1 < px2 < x2:
                x1 = px2
            elif x1 < px1 < x2 <= px2:
                x2 = px1
    if (x1, y1, x2, y2) == box or (x2 - x1) * (y2 - y1) < 0.5 * (box[2] - box[0]) * (box[3] - box[1]):
        return box
    tight = tight_box(mask, (x1, y1, x2, y2))
    return tight if tight is not None else box


def _split_at_labels(
    content: np.ndarray,
    edges: _EdgeMaps,
    gray: np.ndarray,
    parts: list[IntBox],
    major: list[bool],
    labels: list[IntBox],
    u: float,
    p: SegmentParams,
) -> tuple[list[IntBox], list[bool]]:
    """Each label marks one panel: an image part headed by a label at its top-left corner and
    by more labels of that size further along its top edge (or down its left side) holds as
    many images, touching without a seam the colour or texture tests see (two fields of one
    stain). Labels printed inside the images count too. Each is cut off where the first
    label's offset from the part's corner puts it, moved to the strongest line of colour steps
    close by."""
    out_parts: list[IntBox] = []
    out_major: list[bool] = []
    for part, is_major in zip(parts, major, strict=True):
        x1, y1, x2, y2 = part
        if not is_major or float(content[y1:y2, x1:x2].mean()) < 0.85:
            out_parts.append(part)
            out_major.append(is_major)
            continue
        pieces = _cut_at_labels(content, edges, gray, part, labels, u, 0)
        if len(pieces) == 1:
            pieces = _cut_at_end_labels(content, edges, gray, part, labels, u)
        if len(pieces) > 1:
            # a seam running along one row of images only is too short to be seen across the
            # whole part; within the row, once cut off, it runs the row's full length
            pieces = [piece for cut in pieces for piece in _split_dense(edges.mask, edges, cut, u, p)]
        out_parts.extend(pieces)
        out_major.extend(_is_major(content, piece, u) for piece in pieces)
    return out_parts, out_major


def _cut_at_labels(
    content: np.ndarray,
    edges: _EdgeMaps,
    gray: np.ndarray,
    part: IntBox,
    labels: list[IntBox],
    u: float,
    depth: int,
) -> list[IntBox]:
    x1, y1, x2, y2 = part
    if depth > 6:
        return [part]
    inside = _inside_labels(gray, part, u)
    labels = labels + inside
    heads = [
        b
        for b in labels
        if abs(b[0] - x1) <= 2.5 * (b[3] - b[1])
        and y1 - 3 * (b[3] - b[1]) <= b[1] <= y1 + 2.5 * (b[3] - b[1])
        and b[2] < x2
    ]
    if not heads:
        return [part]
    head = min(heads, key=lambda b: abs(b[0] - x1) + abs(b[1] - y1))
    gh = head[3] - head[1]
    like = [b for b in labels if b != head and 0.7 * gh <= b[3] - b[1] <= 1.4 * gh]
    tol = max(2.0, 0.4 * gh)
    # (start, seen only inside the images): texture can pass for a glyph there, so such a
    # label is trusted only where a seam runs
    row = sorted(
        (b[0], b in inside) for b in like if abs(b[1] - head[1]) <= tol and x1 + 3 * gh < b[0] < x2 - 3 * gh
    )
    column = sorted(
        (b[1], b in inside) for b in like if abs(b[0] - head[0]) <= tol and y1 + 3 * gh < b[1] < y2 - 3 * gh
    )
    for axis, starts in ((0, row), (1, column)):
        if not starts:
            continue
        lo = x1 if axis == 0 else y1
        offset = (head[0] - x1) if axis == 0 else (head[1] - y1)
        strength = edges.profile("step", part, axis)
        cuts: list[int] = []
        for start, needs_seam in starts:
            expected = start - offset - lo  # part-relative
            a = max(int(expected - gh), (cuts[-1] if cuts else 0) + round(3 * gh))
            b = min(int(expected + gh) + 1, strength.size - round(3 * gh))
            if b <= a:
                continue
            window = strength[a:b]
            around = strength[max(0, a - 3 * gh) : b + 3 * gh]
            peak = int(np.argmax(window))
            strong = float(window[peak]) >= 1.5 * float(np.median(around)) + 4.0
            if needs_seam and not (strong and _line_contrast(edges, part, axis, a + peak) >= 0.4):
                continue
            cut = a + peak if strong else int(np.clip(round(expected), a, b - 1))
            cuts.append(cut)
        if not cuts:
            continue
        bounds = [0, *cuts, strength.size]
        pieces: list[IntBox] = []
        for start, stop in itertools.pairwise(bounds):
            box = (x1 + start, y1, x1 + stop, y2) if axis == 0 else (x1, y1 + start, x2, y1 + stop)
            tight = tight_box(content, box)
            if tight is not None:
                pieces.extend(_cut_at_labels(content, edges, gray, tight, labels, u, depth + 1))
        return pieces
    return [part]


def _cut_at_end_labels(
    content: np.ndarray, edges: _EdgeMaps, gray: np.ndarray, part: IntBox, labels: list[IntBox], u: float
) -> list[IntBox]:
    """``_cut_at_labels`` for labels printed at the bottom right of each image (the other common
    place): the part is turned half a turn, so that its labels head it, and cut as such."""
    x1, y1, x2, y2 = part

    def turn(crop: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(crop[y1:y2, x1:x2][::-1, ::-1])

    def back(b: IntBox) -> IntBox:
        # the half turn maps the box back onto itself: (a, b, c, d) <-> (x2 - c, y2 - d, x2 - a, y2 - b)
        return (x2 - b[2], y2 - b[3], x2 - b[0], y2 - b[1])

    turned = turn(content)
    turned_edges = _EdgeMaps(turn(edges.rgb), turned.astype(bool))
    inside = [back(b) for b in labels if overlaps(b, part)]
    pieces = _cut_at_labels(turned, turned_edges, turn(gray), (0, 0, x2 - x1, y2 - y1), inside, u, 0)
    return [part] if len(pieces) == 1 else sorted(back(b) for b in pieces)


def _line_contrast(edges: _EdgeMaps, box: IntBox, axis: int, c: int) -> float:
    """Share of the line at offset ``c`` (0: vertical) along which the colour step stands out
    from the steps parallel to it."""
    x1, y1, x2, y2 = box
    d = edges.steps(axis)[y1:y2, x1:x2]
    lines = d.T if axis == 0 else d
    step = lines[max(0, c - 1) : c + 2].max(axis=0).astype(np.float32)
    context = np.concatenate([lines[max(0, c - 10) : max(0, c - 3)], lines[c + 4 : c + 11]]).astype(
        np.float32
    )
    local = np.median(context, axis=0) if context.size else np.zeros_like(step)
    return float((step >= np.maximum(24.0, 2.0 * local + 8.0)).mean())


def _inside_labels(gray: np.ndarray, part: IntBox, u: float) -> list[IntBox]:
    """Labels printed inside touching images: when the part's top-left corner holds one, glyph
    groups of its size and polarity level with it further along the top of the part, or
    below it down the part's left side, are the labels of the images the part joins."""
    x1, y1, x2, y2 = part
    corner = corner_glyphs(gray, part, u, ("tl",), otsu=False)
    if not corner:
        return []
    head = min(corner, key=lambda g: g.box[0] + g.box[1])
    hx1, hy1, hx2, hy2 = head.box
    gh = hy2 - hy1
    tol = max(2, round(0.4 * gh))
    found = [head.box]
    bands = (
        (min(x2, hx2 + 2 * gh), max(y1, hy1 - tol), x2, min(y2, hy2 + tol)),  # along the top
        (max(x1, hx1 - tol), min(y2, hy2 + 2 * gh), min(x2, hx1 + round(3.2 * gh) + tol), y2),  # down
    )
    for bx1, by1, bx2, by2 in bands:
        if bx2 - bx1 < gh or by2 - by1 < gh:
            continue
        crop = gray[by1:by2, bx1:bx2]
        ground = float(np.median(crop))
        if head.invert:
            text_mask = crop >= min(230.0, max(185.0, ground + 0.7 * (255.0 - ground)))
        else:
            text_mask = crop <= max(30.0, min(70.0, 0.3 * ground))
        found.extend(
            (bx1 + gx1, by1 + gy1, bx1 + gx2, by1 + gy2)
            for gx1, gy1, gx2, gy2 in _band_glyph_groups(crop, text_mask, gh)
        )
    return found


def _band_glyph_groups(crop: np.ndarray, text_mask: np.ndarray, gh: int) -> list[IntBox]:
    """Isolated glyph groups about ``gh`` tall that stand out from the ground around them."""
    n, labels, stats, _ = cv2.connectedComponentsWithStats(text_mask.astype(np.uint8), connectivity=8)
    size = max(crop.shape)
    out: list[IntBox] = []
    for cid in range(1, n):
        bx, by, bw, bh, area = (int(v) for v in stats[cid])
        if not (0.7 * gh <= bh <= 1.4 * gh and bw <= 1.6 * bh + 2 and area >= 0.12 * bw * bh):
            continue
        if any(b[0] <= bx < b[2] and b[1] <= by < b[3] for b in out):
            continue
        members = line_mates(labels, stats, cid, size, False)
        group = None if members is None else standout_group(crop, labels, stats, members)
        if group is not None:
            out.append(group[0])
    return out


def _trim_fringes(content: np.ndarray, box: IntBox, u: float) -> tuple[IntBox, list[IntBox]]:
    """An image part without the glyph groups stuck to its edges: rows (columns) along an edge
    that hold only a little ink, above (beside) rows that the image fills, are label-sized text
    fused to the image across a 0-2 px gutter. Returns the image's box and the groups' boxes."""
    x1, y1, x2, y2 = box
    crop = content[y1:y2, x1:x2]
    if crop.size == 0 or float(crop.mean()) < 0.7:
        return box, []
    # as tall as the label guesses of label_candidates may be
    lo_depth, hi_depth = max(3, round(0.5 * u)), max(6, round(max(3.2 * u, 0.045 * max(content.shape))))
    strips: list[IntBox] = []
    for axis in (0, 1):  # 0: top/bottom rows, 1: left/right columns
        fill = crop.mean(axis=1 - axis)
        size = fill.size
        if size < 3 * hi_depth:
            continue
        for from_end in (False, True):
            seq = fill[::-1] if from_end else fill
            solid = np.flatnonzero(seq > 0.45)
            if solid.size == 0:
                continue
            depth = int(solid[0])
            if not lo_depth <= depth <= hi_depth or float(seq[:depth].max()) > 0.45:
                continue
            if float(seq[depth : depth + hi_depth].mean()) < 0.85:
                continue  # no image body behind the strip: the part is not one image
            start, stop = (size - depth, size) if from_end else (0, depth)
            if axis == 0:
                strips.append((0, start, crop.shape[1], stop))
            else:
                strips.append((start, 0, stop, crop.shape[0]))
    if not strips:
        return box, []
    groups: list[IntBox] = []
    keep = np.ones(crop.shape, dtype=bool)
    for sx1, sy1, sx2, sy2 in strips:
        keep[sy1:sy2, sx1:sx2] = False
        strip = crop[sy1:sy2, sx1:sx2].astype(np.uint8)
        # the glyphs of one label stand closer than half a glyph height
        joined = cv2.dilate(strip, np.ones((1, max(3, round(0.5 * u))), np.uint8))
        n, _, stats, _ = cv2.connectedComponentsWithStats(joined, connectivity=8)
        for cid in range(1, n):
            gx, gy, gw, gh = (int(v) for v in stats[cid, :4])
            tight = tight_box(content, (x1 + sx1 + gx, y1 + sy1 + gy, x1 + sx1 + gx + gw, y1 + sy1 + gy + gh))
            if tight is not None:
                groups.append(tight)
    rows = np.flatnonzero((crop & keep).any(axis=1))
    cols = np.flatnonzero((crop & keep).any(axis=0))
    if rows.size == 0:
        return box, []
    trimmed = (x1 + int(cols[0]), y1 + int(rows[0]), x1 + int(cols[-1]) + 1, y1 + int(rows[-1]) + 1)
    return trimmed, groups


def _is_major(content: np.ndarray, box: IntBox, u: float) -> bool:
    """Panel-sized content: big enough, and crossed somewhere by a long run of ink (an image,
    an axis line, a drawing) rather than a loose scatter of glyphs (rotated tick labels)."""
    x1, y1, x2, y2 = box
    w, h = x2 - x1, y2 - y1
    if min(w, h) < 3.0 * u or w * h < 20.0 * u * u:
        return False
    crop = content[y1:y2, x1:x2]
    return bool(crop.sum(axis=1).max() >= 0.45 * w or crop.sum(axis=0).max() >= 0.45 * h)


def _anchor_labels(
    candidates: list[IntBox],
    parts: list[IntBox],
    major: list[bool],
    stats: np.ndarray,
    u: float,
    *,
    trust: bool,
) -> tuple[list[IntBox], list[int]]:
    """Which label candidates head a panel, and the part each one anchors.

    Returns the accepted label boxes and, per part, the index of its anchoring label (-1: none).
    """
    anchors = [-1] * len(parts)
    accepted: list[tuple[IntBox, int]] = []
    blocks: dict[IntBox, list[int]] = {}  # a table's other rows, by the label heading it
    for box in candidates:
        x1, y1, x2, y2 = box
        gh = y2 - y1
        if not trust and gh < max(5.0, 0.5 * u):
            continue  # a dot or a speck (the dot of an "i" trimmed off the image below it)
        if not trust and in_series(box, stats, u):
            continue  # a y-axis tick label: same-size glyphs right-aligned above or below it
        best, best_cost = -1, math.inf
        for k, p in enumerate(parts):
            # a label heads panel-sized content lying to its right and/or below it
            if not major[k]:
                continue
            if p[2] < x2 + 0.5 * gh or p[3] < y2 + 0.5 * gh:
                continue
            at_corner = p[0] <= x1 and p[1] <= y1 and x1 - p[0] <= 2.5 * gh and y1 - p[1] <= 2.5 * gh
            if (p[0] < x1 - gh or p[1] < y1 - gh) and not at_corner:
                continue
            gap = _box_gap(box, p)
            if gap > max(6.0 * min(gh, 2.0 * u), 8.0 * u):
                continue
            cost = gap
            if cost < best_cost:
                best, best_cost = k, cost
        block: list[int] = []
        if best < 0:
            # a table (rows of text, each too small to be panel-sized) right under the label
            block = _text_block_under(box, parts, major, u) or _text_block_under(
                box, parts, major, u, beside_label=True
            )
            if not block:
                continue
            best = block[0]
            blocks[box] = block[1:]
        if not trust:
            # a glyph inside some other part (not at its top-left corner) is in-panel text
            inside = False
            for k, p in enumerate(parts):
                if k == best or not major[k]:
                    continue
                contains = p[0] <= x1 and p[1] <= y1 and p[2] >= x2 and p[3] >= y2
                if contains and (x1 - p[0] > 2.5 * gh or y1 - p[1] > 2.5 * gh):
                    inside = True
                    break
            if inside:
                continue
        accepted.append((box, best))
    if not trust and accepted:
        heights = np.array([b[3] - b[1] for b, _ in accepted], dtype=np.float64)
        typical = float(np.median(heights))
        accepted = [(b, k) for b, k in accepted if 0.6 * typical <= b[3] - b[1] <= 1.7 * typical]
        # one label per anchored part: the top-left-most wins
        accepted.sort(key=lambda item: item[0][1] + item[0][0])
        seen: set[int] = set()
        unique: list[tuple[IntBox, int]] = []
        for b, k in accepted:
            if k in seen:
                continue
            seen.add(k)
            unique.append((b, k))
        accepted = unique
    boxes: list[IntBox] = []
    for index, (b, k) in enumerate(accepted):
        boxes.append(b)
        for member in [k, *blocks.get(b, [])]:
            if anchors[member] < 0:
                anchors[member] = index
    return boxes, anchors


def _text_block_under(
    label: IntBox, parts: list[IntBox], major: list[bool], u: float, beside_label: bool = False
) -> list[int]:
    """The parts of a table headed by ``label``: small parts (cells, rows, rules) starting just
    below it at its left, and those stacked on them or beside them on their lines, when together
    they make a panel-sized block of several rows (the first index is the top-left part)."""
    x1, _, _, y2 = label
    gh = label[3] - label[1]
    small = [k for k in range(len(parts)) if not major[k]]
    if beside_label:
        # a table whose top row starts right beside the label, level with it (the label printed
        # in the gutter left of the table's top-left corner), with nothing under the label
        lx2, ly1 = label[2], label[1]
        starts = [k for k in small if 0 <= parts[k][0] - lx2 <= gh and abs(parts[k][1] - ly1) <= 0.5 * gh]
        if any(p[0] < lx2 and p[2] > x1 and y2 <= p[1] <= y2 + 3.0 * gh for p in parts):
            return []
    else:
        starts = [
            k
            for k in small
            if y2 - 0.3 * gh <= parts[k][1] <= y2 + 2.5 * gh and abs(parts[k][0] - x1) <= 2.5 * gh
        ]
    if not starts:
        return []
    first = min(starts, key=lambda k: (parts[k][1], parts[k][0]))
    members = [first]
    taken = {first}  # the membership test runs for every part on every pass
    block = list(parts[first])
    step = max(1.5 * u, 0.8 * gh)
    grown = True
    while grown:
        grown = False
        for k in small:
            if k in taken:
                continue
            p = parts[k]
            below = 0 <= p[1] - block[3] <= step and min(p[2], block[2]) - max(p[0], block[0]) > 0
            beside = (
                p[1] < block[3] and p[3] > block[1] and max(p[0], block[0]) - min(p[2], block[2]) <= 4.0 * u
            )
            inside = p[0] >= block[0] and p[2] <= block[2] and p[1] >= block[1] and p[3] <= block[3]
            if below or beside or inside:
                members.append(k)
                taken.add(k)
                block = [min(block[0], p[0]), min(block[1], p[1]), max(block[2], p[2]), max(block[3], p[3])]
                grown = True
    bw, bh = block[2] - block[0], block[3] - block[1]
    if len(members) < 4 or min(bw, bh) < 4.0 * u or bw * bh < 60.0 * u * u:
        return []
    if beside_label:
        # the whole block lies right of the label (its top row is the label's line)
        return members if block[0] >= label[2] else []
    # a label stands alone on its line: a word with more cells beside it is in a table's row
    # (a panel-sized neighbour beside the table is no cell)
    ly1, ly2 = label[1], label[3]
    lx1, lx2 = min(block[0], label[0]) - gh, max(block[2], label[2]) + gh
    for k, p in enumerate(parts):
        if not major[k] and p[1] < ly2 and p[3] > ly1 and p[0] < lx2 and p[2] > lx1:
            return []
    return members
