"""Panels split at a second label printed inside them.

Touching panels of one tone (two dark fluorescence fields, two grey scans) often reach the label
reader as one box, and the caption's count cannot tell: the same figure usually has a panel cut
along a false seam too, so the count is right and the labels are not. The labels can tell. Where a
figure prints its labels inside the panels at their top-left corners, a glyph group at the same
height as a panel's own label, further along its top edge (or below it, at the same distance from
its left edge), that reads as a label the caption names and no panel has, is the top-left label of
a panel of its own. The panel is cut just before it, along the line the panel-boundary network
(``seam_net``) believes in most near there, and the new part gets that label.

The same glyph reading as the label of the panel just beyond (right of it, or below), one with no
label in its own corner, says the side the two share was placed too far: it moves back to just
before the label.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import cv2
import numpy as np

from p2p.mining.cpu.imaging import Analysis, CornerGlyph, ink_mask
from p2p.mining.cpu.labels.read import read_glyphs
from p2p.mining.cpu.segmentation import seam_net
from p2p.mining.cpu.segmentation.seams import IntBox, cut_parts
from p2p.mining.params import LabelSplitParams, load_params
from p2p.mining.types import LabelDetection, PanelCandidate
from p2p.shared.geometry import union_box


@dataclass(frozen=True)
class _Corner:
    dx: float  # label box left minus panel left
    dy: float
    height: float  # the label's glyph height


def split_at_labels(
    image: np.ndarray,
    panels: Sequence[PanelCandidate],
    labels: Sequence[str | None],
    detections: Sequence[LabelDetection],
    *,
    named: Sequence[str],
    analysis: Analysis | None = None,
    params: LabelSplitParams | None = None,
    split_confidence: float | None = None,
) -> tuple[list[PanelCandidate], list[str | None], list[LabelDetection]]:
    """``panels`` with their ``labels`` (and the label ``detections``), each panel that holds the
    label of another panel the caption names (``named``, in the caption's spelling) and none of
    ``labels`` has, cut in two at it, and each that holds the label of the panel beyond it cut
    back to it; unchanged when nothing is found. ``analysis``: the segmenter's look at this figure;
    ``split_confidence``: the parts' confidence (``count_guided``'s, as for the count's cuts)."""
    shipped = load_params()
    p = params or shipped.label_split
    confidence = shipped.count_guided.split_confidence if split_confidence is None else split_confidence
    panels, labels, detections = list(panels), list(labels), list(detections)
    have = {label.casefold() for label in labels if label}
    missing = {name.casefold(): name for name in named if name.casefold() not in have}
    if not panels:
        return panels, labels, detections
    by_text = {d.text: d for d in detections}
    corners = {
        k: corner
        for k, label in enumerate(labels)
        if label and label in by_text and (corner := _corner_of(panels[k].box, by_text[label], p)) is not None
    }
    if not corners:
        return panels, labels, detections  # the labels are not printed inside the corners
    typical = _Corner(
        dx=float(np.median([c.dx for c in corners.values()])),
        dy=float(np.median([c.dy for c in corners.values()])),
        height=float(np.median([c.height for c in corners.values()])),
    )
    rgb = np.ascontiguousarray(image[..., :3])
    if analysis is not None and analysis.gray.shape != rgb.shape[:2]:
        analysis = None
    gray = analysis.gray if analysis else cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY)
    maps = analysis.maps if analysis else None
    ink = analysis.ink if analysis else None
    # only labelled panels: a panel without a label is as likely a table or plot whose digits and
    # letters merely look like labels (a table of numbers in a figure labelled 1-9)
    queue = [k for k, label in enumerate(labels) if label]
    while queue:
        k = queue.pop(0)
        corner = corners.get(k, typical)
        box = _int_box(panels[k].box, rgb.shape[1], rgb.shape[0])
        glyphs = _edge_glyphs(gray, box, corner, p)
        if not glyphs:
            continue
        for (axis, glyph), detection in zip(glyphs, read_glyphs(gray, [g for _, g in glyphs]), strict=True):
            if detection is None or detection.confidence < p.min_reading:
                continue
            text = detection.text.casefold()
            after = None if text in missing else _next_panel(panels, labels, corners, k, axis, text, p.touch)
            if text not in missing and after is None:
                continue
            if maps is None:
                maps = seam_net.boundary_maps(rgb)
            if ink is None:
                ink = ink_mask(rgb)
            sure = detection.confidence >= p.sure_reading
            parts = _cut(rgb, ink, maps, box, axis, glyph.box, corner, p, sure=sure, own_part=after is None)
            if parts is None:
                continue
            panels[k] = PanelCandidate(
                box=_float_box(parts[0]), confidence=min(panels[k].confidence, confidence)
            )
            if after is not None:
                # the label's panel reaches into this one: their shared side moves back to it
                joint = union_box(_float_box(parts[1]), panels[after].box)
                panels[after] = PanelCandidate(box=joint, confidence=confidence)
                corners[after] = corner
                break
            name = missing.pop(text)
            panels.append(PanelCandidate(box=_float_box(parts[1]), confidence=confidence))
            labels.append(name)
            detections.append(
                LabelDetection(
                    text=name, box=detection.box, confidence=detection.confidence, raw=detection.raw
                )
            )
            corners[len(panels) - 1] = corner
            queue += [k, len(panels) - 1]  # either part may hold a third panel
            break
    return panels, labels, detections


