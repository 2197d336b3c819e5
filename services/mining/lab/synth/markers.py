"""Annotation glyphs drawn on image panels, with exact geometry.

Every glyph is drawn as an 8-bit coverage mask (OpenCV, anti-aliased, sub-pixel precision) and
blended onto the panel, so its box is measured from what was drawn: ``glyph`` is the tight box of the
pixels with coverage >= ``GLYPH_THRESHOLD``. Arrows and arrowheads point at a structure: the tip is
the drawn pixel farthest along the direction of travel (coverage >= ``TIP_THRESHOLD``), and
``target_box`` is the structure (a salient region of the panel) the tip touches. Asterisks and stars
sit on or beside their structure, boxes and circles enclose it, and an inset is a framed, magnified
copy of a source region (which also gets a ``box`` marker, with optional connecting lines).
Coordinates here are panel-local; the figure assembler translates them.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import cv2
import numpy as np

from p2p.mining.lab.synth.fonts import get_font, text_box
from p2p.mining.lab.synth.util import Rect, inside, luminance, mask_bbox, overlaps, paste_alpha

GLYPH_THRESHOLD = 30
TIP_THRESHOLD = 96
SHIFT = 4  # sub-pixel bits for OpenCV drawing
ONE = 1 << SHIFT

COLORS: dict[str, tuple[int, int, int]] = {
    "white": (255, 255, 255),
    "black": (0, 0, 0),
    "yellow": (255, 225, 0),
    "red": (235, 25, 25),
    "green": (20, 220, 20),
    "cyan": (0, 225, 235),
    "magenta": (240, 20, 240),
    "orange": (255, 140, 0),
    "blue": (40, 80, 255),
}
LIGHT_ON_DARK = ("white", "yellow", "cyan", "green", "red", "magenta", "orange")
DARK_ON_LIGHT = ("black", "red", "blue", "magenta")
ARROW_STYLES = ("line", "block", "open", "thin")
TAGS = ("N", "T", "LV", "GC", "M", "V", "1", "2", "Ag", "Mn", "C", "P")


@dataclass
class MarkerDraw:
    kind: str
    glyph: Rect
    target_point: tuple[int, int]
    target_box: Rect
    color_name: str
    color: tuple[int, int, int]
    style: str
    direction_deg: float | None = None
    tag: str | None = None
    tag_box: Rect | None = None
    note: str = ""
    extra: dict[str, object] = field(default_factory=dict)
    offset: tuple[int, int] = (0, 0)  # of the drawing surface inside the panel (sub-image of a group)


class Layer:
    """An 8-bit coverage mask over a window of the panel; drawing takes panel coordinates."""

    def __init__(self, h: int, w: int, rect: Rect, pad: int = 4) -> None:
        self.ox, self.oy = max(0, rect[0] - pad), max(0, rect[1] - pad)
        x1, y1 = min(w, rect[2] + pad), min(h, rect[3] + pad)
        self.mask = np.zeros((max(1, y1 - self.oy), max(1, x1 - self.ox)), np.uint8)

    def pts(self, points: list[tuple[float, float]]) -> np.ndarray:
        arr = np.asarray(points, dtype=np.float64) - (self.ox, self.oy)
        return np.round(arr * ONE).astype(np.int32).reshape(-1, 1, 2)

    def line(self, p0: tuple[float, float], p1: tuple[float, float], thick: int) -> None:
        a = (round((p0[0] - self.ox) * ONE), round((p0[1] - self.oy) * ONE))
        b = (round((p1[0] - self.ox) * ONE), round((p1[1] - self.oy) * ONE))
        cv2.line(self.mask, a, b, 255, max(1, int(thick)), cv2.LINE_AA, SHIFT)

    def fill(self, poly: list[tuple[float, float]]) -> None:
        cv2.fillPoly(self.mask, [self.pts(poly)], 255, cv2.LINE_AA, SHIFT)

    def polyline(self, pts: list[tuple[float, float]], thick: int, smooth: bool) -> None:
        cv2.polylines(
            self.mask, [self.pts(pts)], True, 255, thick, cv2.LINE_AA if smooth else cv2.LINE_8, SHIFT
        )

    def rectangle(self, x0: int, y0: int, x1: int, y1: int, thick: int) -> None:
        """Pixel-exact outline whose outer edge runs through (x0, y0)-(x1, y1) inclusive."""
        h = thick // 2
        cv2.rectangle(
            self.mask,
            (x0 + h - self.ox, y0 + h - self.oy),
            (x1 - (thick - 1 - h) - self.ox, y1 - (thick - 1 - h) - self.oy),
            255,
            thick,
        )


def _dashed_polyline(
    layer: Layer, pts: list[tuple[float, float]], thick: int, dash: float, gap: float, closed: bool
) -> None:
    """Dashes of length ``dash`` every ``dash + gap`` pixels along the path (phase kept across corners)."""
    seq = [*pts, pts[0]] if closed else list(pts)
    period = dash + gap
    offset = 0.0
    for (x0, y0), (x1, y1) in itertools.pairwise(seq):
        length = math.hypot(x1 - x0, y1 - y0)
        if length == 0:
            continue
        ux, uy = (x1 - x0) / length, (y1 - y0) / length
        k = math.floor(offset / period)
        while k * period < offset + length:
            a = max(k * period, offset) - offset
            b = min(k * period + dash, offset + length) - offset
            if b > a:
                layer.line((x0 + ux * a, y0 + uy * a), (x0 + ux * b, y0 + uy * b), thick)
            k += 1
        offset += length


class Painter:
    """Draws markers on one image panel while keeping them clear of each other and of reserved areas."""

    def __init__(self, rng: np.random.Generator, img: np.ndarray, reserved: list[Rect]) -> None:
        self.rng = rng
        self.img = img
        self.h, self.w = img.shape[:2]
        self.occupied: list[Rect] = list(reserved)
        self._saliency: np.ndarray | None = None
        self.scale = max(0.5, min(self.w, self.h) / 250.0)

    # -- helpers -------------------------------------------------------------------------------
    def _free(self, rect: Rect, pad: int = 2) -> bool:
        if not inside(rect, (1, 1, self.w - 1, self.h - 1)):
            return False
        return not any(overlaps(rect, o, pad) for o in self.occupied)

    def _blend(
        self, layer: Layer, color: tuple[int, int, int], outline: tuple[int, int, int] | None
    ) -> Rect | None:
        mask = layer.mask
        ox, oy = layer.ox, layer.oy
        view = self.img[oy : oy + mask.shape[0], ox : ox + mask.shape[1]]
        cover = mask >= GLYPH_THRESHOLD
        if outline is not None:
            grown = cv2.dilate(mask, np.ones((3, 3), np.uint8))
            paste_alpha(view, 0, 0, outline, grown)
            cover = grown >= GLYPH_THRESHOLD
        box = mask_bbox(cover)
        if box is None:
            return None
        paste_alpha(view, 0, 0, color, mask)
        return (box[0] + ox, box[1] + oy, box[2] + ox, box[3] + oy)

    def _colour(self, region: Rect) -> tuple[str, tuple[int, int, int], tuple[int, int, int] | None]:
        x0, y0, x1, y1 = region
        lum = luminance(self.img[max(0, y0) : y1, max(0, x0) : x1])
        names = LIGHT_ON_DARK if lum < 120 else DARK_ON_LIGHT
        weights = np.array([4.0 if n in ("white", "black") else 1.0 for n in names])
        name = names[int(self.rng.choice(len(names), p=weights / weights.sum()))]
        outline = None
        if self.rng.random() < 0.15:
            outline = (0, 0, 0) if name != "black" else (255, 255, 255)
        return name, COLORS[name], outline

    def saliency(self) -> np.ndarray:
        if self._saliency is None:
            grey = self.img.astype(np.float32).mean(axis=2)
            f = 48.0 / max(self.w, self.h)
            small = cv2.resize(
                grey, (max(2, round(self.w * f)), max(2, round(self.h * f))), interpolation=cv2.INTER_AREA
            )
            small = cv2.GaussianBlur(small, (0, 0), 1.0)
            sal = np.abs(small - np.median(small)) + 1.0
            self._saliency = sal**2
        return self._saliency

    def pick_region(self, frac: tuple[float, float] = (0.07, 0.2)) -> Rect:
        sal = self.saliency()
        flat = sal.ravel() / sal.sum()
        idx = int(self.rng.choice(flat.size, p=flat))
        sy, sx = divmod(idx, sal.shape[1])
        cx = (sx + float(self.rng.random())) * self.w / sal.shape[1]
        cy = (sy + float(self.rng.random())) * self.h / sal.shape[0]
        side = max(6.0, float(self.rng.uniform(*frac)) * min(self.w, self.h))
        rw, rh = side * float(self.rng.uniform(0.75, 1.35)), side * float(self.rng.uniform(0.75, 1.35))
        x0 = int(np.clip(cx - rw / 2, 2, max(2, self.w - rw - 2)))
        y0 = int(np.clip(cy - rh / 2, 2, max(2, self.h - rh - 2)))
        return (x0, y0, min(self.w - 2, x0 + round(rw)), min(self.h - 2, y0 + round(rh)))

    # -- arrows --------------------------------------------------------------------------------
    def arrow(
        self, kind: str = "arrow", style: str | None = None, colour: str | None = None
    ) -> MarkerDraw | None:
        style = style or str(self.rng.choice(ARROW_STYLES))
        s = self.scale
        for _ in range(30):
            region = self.pick_region((0.05, 0.16))
            cx, cy = (region[0] + region[2]) / 2, (region[1] + region[3]) / 2
            theta = (
                float(self.rng.uniform(0, 360))
                if self.rng.random() < 0.5
                else 45.0 * int(self.rng.integers(8))
            )
            theta = theta % 360.0
            ux, uy = math.cos(math.radians(theta)), math.sin(math.radians(theta))
            reach = 0.5 * abs(ux) * (region[2] - region[0]) + 0.5 * abs(uy) * (region[3] - region[1])
            tip = (cx - ux * reach * 0.9, cy - uy * reach * 0.9)
            if kind == "arrowhead":
                length = float(self.rng.uniform(7, 14)) * s
            else:
                length = float(self.rng.uniform(16, 40)) * s
            tail = (tip[0] - ux * length, tip[1] - uy * length)
            pad = 6 * s
            rough = (
                int(min(tip[0], tail[0]) - pad),
                int(min(tip[1], tail[1]) - pad),
                int(max(tip[0], tail[0]) + pad) + 1,
                int(max(tip[1], tail[1]) + pad) + 1,
            )
            if not self._free(rough, 1):
                continue
            name, color, outline = colour_override(colour) or self._colour(rough)
            layer = Layer(self.h, self.w, rough)
            self._draw_arrow(layer, tip, tail, ux, uy, length, style if kind == "arrow" else "head", s)
            box = self._blend(layer, color, outline)
            if box is None:
                continue
            tip_px = _tip_pixel(layer, ux, uy, tip)
            self.occupied.append(box)
            marker = MarkerDraw(
                kind=kind,
                glyph=box,
                target_point=tip_px,
                target_box=region,
                color_name=name,
                color=color,
                style=style if kind == "arrow" else "filled head",
                direction_deg=round(theta, 1),
                note=f"{name} {style if kind == 'arrow' else ''} {kind}".replace("  ", " "),
            )
            if kind == "arrow" and self.rng.random() < 0.3:
                self._tag(marker, tail, ux, uy)
            return marker
        return None

    def _draw_arrow(
        self,
        layer: Layer,
        tip: tuple[float, float],
        tail: tuple[float, float],
        ux: float,
        uy: float,
        length: float,
        style: str,
        s: float,
    ) -> None:
        px, py = -uy, ux
        if style == "head":
            hl, hw = length, length * float(self.rng.uniform(0.6, 0.9))
            base = (tip[0] - ux * hl, tip[1] - uy * hl)
            if self.rng.random() < 0.5:  # concave "stealth" head
                notch = (tip[0] - ux * hl * 0.7, tip[1] - uy * hl * 0.7)
                poly = [
                    tip,
                    (base[0] + px * hw / 2, base[1] + py * hw / 2),
                    notch,
                    (base[0] - px * hw / 2, base[1] - py * hw / 2),
                ]
            else:
                poly = [
                    tip,
                    (base[0] + px * hw / 2, base[1] + py * hw / 2),
                    (base[0] - px * hw / 2, base[1] - py * hw / 2),
                ]
            layer.fill(poly)
            return
        thick = max(1, round(float(self.rng.uniform(1.0, 2.6)) * s)) if style != "thin" else 1
        hl = max(4.0, length * float(self.rng.uniform(0.25, 0.4)))
        hw = hl * float(self.rng.uniform(0.7, 1.0))
        if style == "thin":
            hl, hw = max(4.0, length * 0.25), max(4.0, length * 0.2)
        base = (tip[0] - ux * hl, tip[1] - uy * hl)
        if style == "block":
            sw = max(2.0, hw * 0.4)
            poly = [
                (tail[0] + px * sw / 2, tail[1] + py * sw / 2),
                (base[0] + px * sw / 2, base[1] + py * sw / 2),
                (base[0] + px * hw / 2, base[1] + py * hw / 2),
                tip,
                (base[0] - px * hw / 2, base[1] - py * hw / 2),
                (base[0] - px * sw / 2, base[1] - py * sw / 2),
                (tail[0] - px * sw / 2, tail[1] - py * sw / 2),
            ]
            layer.fill(poly)
        elif style == "open":
            back = thick * 0.5
            layer.line(tail, (tip[0] - ux * back, tip[1] - uy * back), thick)
            for sign in (1, -1):
                wing = (base[0] + sign * px * hw / 2, base[1] + sign * py * hw / 2)
                layer.line((tip[0] - ux * back, tip[1] - uy * back), wing, thick)
        else:
            layer.line(tail, (base[0] + ux, base[1] + uy), thick)
            poly = [
                tip,
                (base[0] + px * hw / 2, base[1] + py * hw / 2),
                (base[0] - px * hw / 2, base[1] - py * hw / 2),
            ]
            layer.fill(poly)

    def _tag(self, marker: MarkerDraw, tail: tuple[float, float], ux: float, uy: float) -> None:
        text = str(self.rng.choice(TAGS))
        size = max(8, round(float(self.rng.uniform(9, 13)) * self.scale))
        font = get_font("DejaVu Sans Bold" if self.rng.random() < 0.6 else "DejaVu Sans", size)
        left, top, right, bottom = text_box(font, text)
        tw, th = right - left, bottom - top
        dist = 3 + 0.5 * math.hypot(tw, th)
        cx, cy = tail[0] - ux * dist, tail[1] - uy * dist
        x0, y0 = round(cx - tw / 2), round(cy - th / 2)
        rect = (x0, y0, x0 + tw, y0 + th)
        if not self._free(rect, 1):
            return
        from PIL import Image, ImageDraw

        patch = Image.new("L", (tw, th), 0)
        ImageDraw.Draw(patch).text((-left, -top), text, fill=255, font=font)
        alpha = np.asarray(patch)
        paste_alpha(self.img, x0, y0, marker.color, alpha)
        box = mask_bbox(alpha >= GLYPH_THRESHOLD)
        if box is not None:
            rect = (x0 + box[0], y0 + box[1], x0 + box[2], y0 + box[3])
        self.occupied.append(rect)
        marker.tag, marker.tag_box = text, rect
        marker.note += f', tag "{text}"'

    # -- centre glyphs -------------------------------------------------------------------------
    def symbol(self, kind: str, colour: str | None = None) -> MarkerDraw | None:
        """An asterisk or a five-pointed star on, or right beside, a structure."""
        s = self.scale
        for _ in range(30):
            region = self.pick_region((0.06, 0.18))
            r = float(self.rng.uniform(4.5, 9.0)) * s
            cx, cy = (region[0] + region[2]) / 2, (region[1] + region[3]) / 2
            if self.rng.random() < 0.6:  # beside the structure
                phi = float(self.rng.uniform(0, 2 * math.pi))
                reach = 0.5 * max(region[2] - region[0], region[3] - region[1])
                cx, cy = cx + math.cos(phi) * (reach + r + 2), cy + math.sin(phi) * (reach + r + 2)
            rough = (int(cx - r - 2), int(cy - r - 2), int(cx + r + 3), int(cy + r + 3))
            if not self._free(rough, 1):
                continue
            name, color, outline = colour_override(colour) or self._colour(rough)
            layer = Layer(self.h, self.w, rough)
            rot = float(self.rng.uniform(0, 360)) if kind == "star" else 90.0 * int(self.rng.integers(2))
            if kind == "star":
                pts = []
                for i in range(10):
                    rad = r if i % 2 == 0 else r * 0.42
                    a = math.radians(rot + i * 36 - 90)
                    pts.append((cx + rad * math.cos(a), cy + rad * math.sin(a)))
                layer.fill(pts)
            else:
                arms = 3 if self.rng.random() < 0.75 else 4
                thick = max(1, round(r / 4))
                for i in range(arms):
                    a = math.radians(rot + i * 180.0 / arms)
                    dx, dy = r * math.cos(a), r * math.sin(a)
                    layer.line((cx - dx, cy - dy), (cx + dx, cy + dy), thick)
            box = self._blend(layer, color, outline)
            if box is None:
                continue
            self.occupied.append(box)
            centre = (int((box[0] + box[2] - 1) // 2), int((box[1] + box[3] - 1) // 2))
            return MarkerDraw(kind, box, centre, region, name, color, kind, note=f"{name} {kind}")
        return None

    def enclosure(
        self, kind: str, region: Rect | None = None, colour: str | None = None
    ) -> MarkerDraw | None:
        """A rectangle (``box``) or an ellipse (``circle``) drawn around a structure."""
        s = self.scale
        for _ in range(30):
            reg = region or self.pick_region((0.1, 0.25))
            thick = max(1, round(float(self.rng.uniform(0.8, 2.2)) * s))
            pad = thick + int(self.rng.integers(1, 4))
            if kind == "circle":
                cx, cy = (reg[0] + reg[2]) / 2, (reg[1] + reg[3]) / 2
                ax_, ay_ = (reg[2] - reg[0]) / 2 * 1.2 + pad, (reg[3] - reg[1]) / 2 * 1.2 + pad
                rough = (
                    int(cx - ax_ - thick),
                    int(cy - ay_ - thick),
                    int(cx + ax_ + thick) + 1,
                    int(cy + ay_ + thick) + 1,
                )
            else:
                rough = (
                    reg[0] - pad - thick,
                    reg[1] - pad - thick,
                    reg[2] + pad + thick,
                    reg[3] + pad + thick,
                )
            if not self._free(rough, 1):
                if region is not None:
                    return None
                continue
            name, color, _ = colour_override(colour) or self._colour(rough)
            dashed = self.rng.random() < 0.4
            layer = Layer(self.h, self.w, rough)
            if kind == "circle":
                pts = [
                    (cx + ax_ * math.cos(t), cy + ay_ * math.sin(t))
                    for t in np.linspace(0, 2 * math.pi, 72, endpoint=False)
                ]
            else:
                x0, y0, x1, y1 = reg[0] - pad, reg[1] - pad, reg[2] + pad - 1, reg[3] + pad - 1
                pts = [(x0, y0), (x1, y0), (x1, y1), (x0, y1)]
            if dashed:
                _dashed_polyline(layer, pts, thick, dash=4.0 * s + 2, gap=3.0 * s + 1, closed=True)
            else:
                layer.polyline(pts, thick, smooth=kind == "circle")
            box = self._blend(layer, color, None)
            if box is None:
                continue
            self.occupied.append(box)
            centre = (int((box[0] + box[2] - 1) // 2), int((box[1] + box[3] - 1) // 2))
            style = ("dashed " if dashed else "") + ("oval" if kind == "circle" else "rectangle")
            return MarkerDraw(kind, box, centre, reg, name, color, style, note=f"{name} {style}")
        return None

    def inset(self, colour: str | None = None) -> list[MarkerDraw]:
        """A framed, magnified copy of a source region, placed in the corner farthest from it."""
        if min(self.w, self.h) < 90:
            return []
        for _ in range(20):
            zoom = float(self.rng.uniform(2.0, 3.2))
            side = float(self.rng.uniform(0.1, 0.16)) * min(self.w, self.h)
            src = self.pick_region((side / min(self.w, self.h), side / min(self.w, self.h) + 1e-3))
            sw, sh = src[2] - src[0], src[3] - src[1]
            iw, ih = round(sw * zoom), round(sh * zoom)
            if iw > 0.48 * self.w or ih > 0.48 * self.h:
                scale = min(0.48 * self.w / iw, 0.48 * self.h / ih)
                iw, ih = round(iw * scale), round(ih * scale)
            if iw < 20 or ih < 20:
                continue
            scx, scy = (src[0] + src[2]) / 2, (src[1] + src[3]) / 2
            margin = int(self.rng.integers(0, 6))
            corners = {
                "top-left": (margin, margin),
                "top-right": (self.w - margin - iw, margin),
                "bottom-left": (margin, self.h - margin - ih),
                "bottom-right": (self.w - margin - iw, self.h - margin - ih),
            }
            order = sorted(
                corners, key=lambda k: -math.hypot(corners[k][0] + iw / 2 - scx, corners[k][1] + ih / 2 - scy)
            )
            thick = max(1, round(float(self.rng.uniform(0.8, 2.0)) * self.scale))
            for corner in order[:2]:
                ix, iy = corners[corner]
                irect = (ix, iy, ix + iw, iy + ih)
                box_rect = (src[0] - thick - 1, src[1] - thick - 1, src[2] + thick + 1, src[3] + thick + 1)
                if overlaps(irect, box_rect, 3) or any(overlaps(irect, o, 1) for o in self.occupied):
                    continue
                if not self._free(box_rect, 1):
                    continue
                name, color, _ = colour_override(colour) or self._colour(irect)
                patch = cv2.resize(
                    np.ascontiguousarray(self.img[src[1] : src[3], src[0] : src[2]]),
                    (iw, ih),
                    interpolation=cv2.INTER_CUBIC,
                )
                self.img[iy : iy + ih, ix : ix + iw] = patch
                frame = Layer(self.h, self.w, irect)
                frame.rectangle(ix, iy, ix + iw - 1, iy + ih - 1, thick)
                inset_box = self._blend(frame, color, None) or irect
                self.occupied.append(inset_box)
                inset_marker = MarkerDraw(
                    "inset",
                    inset_box,
                    (
                        int((inset_box[0] + inset_box[2] - 1) // 2),
                        int((inset_box[1] + inset_box[3] - 1) // 2),
                    ),
                    src,
                    name,
                    color,
                    "framed inset",
                    note=f"{corner} zoom-in inset ({zoom:.1f}x) of the boxed region",
                    extra={"corner": corner, "zoom": round(zoom, 2)},
                )
                box_marker = self._source_box(src, thick, name, color)
                if box_marker is None:
                    return [inset_marker]
                if self.rng.random() < 0.6:
                    self._connect(src, irect, color)
                return [inset_marker, box_marker]
        return []

    def _source_box(self, src: Rect, thick: int, name: str, color: tuple[int, int, int]) -> MarkerDraw | None:
        outer = (src[0] - thick, src[1] - thick, src[2] + thick, src[3] + thick)
        layer = Layer(self.h, self.w, outer)
        layer.rectangle(outer[0], outer[1], outer[2] - 1, outer[3] - 1, thick)
        box = self._blend(layer, color, None)
        if box is None:
            return None
        self.occupied.append(box)
        centre = (int((box[0] + box[2] - 1) // 2), int((box[1] + box[3] - 1) // 2))
        return MarkerDraw(
            "box",
            box,
            centre,
            src,
            name,
            color,
            "rectangle",
            note=f"{name} rectangle, source region of the inset",
        )

    def _connect(self, src: Rect, irect: Rect, color: tuple[int, int, int]) -> None:
        dx = (irect[0] + irect[2]) / 2 - (src[0] + src[2]) / 2
        dy = (irect[1] + irect[3]) / 2 - (src[1] + src[3]) / 2
        if (dx >= 0) == (dy >= 0):
            pairs = [
                ((src[2] - 1, src[1] - 1), (irect[2] - 1, irect[1])),
                ((src[0] - 1, src[3]), (irect[0], irect[3] - 1)),
            ]
        else:
            pairs = [
                ((src[0] - 1, src[1] - 1), (irect[0], irect[1])),
                ((src[2], src[3]), (irect[2] - 1, irect[3] - 1)),
            ]
        xs = [a[0] for a, _ in pairs] + [b[0] for _, b in pairs]
        ys = [a[1] for a, _ in pairs] + [b[1] for _, b in pairs]
        layer = Layer(self.h, self.w, (min(xs), min(ys), max(xs) + 1, max(ys) + 1))
        for a, b in pairs:
            layer.line((float(a[0]), float(a[1])), (float(b[0]), float(b[1])), 1)
        self._blend(layer, color, None)

    # -- scale bars and text overlays ----------------------------------------------------------
    def scale_bar(self, corner: str) -> tuple[Rect, str] | None:
        """A horizontal bar in a bottom corner; returns (bar box, colour name)."""
        bw = max(8, round(self.w * float(self.rng.uniform(0.12, 0.25))))
        bh = max(2, round(float(self.rng.uniform(2.0, 4.5)) * self.scale))
        margin = max(3, round(float(self.rng.uniform(4, 10)) * self.scale))
        y1 = self.h - margin
        x0 = self.w - margin - bw if corner == "right" else margin
        rect = (x0, y1 - bh, x0 + bw, y1)
        if not self._free(rect, 2):
            return None
        lum = luminance(self.img[rect[1] - 4 : rect[3] + 4, rect[0] : rect[2]])
        name = "white" if lum < 128 else "black"
        self.img[rect[1] : rect[3], rect[0] : rect[2]] = COLORS[name]
        self.occupied.append(rect)
        return rect, name

    def text_overlay(self, text: str, colour: str, corner: str) -> Rect | None:
        from PIL import Image, ImageDraw

        size = max(8, round(float(self.rng.uniform(9, 13)) * self.scale))
        font = get_font("DejaVu Sans", size)
        left, top, right, bottom = text_box(font, text)
        tw, th = right - left, bottom - top
        m = max(3, round(4 * self.scale))
        x0 = m if "left" in corner else self.w - m - tw
        y0 = m if "top" in corner else self.h - m - th
        rect = (x0, y0, x0 + tw, y0 + th)
        if not self._free(rect, 2):
            return None
        patch = Image.new("L", (tw, th), 0)
        ImageDraw.Draw(patch).text((-left, -top), text, fill=255, font=font)
        paste_alpha(self.img, x0, y0, COLORS[colour], np.asarray(patch))
        self.occupied.append(rect)
        return rect


def colour_override(name: str | None) -> tuple[str, tuple[int, int, int], None] | None:
    if name is None:
        return None
    return name, COLORS[name], None


def _tip_pixel(layer: Layer, ux: float, uy: float, tip: tuple[float, float]) -> tuple[int, int]:
    """The drawn pixel farthest along the direction of travel (ties: nearest the geometric tip)."""
    ys, xs = np.nonzero(layer.mask >= TIP_THRESHOLD)
    if xs.size == 0:
        return (round(tip[0]), round(tip[1]))
    xs, ys = xs + layer.ox, ys + layer.oy
    proj = xs * ux + ys * uy
    best = proj >= proj.max() - 0.5
    d = np.hypot(xs[best] - tip[0], ys[best] - tip[1])
    i = int(np.argmin(d))
    return (int(xs[best][i]), int(ys[best][i]))
