"""Coordinate frames between the original figure and the image Qwen2.5-VL is shown.

Qwen2.5-VL answers boxes in absolute pixels of the image its processor produced. We resize
(and crop) each view ourselves to exactly the size the processor would pick, so the processor
leaves it alone and the pixel frame the model answers in is one we know. ``ViewFrame`` records
that frame; ``interpret_boxes`` maps answers back and copes with models that answer in another
convention (normalized fractions, or pixels of the original image).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
from PIL import Image

from p2p.shared.geometry import Box, height, width

FACTOR = 28  # Qwen2.5-VL: 14-px patches merged 2x2
MIN_PIXELS = FACTOR * FACTOR * 4
MAX_PIXELS = FACTOR * FACTOR * 1280
MAX_RATIO = 200
MIN_SIDE_PX = 2.0  # boxes thinner than this in the original frame carry no content
TOLERANCE = 0.03  # how far past the frame a coordinate may stray before we doubt the convention

Mode = Literal["auto", "absolute", "normalized", "original"]


def _round_by(value: float, factor: int) -> int:
    return round(value / factor) * factor


def _floor_by(value: float, factor: int) -> int:
    return math.floor(value / factor) * factor


def _ceil_by(value: float, factor: int) -> int:
    return math.ceil(value / factor) * factor


def smart_resize(
    height: int,
    width: int,
    *,
    factor: int = FACTOR,
    min_pixels: int = MIN_PIXELS,
    max_pixels: int = MAX_PIXELS,
) -> tuple[int, int]:
    """(height, width) the Qwen2.5-VL image processor resizes an image of this size to."""
    if height <= 0 or width <= 0:
        raise ValueError(f"image size must be positive, got {height}x{width}")
    if max(height, width) / min(height, width) > MAX_RATIO:
        raise ValueError(f"aspect ratio above {MAX_RATIO}: {height}x{width}")
    h_bar = max(factor, _round_by(height, factor))
    w_bar = max(factor, _round_by(width, factor))
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar = max(factor, _floor_by(height / beta, factor))
        w_bar = max(factor, _floor_by(width / beta, factor))
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = _ceil_by(height * beta, factor)
        w_bar = _ceil_by(width * beta, factor)
    return h_bar, w_bar


def sent_size(
    height: int, width: int, *, min_pixels: int = MIN_PIXELS, max_pixels: int = MAX_PIXELS
) -> tuple[int, int]:
    """smart_resize until it no longer changes the size, so the processor will not resize again.

    For very elongated images under a small budget the factor floor on the short side pushes the
    product past max_pixels, and a second pass would shrink the long side once more.
    """
    size = (height, width)
    for _ in range(8):
        nxt = smart_resize(*size, min_pixels=min_pixels, max_pixels=max_pixels)
        if nxt == size:
            break
        size = nxt
    return size


@dataclass(frozen=True)
class ViewFrame:
    """A view sent to the model: ``crop`` of the original figure, resized to sent_width x sent_height."""

    crop: Box
    sent_width: int
    sent_height: int
    original_width: int
    original_height: int

    @property
    def crop_width(self) -> float:
        return self.crop[2] - self.crop[0]

    @property
    def crop_height(self) -> float:
        return self.crop[3] - self.crop[1]

    @property
    def scale_x(self) -> float:
        """Sent pixels per original pixel, horizontally."""
        return self.sent_width / self.crop_width

    @property
    def scale_y(self) -> float:
        return self.sent_height / self.crop_height

    def to_original(self, box: Box) -> Box:
        x0, y0 = self.crop[0], self.crop[1]
        sx, sy = self.scale_x, self.scale_y
        return (box[0] / sx + x0, box[1] / sy + y0, box[2] / sx + x0, box[3] / sy + y0)

    def from_original(self, box: Box) -> Box:
        x0, y0 = self.crop[0], self.crop[1]
        sx, sy = self.scale_x, self.scale_y
        return ((box[0] - x0) * sx, (box[1] - y0) * sy, (box[2] - x0) * sx, (box[3] - y0) * sy)


def _integer_crop(crop: Box | None, img_w: int, img_h: int) -> tuple[int, int, int, int]:
    if crop is None:
        return 0, 0, img_w, img_h
    x1, y1, x2, y2 = (round(v) for v in crop)
    x1, x2 = sorted((min(max(x1, 0), img_w), min(max(x2, 0), img_w)))
    y1, y2 = sorted((min(max(y1, 0), img_h), min(max(y2, 0), img_h)))
    if x2 - x1 < 1 or y2 - y1 < 1:
        raise ValueError(f"crop {crop} is empty inside a {img_w}x{img_h} image")
    return x1, y1, x2, y2


def prepare_view(
    image: np.ndarray,
    crop: Box | None = None,
    *,
    max_pixels: int = MAX_PIXELS,
    min_pixels: int = MIN_PIXELS,
) -> tuple[np.ndarray, ViewFrame]:
    """Crop and resize ``image`` to the size the processor keeps as is, with the frame to map back."""
    img_h, img_w = int(image.shape[0]), int(image.shape[1])
    x1, y1, x2, y2 = _integer_crop(crop, img_w, img_h)
    region = np.ascontiguousarray(image[y1:y2, x1:x2])
    crop_w, crop_h = x2 - x1, y2 - y1
    sent_h, sent_w = sent_size(crop_h, crop_w, min_pixels=min_pixels, max_pixels=max_pixels)
    if (sent_w, sent_h) != (crop_w, crop_h):
        shrinking = sent_w * sent_h < crop_w * crop_h
        resample = Image.Resampling.LANCZOS if shrinking else Image.Resampling.BICUBIC
        region = np.asarray(Image.fromarray(region).resize((sent_w, sent_h), resample=resample))
    frame = ViewFrame(
        crop=(float(x1), float(y1), float(x2), float(y2)),
        sent_width=sent_w,
        sent_height=sent_h,
        original_width=img_w,
        original_height=img_h,
    )
    return region, frame


def _detect_mode(raw: list[list[float]], frame: ViewFrame) -> Mode:
    coords = [v for box in raw for v in box]
    if not coords:
        return "absolute"
    if all(0.0 <= v <= 1.0 for v in coords):
        return "normalized"
    xs = [v for box in raw for v in box[0::2]]
    ys = [v for box in raw for v in box[1::2]]
    past_sent = max(xs) > frame.sent_width * (1 + TOLERANCE) or max(ys) > frame.sent_height * (1 + TOLERANCE)
    fits_crop = max(xs) <= frame.crop_width * (1 + TOLERANCE) and max(ys) <= frame.crop_height * (
        1 + TOLERANCE
    )
    return "original" if past_sent and fits_crop else "absolute"


def _to_original(box: Box, frame: ViewFrame, mode: Mode) -> Box:
    if mode == "normalized":
        box = (
            box[0] * frame.sent_width,
            box[1] * frame.sent_height,
            box[2] * frame.sent_width,
            box[3] * frame.sent_height,
        )
    if mode == "original":
        # Pixels of the crop at original resolution: only the crop offset is missing.
        x0, y0 = frame.crop[0], frame.crop[1]
        return (box[0] + x0, box[1] + y0, box[2] + x0, box[3] + y0)
    return frame.to_original(box)


def _clamp(box: Box, bounds: Box) -> Box:
    # Clamped in place rather than via a shifted geometry.clip so untouched coordinates stay exact.
    return (
        min(max(box[0], bounds[0]), bounds[2]),
        min(max(box[1], bounds[1]), bounds[3]),
        min(max(box[2], bounds[0]), bounds[2]),
        min(max(box[3], bounds[1]), bounds[3]),
    )


def _plural(count: int, noun: str) -> str:
    if count == 1:
        return f"1 {noun}"
    return f"{count} {noun}es" if noun.endswith("x") else f"{count} {noun}s"


def interpret_boxes(
    raw: list[list[float]], frame: ViewFrame, *, mode: Mode = "auto"
) -> tuple[list[Box | None], list[str]]:
    """Model boxes in original-figure pixels (None where a box is unusable), with notes on what was done.

    The convention is decided for the whole answer, not per box: a model answers consistently,
    and a per-box guess would misread a small box near the origin as normalized.
    """
    if mode not in ("auto", "absolute", "normalized", "original"):
        raise ValueError(f"unknown coordinate mode {mode!r}")
    well_formed = [box for box in raw if len(box) == 4 and all(math.isfinite(float(v)) for v in box)]
    chosen: Mode = _detect_mode(well_formed, frame) if mode == "auto" else mode
    notes: list[str] = []
    if chosen != "absolute":
        notes.append(
            "coordinates read as normalized"
            if chosen == "normalized"
            else "coordinates read as pixels of the original image (answer for the wrong image size)"
        )
    malformed = inverted = outside = tiny = clipped = 0
    crop = frame.crop
    out: list[Box | None] = []
    for values in raw:
        if len(values) != 4 or not all(math.isfinite(float(v)) for v in values):
            malformed += 1
            out.append(None)
            continue
        x1, y1, x2, y2 = _to_original(
            (float(values[0]), float(values[1]), float(values[2]), float(values[3])), frame, chosen
        )
        if x1 > x2 or y1 > y2:
            inverted += 1
            x1, x2 = min(x1, x2), max(x1, x2)
            y1, y2 = min(y1, y2), max(y1, y2)
        box: Box = (x1, y1, x2, y2)
        if x2 <= crop[0] or x1 >= crop[2] or y2 <= crop[1] or y1 >= crop[3]:
            outside += 1
            out.append(None)
            continue
        fitted = _clamp(box, crop)
        if fitted != box:
            clipped += 1
        if width(fitted) < MIN_SIDE_PX or height(fitted) < MIN_SIDE_PX:
            tiny += 1
            out.append(None)
            continue
        out.append(fitted)
    if malformed:
        notes.append(f"{_plural(malformed, 'malformed box')} dropped")
    if inverted:
        notes.append(f"{_plural(inverted, 'inverted box')} fixed")
    if outside:
        notes.append(f"{_plural(outside, 'box')} outside the image dropped")
    if clipped:
        notes.append(f"{_plural(clipped, 'box')} clipped to the image")
    if tiny:
        notes.append(f"{_plural(tiny, 'box')} smaller than {MIN_SIDE_PX:g} px dropped")
    return out, notes