def _next_panel(
    panels: list[PanelCandidate],
    labels: list[str | None],
    corners: dict[int, _Corner],
    k: int,
    axis: int,
    text: str,
    touch: int,
) -> int | None:
    """The panel labelled ``text`` that touches panel ``k`` on its far side along ``axis`` (right
    of it, or below) and has no label of its own in its corner: its label is the one printed
    inside ``k``, and ``k`` took a strip of it."""
    box = panels[k].box
    for q, label in enumerate(labels):
        if q == k or q in corners or not label or label.casefold() != text:
            continue
        other = panels[q].box
        across = 1 - axis
        shared = min(box[across + 2], other[across + 2]) - max(box[across], other[across])
        if abs(other[axis] - box[axis + 2]) <= touch and shared >= 0.5 * (other[across + 2] - other[across]):
            return q
    return None


def _corner_of(
    box: tuple[float, float, float, float], detection: LabelDetection, p: LabelSplitParams
) -> _Corner | None:
    """The label's offset from the panel's top-left corner, when it is printed inside near it."""
    x1, y1, _, y2 = detection.box
    height = y2 - y1
    dx, dy = x1 - box[0], y1 - box[1]
    if height < 4 or not (0 <= dx <= p.max_offset * height and 0 <= dy <= p.max_offset * height):
        return None
    return _Corner(dx=dx, dy=dy, height=height)


def _edge_glyphs(
    gray: np.ndarray, box: IntBox, corner: _Corner, p: LabelSplitParams
) -> list[tuple[int, CornerGlyph]]:
    """Lone label-sized glyph groups along the panel's top edge at its label's height (axis 0: a
    vertical cut would fall before them) and down its left edge at its label's indent (axis 1)."""
    x1, y1, x2, y2 = box
    h = corner.height
    margin = round(p.alone * h) + 2
    span = round(p.glyph_height[1] * h) + margin
    out: list[tuple[int, CornerGlyph]] = []
    top = round(y1 + corner.dy)
    left = round(x1 + corner.dx)
    first = round(p.min_part * h)
    bands = (
        (0, (x1 + first, max(y1, top - margin), x2, top + span)),
        (1, (max(x1, left - margin), y1 + first, left + 4 * span, y2)),
    )
    for axis, (bx1, by1, bx2, by2) in bands:
        if bx2 - bx1 < h or by2 - by1 < h:
            continue
        crop = gray[by1:by2, bx1:bx2]
        for invert, mask in ((True, crop >= p.light), (False, crop <= p.dark)):
            for group, keep_box, keep in _lone_groups(mask, h, p):
                gx1, gy1, gx2, gy2 = group
                aligned = abs(by1 + gy1 - top) if axis == 0 else abs(bx1 + gx1 - left)
                if aligned > p.top_slack * h + 1:
                    continue
                kx1, ky1, kx2, ky2 = keep_box
                out.append(
                    (
                        axis,
                        CornerGlyph(
                            box=(bx1 + gx1, by1 + gy1, bx1 + gx2, by1 + gy2),
                            crop_box=(bx1 + kx1, by1 + ky1, bx1 + kx2, by1 + ky2),
                            keep=keep,
                            invert=invert,
                            corner="tl",
                        ),
                    )
                )
    return out


