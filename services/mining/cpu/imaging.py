"""Image primitives the CPU miner's stages share: the ink mask, boxes tightened to it, the text
unit, the glyph groups that may be panel labels, corner glyphs, and the ``Analysis`` the segmenter
makes of a figure and hands on to the label stages (``StageContext.analysis``).

Nothing here decides what a panel is; ``segmentation``, ``labels`` and ``markers`` build on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import cv2
import numpy as np

from p2p.shared.geometry import Box

if TYPE_CHECKING:  # the network (and torch) load only where boundary maps are made
    from p2p.mining.cpu.segmentation.seam_net import BoundaryMaps

INK_THRESHOLD = 225  # darkest channel below this = ink (as in the annotation notes)
MIN_SIDE = 8  # figures smaller than this are one panel (when they hold ink) or nothing
SPECK_AREA = 4  # ink components this small (px) are noise
LABEL_SHARE = 0.12  # of a panel's shorter side: the tallest label printed inside it

IntBox = tuple[int, int, int, int]  # x1, y1, x2, y2 with x2/y2 exclusive


def as_rgb(image: np.ndarray) -> np.ndarray:
    array = np.asarray(image)
    if array.dtype != np.uint8:
        if np.issubdtype(array.dtype, np.floating) and array.size and float(np.nanmax(array)) <= 1.0:
            array = array * 255.0
        array = np.clip(np.nan_to_num(array), 0, 255).astype(np.uint8)
    if array.ndim == 2:
        return np.repeat(array[:, :, None], 3, axis=2)
    if array.ndim == 3 and array.shape[2] == 1:
        return np.repeat(array, 3, axis=2)
    if array.ndim == 3 and array.shape[2] >= 3:
        return np.ascontiguousarray(array[:, :, :3])
    raise ValueError(f"expected an HxW or HxWxC image, got shape {array.shape}")


def ink_mask(rgb: np.ndarray) -> np.ndarray:
    """Boolean foreground mask.

    Light backgrounds (the usual case): darkest channel below ``INK_THRESHOLD``. Only a figure
    drawn on a flat dark canvas (border one exact dark tone, and that tone running across the
    figure as gutters) is read the other way round: ink is whatever differs from the canvas.
    """
    height, width = rgb.shape[:2]
    darkest = np.minimum(np.minimum(rgb[:, :, 0], rgb[:, :, 1]), rgb[:, :, 2])
    light = np.asarray(darkest < INK_THRESHOLD)
    if height < MIN_SIDE or width < MIN_SIDE:
        return light
    border = np.concatenate([rgb[0], rgb[-1], rgb[:, 0], rgb[:, -1]]).astype(np.int16)
    if float((border.min(axis=1) >= INK_THRESHOLD).mean()) >= 0.4:
        return light
    background = np.median(border, axis=0)
    if float(background.max()) >= 100 or float((np.abs(border - background).max(axis=1) <= 6).mean()) < 0.97:
        return light
    # a line of light background right across the figure is a gutter: the dark border is the
    # edge of images placed against the figure's edges, not a canvas
    inner_light = light[2:-2, 2:-2]
    if bool((inner_light.mean(axis=1) >= 0.99).any() or (inner_light.mean(axis=0) >= 0.99).any()):
        return light
    dark = np.asarray(np.abs(rgb.astype(np.int16) - background.astype(np.int16)).max(axis=2) > 40)
    inner_rows = np.asarray(dark[2:-2].any(axis=1), dtype=bool)
    inner_cols = np.asarray(dark[:, 2:-2].any(axis=0), dtype=bool)
    has_gutter = bool((~inner_rows[2:-2]).any() or (~inner_cols[2:-2]).any())
    return dark if has_gutter else light


def remove_border_rules(mask: np.ndarray) -> None:
    """Clear a thin frame drawn along the figure's edge (full-length lines with white inside)."""
    height, width = mask.shape
    for axis in (0, 1):
        length = width if axis == 0 else height
        size = height if axis == 0 else width
        coverage = mask.sum(axis=1 - axis) / max(1, length)
        limit = max(3, round(0.01 * size))
        for start, step in ((0, 1), (size - 1, -1)):
            run = 0
            while run <= limit and 0 <= start + step * run < size and coverage[start + step * run] >= 0.97:
                run += 1
            inner = start + step * run
            if run == 0 or run > limit or not 0 <= inner < size or coverage[inner] > 0.5:
                continue
            band = [start + step * k for k in range(run)]
            if axis == 0:
                mask[band, :] = False
            else:
                mask[:, band] = False


