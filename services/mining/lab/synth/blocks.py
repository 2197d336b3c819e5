"""Panels as real papers compose them, for the "realistic" profile (``realistic.py``).

Each block draws one printed label's worth of content into a rectangle of a shared PIL sheet and
reports its truth in the real development set's conventions: ``box`` holds the content the
conventions count (image extents, a plot's ink, everything printed under a blot's letter);
``outer`` adds what they leave out (row and column headers, headings, subplot titles, colour
bars). Rectangles are exclusive ``(x0, y0, x1, y1)`` on the sheet.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from matplotlib import colormaps
from PIL import Image, ImageDraw

from p2p.mining.lab.synth import charts, sources, vocab
from p2p.mining.lab.synth.fonts import get_font
from p2p.mining.lab.synth.util import Rect, crop_to_ink, rect_h, rect_w, union

CHANNELS = ("DAPI", "GFP", "Merge", "RIPK3", "Ki-67", "CD31", "mCherry", "Phalloidin", "Overlay")
ROW_NAMES = ("Control", "Dox", "TSZ", "WT", "KO", "DMSO", "24 h", "48 h", "siCtrl", "siRNA", "Vehicle")
BAND_NAMES = ("Actin", "GAPDH", "Flag-RIPK3", "p-MLKL", "Caspase-8", "Tubulin", "RIPK1", "FADD", "LC3-II")
KDA = ("250", "130", "100", "70", "55", "40", "35", "25", "15")
HEADINGS = ("MCF7/TO-RIPK3", "HeLa cells", "Target: mature female", "Day 7 after injury", "Young vs aged")
HEAT_MAPS = ("viridis", "magma", "inferno", "jet", "hot")


@dataclass
class Sheet:
    """The figure being drawn: one RGB PIL image, its draw handle, the scale of text on it."""

    image: Image.Image
    rng: np.random.Generator
    unit: float  # pixels per point of a 1000-px-wide figure
    font: str = "DejaVu Sans"
    draw: ImageDraw.ImageDraw = field(init=False)

    def __post_init__(self) -> None:
        self.draw = ImageDraw.Draw(self.image)

    def size(self, points: float) -> int:
        return max(7, round(points * self.unit))

    def text(self, x: float, y: float, words: str, points: float, anchor: str = "la") -> Rect:
        """Draw ``words`` at (x, y) and return their ink box."""
        font = get_font(self.font, self.size(points))
        self.draw.text((x, y), words, fill=(0, 0, 0), font=font, anchor=anchor)
        left, top, right, bottom = self.draw.textbbox((x, y), words, font=font, anchor=anchor)
        return (int(left), int(top), int(right) + 1, int(bottom) + 1)

    def text_width(self, words: str, points: float) -> int:
        return int(get_font(self.font, self.size(points)).getlength(words)) + 1

    def vertical_text(self, cx: float, cy: float, words: str, points: float) -> Rect:
        """``words`` turned 90 degrees (read bottom to top), centred on (cx, cy)."""
        font = get_font(self.font, self.size(points))
        left, top, right, bottom = font.getbbox(words)
        patch = Image.new("L", (int(right - left) + 2, int(bottom - top) + 2), 0)
        ImageDraw.Draw(patch).text((1 - left, 1 - top), words, fill=255, font=font)
        patch = patch.rotate(90, expand=True)
        x0, y0 = int(cx - patch.width / 2), int(cy - patch.height / 2)
        self.image.paste((0, 0, 0), (x0, y0), patch)
        ys, xs = np.nonzero(np.asarray(patch) >= 30)
        if xs.size == 0:
            return (x0, y0, x0 + 1, y0 + 1)
        return (x0 + int(xs.min()), y0 + int(ys.min()), x0 + int(xs.max()) + 1, y0 + int(ys.max()) + 1)

    def paste(self, pixels: np.ndarray, x: int, y: int) -> Rect:
        self.image.paste(Image.fromarray(np.ascontiguousarray(pixels)), (int(x), int(y)))
        return (int(x), int(y), int(x) + pixels.shape[1], int(y) + pixels.shape[0])


@dataclass
class Drawn:
    """One panel's truth on the sheet."""

    box: Rect
    type: str
    outer: Rect | None = None
    subtypes: list[str] | None = None
    parts: dict[str, list[Rect]] = field(default_factory=dict)  # sub-images, headers, colour bar ...
    words: dict[str, Any] = field(default_factory=dict)  # what the caption may say about it


