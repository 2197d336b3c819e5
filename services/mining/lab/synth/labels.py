"""Printed panel labels: sequences, print styles, decorations and rendering to a coverage patch."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw

from p2p.mining.lab.synth.fonts import get_font, text_box
from p2p.mining.lab.synth.util import Rect, mask_bbox

# Print styles: how a label of the sequence is printed. "1a" = figure number + letter.
LABEL_STYLES = ("A", "a", "(a)", "(A)", "A.", "a.", "1", "(1)", "i", "(i)", "1a")
DECORATIONS = ("plain", "circled")
ROMAN = ("i", "ii", "iii", "iv", "v", "vi", "vii", "viii", "ix", "x", "xi", "xii", "xiii", "xiv", "xv", "xvi")

# Coverage (0-255) above which a pixel counts as part of a glyph: black on white that is ink
# (min RGB < 225).
GLYPH_THRESHOLD = 30


def label_sequence(style: str, n: int, figure_number: int = 1) -> list[str]:
    """The normalised labels (no punctuation) for ``n`` panels in ``style``."""
    if style in ("A", "(A)", "A."):
        return [chr(ord("A") + i) for i in range(n)]
    if style in ("a", "(a)", "a."):
        return [chr(ord("a") + i) for i in range(n)]
    if style in ("1", "(1)"):
        return [str(i + 1) for i in range(n)]
    if style in ("i", "(i)"):
        return list(ROMAN[:n])
    if style == "1a":
        return [f"{figure_number}{chr(ord('a') + i)}" for i in range(n)]
    raise ValueError(f"unknown label style {style!r}")


def printed(style: str, label: str) -> str:
    if style.startswith("("):
        return f"({label})"
    if style.endswith("."):
        return f"{label}."
    return label


@dataclass
class LabelPatch:
    alpha: np.ndarray  # coverage of the foreground (text, and outline of a circle)
    fill_alpha: np.ndarray | None  # coverage of a circle's fill, drawn under the text
    glyph: Rect  # tight box of everything drawn, in patch coordinates

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.alpha.shape[0]), int(self.alpha.shape[1]))


def render_label(text: str, font_name: str, size: int, decoration: str = "plain") -> LabelPatch:
    font = get_font(font_name, size)
    left, top, right, bottom = text_box(font, text)
    tw, th = right - left, bottom - top
    pad = 2
    if decoration == "circled":
        diam = int(max(tw, th) * 1.25) + 6
        side = diam + 2 * pad
        fg = Image.new("L", (side, side), 0)
        fill = Image.new("L", (side, side), 0)
        ImageDraw.Draw(fill).ellipse([pad, pad, pad + diam - 1, pad + diam - 1], fill=255)
        draw = ImageDraw.Draw(fg)
        draw.ellipse([pad, pad, pad + diam - 1, pad + diam - 1], outline=255, width=max(1, size // 12))
        ox = pad + (diam - tw) / 2 - left
        oy = pad + (diam - th) / 2 - top
        draw.text((ox, oy), text, fill=255, font=font)
        fill_arr = np.asarray(fill).copy()
    else:
        fg = Image.new("L", (tw + 2 * pad, th + 2 * pad), 0)
        ImageDraw.Draw(fg).text((pad - left, pad - top), text, fill=255, font=font)
        fill_arr = None
    alpha = np.asarray(fg).copy()
    cover = alpha >= GLYPH_THRESHOLD
    if fill_arr is not None:
        cover |= fill_arr >= GLYPH_THRESHOLD
    glyph = mask_bbox(cover) or (0, 0, alpha.shape[1], alpha.shape[0])
    return LabelPatch(alpha=alpha, fill_alpha=fill_arr, glyph=glyph)
