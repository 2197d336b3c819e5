"""A small learned marker detector: a fully convolutional network that finds the target points
of markers on a photographic panel and regresses, per point, the target box, the glyph box and,
for arrows and arrowheads, the direction of travel.

It complements the hand-made rules of ``markers.py`` where they fail: glyphs of a few pixels
after a figure was scaled down, thin outlines whose colour JPEG's chroma subsampling washed out,
glyphs in a hue the panel is full of, arrow heads smeared on texture. Those are appearance
questions a network trained on many rendered examples answers better than thresholds.

The design follows CenterNet: at stride 4 of the panel crop the network outputs one heat map per
marker kind whose peaks are target points (arrow tip, symbol centre, outline centre), a sub-cell
offset of the point, the target box and the glyph box as distances from the point to their four
sides (``log1p(d / 4)``, so small and large boxes weigh alike) and the unit direction vector.
The encoder is depthwise-separable (cheap enough for about 60 ms per figure on one thread) and
reaches stride 32 so that the centre of a large drawn rectangle still sees its sides; a feature
pyramid brings that context back to stride 4.

Weights ship as ``marker_net.pt`` (written by ``train_marker_net``) and are loaded once per
process. ``encode_targets`` is the exact inverse of ``decode`` so that training and inference
agree on every convention.

The same file holds the fusion model (``TreeEnsemble``, written by ``train_marker_net --fusion``):
gradient-boosted trees that score every candidate of the rules and every network peak from
measurements of both (``markers.fusion_features``) with the probability that it marks a true
target. It is evaluated here with numpy alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from p2p.mining.artifacts import artifact_path
from p2p.mining.cpu.nets import dws, fuse_batchnorm, pad_to_align, save_atomic, to_input

KINDS = ("arrow", "arrowhead", "asterisk", "star", "box", "circle", "inset")
POINTING = ("arrow", "arrowhead")
STRIDE = 4
WEIGHTS_FILE = "marker_net.pt"
ARCH = "centernet-dws-v1"

# Output channels: heat maps, then offset (2), target ltrb (4), glyph ltrb (4), direction (2).
N_KINDS = len(KINDS)
OFF = N_KINDS
TBOX = OFF + 2
GBOX = TBOX + 4
DIR = GBOX + 4
N_OUT = DIR + 2


class MarkerNetError(RuntimeError):
    """The shipped weights are missing or do not fit the network."""


class MarkerNet(nn.Module):
    def __init__(self, width: int = 32) -> None:
        super().__init__()
        w = width
        # A dense stem, then straight down: a block at stride 2 would cost more than the rest together.
        self.stem = nn.Sequential(
            nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(inplace=True)
        )
        self.s4 = nn.Sequential(dws(16, w, 2), dws(w, w), dws(w, w, dilation=2))
        self.s8 = nn.Sequential(dws(w, 48, 2), dws(48, 48))
        self.s16 = nn.Sequential(dws(48, 64, 2), dws(64, 64, dilation=2))
        self.s32 = nn.Sequential(dws(64, 96, 2), dws(96, 96, dilation=2))
        self.lat8 = nn.Conv2d(48, w, 1)
        self.lat16 = nn.Conv2d(64, w, 1)
        self.lat32 = nn.Conv2d(96, w, 1)
        self.fuse = nn.Sequential(dws(w, w), dws(w, w, dilation=2))
        self.head = nn.Conv2d(w, N_OUT, 1)
        # Rare positives: start the heat maps near 0.01 (CenterNet's prior) so the focal loss is sane.
        bias = self.head.bias
        assert bias is not None
        with torch.no_grad():
            bias.zero_()
            bias[:N_KINDS].fill_(-4.6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f4 = self.s4(self.stem(x))
        f8 = self.s8(f4)
        f16 = self.s16(f8)
        f32 = self.s32(f16)
        top = self.lat32(f32)
        top = F.interpolate(top, size=f16.shape[-2:], mode="nearest") + self.lat16(f16)
        top = F.interpolate(top, size=f8.shape[-2:], mode="nearest") + self.lat8(f8)
        top = F.interpolate(top, size=f4.shape[-2:], mode="nearest") + f4
        return self.head(self.fuse(top))


# ----------------------------------------------------------------------------- targets / decoding


@dataclass
class NetMarker:
    kind: str
    point: tuple[float, float]  # crop pixels
    target: tuple[float, float, float, float]  # crop pixels, x2/y2 exclusive
    glyph: tuple[float, float, float, float]
    score: float
    direction: float | None = None  # degrees, image coordinates, tail -> tip


def _enc_dist(d: float) -> float:
    return math.log1p(max(0.0, d) / STRIDE)


def _dec_dist(v: np.ndarray) -> np.ndarray:
    return STRIDE * np.expm1(np.clip(v, 0.0, 6.0))


def _sides(point: tuple[float, float], box: tuple[float, float, float, float]) -> list[float]:
    px, py = point
    return [_enc_dist(px - box[0]), _enc_dist(py - box[1]), _enc_dist(box[2] - px), _enc_dist(box[3] - py)]


def encode_targets(
    markers: list[dict[str, Any]], h: int, w: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Training targets for one crop of ``h`` x ``w`` pixels (multiples of ``STRIDE``).

    ``markers`` hold ``kind``, ``point`` (x, y), ``target`` and ``glyph`` (x1, y1, x2, y2,
    exclusive, crop pixels) and ``direction`` (degrees or None). Returns the heat maps
    (kinds x h/4 x w/4, Gaussian peaks of 1 at the point cells), the regression map
    (``N_OUT - N_KINDS`` x h/4 x w/4, set at the point cells only), the regression mask
    (1 x h/4 x w/4) and the direction mask (1 x h/4 x w/4, pointing kinds only). A target box
    that lies beside its point (an asterisk's structure next to it) is stretched to reach the
    point: the miner's target box must contain the point it reports.
    """
    gh, gw = h // STRIDE, w // STRIDE
    heat = np.zeros((N_KINDS, gh, gw), dtype=np.float32)
    reg = np.zeros((N_OUT - N_KINDS, gh, gw), dtype=np.float32)
    mask = np.zeros((1, gh, gw), dtype=np.float32)
    dmask = np.zeros((1, gh, gw), dtype=np.float32)
    yy, xx = np.mgrid[0:gh, 0:gw]
    for m in markers:
        px, py = m["point"]
        cx, cy = int(px // STRIDE), int(py // STRIDE)
        if not (0 <= cx < gw and 0 <= cy < gh):
            continue
        k = KINDS.index(m["kind"])
        g = m["glyph"]
        size = max(g[2] - g[0], g[3] - g[1]) / STRIDE
        sigma = float(np.clip(size / 4.0, 0.7, 3.0))
        blob = np.exp(-((xx - cx) ** 2 + (yy - cy) ** 2) / (2.0 * sigma * sigma))
        np.maximum(heat[k], blob.astype(np.float32), out=heat[k])
        reg[0, cy, cx] = px / STRIDE - cx
        reg[1, cy, cx] = py / STRIDE - cy
        reg[2:6, cy, cx] = _sides((px, py), m["target"])
        reg[6:10, cy, cx] = _sides((px, py), g)
        mask[0, cy, cx] = 1.0
        if m["kind"] in POINTING and m.get("direction") is not None:
            rad = math.radians(float(m["direction"]))
            reg[10, cy, cx] = math.cos(rad)
            reg[11, cy, cx] = math.sin(rad)
            dmask[0, cy, cx] = 1.0
    return heat, reg, mask, dmask


def decode(out: np.ndarray, threshold: float, top_k: int = 24) -> list[NetMarker]:
    """Peaks of the heat maps (a 3x3 local maximum, above ``threshold``) -> markers in crop pixels.

    ``out`` is the network output for one crop (``N_OUT`` x h/4 x w/4) with the heat maps
    already passed through the sigmoid. At most ``top_k`` peaks, best first; one kind per cell.
    """
    heat = torch.from_numpy(np.ascontiguousarray(out[:N_KINDS]))
    peak = F.max_pool2d(heat.unsqueeze(0), 3, 1, 1)[0]
    best, kind = heat.max(dim=0)
    keep = (best >= threshold) & (heat.eq(peak).any(dim=0))
    keep &= heat.gather(0, kind.unsqueeze(0))[0].eq(peak.gather(0, kind.unsqueeze(0))[0])
    ys, xs = np.nonzero(keep.numpy())
    scores = best.numpy()[ys, xs]
    order = np.argsort(-scores, kind="stable")[:top_k]
    found: list[NetMarker] = []
    for i in order:
        y, x = int(ys[i]), int(xs[i])
        k = KINDS[int(kind[y, x])]
        px = (x + float(out[OFF, y, x])) * STRIDE
        py = (y + float(out[OFF + 1, y, x])) * STRIDE
        t = [float(v) for v in _dec_dist(out[TBOX : TBOX + 4, y, x])]
        g = [float(v) for v in _dec_dist(out[GBOX : GBOX + 4, y, x])]
        direction = None
        if k in POINTING:
            direction = math.degrees(math.atan2(float(out[DIR + 1, y, x]), float(out[DIR, y, x]))) % 360.0
        found.append(
            NetMarker(
                kind=k,
                point=(px, py),
                target=(px - t[0], py - t[1], px + t[2], py + t[3]),
                glyph=(px - g[0], py - g[1], px + g[2], py + g[3]),
                score=float(scores[i]),
                direction=direction,
            )
        )
    return found


# ----------------------------------------------------------------------------- shipped weights


def weights_path() -> Path:
    return artifact_path(WEIGHTS_FILE)


def save_weights(net: MarkerNet, path: Path, meta: dict[str, Any]) -> None:
    state = {k: v.detach().clone() for k, v in net.state_dict().items()}
    save_atomic({"arch": ARCH, "kinds": list(KINDS), "state_dict": state, "meta": meta}, path)


def load_weights(path: Path) -> MarkerNet:
    """The network with the weights of ``path``; ``MarkerNetError`` naming the file otherwise."""
    if not path.is_file():
        raise MarkerNetError(f"marker network weights not found: {path} (train with train_marker_net)")
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # any unreadable file is reported the same way
        raise MarkerNetError(f"marker network weights unreadable: {path}: {exc}") from exc
    if not isinstance(blob, dict) or blob.get("arch") != ARCH or blob.get("kinds") != list(KINDS):
        raise MarkerNetError(f"marker network weights do not match the network ({ARCH}, {KINDS}): {path}")
    net = MarkerNet()
    try:
        net.load_state_dict(blob["state_dict"])
    except (RuntimeError, KeyError, TypeError) as exc:
        raise MarkerNetError(f"marker network weights do not match the network: {path}: {exc}") from exc
    net.eval()
    fuse_batchnorm(net)
    return net


@dataclass(frozen=True)
class TreeEnsemble:
    """Binary gradient-boosted trees, padded to one node table per tree (a leaf's children are
    itself, so every tree is walked ``depth`` steps): ``x <= threshold`` goes left."""

    feature: np.ndarray  # trees x nodes, int
    threshold: np.ndarray  # trees x nodes, float
    left: np.ndarray  # trees x nodes, int
    right: np.ndarray  # trees x nodes, int
    value: np.ndarray  # trees x nodes, float (leaves only)
    baseline: float
    depth: int
    names: tuple[str, ...]  # feature names, in column order

    def probability(self, x: np.ndarray) -> np.ndarray:
        """Rows of ``x`` (candidates x features) -> probability of a true marker."""
        x = np.asarray(x, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != len(self.names):
            raise ValueError(f"expected n x {len(self.names)} features, got {x.shape}")
        if x.shape[0] == 0:
            return np.zeros(0)
        # Flat indices into the node tables (tree t's node k at t * nodes + k) and into x.
        n_trees, width = self.feature.shape
        feature, threshold = self.feature.ravel(), self.threshold.ravel()
        base = (np.arange(n_trees) * width)[:, None]
        left, right = (self.left + base[:, :1]).ravel(), (self.right + base[:, :1]).ravel()
        flat_x = x.ravel()
        row_start = (np.arange(x.shape[0]) * x.shape[1])[None, :]
        node = np.broadcast_to(base, (n_trees, x.shape[0])).copy()
        for _ in range(self.depth):
            go_left = flat_x[row_start + feature[node]] <= threshold[node]
            node = np.where(go_left, left[node], right[node])
        raw = self.baseline + self.value.ravel()[node].sum(axis=0)
        return 1.0 / (1.0 + np.exp(-raw))

    def as_blob(self) -> dict[str, Any]:
        return {
            "feature": torch.from_numpy(self.feature.astype(np.int32)),
            "threshold": torch.from_numpy(self.threshold.astype(np.float64)),
            "left": torch.from_numpy(self.left.astype(np.int32)),
            "right": torch.from_numpy(self.right.astype(np.int32)),
            "value": torch.from_numpy(self.value.astype(np.float64)),
            "baseline": float(self.baseline),
            "depth": int(self.depth),
            "names": list(self.names),
        }

    @classmethod
    def from_blob(cls, blob: dict[str, Any]) -> TreeEnsemble:
        return cls(
            feature=blob["feature"].numpy().astype(np.intp),
            threshold=blob["threshold"].numpy(),
            left=blob["left"].numpy().astype(np.intp),
            right=blob["right"].numpy().astype(np.intp),
            value=blob["value"].numpy(),
            baseline=float(blob["baseline"]),
            depth=int(blob["depth"]),
            names=tuple(blob["names"]),
        )


def save_fusion(model: TreeEnsemble, path: Path) -> None:
    """Store the fusion model in the weights file ``path`` (its network weights stay)."""
    blob = torch.load(path, map_location="cpu", weights_only=True)
    blob["fusion"] = model.as_blob()
    save_atomic(blob, path)


def load_fusion(path: Path) -> TreeEnsemble:
    """The fusion model stored in ``path``; ``MarkerNetError`` naming the file otherwise."""
    if not path.is_file():
        raise MarkerNetError(f"marker network weights not found: {path} (train with train_marker_net)")
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
        return TreeEnsemble.from_blob(blob["fusion"])
    except Exception as exc:  # a file without it, or unreadable, is reported the same way
        raise MarkerNetError(
            f"marker fusion model missing or unreadable in {path}"
            f" (train with train_marker_net --fusion): {exc}"
        ) from exc


@lru_cache(maxsize=1)
def shipped_fusion() -> TreeEnsemble:
    """The shipped fusion model, loaded once per process."""
    return load_fusion(weights_path())


@lru_cache(maxsize=1)
def shipped_net() -> MarkerNet:
    """The shipped network, loaded once per process."""
    return load_weights(weights_path())


def run_net(net: MarkerNet, rgb: np.ndarray) -> np.ndarray:
    """Network output for one RGB crop (any size): heat maps through the sigmoid, ``N_OUT`` x
    ceil(h/4) x ceil(w/4) over the padded crop. Runs torch on one thread: the miner's workers
    are single-threaded processes and the speed budget is per thread."""
    x = to_input(pad_to_align(rgb))
    threads = torch.get_num_threads()
    if threads != 1:
        torch.set_num_threads(1)
    try:
        with torch.inference_mode():
            out = net(x)[0]
            out[:N_KINDS] = torch.sigmoid(out[:N_KINDS])
    finally:
        if threads != 1:
            torch.set_num_threads(threads)
    return out.numpy()


def detect(rgb: np.ndarray, threshold: float, net: MarkerNet | None = None) -> list[NetMarker]:
    """Markers the network finds on one RGB uint8 crop, crop pixels, best first."""
    h, w = rgb.shape[:2]
    found = decode(run_net(net if net is not None else shipped_net(), rgb), threshold)
    return [m for m in found if m.point[0] < w and m.point[1] < h]