def _lone_groups(mask: np.ndarray, h: float, p: LabelSplitParams) -> list[tuple[IntBox, IntBox, np.ndarray]]:
    """Groups of label-sized components on one line ("(a)", "1a") with no other label-sized
    component around them: (glyph box, crop box, glyph pixels in the crop box)."""
    n, cc, stats, _ = cv2.connectedComponentsWithStats(mask.astype(np.uint8), connectivity=8)
    heights, widths = stats[:, 3], stats[:, 2]
    sized = [
        i
        for i in range(1, n)
        if p.glyph_height[0] * h <= heights[i] <= p.glyph_height[1] * h and widths[i] <= 1.6 * heights[i] + 2
    ]
    if not sized or len(sized) > 400:  # a field of label-sized blobs is texture
        return []
    out = []
    used: set[int] = set()
    gap = 0.6 * h
    for i in sorted(sized, key=lambda i: stats[i, 0]):
        if i in used:
            continue
        members = [i]
        box = [
            int(stats[i, 0]),
            int(stats[i, 1]),
            int(stats[i, 0] + stats[i, 2]),
            int(stats[i, 1] + stats[i, 3]),
        ]
        for j in sorted(sized, key=lambda j: stats[j, 0]):
            if j in used or j in members:
                continue
            jx1, jy1 = int(stats[j, 0]), int(stats[j, 1])
            jx2, jy2 = jx1 + int(stats[j, 2]), jy1 + int(stats[j, 3])
            if 0 <= jx1 - box[2] <= gap and min(jy2, box[3]) - max(jy1, box[1]) > 0.5 * min(
                jy2 - jy1, box[3] - box[1]
            ):
                members.append(j)
                box = [box[0], min(box[1], jy1), jx2, max(box[3], jy2)]
        if box[2] - box[0] > 4 * h:
            continue
        used.update(members)
        m = round(p.alone * h) + 1
        ox1, oy1 = max(0, box[0] - m), max(0, box[1] - m)
        ox2, oy2 = min(mask.shape[1], box[2] + m), min(mask.shape[0], box[3] + m)
        around = {int(v) for v in np.unique(cc[oy1:oy2, ox1:ox2])} & set(sized)
        if around - set(members):
            continue  # a letter of a word, or one of many blobs: not a lone label
        pad = max(1, round(0.08 * (box[3] - box[1])))
        kx1, ky1 = max(0, box[0] - pad), max(0, box[1] - pad)
        kx2, ky2 = min(mask.shape[1], box[2] + pad), min(mask.shape[0], box[3] + pad)
        keep = np.isin(cc[ky1:ky2, kx1:kx2], members)
        out.append(((box[0], box[1], box[2], box[3]), (kx1, ky1, kx2, ky2), keep))
    return out


def _cut(
    rgb: np.ndarray,
    ink: np.ndarray,
    maps: seam_net.BoundaryMaps,
    box: IntBox,
    axis: int,
    glyph: IntBox,
    corner: _Corner,
    p: LabelSplitParams,
    *,
    sure: bool,
    own_part: bool = True,
) -> tuple[IntBox, IntBox] | None:
    """The panel cut just before the second label's corner (the line the boundary network
    believes in most there), when it believes in it and both parts are panel-sized."""
    h = corner.height
    start = box[axis]
    expected = (glyph[0] - corner.dx if axis == 0 else glyph[1] - corner.dy) - start
    reach = max(3.0, p.reach * h)
    offsets = np.arange(max(1, round(expected - reach)), round(expected + 0.3 * h) + 1)
    length = box[axis + 2] - start
    offsets = offsets[(offsets > 0) & (offsets < length)]
    if offsets.size == 0:
        return None
    strength = maps.line_strength(box, axis, offsets.astype(np.float64))
    best = int(np.argmax(strength))
    if strength[best] >= p.min_strength:
        offset = int(offsets[best])
    elif sure:
        # two panels of one tone the network cannot tell apart: the label's own corner places the
        # line (its offset from the corner is the figure's), the sharpest colour step beside it
        offset = int(np.clip(round(expected), 1, length - 1))
    else:
        return None
    _, _, parts = cut_parts(rgb, ink, box, axis, offset)
    if len(parts) < 2:
        return None
    first, second = parts
    # the part from the label on is a panel of its own, or (``own_part`` False) a strip of the
    # label's panel that joins it, any size
    sizes = (first[axis + 2] - first[axis], second[axis + 2] - second[axis] if own_part else np.inf)
    if min(sizes) < p.min_part * h:
        return None
    if second[axis] > glyph[axis]:
        return None  # the label would lie outside its own part
    return first, second


def _int_box(box: tuple[float, float, float, float], width: int, height: int) -> IntBox:
    x1, y1, x2, y2 = box
    return (max(0, int(x1)), max(0, int(y1)), min(width, round(x2)), min(height, round(y2)))


def _float_box(box: IntBox) -> tuple[float, float, float, float]:
    return (float(box[0]), float(box[1]), float(box[2]), float(box[3]))
