"""A panel-boundary network: where do panel edges run in a whole compound figure?

The seam splitter (``seams``) must tell a true seam between two touching panels from a strong
edge inside one image (a colour step in a micrograph, a plot's axis). Cheap measurements across
one line cannot always do it; a network that sees the whole figure can, from the panels' layout
and content on both sides. This one is fully convolutional: the figure is scaled so its longer
side is ``SIDE`` pixels and the network outputs, at stride ``STRIDE`` of that copy, the
probability that a vertical panel boundary (a panel's left or right edge) runs through each cell,
the same for horizontal boundaries (top or bottom edges) and, as a helper target that makes it
learn what a panel is, whether the cell lies inside a panel.

The encoder reuses the depthwise-separable blocks of ``marker_net`` and reaches stride 32 (the
panel a line belongs to is a question of large context); a feature pyramid brings it back to
stride 4. Weights ship as ``seam_net.pt`` (written by ``train_seam_net``), loaded once per
process.

    >>> maps = boundary_maps(rgb)                       # RGB uint8, H x W x 3
    >>> maps.line_strength((x1, y1, x2, y2), 0, offsets)  # vertical lines at x1 + offsets
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from p2p.mining.artifacts import artifact_path
from p2p.mining.cpu.nets import dws, fuse_batchnorm, pad_to_align, save_atomic, to_input

SIDE = 512  # px: the longer side of the copy the network sees
STRIDE = 4
WEIGHTS_FILE = "seam_net.pt"
ARCH = "seam-fpn-dws-v1"
MAPS = ("vertical", "horizontal", "interior")
REBUILD = "python -m p2p.mining.lab.train_seam_net (command in its docstring)"
SIGMA = 0.6  # output cells: the soft width of a boundary line in the targets

IntBox = tuple[int, int, int, int]


class SeamNetError(RuntimeError):
    """The shipped weights are missing, unreadable or do not fit the network."""


class SeamNet(nn.Module):
    def __init__(self, width: int = 24) -> None:
        super().__init__()
        w = width
        self.stem = nn.Sequential(
            nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(inplace=True)
        )
        self.s4 = nn.Sequential(dws(16, w, 2), dws(w, w))
        self.s8 = nn.Sequential(dws(w, 32, 2), dws(32, 32))
        self.s16 = nn.Sequential(dws(32, 48, 2), dws(48, 48, dilation=2))
        self.s32 = nn.Sequential(dws(48, 64, 2), dws(64, 64, dilation=2), dws(64, 64, dilation=4))
        self.lat8 = nn.Conv2d(32, w, 1)
        self.lat16 = nn.Conv2d(48, w, 1)
        self.lat32 = nn.Conv2d(64, w, 1)
        self.fuse = nn.Sequential(dws(w, w), dws(w, w, dilation=2))
        self.head = nn.Conv2d(w, len(MAPS), 1)
        bias = self.head.bias
        assert bias is not None
        with torch.no_grad():
            bias.fill_(-3.0)  # boundaries are rare: start near 5 %

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f4 = self.s4(self.stem(x))
        f8 = self.s8(f4)
        f16 = self.s16(f8)
        top = self.lat32(self.s32(f16))
        top = F.interpolate(top, size=f16.shape[-2:], mode="nearest") + self.lat16(f16)
        top = F.interpolate(top, size=f8.shape[-2:], mode="nearest") + self.lat8(f8)
        top = F.interpolate(top, size=f4.shape[-2:], mode="nearest") + f4
        return self.head(self.fuse(top))


def scale_for(h: int, w: int, side: int = SIDE) -> float:
    """Factor from figure pixels to the network's copy (longer side ``side``)."""
    return side / max(h, w)


def resize(rgb: np.ndarray, scale: float) -> np.ndarray:
    h, w = rgb.shape[:2]
    size = (max(1, round(w * scale)), max(1, round(h * scale)))
    return cv2.resize(rgb, size, interpolation=cv2.INTER_AREA if scale < 1 else cv2.INTER_LINEAR)


def encode_targets(
    boxes: list[tuple[float, float, float, float]], h: int, w: int, scale: float
) -> np.ndarray:
    """Training targets (``MAPS`` x h/STRIDE x w/STRIDE) for a copy of ``h`` x ``w`` pixels
    (multiples of ``STRIDE``) made with ``scale`` from a figure whose panels are ``boxes``
    (figure pixels, x2/y2 exclusive). A boundary is the grid line at a box's x1 or x2 (vertical)
    or y1 or y2 (horizontal); cells get ``exp(-d^2 / 2 SIGMA^2)`` of their centre's distance
    ``d`` (cells) to it, over the cells the box spans along the line."""
    gh, gw = h // STRIDE, w // STRIDE
    out = np.zeros((len(MAPS), gh, gw), dtype=np.float32)
    centre_x = np.arange(gw) + 0.5
    centre_y = np.arange(gh) + 0.5
    k = scale / STRIDE  # figure pixels -> cells
    for x1, y1, x2, y2 in boxes:
        cx1, cy1, cx2, cy2 = x1 * k, y1 * k, x2 * k, y2 * k
        rows = slice(max(0, int(np.floor(cy1))), min(gh, int(np.ceil(cy2))))
        cols = slice(max(0, int(np.floor(cx1))), min(gw, int(np.ceil(cx2))))
        for edge in (cx1, cx2):
            line = np.exp(-((centre_x - edge) ** 2) / (2 * SIGMA**2)).astype(np.float32)
            np.maximum(out[0, rows], line[None, :], out=out[0, rows])
        for edge in (cy1, cy2):
            line = np.exp(-((centre_y - edge) ** 2) / (2 * SIGMA**2)).astype(np.float32)
            np.maximum(out[1, :, cols], line[:, None], out=out[1, :, cols])
        inside_y = (centre_y > cy1) & (centre_y < cy2)
        inside_x = (centre_x > cx1) & (centre_x < cx2)
        out[2][np.ix_(inside_y, inside_x)] = 1.0
    return out


