"""Building blocks the CPU miner's two small networks share (the marker network and the
panel-boundary network): depthwise-separable convolutions, the input layout, padding to the
encoder's stride, BatchNorm folded into the convolutions for inference, and atomic weight files.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn.utils.fusion import fuse_conv_bn_eval

ALIGN = 32  # the encoder halves the resolution five times


def dws(cin: int, cout: int, stride: int = 1, dilation: int = 1) -> nn.Sequential:
    """Depthwise 3x3 then pointwise 1x1, each normalised; ReLU at the end."""
    return nn.Sequential(
        nn.Conv2d(cin, cin, 3, stride, padding=dilation, dilation=dilation, groups=cin, bias=False),
        nn.BatchNorm2d(cin),
        nn.Conv2d(cin, cout, 1, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU(inplace=True),
    )


def to_input(rgb: np.ndarray) -> torch.Tensor:
    """RGB uint8 N x H x W x 3 or H x W x 3 (H, W multiples of ``ALIGN``) -> N x 3 x H x W, centred."""
    arr = torch.from_numpy(np.ascontiguousarray(rgb))
    if arr.ndim == 3:
        arr = arr.unsqueeze(0)
    return (arr.permute(0, 3, 1, 2).float() - 128.0) / 64.0


def pad_to_align(rgb: np.ndarray) -> np.ndarray:
    """Edge-replicate the bottom and right so both sides are multiples of ``ALIGN``."""
    h, w = rgb.shape[:2]
    ph, pw = (-h) % ALIGN, (-w) % ALIGN
    if ph == 0 and pw == 0:
        return rgb
    return np.pad(rgb, ((0, ph), (0, pw), (0, 0)), mode="edge")


def save_atomic(blob: dict[str, Any], path: Path) -> None:
    """Write ``blob`` to a temporary file beside ``path``, then move it into place: a write cut
    short leaves the previous weights whole (the fusion model shares the network's file)."""
    path = Path(path)
    temporary = path.with_name(f".{path.name}.tmp")
    try:
        torch.save(blob, temporary)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def fuse_batchnorm(module: nn.Module) -> None:
    """Fold every BatchNorm into the convolution before it (eval only): half the passes over memory."""
    for name, child in list(module.named_children()):
        if isinstance(child, nn.Sequential):
            setattr(module, name, fused_sequence(child))
        else:
            fuse_batchnorm(child)


def fused_sequence(seq: nn.Sequential) -> nn.Sequential:
    layers = list(seq)
    fused: list[nn.Module] = []
    i = 0
    while i < len(layers):
        layer = layers[i]
        nxt = layers[i + 1] if i + 1 < len(layers) else None
        if isinstance(layer, nn.Conv2d) and isinstance(nxt, nn.BatchNorm2d):
            fused.append(fuse_conv_bn_eval(layer, nxt))
            i += 2
            continue
        if isinstance(layer, nn.Sequential):
            layer = fused_sequence(layer)
        else:
            fuse_batchnorm(layer)
        fused.append(layer)
        i += 1
    return nn.Sequential(*fused)