def downscale_max(mask: np.ndarray, factor: int) -> np.ndarray:
    height, width = mask.shape
    ph, pw = -height % factor, -width % factor
    padded = np.pad(mask, ((0, ph), (0, pw)))
    blocks = padded.reshape(padded.shape[0] // factor, factor, padded.shape[1] // factor, factor)
    return np.asarray(blocks.any(axis=(1, 3)), dtype=bool)


def tight_box(mask: np.ndarray, box: IntBox) -> IntBox | None:
    """``box`` shrunk to the ``mask`` pixels inside it, or None when it holds none."""
    x1, y1, x2, y2 = box
    crop = mask[y1:y2, x1:x2]
    rows = np.flatnonzero(crop.any(axis=1))
    if rows.size == 0:
        return None
    cols = np.flatnonzero(crop.any(axis=0))
    return (x1 + int(cols[0]), y1 + int(rows[0]), x1 + int(cols[-1]) + 1, y1 + int(rows[-1]) + 1)


def float_box(box: IntBox) -> Box:
    return (float(box[0]), float(box[1]), float(box[2]), float(box[3]))


def window_sum(integral: np.ndarray, x1: int, y1: int, x2: int, y2: int) -> int:
    if x2 <= x1 or y2 <= y1:
        return 0
    return int(integral[y2, x2] - integral[y1, x2] - integral[y2, x1] + integral[y1, x1])


def overlaps(a: IntBox | list[int], b: IntBox | list[int]) -> bool:
    return min(a[2], b[2]) > max(a[0], b[0]) and min(a[3], b[3]) > max(a[1], b[1])


def text_unit(stats: np.ndarray, height: int, width: int) -> float:
    """Median height of glyph-like components: the scale for every gap and size threshold."""
    fallback = float(np.clip(0.012 * max(height, width), 5.0, 40.0))
    if stats.shape[0] <= 1:
        return fallback
    w, h, area = stats[1:, 2], stats[1:, 3], stats[1:, 4]
    glyph = (h >= 4) & (h <= max(8.0, 0.08 * max(height, width))) & (w <= 3 * h) & (area >= 0.12 * w * h)
    if int(glyph.sum()) < 3:
        return fallback
    return float(np.clip(np.median(h[glyph]), 4.0, max(8.0, 0.05 * max(height, width))))


@dataclass
class Glyphs:
    """Connected components of the ink mask and the word groups that may be panel labels."""

    labels: np.ndarray  # component id per pixel
    stats: np.ndarray  # cv2 stats (x, y, w, h, area) per component id
    words: list[tuple[IntBox, list[int]]]  # label candidates: box and component ids


@dataclass
class Analysis:
    """What the segmenter learnt about a figure that the label reader needs again."""

    gray: np.ndarray
    mask: np.ndarray  # uint8 ink mask (figure frame removed)
    glyphs: Glyphs
    u: float
    # set once the seams are looked for: the boundary network's maps and the content mask the
    # panels were tightened to (label splitting cuts along the maps and tightens the same way)
    maps: BoundaryMaps | None = None
    ink: np.ndarray | None = None


def full_size_analysis(rgb: np.ndarray, known: Analysis | None = None) -> Analysis:
    """The figure's grey, ink, glyphs and text unit at its own size, as the label reader measures
    them: ``known`` (the segmenter's) when it is at the figure's size, else made here (the
    segmenter works on a downscale of large figures)."""
    if known is not None and known.mask.shape == rgb.shape[:2]:
        return known
    gray = cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY)
    mask = ink_mask(rgb).astype(np.uint8)
    _, cc_labels, cc_stats, _ = cv2.connectedComponentsWithStats(mask, connectivity=8)
    cc_labels, mask = without_specks(cc_labels, cc_stats, mask)
    height, width = gray.shape
    u = text_unit(cc_stats, height, width)
    return Analysis(gray=gray, mask=mask, glyphs=label_candidates(mask, cc_labels, cc_stats, u), u=u)