def _union_all(rects: list[Rect]) -> Rect:
    out = rects[0]
    for r in rects[1:]:
        out = union(out, r)
    return out


def _with_outer(box: Rect, extras: list[Rect]) -> Rect | None:
    outer = _union_all([box, *extras]) if extras else box
    return None if outer == box else outer


def _pick(rng: np.random.Generator, items: tuple[str, ...], k: int) -> list[str]:
    return [items[i] for i in rng.permutation(len(items))[:k]]


# -- image grids ---------------------------------------------------------------------------------


def image_grid(sheet: Sheet, area: Rect) -> Drawn:
    """Rows x columns of images under one letter, column headers above, row headers at the left."""
    rng = sheet.rng
    pts = float(rng.uniform(8.5, 11.0))
    line = sheet.size(pts) + 6
    rotated = bool(rng.random() < 0.6)
    names = _pick(rng, ROW_NAMES, 4)
    row_w = line if rotated else max(sheet.text_width(n, pts) for n in names) + 8
    spanning = bool(rng.random() < 0.3)
    top = area[1] + line * (2 if spanning else 1)
    left = area[0] + row_w
    gap = int(rng.integers(2, 7))
    avail_w, avail_h = area[2] - left, area[3] - top
    rows = int(rng.integers(2, 5)) if avail_h >= 0.45 * avail_w else int(rng.integers(1, 3))
    tile_h = (avail_h - gap * (rows - 1)) // rows
    cols = int(np.clip(round((avail_w + gap) / (tile_h * float(rng.uniform(0.9, 1.4)) + gap)), 2, 6))
    tile_w = (avail_w - gap * (cols - 1)) // cols
    tile_h = max(16, min(tile_h, int(tile_w * 1.15)))
    modality = str(rng.choice(["fluorescence", "fluorescence", "ihc", "em", "phase"]))
    tiles: list[Rect] = []
    for r in range(rows):
        for c in range(cols):
            x, y = left + c * (tile_w + gap), top + r * (tile_h + gap)
            pixels, _, _ = sources.render_image(rng, tile_w, tile_h, modality)
            tiles.append(sheet.paste(pixels, x, y))
    headers = [
        sheet.text(left + c * (tile_w + gap) + tile_w / 2, top - 4, name, pts, anchor="md")
        for c, name in enumerate(_pick(rng, CHANNELS, cols))
    ]
    for r in range(rows):
        cy = top + r * (tile_h + gap) + tile_h / 2
        if rotated:
            headers.append(sheet.vertical_text(left - line / 2, cy, names[r % len(names)], pts))
        else:
            headers.append(sheet.text(left - 6, cy, names[r % len(names)], pts, anchor="rm"))
    if spanning:
        span_y = top - line - 2
        words = vocab.pick(rng, HEADINGS)
        headers.append(sheet.text((left + tiles[cols - 1][2]) / 2, span_y - 3, words, pts, anchor="md"))
        sheet.draw.line([(left, span_y), (tiles[cols - 1][2] - 1, span_y)], fill=(0, 0, 0), width=1)
        headers.append((left, span_y, tiles[cols - 1][2], span_y + 1))
    box = _union_all(tiles)
    return Drawn(
        box=box,
        type="image",
        outer=_with_outer(box, headers),
        parts={"subimages": tiles, "headers": headers},
        words={"modality": modality, "rows": rows, "cols": cols},
    )


def single_image(sheet: Sheet, area: Rect) -> Drawn:
    """One picture (what an unlabelled figure may hold beside other separate panels)."""
    return image_strip(sheet, area, k=1)


