"""Fonts that ship inside matplotlib (mpl-data/fonts/ttf), loaded by file path."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import matplotlib
from PIL import ImageFont

# name -> file in mpl-data/fonts/ttf
FONT_FILES = {
    "DejaVu Sans Bold": "DejaVuSans-Bold.ttf",
    "DejaVu Sans": "DejaVuSans.ttf",
    "DejaVu Serif Bold": "DejaVuSerif-Bold.ttf",
    "DejaVu Serif": "DejaVuSerif.ttf",
    "DejaVu Sans Mono Bold": "DejaVuSansMono-Bold.ttf",
    "DejaVu Sans Mono": "DejaVuSansMono.ttf",
    "STIX Bold": "STIXGeneralBol.ttf",
    "STIX": "STIXGeneral.ttf",
}

# Fonts for printed panel labels, with how often each is drawn (bold sans is the common case).
LABEL_FONTS = (
    ("DejaVu Sans Bold", 5.0),
    ("DejaVu Sans", 1.0),
    ("DejaVu Serif Bold", 1.5),
    ("DejaVu Serif", 0.5),
    ("DejaVu Sans Mono Bold", 0.5),
    ("STIX Bold", 1.5),
    ("STIX", 0.5),
)

# matplotlib family names for plots, and the PIL fonts used for text in diagrams and tables.
PLOT_FAMILIES = ("DejaVu Sans", "DejaVu Serif", "STIXGeneral")
BODY_FONTS = ("DejaVu Sans", "DejaVu Serif", "STIX")
BOLD_OF = {"DejaVu Sans": "DejaVu Sans Bold", "DejaVu Serif": "DejaVu Serif Bold", "STIX": "STIX Bold"}


def font_dir() -> Path:
    return Path(matplotlib.get_data_path()) / "fonts" / "ttf"


def font_path(name: str) -> Path:
    return font_dir() / FONT_FILES[name]


def text_box(font: ImageFont.FreeTypeFont, text: str) -> tuple[int, int, int, int]:
    """Integer (left, top, right, bottom) of ``text`` drawn at the origin."""
    left, top, right, bottom = font.getbbox(text)
    return int(left), int(top), int(right), int(bottom)


@lru_cache(maxsize=512)
def get_font(name: str, size: int) -> ImageFont.FreeTypeFont:
    return ImageFont.truetype(str(font_path(name)), max(4, int(size)))
