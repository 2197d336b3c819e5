"""Panel type classifier: image (photograph, micrograph, medical image) vs plot, schematic, table.

Region mining only runs on photographic panels, as in the paper. The classifier is a small neural
network (one hidden layer) over hand-made image features computed on a copy of the crop shrunk to
at most ``WORK_SIDE`` pixels: how much near-white and near-black there is, colourfulness and colour
count, grey and colour entropy, flat areas, gradients and how axis-aligned they are, long horizontal
and vertical dark lines (axes, table rules), small dark connected components (text), noise and
texture. Its weights ship as JSON (``panel_type_model.json``, written by ``train_panel_type``);
inference is plain numpy.

    >>> kind, confidence = classify_panel(crop)   # crop: RGB uint8 (H, W, 3)
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from p2p.mining.artifacts import artifact_path
from p2p.mining.types import PANEL_TYPES

MODEL_FILE = "panel_type_model.json"
WORK_SIDE = 160

FEATURE_NAMES = (
    "white",
    "near_white",
    "black",
    "ink",
    "mid_grey",
    "sat_mean",
    "sat_frac",
    "grey_entropy",
    "colour_entropy",
    "n_colours",
    "top1_colour",
    "top3_colour",
    "flat",
    "flat_nonwhite",
    "grad_mean",
    "edge_frac",
    "axis_aligned",
    "row_line_max",
    "col_line_max",
    "long_rows",
    "long_cols",
    "text_components",
    "component_fill",
    "laplacian",
    "noise",
    "border_white",
    "hue_spread",
    "log_aspect",
    "log_area",
)


def as_rgb_uint8(crop: np.ndarray) -> np.ndarray:
    """Any 2-D/3-D array (grey, RGB, RGBA; uint8 or float 0..1 / 0..255) as RGB uint8."""
    arr = np.asarray(crop)
    if arr.ndim == 2:
        arr = arr[..., None]
    if arr.ndim != 3:
        raise ValueError(f"expected an image array, got shape {arr.shape}")
    if arr.shape[2] == 1:
        arr = np.repeat(arr, 3, axis=2)
    elif arr.shape[2] >= 4:
        arr = arr[..., :3]
    elif arr.shape[2] == 2:
        arr = np.repeat(arr[..., :1], 3, axis=2)
    if arr.dtype != np.uint8:
        a = arr.astype(np.float32)
        if a.size and float(np.nanmax(a)) <= 1.0:
            a = a * 255.0
        arr = np.clip(np.nan_to_num(a), 0, 255).astype(np.uint8)
    return arr


def _shrink(rgb: np.ndarray, side: int = WORK_SIDE) -> np.ndarray:
    h, w = rgb.shape[:2]
    big = max(h, w)
    if big <= side:
        return np.ascontiguousarray(rgb)
    step = big // (side * 2)
    if step >= 2:  # cheap decimation first, so huge crops cost little
        rgb = rgb[::step, ::step]
        h, w = rgb.shape[:2]
        big = max(h, w)
    f = side / big
    size = (max(1, round(w * f)), max(1, round(h * f)))
    return cv2.resize(np.ascontiguousarray(rgb), size, interpolation=cv2.INTER_AREA)


def _count(mask: np.ndarray) -> int:
    return int(np.count_nonzero(mask))


def _entropy(counts: np.ndarray) -> float:
    total = float(counts.sum())
    if total <= 0:
        return 0.0
    p = counts[counts > 0] / total
    return float(-(p * np.log2(p)).sum())


def panel_features(crop: np.ndarray) -> np.ndarray:
    """The feature vector (``FEATURE_NAMES`` order) of one panel crop."""
    rgb_full = as_rgb_uint8(crop)
    H, W = rgb_full.shape[:2]
    if H == 0 or W == 0:
        rgb_full = np.full((1, 1, 3), 255, np.uint8)
        H, W = 1, 1
    rgb = _shrink(rgb_full)
    h, w = rgb.shape[:2]
    n = float(h * w)
    mn = rgb.min(axis=2).astype(np.int16)
    mx = rgb.max(axis=2).astype(np.int16)
    grey = np.asarray(cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY), dtype=np.uint8)
    g16 = grey.astype(np.int16)

    white_mask = mn >= 235
    white = _count(white_mask) / n
    near_white = _count(mn >= 215) / n
    black = _count(mx <= 35) / n
    ink = _count(mn < 225) / n
    mid_grey = _count((grey > 60) & (grey < 200)) / n
    sat = (mx - mn) / np.maximum(mx, 1)
    sat_mean = float(sat.mean())
    coloured = (sat > 0.3) & (mx > 60)
    sat_frac = _count(coloured) / n

    grey_entropy = _entropy(np.bincount((grey >> 3).ravel(), minlength=32)) / 5.0
    q = (
        ((rgb[..., 0] >> 5).astype(np.int32) << 6)
        | ((rgb[..., 1] >> 5).astype(np.int32) << 3)
        | (rgb[..., 2] >> 5)
    )
    hist = np.bincount(q.ravel(), minlength=512).astype(np.float64)
    colour_entropy = _entropy(hist) / 9.0
    n_colours = math.log1p(float((hist > max(1.0, n * 0.002)).sum())) / math.log(513)
    ordered = np.sort(hist)[::-1] / n
    top1 = float(ordered[0])
    top3 = float(ordered[:3].sum())

    flat: float
    flat_nonwhite: float
    grad_mean: float
    edge_frac: float
    axis_aligned: float
    laplacian: float
    noise: float
    if h >= 2 and w >= 2:
        dx = np.abs(np.diff(g16, axis=1))[:-1, :]
        dy = np.abs(np.diff(g16, axis=0))[:, :-1]
        m = float(dx.size)
        flat_mask = (dx <= 2) & (dy <= 2)
        flat = _count(flat_mask) / m
        nonwhite = mn[:-1, :-1] < 215
        flat_nonwhite = _count(flat_mask & nonwhite) / max(1, _count(nonwhite))
        mag = dx + dy
        grad_mean = float(mag.mean()) / 255.0
        strong = mag > 40
        n_strong = _count(strong)
        edge_frac = n_strong / m
        aligned = strong & ((dx > 4 * dy) | (dy > 4 * dx))
        axis_aligned = _count(aligned) / max(1, n_strong)
        lap = cv2.Laplacian(grey, cv2.CV_16S, ksize=1)
        laplacian = math.log1p(float(np.abs(lap).mean()))
        blur = cv2.blur(grey, (3, 3)).astype(np.int16)
        noise = float(np.abs(g16 - blur)[~white_mask].mean()) / 32.0 if not white_mask.all() else 0.0
    else:
        flat = flat_nonwhite = 1.0
        grad_mean = edge_frac = axis_aligned = laplacian = noise = 0.0

    dark = grey < 150
    rows = dark.mean(axis=1)
    cols = dark.mean(axis=0)
    row_line_max = float(rows.max())
    col_line_max = float(cols.max())
    long_rows = _count(rows > 0.6) / h
    long_cols = _count(cols > 0.6) / w

    count, _, stats, _ = cv2.connectedComponentsWithStats(dark.astype(np.uint8), connectivity=8)
    if count > 1:
        st = stats[1:]
        small = (
            (st[:, cv2.CC_STAT_AREA] >= 2)
            & (st[:, cv2.CC_STAT_AREA] <= 80)
            & (st[:, cv2.CC_STAT_HEIGHT] <= 14)
        )
        text_components = math.log1p(float(small.sum()) * 1000.0 / n)
        boxes = st[:, cv2.CC_STAT_WIDTH] * st[:, cv2.CC_STAT_HEIGHT]
        component_fill = float((st[:, cv2.CC_STAT_AREA] / np.maximum(boxes, 1)).mean())
    else:
        text_components = 0.0
        component_fill = 0.0

    border = np.concatenate([mn[0], mn[-1], mn[:, 0], mn[:, -1]])
    border_white = _count(border >= 225) / border.size
    hue_spread = 0.0
    if _count(coloured) >= 10:
        hsv = cv2.cvtColor(rgb, cv2.COLOR_RGB2HSV)
        hues = np.bincount((hsv[..., 0][coloured] // 15).ravel(), minlength=12)
        hue_spread = _entropy(hues) / math.log2(12)
    log_aspect = math.log(W / H)
    log_area = math.log(float(H * W)) / 10.0
    return np.array(
        [
            white,
            near_white,
            black,
            ink,
            mid_grey,
            sat_mean,
            sat_frac,
            grey_entropy,
            colour_entropy,
            n_colours,
            top1,
            top3,
            flat,
            flat_nonwhite,
            grad_mean,
            edge_frac,
            axis_aligned,
            row_line_max,
            col_line_max,
            long_rows,
            long_cols,
            text_components,
            component_fill,
            laplacian,
            noise,
            border_white,
            hue_spread,
            log_aspect,
            log_area,
        ],
        dtype=np.float64,
    )


class PanelTypeClassifier:
    """Standardise features, then a small MLP (or logistic regression: no hidden layer) -> softmax."""

    def __init__(self, model: dict[str, Any] | None = None, path: Path | None = None) -> None:
        if model is None:
            model = _load_model(path)
        if tuple(model["features"]) != FEATURE_NAMES:
            raise ValueError("model was trained on a different feature set")
        self.classes: tuple[str, ...] = tuple(model["classes"])
        if not set(self.classes) <= set(PANEL_TYPES):
            raise ValueError(f"unknown classes in model: {self.classes}")
        self.mean = np.asarray(model["mean"], dtype=np.float64)
        self.scale = np.asarray(model["scale"], dtype=np.float64)
        self.layers = [
            (
                np.asarray(layer["W"], dtype=np.float64),
                np.asarray(layer["b"], dtype=np.float64),
                layer["activation"],
            )
            for layer in model["layers"]
        ]
        self.meta = {k: v for k, v in model.items() if k not in ("mean", "scale", "layers")}

    def predict_proba_features(self, feats: np.ndarray) -> np.ndarray:
        x = (np.atleast_2d(feats) - self.mean) / self.scale
        for weights, bias, activation in self.layers:
            x = x @ weights + bias
            if activation == "relu":
                x = np.maximum(x, 0.0)
            elif activation == "tanh":
                x = np.tanh(x)
        x = x - x.max(axis=1, keepdims=True)
        e = np.exp(x)
        return np.asarray(e / e.sum(axis=1, keepdims=True))

    def predict_proba(self, crop: np.ndarray) -> dict[str, float]:
        probs = self.predict_proba_features(panel_features(crop))[0]
        return {c: float(p) for c, p in zip(self.classes, probs, strict=True)}

    def classify(self, crop: np.ndarray) -> tuple[str, float]:
        probs = self.predict_proba_features(panel_features(crop))[0]
        best = int(np.argmax(probs))
        return self.classes[best], float(probs[best])

    __call__ = classify


def _load_model(path: Path | None) -> dict[str, Any]:
    if path is not None:
        return dict(json.loads(Path(path).read_text(encoding="utf-8")))
    text = artifact_path(MODEL_FILE).read_text(encoding="utf-8")
    return dict(json.loads(text))


@lru_cache(maxsize=1)
def default_classifier() -> PanelTypeClassifier:
    """The shipped model, loaded once."""
    return PanelTypeClassifier()


def classify_panel(crop: np.ndarray) -> tuple[str, float]:
    """(panel type, confidence) for an RGB uint8 crop; one of ``PANEL_TYPES``."""
    return default_classifier().classify(crop)
