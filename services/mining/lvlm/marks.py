"""Set-of-mark images: numbered boxes drawn on the figure the model is shown."""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from p2p.mining.lvlm.prompts import Mark

PANEL_COLOUR = (230, 30, 30)
REGION_COLOUR = (20, 90, 230)


def draw_marks(image: np.ndarray, marks: list[Mark]) -> np.ndarray:
    """A copy of ``image`` with each mark's box outlined and its number in a filled tag."""
    canvas = Image.fromarray(np.ascontiguousarray(image)).convert("RGB")
    draw = ImageDraw.Draw(canvas)
    side = max(10, min(canvas.size) // 40)
    font = ImageFont.load_default(size=side)
    width = max(1, min(canvas.size) // 300)
    for mark in marks:
        colour = PANEL_COLOUR if mark.kind == "panel" else REGION_COLOUR
        x1, y1, x2, y2 = (round(v) for v in mark.box)
        draw.rectangle((x1, y1, max(x1, x2 - 1), max(y1, y2 - 1)), outline=colour, width=width)
        text = str(mark.number)
        left, top, right, bottom = draw.textbbox((0, 0), text, font=font)
        tag = (x1, y1, x1 + right - left + 4, y1 + bottom - top + 4)
        draw.rectangle(tag, fill=colour)
        draw.text((x1 + 2 - left, y1 + 2 - top), text, fill=(255, 255, 255), font=font)
    return np.asarray(canvas)
