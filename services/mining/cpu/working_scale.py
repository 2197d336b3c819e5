"""Large figures mined at a bounded working resolution, their results mapped back exactly.

Real figures reach 6,700 px a side; every stage's cost grows with the pixel count while what it
looks for (gutters, label glyphs, arrows) stays legible far below that. A figure whose longer
side exceeds the bound is shrunk (area averaging) so that side is the bound, mined, and every
box and point is scaled back by the exact per-axis ratio of the two sizes, then clipped to the
figure: a box at the small image's edge lands on the figure's edge.
"""

from __future__ import annotations

from dataclasses import replace

import cv2
import numpy as np

from p2p.mining.types import MiningResult
from p2p.shared import geometry

MAX_SIDE = 4000  # figures are mined at most this large (longest side), results mapped back


def shrink(image: np.ndarray, max_side: int) -> np.ndarray | None:
    """``image`` with its longer side brought down to ``max_side``; None when it is not larger."""
    height, width = image.shape[:2]
    if max_side <= 0 or max(height, width) <= max_side:
        return None
    ratio = max_side / max(height, width)
    size = (max(1, round(width * ratio)), max(1, round(height * ratio)))
    return cv2.resize(np.ascontiguousarray(image), size, interpolation=cv2.INTER_AREA)


def map_back(result: MiningResult, width: int, height: int) -> MiningResult:
    """A result found on a shrunk copy, in the pixels of the ``width`` x ``height`` figure."""
    sx, sy = width / max(1, result.width), height / max(1, result.height)

    def box(b: geometry.Box) -> geometry.Box:
        return geometry.clip(geometry.scale(b, sx, sy), width, height)

    panels = [
        replace(
            p,
            box=box(p.box),
            label_box=box(p.label_box) if p.label_box else None,
            outer_box=box(p.outer_box) if p.outer_box else None,
        )
        for p in result.panels
    ]
    markers = [
        replace(
            m,
            glyph_box=box(m.glyph_box),
            target_box=box(m.target_box),
            target_point=(min(m.target_point[0] * sx, width), min(m.target_point[1] * sy, height)),
        )
        for m in result.markers
    ]
    regions = [replace(r, box=box(r.box)) for r in result.regions]
    notes = [
        *result.notes,
        f"mined at {result.width}x{result.height} px, boxes mapped back to {width}x{height}",
    ]
    return replace(
        result, width=width, height=height, panels=panels, markers=markers, regions=regions, notes=notes
    )