def without_specks(
    cc_labels: np.ndarray, cc_stats: np.ndarray, mask_u8: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Component ids and uint8 mask with specks (``SPECK_AREA``: JPEG ringing, noise) cleared:
    they are not content, would bridge gutters, and one pixel of ringing above a label reads
    as ink over it (``label_candidates``)."""
    specks = cc_stats[:, 4] <= SPECK_AREA
    specks[0] = False
    if not specks.any():
        return cc_labels, mask_u8
    cleared = np.where(specks[cc_labels], 0, cc_labels).astype(np.int32)
    return cleared, (cleared > 0).astype(np.uint8)


def label_candidates(mask_u8: np.ndarray, labels: np.ndarray, stats: np.ndarray, u: float) -> Glyphs:
    """Glyph groups that may be panel labels: glyph-sized, at most four glyphs on one line ("a",
    "(a)", "1a", "ii", "A."), with nothing to their left or just above them."""
    height, width = mask_u8.shape
    n = stats.shape[0]
    integral = cv2.integral(mask_u8)
    x, y, w, h = stats[:, 0], stats[:, 1], stats[:, 2], stats[:, 3]
    hmin = max(4.0, 0.5 * u)
    hmax = max(3.2 * u, 0.045 * max(height, width))
    ids = np.arange(n)
    glyph = (ids > 0) & (h >= hmin) & (h <= hmax) & (w <= 1.6 * h + 2)
    # specks are no longer ink (segment_panels cleared them) and must not pass for glyphs
    small = (ids > 0) & (h <= hmax) & (w <= 1.6 * hmax) & (stats[:, 4] > SPECK_AREA)
    small_ids = ids[small]
    order = small_ids[np.argsort(x[small_ids], kind="stable")]
    xs_sorted = x[order]

    def near_x(lo: float, hi: float) -> np.ndarray:
        return order[
            int(np.searchsorted(xs_sorted, lo, side="left")) : int(
                np.searchsorted(xs_sorted, hi, side="right")
            )
        ]

    def dots(cid: int, gh: int) -> list[int]:
        """i/j dots and accents: small components just above the glyph."""
        # one test over the whole column of candidates (a table's column holds hundreds)
        near = near_x(x[cid] - gh, x[cid] + w[cid] + 1)
        nx, nw, nh, bottom = x[near], w[near], h[near], y[near] + h[near]
        keep = (near != cid) & (nh <= 0.5 * gh) & (nw <= w[cid] + 0.5 * gh + 2)
        keep &= (nx + nw >= x[cid] - 1) & (nx <= x[cid] + w[cid] + 1)
        keep &= (y[cid] - 0.7 * gh <= bottom) & (bottom <= y[cid] + 1)
        return [int(j) for j in near[keep]]

    area = stats[:, 4]
    # solid images: a label may sit right beside one (narrow gutters) without being text
    solid = (h > hmax) & (w > hmax) & (area >= 0.6 * w * h)
    # a straight rule (a table's or a frame's edge) ending beside a label is no word before it
    rule = ((w >= 4 * hmax) & (h <= 3)) | ((h >= 4 * hmax) & (w <= 3))

    def foreign(x1: int, y1: int, x2: int, y2: int, members: list[int], rules: bool = False) -> int:
        """Ink in the window that is neither the group's own nor a solid image beside it (nor,
        with ``rules``, a straight line)."""
        x1, y1, x2, y2 = max(0, x1), max(0, y1), min(width, x2), min(height, y2)
        total = window_sum(integral, x1, y1, x2, y2)
        if total == 0:
            return 0
        window = labels[y1:y2, x1:x2]
        ids_here = np.unique(window)
        ignore = [int(j) for j in ids_here if j and (int(j) in members or solid[j] or (rules and rule[j]))]
        if not ignore:
            return total
        return total - int(np.isin(window, ignore).sum())

    words: list[tuple[IntBox, list[int]]] = []
    for cid in ids[glyph]:
        cid = int(cid)
        gx1, gy1, gx2, gy2 = int(x[cid]), int(y[cid]), int(x[cid] + w[cid]), int(y[cid] + h[cid])
        gh = gy2 - gy1
        margin = max(2, round(0.45 * gh), round(0.6 * u))
        # nothing to the left (same rows)
        if foreign(gx1 - margin, gy1, gx1, gy2, [cid], rules=True) > 0:
            continue
        members = [cid, *dots(cid, gh)]
        bx1, bx2, by2 = gx1, gx2, gy2
        by1 = min(int(y[j]) for j in members)
        # grow to the right: "(a)", "1a", "ii", "A." are up to four glyphs on one line
        glyph_count = 1
        while glyph_count < 5:
            nxt = None
            for j in near_x(bx2 - 1, bx2 + 0.5 * gh + 1):
                j = int(j)
                if j in members:
                    continue
                jy1, jy2 = int(y[j]), int(y[j] + h[j])
                same_line = abs(jy2 - gy2) <= max(2.0, 0.35 * gh) and jy1 >= gy1 - 0.5 * gh
                small_mark = jy2 - jy1 <= 0.4 * gh and gy1 <= jy1 and jy2 <= gy2  # "." or ","
                if (same_line or small_mark) and w[j] <= 1.6 * h[j] + 2 and x[j] >= bx2 - 1:
                    nxt = j
                    break
            if nxt is None:
                break
            glyph_count += 1
            added = [nxt, *dots(nxt, gh)]
            members.extend(added)
            bx2 = max(bx2, max(int(x[j] + w[j]) for j in added))
            by1 = min(by1, min(int(y[j]) for j in added))
            by2 = max(by2, max(int(y[j] + h[j]) for j in added))
        if glyph_count > 4 or bx2 - bx1 > 3.2 * gh:
            continue
        # nothing just above, nor left of the dots
        if foreign(bx1 - margin, by1 - margin, bx2 + margin, by1, members) > 0:
            continue
        if by1 < gy1 and foreign(bx1 - margin, by1, bx1, gy1, members) > 0:
            continue
        # glyphs enclosed by the group (the letter inside a circled label) belong to it
        enclosed = [
            int(j)
            for j in np.unique(labels[by1:by2, bx1:bx2])
            if j
            and int(j) not in members
            and x[j] >= bx1
            and y[j] >= by1
            and x[j] + w[j] <= bx2
            and y[j] + h[j] <= by2
        ]
        if len(enclosed) > 4:
            continue  # a diagram node with a word inside, not a circled label
        words.append(((bx1, by1, bx2, by2), members + enclosed))
    return Glyphs(labels=labels, stats=stats, words=words)


def in_series(box: IntBox, stats: np.ndarray, u: float) -> bool:
    """True when glyphs of the same size line up in a column with it (axis tick labels)."""
    _, y1, x2, y2 = box
    gh = y2 - y1
    sx, sy, sw, sh = stats[1:, 0], stats[1:, 1], stats[1:, 2], stats[1:, 3]
    similar = (np.abs(sh - gh) <= max(1, 0.2 * gh)) & (sw <= 3 * gh)
    near = (np.abs(sy - y1) <= 8 * u) & (np.abs(sy - y1) >= 1.5 * gh)
    right_aligned = np.abs((sx + sw) - x2) <= 1
    return bool(int((similar & near & right_aligned).sum()) >= 2)


@dataclass
class CornerGlyph:
    """A label-like glyph group printed inside a panel near one of its corners."""

    box: IntBox  # glyphs, figure pixels (analysis scale when called from the segmenter)
    crop_box: IntBox  # region of ``keep``
    keep: np.ndarray  # True on the glyph pixels inside crop_box
    invert: bool  # light glyphs on a dark ground
    corner: str  # "tl", "tr", "bl", "br"


def corner_glyphs(
    gray: np.ndarray,
    box: IntBox,
    u: float,
    corners: tuple[str, ...] = ("tl", "tr", "bl", "br"),
    *,
    otsu: bool = True,
    grow: bool = False,
    panel_scale: bool = False,
) -> list[CornerGlyph]:
    """Isolated, high-contrast glyph groups (either polarity) near the corners inside ``box``.

    In each corner window, glyph candidates are near-white or near-black pixels (labels are
    printed in pure white or black) and, on a calm ground, the minority class of an Otsu split.
    Glyph-sized components that stand alone (nothing of their kind around them) are kept,
    together with their neighbours on the same line ("(a)", "1a").
    """
    x1, y1, x2, y2 = box
    # in a figure of images only, "glyphs" found by the text unit are texture: labels are smaller
    u = min(u, max(8.0, 0.02 * max(gray.shape)))
    side = min(x2 - x1, y2 - y1)
    # ``panel_scale``: labels sized to the panel, not to the figure's text (large letters on
    # micrographs in a figure whose only text is small), fit in the window and pass as glyphs
    tallest = max(4.0 * u, LABEL_SHARE * side) if panel_scale else 4.0 * u
    size = int(np.clip(0.3 * side, 3.0 * u, max(8.0 * u, 1.6 * tallest)))
    size = min(size, x2 - x1, y2 - y1)
    out: list[CornerGlyph] = []
    if size < 8:
        return out
    for corner in corners:
        cx1 = x1 if corner[1] == "l" else x2 - size
        cy1 = y1 if corner[0] == "t" else y2 - size
        crop = gray[cy1 : cy1 + size, cx1 : cx1 + size]
        if crop.size == 0 or int(crop.max()) - int(crop.min()) < 60:
            continue
        threshold, _ = cv2.threshold(crop, 0, 255, cv2.THRESH_BINARY + cv2.THRESH_OTSU)
        # near-white / near-black, relative to the ground: JPEG dims thin strokes of a pure white
        # glyph on a dark image (or lifts a black one on a light image) and breaks them apart
        ground = float(np.median(crop))
        light = min(230.0, max(185.0, ground + 0.7 * (255.0 - ground)))
        dark = max(30.0, min(70.0, 0.3 * ground))
        masks = [(True, crop >= light, False), (False, crop <= dark, False)]
        if otsu:
            masks += [(True, crop > threshold, True), (False, crop <= threshold, True)]
        seen: set[IntBox] = set()
        for invert, text_mask, calm in masks:
            fraction = float(text_mask.mean())
            if fraction == 0.0 or fraction > 0.3:
                continue
            for glyph in glyph_groups(crop, text_mask, u, corner, calm, grow, tallest):
                wx1, wy1, wx2, wy2 = glyph[0]
                if any(overlaps(glyph[0], other) for other in seen):
                    continue
                seen.add(glyph[0])
                px1, py1, px2, py2 = glyph[1]
                out.append(
                    CornerGlyph(
                        box=(cx1 + wx1, cy1 + wy1, cx1 + wx2, cy1 + wy2),
                        crop_box=(cx1 + px1, cy1 + py1, cx1 + px2, cy1 + py2),
                        keep=glyph[2],
                        invert=invert,
                        corner=corner,
                    )
                )
    return out


def ring_group(
    crop: np.ndarray, labels: np.ndarray, stats: np.ndarray, ring: int, inner: list[int]
) -> list[tuple[IntBox, IntBox, np.ndarray]]:
    size = crop.shape[0]
    wx1 = min(int(stats[k, 0]) for k in inner)
    wy1 = min(int(stats[k, 1]) for k in inner)
    wx2 = max(int(stats[k, 0] + stats[k, 2]) for k in inner)
    wy2 = max(int(stats[k, 1] + stats[k, 3]) for k in inner)
    if wy2 - wy1 < 4:
        return []
    pad = max(1, round(0.1 * (wy2 - wy1)))
    px1, py1 = max(0, wx1 - pad), max(0, wy1 - pad)
    px2, py2 = min(size, wx2 + pad), min(size, wy2 + pad)
    keep = np.isin(labels[py1:py2, px1:px2], inner)
    return [((wx1, wy1, wx2, wy2), (px1, py1, px2, py2), keep)]


def _edge_sliver(stat: np.ndarray, size: int) -> bool:
    """A piece of a picture's frame or of the gutter beside it, cut into bits by JPEG: at most two
    pixels thin along the window's edge. It is no glyph's neighbour."""
    bx, by, bw, bh = (int(v) for v in stat[:4])
    on_side = bw <= 2 and (bx == 0 or bx + bw >= size)
    on_top = bh <= 2 and (by == 0 or by + bh >= size)
    return on_side or on_top


def line_mates(labels: np.ndarray, stats: np.ndarray, cid: int, size: int, grow: bool) -> list[int] | None:
    """``cid`` and its neighbours on the same line, or None when something that is not on the
    line (texture, an image edge) touches the group. ``grow``: add neighbours of neighbours too
    ("(a)" seen from its "(": the "a" reaches the ")"), for reading; the segmenter, which only
    asks whether a corner holds a label, keeps to direct neighbours."""
    bx, by, bw, bh = (int(v) for v in stats[cid, :4])
    margin = max(2, round(0.35 * bh))
    # reading a group, look a little further along the line: a serif font's ")" stands apart
    reach = max(margin, round(0.5 * bh)) if grow else margin
    bottom = by + bh
    members = [cid]
    box = (bx, by, bx + bw, by + bh)
    while True:
        ring = labels[
            max(0, box[1] - margin) : min(size, box[3] + margin),
            max(0, box[0] - reach) : min(size, box[2] + reach),
        ]
        # a strip of background along the panel's edge spans the window: it is no neighbour
        others = [
            int(o)
            for o in np.unique(ring)
            if o
            and o not in members
            and max(stats[o, 2], stats[o, 3]) < 0.8 * size
            and not _edge_sliver(stats[o], size)
        ]
        mates = [
            o
            for o in others
            if abs(int(stats[o, 1] + stats[o, 3]) - bottom) <= max(2.0, 0.4 * bh) or stats[o, 3] <= 0.45 * bh
        ]
        # up to four glyphs; read after JPEG, a glyph's core may come in two or three pieces
        if len(others) > len(mates) or len(members) + len(mates) > (8 if grow else 4):
            return None
        if not mates:
            return members
        members.extend(mates)
        if not grow:
            return members
        box = (
            min(box[0], *(int(stats[k, 0]) for k in mates)),
            min(box[1], *(int(stats[k, 1]) for k in mates)),
            max(box[2], *(int(stats[k, 0] + stats[k, 2]) for k in mates)),
            max(box[3], *(int(stats[k, 1] + stats[k, 3]) for k in mates)),
        )


def glyph_groups(
    crop: np.ndarray,
    text_mask: np.ndarray,
    u: float,
    corner: str,
    calm: bool,
    grow: bool,
    tallest: float,
) -> list[tuple[IntBox, IntBox, np.ndarray]]:
    size = crop.shape[0]
    n, labels, stats, _ = cv2.connectedComponentsWithStats(text_mask.astype(np.uint8), connectivity=8)
    found: list[tuple[IntBox, IntBox, np.ndarray]] = []
    inside_ring: set[int] = set()
    for cid in range(1, n):
        bx, by, bw, bh, area = (int(v) for v in stats[cid])
        if not (max(5.0, 0.5 * u) <= bh <= tallest and bw <= 1.6 * bh + 2):
            continue
        if area < 0.45 * bw * bh and 0.7 <= bw / max(1, bh) <= 1.4:
            # a circle around the label: what it encloses is the glyph group
            ring_ids = np.unique(labels[by : by + bh, bx : bx + bw])
            inner = [
                int(o)
                for o in ring_ids
                if o
                and o != cid
                and stats[o, 0] > bx
                and stats[o, 1] > by
                and stats[o, 0] + stats[o, 2] < bx + bw
                and stats[o, 1] + stats[o, 3] < by + bh
            ]
            if inner:
                inside_ring.update(inner)
                found.extend(ring_group(crop, labels, stats, cid, inner))
                continue
        if cid in inside_ring or area < 0.12 * bw * bh:
            continue
        # near the corner; whole (not cut by the window's inner edges)
        near_x = bx <= 0.5 * size if corner[1] == "l" else bx + bw >= 0.5 * size
        near_y = by <= 0.5 * size if corner[0] == "t" else by + bh >= 0.5 * size
        if not (near_x and near_y):
            continue
        if (corner[1] == "l" and bx + bw >= size - 1) or (corner[1] == "r" and bx <= 0):
            continue
        if (corner[0] == "t" and by + bh >= size - 1) or (corner[0] == "b" and by <= 0):
            continue
        members = line_mates(labels, stats, cid, size, grow)
        group = None if members is None else standout_group(crop, labels, stats, members)
        if group is None:
            continue
        word, padded, keep, ground = group
        if calm and float(np.std(ground)) > 35:
            continue
        found.append((word, padded, keep))
    return found


def standout_group(
    crop: np.ndarray, labels: np.ndarray, stats: np.ndarray, members: list[int]
) -> tuple[IntBox, IntBox, np.ndarray, np.ndarray] | None:
    """The box of a glyph group, a padded box around it, its pixels in the padded box and the
    ground's, when it is no wider than a label and stands out from the ground (None if not)."""
    wx1 = min(int(stats[k, 0]) for k in members)
    wy1 = min(int(stats[k, 1]) for k in members)
    wx2 = max(int(stats[k, 0] + stats[k, 2]) for k in members)
    wy2 = max(int(stats[k, 1] + stats[k, 3]) for k in members)
    if wx2 - wx1 > 3.2 * (wy2 - wy1):
        return None
    pad = max(2, round(0.3 * (wy2 - wy1)))
    px1, py1 = max(0, wx1 - pad), max(0, wy1 - pad)
    px2, py2 = min(crop.shape[1], wx2 + pad), min(crop.shape[0], wy2 + pad)
    region = labels[py1:py2, px1:px2]
    keep = np.isin(region, members)
    glyph_px = crop[py1:py2, px1:px2][keep]
    ground = crop[py1:py2, px1:px2][region == 0]
    if glyph_px.size == 0 or ground.size < 4:
        return None
    if abs(float(np.median(glyph_px)) - float(np.median(ground))) < 70:
        return None
    return (wx1, wy1, wx2, wy2), (px1, py1, px2, py2), keep, ground


def without_sliver(mask: np.ndarray, box: IntBox, axis: int, before: bool) -> IntBox:
    """A piece cut off along a seam (``before``: the piece before the cut) without the 1-2 px
    of the image across the seam it may have kept (the colour step spans two pixels, JPEG
    blurs it): full lines of ink at the cut beside lines of mostly background. Left in, the
    sliver crosses the gutters of the piece, and no blank line is found along them."""
    x1, y1, x2, y2 = box
    if x2 - x1 < 8 or y2 - y1 < 8:
        return box
    ink = mask[y1:y2, x1:x2].mean(axis=axis)  # per line parallel to the cut
    order = ink[::-1] if before else ink
    strip = 0
    while strip < 2 and order[strip] >= 0.9 and float(order[strip + 1 : strip + 4].max()) <= 0.5:
        strip += 1
    if strip == 0:
        return box
    if axis == 0:
        return (x1, y1, x2 - strip, y2) if before else (x1 + strip, y1, x2, y2)
    return (x1, y1, x2, y2 - strip) if before else (x1, y1 + strip, x2, y2)
