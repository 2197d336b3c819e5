"""Panel boxes without their printed labels, once the labels have been read.

A panel's box is its content: a label printed above or beside a plot, schematic or table is not
part of it, while a label printed on an image is the image's own pixels. The segmenter has to
guess which glyphs are labels before anything has been read, and a label it misses (a "(viii)"
in a serif face, a label standing over the plot's frame) stays in the box, which then reaches a
label's height too far and fails IoU 0.9. After OCR (``labels.find_labels``) the labels are
known, so each box is tightened to its ink without the read labels at its edges. A label on an
image changes nothing: the image's pixels round it keep the box where it was. The same pass
drops what a box took of a neighbouring image (a seam placed a pixel into its blur), which held
plot boxes tens of pixels wide of their content.
"""

from __future__ import annotations

import cv2
import numpy as np

from p2p.mining.cpu.imaging import Analysis, IntBox, ink_mask, tight_box
from p2p.mining.params import LabelTrimParams, load_params
from p2p.mining.types import LabelDetection, PanelCandidate
from p2p.shared.geometry import area, intersection


def trim_labels(
    image: np.ndarray,
    panels: list[PanelCandidate],
    labels: list[str | None],
    detections: list[LabelDetection],
    *,
    analysis: Analysis | None = None,
    params: LabelTrimParams | None = None,
) -> list[PanelCandidate]:
    """``panels`` (with ``labels``, one per panel, as assigned) with the read labels printed on
    the page at a box's edge taken out of it: the panel's own label, and any other the box
    reached over (a label in the gutter below a panel heads the next one; a label OCR misread,
    "(iii)" as "(m)", is still a label). ``analysis``: the segmenter's look at this figure."""
    p = params or load_params().label_trim
    mask, ids, stats = _ink(image, analysis)
    height, width = mask.shape
    read = [(d.text.lower(), g) for d in detections if (g := _clip(d.box, width, height)) is not None]
    size = float(np.median([g[3] - g[1] for _, g in read])) if read else 0.0  # a label's height
    out = list(panels)
    for k, (panel, label) in enumerate(zip(panels, labels, strict=True)):
        box = _clip(panel.box, width, height)
        if box is None:
            continue
        # OCR may read a "vii" as "VII", and the same text twice: the panel's own is the one on it
        own = [g for text, g in read if label and text == label.lower()]
        mine = sorted(own, key=lambda g: -intersection(g, box))[:1]
        glyphs = mine + [g for _, g in read if g not in mine and _at_edge(g, box)]
        if label and size and not any(intersection(g, box) for g in mine):
            # the panel's label not read on it (assigned from the caption's sequence, or read as
            # something else, "(viii)" as "vii"): a label-sized group heading the box, blank
            # rows under it, is that label; what was read of it goes with it
            unread = _unread_label(mask, box, size, p)
            if unread is not None:
                glyphs = [g for g in glyphs if not intersection(g, unread)] + [unread]
        trimmed = _without(mask, box, glyphs, p, _foreign(ids, stats, box, p.edge_band))
        if trimmed is not None and trimmed != box:
            x1, y1, x2, y2 = trimmed
            out[k] = PanelCandidate(
                box=(float(x1), float(y1), float(x2), float(y2)), confidence=panel.confidence
            )
    return out


def _unread_label(mask: np.ndarray, box: IntBox, size: float, p: LabelTrimParams) -> IntBox | None:
    """The glyphs heading ``box`` at its left when they look like a label of height ``size``:
    ink rows from the top as tall as a label, then blank rows, the ink no wider than a label
    ("(viii)") and starting at the box's left side."""
    x1, y1, x2, y2 = box
    rows: np.ndarray = np.asarray(mask[y1 : min(y2, y1 + round(p.unread_reach * size)), x1:x2].any(axis=1))
    if rows.size == 0 or not rows[0]:
        return None
    # the first blank row below a label's height of ink (an "i"'s dot stands apart above it)
    blank = np.flatnonzero(~rows)
    blank = blank[blank >= p.unread_height[0] * size]
    if blank.size == 0 or blank[0] > p.unread_height[1] * size:
        return None
    end = int(blank[0])
    if not (~rows[end : end + p.unread_gap]).all():
        return None
    cols = np.flatnonzero(mask[y1 : y1 + end, x1:x2].any(axis=0))
    if cols[0] > size or cols[-1] - cols[0] + 1 > p.unread_width * size:
        return None
    return (x1 + int(cols[0]), y1, x1 + int(cols[-1]) + 1, y1 + end)


