"""Small geometry and pixel helpers shared by the synthetic-figure generator.

Internally every rectangle is ``(x0, y0, x1, y1)`` in integer pixels with x1/y1 exclusive (like
``p2p.shared.geometry.Box``); ground truth is written with inclusive corners, as the real
development set does (``to_inclusive``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

Rect = tuple[int, int, int, int]

# Ink as the real set defines it: minimum RGB channel below 225.
INK_THRESHOLD = 225


def ink_mask(rgb: np.ndarray) -> np.ndarray:
    if rgb.ndim == 2:
        return rgb < INK_THRESHOLD
    return rgb.min(axis=2) < INK_THRESHOLD


def mask_bbox(mask: np.ndarray) -> Rect | None:
    """Tight exclusive box of the True pixels of a 2-D mask, or None when empty."""
    rows = np.flatnonzero(mask.any(axis=1))
    if rows.size == 0:
        return None
    cols = np.flatnonzero(mask.any(axis=0))
    return (int(cols[0]), int(rows[0]), int(cols[-1]) + 1, int(rows[-1]) + 1)


def crop_to_ink(rgb: np.ndarray) -> np.ndarray:
    box = mask_bbox(ink_mask(rgb))
    if box is None:
        return rgb
    return rgb[box[1] : box[3], box[0] : box[2]]


def rect_w(r: Rect) -> int:
    return r[2] - r[0]


def rect_h(r: Rect) -> int:
    return r[3] - r[1]


def translate(r: Rect, dx: int, dy: int) -> Rect:
    return (r[0] + dx, r[1] + dy, r[2] + dx, r[3] + dy)


def overlaps(a: Rect, b: Rect, pad: int = 0) -> bool:
    return a[0] - pad < b[2] and b[0] - pad < a[2] and a[1] - pad < b[3] and b[1] - pad < a[3]


def inside(inner: Rect, outer: Rect) -> bool:
    return inner[0] >= outer[0] and inner[1] >= outer[1] and inner[2] <= outer[2] and inner[3] <= outer[3]


def union(a: Rect, b: Rect) -> Rect:
    return (min(a[0], b[0]), min(a[1], b[1]), max(a[2], b[2]), max(a[3], b[3]))


def to_inclusive(r: Sequence[int]) -> list[int]:
    return [int(r[0]), int(r[1]), int(r[2]) - 1, int(r[3]) - 1]


def scale_inclusive(box: Sequence[int], sx: float, sy: float) -> list[int]:
    """Scale an inclusive box with the image: the exclusive extent scaled, then rounded."""
    x0 = math.floor(box[0] * sx + 0.5)
    y0 = math.floor(box[1] * sy + 0.5)
    x1 = math.floor((box[2] + 1) * sx + 0.5) - 1
    y1 = math.floor((box[3] + 1) * sy + 0.5) - 1
    return [x0, y0, max(x0, x1), max(y0, y1)]


def scale_point(p: Sequence[float], sx: float, sy: float) -> list[int]:
    """Scale a pixel position (pixel centres map onto pixel centres)."""
    return [math.floor((p[0] + 0.5) * sx), math.floor((p[1] + 0.5) * sy)]


def luminance(rgb: np.ndarray) -> float:
    if rgb.size == 0:
        return 255.0
    step = max(1, int(max(rgb.shape[0], rgb.shape[1]) // 64))
    rgb = rgb[::step, ::step]
    arr = rgb.reshape(-1, rgb.shape[-1]) if rgb.ndim == 3 else rgb.reshape(-1, 1)
    if arr.shape[1] == 1:
        return float(arr.mean())
    return float((arr[:, 0] * 0.299 + arr[:, 1] * 0.587 + arr[:, 2] * 0.114).mean())


def paste_alpha(canvas: np.ndarray, x: int, y: int, color: Sequence[int], alpha: np.ndarray) -> None:
    """Blend ``color`` into ``canvas`` at (x, y) with an 8-bit coverage mask (clipped to the canvas)."""
    h, w = alpha.shape
    x0, y0 = max(x, 0), max(y, 0)
    x1, y1 = min(x + w, canvas.shape[1]), min(y + h, canvas.shape[0])
    if x1 <= x0 or y1 <= y0:
        return
    a = alpha[y0 - y : y1 - y, x0 - x : x1 - x].astype(np.float32)[..., None] / 255.0
    region = canvas[y0:y1, x0:x1].astype(np.float32)
    col = np.asarray(color, dtype=np.float32)[None, None, :]
    canvas[y0:y1, x0:x1] = np.clip(region * (1.0 - a) + col * a + 0.5, 0, 255).astype(np.uint8)


def weighted(rng: np.random.Generator, table: dict[str, float]) -> str:
    """One key of ``table`` drawn with probability proportional to its value."""
    keys = list(table)
    w = np.array([table[k] for k in keys], dtype=np.float64)
    return keys[int(rng.choice(len(keys), p=w / w.sum()))]