@dataclass
class BoundaryMaps:
    """The network's maps for one figure: probabilities at stride ``STRIDE`` of its copy scaled
    by ``scale`` (figure pixels times ``scale`` = copy pixels)."""

    vertical: np.ndarray  # cells_y x cells_x
    horizontal: np.ndarray
    interior: np.ndarray
    scale: float
    _widened: dict[int, np.ndarray] = field(default_factory=dict, repr=False)

    def _across_max(self, axis: int) -> np.ndarray:
        """The map of ``axis`` with each cell the max of itself and its neighbours across the line,
        as rows along the line (axis 1 transposed), cached."""
        if axis not in self._widened:
            grid = self.vertical if axis == 0 else self.horizontal.T
            padded = np.pad(grid, ((0, 0), (1, 1)), mode="edge")
            self._widened[axis] = np.maximum(np.maximum(padded[:, :-2], padded[:, 1:-1]), padded[:, 2:])
        return self._widened[axis]

    def _profiles(self, box: IntBox, axis: int, offsets: np.ndarray) -> np.ndarray:
        """Per line (rows) the widened map's cells along it within ``box`` (columns)."""
        x1, y1, x2, y2 = box
        grid = self._across_max(axis)
        k = self.scale / STRIDE
        start, across_start, across_end = (x1, y1, y2) if axis == 0 else (y1, x1, x2)
        n_along, n_across = grid.shape
        cells = np.floor((start + np.asarray(offsets, dtype=np.float64)) * k).astype(np.intp)
        # a boundary at the grid line between cells c-1 and c shows in both: take either
        cells = np.clip(cells, 0, n_across - 1)
        lo = int(np.clip(np.floor(across_start * k), 0, n_along - 1))
        hi = int(np.clip(np.ceil(across_end * k), lo + 1, n_along))
        return grid[lo:hi, cells].T

    def line_strength(self, box: IntBox, axis: int, offsets: np.ndarray) -> np.ndarray:
        """For each candidate line of ``box`` (figure pixels, x2/y2 exclusive) — axis 0: the
        vertical line at x = x1 + offset, axis 1: the horizontal line at y = y1 + offset — the
        mean boundary probability along it within the box (each cell the max over one cell
        either side across the line, which forgives placement)."""
        return self._profiles(box, axis, offsets).mean(axis=1)

    def line_share(self, box: IntBox, axis: int, offsets: np.ndarray, level: float = 0.5) -> np.ndarray:
        """As ``line_strength``, the share of the line's cells above ``level``."""
        return (self._profiles(box, axis, offsets) > level).mean(axis=1)


# ----------------------------------------------------------------------------- shipped weights


def weights_path() -> Path:
    return artifact_path(WEIGHTS_FILE)


def save_weights(net: SeamNet, path: Path, meta: dict[str, Any]) -> None:
    state = {k: v.detach().clone() for k, v in net.state_dict().items()}
    save_atomic({"arch": ARCH, "maps": list(MAPS), "side": SIDE, "state_dict": state, "meta": meta}, path)


def load_weights(path: Path) -> SeamNet:
    """The network with the weights of ``path`` (batchnorm folded); ``SeamNetError`` naming the
    file and the command that rebuilds it otherwise."""
    path = Path(path)
    net = SeamNet()
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(blob, dict) or blob.get("arch") != ARCH or blob.get("maps") != list(MAPS):
            raise ValueError(f"not {ARCH} weights with maps {MAPS}")
        net.load_state_dict(blob["state_dict"])
    except Exception as exc:  # missing, unreadable or foreign: the worker stops with this message
        reason = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise SeamNetError(
            f"seam network weights {path} are unusable ({reason}); rebuild them with {REBUILD}"
        ) from exc
    net.eval()
    fuse_batchnorm(net)
    return net


@lru_cache(maxsize=1)
def shipped_net() -> SeamNet:
    """The shipped network, loaded once per process."""
    return load_weights(weights_path())


def boundary_maps(rgb: np.ndarray, net: SeamNet | None = None) -> BoundaryMaps:
    """The boundary maps of one RGB uint8 figure (H x W x 3), from the shipped network unless
    ``net`` is given. Runs torch on one thread (the miner's workers are single-threaded)."""
    net = net if net is not None else shipped_net()
    h, w = rgb.shape[:2]
    scale = scale_for(h, w)
    small = resize(np.ascontiguousarray(rgb), scale)
    sh, sw = small.shape[:2]
    threads = torch.get_num_threads()
    if threads != 1:
        torch.set_num_threads(1)
    try:
        with torch.inference_mode():
            out = torch.sigmoid(net(to_input(pad_to_align(small)))[0]).numpy()
    finally:
        if threads != 1:
            torch.set_num_threads(threads)
    gh, gw = -(-sh // STRIDE), -(-sw // STRIDE)
    out = out[:, :gh, :gw]
    return BoundaryMaps(vertical=out[0], horizontal=out[1], interior=out[2], scale=scale)