def _ink(
    image: np.ndarray, analysis: Analysis | None
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """The ink mask, with the segmenter's component ids and stats when it analysed this image
    at full size (frame and specks removed)."""
    if analysis is not None and analysis.mask.shape == image.shape[:2]:
        return analysis.mask.astype(bool), analysis.glyphs.labels, analysis.glyphs.stats
    rgb = image if image.ndim == 3 else np.stack([image] * 3, axis=-1)
    return ink_mask(np.ascontiguousarray(rgb[..., :3])), None, None


def _clip(box: tuple[float, float, float, float], width: int, height: int) -> IntBox | None:
    x1, y1 = max(0, int(box[0])), max(0, int(box[1]))
    x2, y2 = min(width, int(np.ceil(box[2]))), min(height, int(np.ceil(box[3])))
    return (x1, y1, x2, y2) if x2 > x1 and y2 > y1 else None


def _at_edge(glyph: IntBox, box: IntBox) -> bool:
    """``glyph`` lies in ``box`` within its own height of one of the box's sides."""
    if intersection(glyph, box) == 0:
        return False
    reach = glyph[3] - glyph[1]
    return (
        glyph[0] - box[0] <= reach
        or glyph[1] - box[1] <= reach
        or box[2] - glyph[2] <= reach
        or box[3] - glyph[3] <= reach
    )


def _foreign(
    ids: np.ndarray | None, stats: np.ndarray | None, box: IntBox, edge_band: int
) -> np.ndarray | None:
    """Pixels along ``box``'s sides (``edge_band`` px) of ink components that reach well past it:
    a neighbouring image's edge, JPEG-blurred into the box."""
    if ids is None or stats is None:
        return None
    x1, y1, x2, y2 = box
    crop = ids[y1:y2, x1:x2]
    band = np.zeros(crop.shape, bool)
    band[:edge_band], band[-edge_band:], band[:, :edge_band], band[:, -edge_band:] = True, True, True, True
    in_band = crop[band]
    found = np.unique(in_band)
    found = found[found > 0]
    left, top = stats[found, cv2.CC_STAT_LEFT], stats[found, cv2.CC_STAT_TOP]
    right, bottom = left + stats[found, cv2.CC_STAT_WIDTH], top + stats[found, cv2.CC_STAT_HEIGHT]
    slack = edge_band
    outside = found[(left < x1 - slack) | (top < y1 - slack) | (right > x2 + slack) | (bottom > y2 + slack)]
    if not outside.size:
        return None
    foreign = np.zeros(crop.shape, bool)
    foreign[band] = np.isin(in_band, outside)  # the band only: the box's inside is never looked at
    return foreign


def _without(
    mask: np.ndarray, box: IntBox, glyphs: list[IntBox], p: LabelTrimParams, foreign: np.ndarray | None = None
) -> IntBox | None:
    """``box`` tightened to its ink once the labels' ``glyphs`` are blanked, and on each side
    the ``foreign`` pixels too when that moves the side past them (the content starts further
    in; a side that moves only across the band is the panel's own frame, joined to the
    neighbour by blur). None when the trim would take content or the content runs round a label
    (it is inside the panel, not on its edge)."""
    inside = [g for g in glyphs if intersection(g, box) > 0]
    crop = mask[box[1] : box[3], box[0] : box[2]].copy()
    for gx1, gy1, gx2, gy2 in inside:
        _blank_glyphs(crop, (gx1 - box[0], gy1 - box[1], gx2 - box[0], gy2 - box[1]), p)
    _blank_slivers(crop, p.sliver)
    whole = (0, 0, box[2] - box[0], box[3] - box[1])
    tight = tight_box(crop, whole)
    if tight is None:
        return None
    if foreign is not None:
        crop[foreign] = False
        inner = tight_box(crop, whole)
        if inner is not None:
            x1, y1, x2, y2 = (a if abs(a - b) > p.edge_band else b for a, b in zip(inner, tight, strict=True))
            tight = (x1, y1, x2, y2)
    new = (box[0] + tight[0], box[1] + tight[1], box[0] + tight[2], box[1] + tight[3])
    if area(new) < p.min_kept * area(box):
        return None
    if any(intersection(g, new) > p.max_overlap * area(g) for g in inside):
        return None
    return new


def _blank_slivers(crop: np.ndarray, sliver: int) -> None:
    """Blank the 1-2 px of a neighbouring image a box may hold along a side (a seam placed a
    pixel off, JPEG blur): full lines of ink at the side with nothing at all just inside them. A
    plot's frame is kept, since its other sides run on inside."""
    for side in (crop, crop.T):
        for lines in (side, side[::-1]):
            if lines.shape[0] < sliver + 2 or lines.shape[1] < 8:
                continue
            share = lines[: sliver + 2].mean(axis=1)
            strip = 0
            while strip < sliver and share[strip] >= 0.9:
                strip += 1
            if strip and not lines[strip : strip + 2].any():
                lines[:strip] = False


def _blank_glyphs(crop: np.ndarray, glyph: IntBox, p: LabelTrimParams) -> None:
    """Blank the label's glyphs in ``crop``: the read box padded, and whole glyph-sized ink
    components touching it (OCR boxes often miss a parenthesis or the circle round a label).
    A component larger than that (a plot frame the label stands over) keeps its pixels."""
    height, width = crop.shape
    x1, y1, x2, y2 = glyph
    size = y2 - y1
    pad = max(1, round(p.pad * size))
    px1, py1, px2, py2 = max(0, x1 - pad), max(0, y1 - pad), min(width, x2 + pad), min(height, y2 + pad)
    wx1, wy1, wx2, wy2 = max(0, x1 - size), max(0, y1 - size), min(width, x2 + size), min(height, y2 + size)
    window = crop[wy1:wy2, wx1:wx2]
    _, ids, stats, _ = cv2.connectedComponentsWithStats(window.astype(np.uint8), connectivity=8)
    touching = np.unique(ids[py1 - wy1 : py2 - wy1, px1 - wx1 : px2 - wx1])
    limit = p.glyph_reach * size
    small = [
        i
        for i in touching
        if i > 0
        and stats[i, cv2.CC_STAT_WIDTH] <= max(limit, x2 - x1 + 2 * pad)
        and stats[i, cv2.CC_STAT_HEIGHT] <= limit
    ]
    if small:
        window[np.isin(ids, small)] = False
    crop[py1:py2, px1:px2] = False