def image_strip(sheet: Sheet, area: Rect, k: int | None = None) -> Drawn:
    """One image, or two to four side by side, under one letter (no headers)."""
    rng = sheet.rng
    k = k or int(rng.choice([1, 1, 2, 3, 4]))
    gap = int(rng.integers(2, 8))
    w = (rect_w(area) - gap * (k - 1)) // k
    h = min(rect_h(area), int(w * float(rng.uniform(0.6, 1.0))) if k > 1 else rect_h(area))
    modality = sources.choose_modality(rng, exclude=("blot",))
    tiles = []
    for i in range(k):
        pixels, _, _ = sources.render_image(rng, w, h, modality)
        tiles.append(sheet.paste(pixels, area[0] + i * (w + gap), area[1]))
    return Drawn(
        box=_union_all(tiles), type="image", parts={"subimages": tiles}, words={"modality": modality}
    )


def _heat(rng: np.random.Generator, w: int, h: int, cmap: str) -> np.ndarray:
    field_ = rng.standard_normal((max(2, h // 24), max(2, w // 24))).astype(np.float32)
    small = Image.fromarray(((field_ - field_.min()) / (np.ptp(field_) + 1e-6) * 255).astype(np.uint8))
    smooth = np.asarray(small.resize((w, h), Image.Resampling.BICUBIC), dtype=np.float32) / 255.0
    rgb = colormaps[cmap](smooth * 0.85 + 0.05)[..., :3]
    return (rgb * 255).astype(np.uint8)


def image_with_colour_bar(sheet: Sheet, area: Rect) -> Drawn:
    """One or two heat-map images with a colour bar and its ticks at the right (bar out of box)."""
    rng = sheet.rng
    pts = float(rng.uniform(8.0, 10.0))
    bar_w = max(8, round(12 * sheet.unit))
    ticks_w = sheet.text_width("255", pts) + 6
    k = int(rng.integers(1, 3))
    gap = int(rng.integers(3, 9))
    img_w = rect_w(area) - bar_w - ticks_w - gap * 2
    img_h = (rect_h(area) - gap * (k - 1)) // k
    img_w = min(img_w, int(img_h * float(rng.uniform(1.0, 2.2))))
    cmap = vocab.pick(rng, HEAT_MAPS)
    tiles = [
        sheet.paste(_heat(rng, img_w, img_h, cmap), area[0], area[1] + i * (img_h + gap)) for i in range(k)
    ]
    box = _union_all(tiles)
    bx = box[2] + gap * 2
    bar_h = max(20, int(rect_h(box) * float(rng.uniform(0.5, 0.9))))
    ramp = np.linspace(1.0, 0.0, bar_h, dtype=np.float32)[:, None].repeat(bar_w, axis=1)
    bar_pixels = (colormaps[cmap](ramp * 0.9 + 0.05)[..., :3] * 255).astype(np.uint8)
    bar = sheet.paste(bar_pixels, bx, box[1])
    top_tick = sheet.text(bar[2] + 3, bar[1], str(rng.choice(["255", "1.0", "Max"])), pts, anchor="lt")
    low_tick = sheet.text(bar[2] + 3, bar[3], str(rng.choice(["0", "Min"])), pts, anchor="lb")
    return Drawn(
        box=box,
        type="image",
        outer=_with_outer(box, [bar, top_tick, low_tick]),
        parts={"subimages": tiles, "colour_bar": [bar, top_tick, low_tick]},
        words={"modality": "heat map"},
    )


# -- plots ---------------------------------------------------------------------------------------


def single_plot(sheet: Sheet, area: Rect) -> Drawn:
    pixels, info = charts.render_plot(sheet.rng, rect_w(area), rect_h(area), title=False)
    box = sheet.paste(pixels, area[0], area[1])
    return Drawn(box=box, type="plot", words={"kind": info.get("kind"), "quantity": info.get("quantity")})


def several_plots(sheet: Sheet, area: Rect) -> Drawn:
    """Two to four plots under one letter, side by side (or 2 x 2), optionally titled each."""
    rng = sheet.rng
    k = int(rng.choice([2, 2, 3, 4]))
    cols = 2 if k == 4 else k
    rows = 2 if k == 4 else 1
    gap = round(float(rng.uniform(8, 24)) * sheet.unit)
    pts = float(rng.uniform(8.0, 10.5))
    titled = bool(rng.random() < 0.4)
    title_h = sheet.size(pts) + 6 if titled else 0
    w = (rect_w(area) - gap * (cols - 1)) // cols
    h = (rect_h(area) - gap * (rows - 1)) // rows - title_h
    plots, titles = [], []
    kind = vocab.pick(rng, charts.PLOT_KINDS) if rng.random() < 0.5 else None
    for i in range(k):
        r, c = divmod(i, cols)
        x, y = area[0] + c * (w + gap), area[1] + r * (h + title_h + gap) + title_h
        pixels, _ = charts.render_plot(rng, w, max(40, h), kind=kind, title=False)
        plots.append(sheet.paste(pixels, x, y))
        if titled:
            name = vocab.pick(rng, vocab.PROTEINS)
            titles.append(sheet.text((plots[-1][0] + plots[-1][2]) / 2, plots[-1][1] - 3, name, pts, "md"))
    box = _union_all(plots)
    return Drawn(
        box=box,
        type="plot",
        outer=_with_outer(box, titles),
        parts={"subplots": plots, "titles": titles},
        words={"kind": kind or "mixed", "count": k},
    )


# -- blots ---------------------------------------------------------------------------------------


def _blot_strips(sheet: Sheet, area: Rect, lanes: int) -> tuple[list[Rect], list[Rect]]:
    """Blot strips with band names (and arrows) at the left and kDa marks at the right."""
    rng = sheet.rng
    pts = float(rng.uniform(8.0, 10.0))
    names = _pick(rng, BAND_NAMES, 3)
    name_w = max(sheet.text_width(n + " \u2192", pts) for n in names) + 4
    kda_w = sheet.text_width("-250", pts) + 4
    n = int(np.clip(rect_h(area) // max(1, round(34 * sheet.unit)), 1, 3))
    gap = int(rng.integers(4, 12))
    strip_h = max(12, min(round(40 * sheet.unit), (rect_h(area) - gap * (n - 1)) // n))
    strip_w = max(
        40, min(rect_w(area) - name_w - kda_w, lanes * round(float(rng.uniform(22, 44)) * sheet.unit))
    )
    x0 = area[0] + name_w
    strips, ink = [], []
    arrow = bool(rng.random() < 0.6)
    for i in range(n):
        y = area[1] + i * (strip_h + gap)
        pixels, _, _ = sources.render_image(rng, strip_w, strip_h, "blot")
        strips.append(sheet.paste(pixels, x0, y))
        ink.append(sheet.text(x0 - 4, y + strip_h / 2, names[i] + (" \u2192" if arrow else ""), pts, "rm"))
        ink.append(sheet.text(x0 + strip_w + 3, y + strip_h / 2, "-" + vocab.pick(rng, KDA), pts, "lm"))
    return strips, ink


def _lane_table(sheet: Sheet, x0: int, x1: int, y: int, lanes: int) -> list[Rect]:
    """Rows of +/- (or lane numbers) over the lanes, with their row names at the left; returns ink."""
    rng = sheet.rng
    pts = float(rng.uniform(8.0, 10.0))
    line = sheet.size(pts) + 5
    ink = []
    rows = int(rng.integers(1, 3))
    names = _pick(rng, ("Dox:", "Lane:", "TSZ:", "siRNA:", "IP:"), rows)
    step = (x1 - x0) / lanes
    for r in range(rows):
        cy = y + r * line + line / 2
        name = names[r]
        ink.append(sheet.text(x0 - 4, cy, name, pts, "rm"))
        for lane in range(lanes):
            mark = str(lane + 1) if name == "Lane:" else ("+" if (lane >> r) & 1 else "-")
            ink.append(sheet.text(x0 + (lane + 0.5) * step, cy, mark, pts, "mm"))
    return ink


def blot(sheet: Sheet, area: Rect) -> Drawn:
    """A western blot: lane table, strips, band names, kDa marks; all of it is the panel's box."""
    rng = sheet.rng
    lanes = int(rng.integers(2, 9))
    line = sheet.size(9) + 6
    titled = bool(rng.random() < 0.3)  # a cell-line heading over the lane table: in box (blot rule)
    table_top = area[1] + (line if titled else 0)
    table_h = round(40 * sheet.unit)
    strips, ink = _blot_strips(sheet, (area[0], table_top + table_h, area[2], area[3]), lanes)
    ink += _lane_table(sheet, strips[0][0], strips[0][2], table_top, lanes)
    if titled:
        ink.append(sheet.text((strips[0][0] + strips[0][2]) / 2, area[1], vocab.pick(rng, HEADINGS), 9, "mt"))
    box = _union_all(strips + ink)
    return Drawn(
        box=box, type="image", parts={"subimages": strips}, words={"modality": "blot", "lanes": lanes}
    )


def blot_with_chart(sheet: Sheet, area: Rect) -> Drawn:
    """A bar chart with a blot below or beside it, under one letter: one panel, typed by area."""
    rng = sheet.rng
    below = bool(rng.random() < 0.7)
    if below:
        split = area[1] + int(rect_h(area) * float(rng.uniform(0.5, 0.65)))
        chart_area, blot_area = (area[0], area[1], area[2], split), (area[0], split + 8, area[2], area[3])
    else:
        split = area[0] + int(rect_w(area) * float(rng.uniform(0.5, 0.62)))
        chart_area, blot_area = (area[0], area[1], split, area[3]), (split + 12, area[1], area[2], area[3])
    pixels, info = charts.render_plot(rng, rect_w(chart_area), rect_h(chart_area), kind="bar", title=False)
    chart = sheet.paste(pixels, chart_area[0], chart_area[1])
    part = blot(sheet, blot_area)
    box = union(chart, part.box)
    chart_size, blot_size = rect_w(chart) * rect_h(chart), rect_w(part.box) * rect_h(part.box)
    return Drawn(
        box=box,
        type="plot" if chart_size >= blot_size else "image",
        subtypes=["plot", "image"],
        parts={"chart": [chart], "blot": [part.box], "subimages": part.parts["subimages"]},
        words={"kind": "bar", "quantity": info.get("quantity"), "modality": "blot"},
    )


# -- diagrams ------------------------------------------------------------------------------------


def schematic(sheet: Sheet, area: Rect) -> Drawn:
    """A flow diagram of text boxes joined by arrows, or an illustration: one panel."""
    style = "flow" if sheet.rng.random() < 0.75 else "cartoon"
    pixels, info = charts.render_schematic(sheet.rng, rect_w(area), rect_h(area), style=style)
    box = sheet.paste(crop_to_ink(pixels), area[0], area[1])
    return Drawn(box=box, type="schematic", words={"kind": info.get("kind", style)})


BLOCKS: dict[str, Callable[[Sheet, Rect], Drawn]] = {
    "grid": image_grid,
    "image": single_image,
    "images": image_strip,
    "colour_bar": image_with_colour_bar,
    "plot": single_plot,
    "plots": several_plots,
    "blot": blot,
    "blot_chart": blot_with_chart,
    "schematic": schematic,
}
# height / width a block looks right at (a range drawn per block)
ASPECTS = {
    "grid": (0.7, 1.1),
    "image": (0.6, 0.9),
    "images": (0.35, 0.8),
    "colour_bar": (0.5, 0.9),
    "plot": (0.6, 0.85),
    "plots": (0.35, 0.55),
    "blot": (0.45, 0.75),
    "blot_chart": (0.9, 1.3),
    "schematic": (0.4, 0.75),
}


def heading(sheet: Sheet, drawn: Drawn, top: int) -> Rect | None:
    """A heading line centred over a drawn panel in the band above it (from ``top``); None if it
    would not fit inside the panel's width."""
    pts = float(sheet.rng.uniform(9.0, 11.5))
    words = vocab.pick(sheet.rng, HEADINGS)
    if sheet.text_width(words, pts) > rect_w(drawn.box) or drawn.box[1] - top < sheet.size(pts) + 4:
        return None
    return sheet.text((drawn.box[0] + drawn.box[2]) / 2, drawn.box[1] - 4, words, pts, "md")
