"""The "realistic" profile: figures composed the way the real development set's figures are.

``generate_figure(seed, profile="realistic", ...)`` lands here. Where the classic profile fills a
grid of cells with one picture or chart each, this one lays out rows of blocks (``blocks.py``):
image grids with row and column headers under one letter, several plots under one letter, blots
with a chart, flow diagrams, heat maps with colour bars, headings over panels; unlabelled
figures hold one diagram or a few clearly separate panels. Then it sizes the figure as papers
and web pages serve them (2,000-7,000 px originals, 350-600 px JPEG web copies, sizes between)
and sometimes writes it with a transparent background. The truth follows the real set's
``_notes``: a panel's ``box`` leaves headers, headings, subplot titles and colour bars out and
its ``outer_box`` takes them in.
"""

from __future__ import annotations

import io
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np
from PIL import Image, ImageChops

from p2p.mining.lab.synth import sources, vocab
from p2p.mining.lab.synth.blocks import ASPECTS, BLOCKS, Drawn, Sheet, heading
from p2p.mining.lab.synth.labels import label_sequence, printed, render_label
from p2p.mining.lab.synth.util import Rect, scale_inclusive, to_inclusive, weighted

PROFILE_VERSION = "2"  # 2: sub-labelled grids (a1, a2 ... printed on each picture)
SIZE_CLASSES = {"web": (350, 600), "medium": (700, 1900), "large": (2000, 7000)}  # long side, px
SIZE_WEIGHTS = {"web": 0.25, "medium": 0.4, "large": 0.35}
LABELLED_KINDS = {
    "grid": 1.6,
    "images": 1.2,
    "colour_bar": 0.6,
    "plot": 1.6,
    "plots": 1.2,
    "blot": 0.7,
    "blot_chart": 0.8,
    "schematic": 0.8,
    "sub_grid": 0.7,
}
UNLABELLED_KINDS = {"plot": 2.0, "image": 1.0, "schematic": 0.6}  # each visually separate
HEADED = {"plot": 0.3, "plots": 0.25, "image": 0.2, "images": 0.2, "schematic": 0.3, "colour_bar": 0.3}
LABEL_STYLES = {"A": 0.6, "a": 0.25, "(a)": 0.15}
KINDS = (*BLOCKS, "sub_grid")
_ASPECTS = {**ASPECTS, "sub_grid": (0.35, 0.8)}


@dataclass
class RealisticOptions:
    """What ``generate_figure(..., profile="realistic")`` can be told; None = draw it from the seed."""

    size_class: str | None = None  # one of SIZE_CLASSES
    long_side: int | None = None  # the written figure's longer side in px (overrides size_class)
    transparent: bool | None = None  # RGBA with a transparent background (PNG figures only)
    labelled: bool | None = None
    kinds: tuple[str, ...] | None = None  # the blocks, in reading order (labelled figures)
    jpeg: bool | None = None  # JPEG round trip (web copies always get one unless told False)
    jpeg_quality: int | None = None  # its quality (implies jpeg unless jpeg is False)


def _options(options: dict[str, Any]) -> RealisticOptions:
    names = {f.name for f in fields(RealisticOptions)}
    unknown = sorted(set(options) - names)
    if unknown:
        raise TypeError(f"unknown options for the realistic profile: {', '.join(unknown)}")
    opts = RealisticOptions(**options)
    if opts.size_class not in (None, *SIZE_CLASSES):
        raise ValueError(f"size_class must be one of {tuple(SIZE_CLASSES)}")
    if opts.kinds is not None:
        opts.kinds = tuple(opts.kinds)
        if not opts.kinds or any(k not in KINDS for k in opts.kinds) or len(opts.kinds) > 9:
            raise ValueError(f"kinds must be 1 to 9 of {KINDS}")
    if opts.long_side is not None and not 200 <= opts.long_side <= 8000:
        raise ValueError("long_side must be between 200 and 8000")
    return opts


@dataclass
class _Member:
    """One sub-labelled picture of a ``sub_grid`` block: a panel of its own ("c1", "c2" ...)."""

    label: str
    box: Rect
    label_box: Rect


@dataclass
class _Block:
    kind: str
    label: str | None
    label_text: str = ""  # as printed
    cell: Rect = (0, 0, 0, 0)
    drawn: Drawn | None = None
    label_box: Rect | None = None
    heading: Rect | None = None
    members: list[_Member] | None = None  # sub_grid: the group letter is not printed, its members are


def _plan(rng: np.random.Generator, opts: RealisticOptions) -> tuple[list[_Block], str]:
    labelled = opts.labelled if opts.labelled is not None else bool(rng.random() < 0.85)
    style = weighted(rng, LABEL_STYLES) if labelled else "none"
    if opts.kinds is not None:
        kinds = list(opts.kinds)
    elif not labelled and rng.random() < 0.45:
        kinds = ["schematic"]  # one diagram, no labels: one panel
    elif not labelled:
        kinds = [weighted(rng, UNLABELLED_KINDS) for _ in range(int(rng.integers(2, 5)))]
    else:
        n = int(rng.choice([1, 2, 2, 3, 3, 4, 4, 4, 5, 6, 6, 8]))
        kinds = [weighted(rng, LABELLED_KINDS) for _ in range(n)]
    labels: list[str | None] = list(label_sequence(style.strip("()"), len(kinds))) if labelled else []
    labels += [None] * (len(kinds) - len(labels))
    return [_Block(kind=k, label=lab) for k, lab in zip(kinds, labels, strict=True)], style


def _rows(rng: np.random.Generator, n: int) -> list[int]:
    """How many blocks each row holds."""
    out: list[int] = []
    while sum(out) < n:
        out.append(min(n - sum(out), int(rng.choice([1, 2, 2, 2, 3, 3]))))
    return out


def _lay_out(rng: np.random.Generator, blocks: list[_Block], width: int, unit: float, strip: int) -> int:
    """Cells for every block (rows of blocks, wide gutters); returns the figure's height."""
    margin = round(float(rng.uniform(4, 16)) * unit)
    gutter = round(float(rng.uniform(22, 50)) * unit)
    y = margin
    start = 0
    for count in _rows(rng, len(blocks)):
        row = blocks[start : start + count]
        start += count
        weights = rng.uniform(0.8, 1.6, size=count)
        span = width - 2 * margin - gutter * (count - 1)
        widths = [int(span * w / weights.sum()) for w in weights]
        heights = [int(w * float(rng.uniform(*_ASPECTS[b.kind]))) for b, w in zip(row, widths, strict=True)]
        height = int(np.clip(np.median(heights), 110 * unit, (0.42 if count == 1 else 0.7) * width)) + strip
        x = margin
        for block, w in zip(row, widths, strict=True):
            block.cell = (x, y, x + w, y + height)
            x += w + gutter
        y += height + gutter
    return y - gutter + margin


def _draw_block(sheet: Sheet, block: _Block, strip: int, font: str, size: int) -> None:
    if block.kind == "sub_grid" and block.label is not None:
        _draw_sub_grid(sheet, block, strip, font, size)
        return
    x0, y0, x1, y1 = block.cell
    top = y0
    if block.label is not None:
        patch = render_label(block.label_text, font, size)
        g = patch.glyph
        sheet.image.paste((0, 0, 0), (x0 - g[0], y0 - g[1]), Image.fromarray(patch.alpha))
        block.label_box = (x0, y0, x0 + g[2] - g[0], y0 + g[3] - g[1])
        top = y0 + strip
    headed = sheet.rng.random() < HEADED.get(block.kind, 0.0)
    band = sheet.size(11) + 8 if headed else 0
    inset = round(6 * sheet.unit) if block.label is not None else 0
    draw = BLOCKS["images" if block.kind == "sub_grid" else block.kind]  # sub_grid unlabelled: pictures
    block.drawn = draw(sheet, (x0 + inset, top + band, x1, y1))
    if headed:
        block.heading = heading(sheet, block.drawn, top)
        if block.heading is not None:
            outer = block.drawn.outer or block.drawn.box
            block.drawn.outer = (
                min(outer[0], block.heading[0]),
                min(outer[1], block.heading[1]),
                max(outer[2], block.heading[2]),
                outer[3],
            )


def _draw_sub_grid(sheet: Sheet, block: _Block, strip: int, font: str, size: int) -> None:
    """Pictures in one or two rows, each with its own label, the group letter followed by a number
    ("c1" ... "c6"), printed inside the picture's top-left corner (light on dark pictures, dark on
    light) or above it in the gutter; the group letter itself is not printed."""
    assert block.label is not None
    rng = sheet.rng
    x0, y0, x1, y1 = block.cell
    inside = bool(rng.random() < 0.65)
    sub_size = max(8, round(size * float(rng.uniform(0.65, 0.9))))
    band = 0 if inside else round(sub_size * 1.2) + 4
    gap = int(rng.integers(3, 9)) if inside else int(rng.integers(8, 16))
    w, h = x1 - x0, y1 - y0
    rows = 2 if h >= 0.55 * w and rng.random() < 0.7 else 1
    row_h = (h - gap * (rows - 1)) // rows - band
    cols = int(np.clip(round((w + gap) / (row_h * float(rng.uniform(0.9, 1.3)) + gap)), 2, 4))
    tile_w = (w - gap * (cols - 1)) // cols
    tile_h = max(24, min(row_h, int(tile_w * 1.1)))
    modality = str(rng.choice(["fluorescence", "fluorescence", "em", "ihc", "phase"]))
    members: list[_Member] = []
    for r in range(rows):
        for c in range(cols):
            x, y = x0 + c * (tile_w + gap), y0 + r * (tile_h + band + gap) + band
            pixels, _, _ = sources.render_image(rng, tile_w, tile_h, modality)
            tile = sheet.paste(pixels, x, y)
            text = f"{block.label}{len(members) + 1}"
            patch = render_label(text, font, sub_size)
            g = patch.glyph
            if inside:
                pad = max(3, sub_size // 4)
                lx, ly = x + pad, y + pad
                corner = pixels[: g[3] - g[1] + 2 * pad, : g[2] - g[0] + 2 * pad]
                colour = (255, 255, 255) if float(corner.mean()) < 110 else (0, 0, 0)
            else:
                lx, ly = x, y - band + 2
                colour = (0, 0, 0)
            sheet.image.paste(colour, (lx - g[0], ly - g[1]), Image.fromarray(patch.alpha))
            label_box = (lx, ly, lx + g[2] - g[0], ly + g[3] - g[1])
            members.append(_Member(label=text, box=tile, label_box=label_box))
    block.members = members
    box = (
        members[0].box[0],
        members[0].box[1],
        max(m.box[2] for m in members),
        max(m.box[3] for m in members),
    )
    block.drawn = Drawn(
        box=box,
        type="image",
        parts={"subimages": [m.box for m in members]},
        words={"modality": modality, "rows": rows, "cols": cols, "inside": inside},
    )


def _caption(rng: np.random.Generator, blocks: list[_Block]) -> tuple[str, dict[str, str]]:
    what = {
        "grid": "Immunofluorescence of {p} in {c} under the conditions shown.",
        "image": "Representative image of {c}.",
        "images": "Representative images of {c}.",
        "colour_bar": "Heat maps of {p} signal; colour bar, intensity.",
        "plot": "Quantification of {p} in {c}.",
        "plots": "Quantification of {p} and {q} across groups.",
        "blot": "Western blot of {p} in {c}.",
        "blot_chart": "Cell viability of {c} (top) and western blot of {p}.",
        "schematic": "Schematic of the experimental design.",
        "sub_grid": "Confocal images of {p} in {c}.",
    }
    number, protein, cells = (
        int(rng.integers(1, 9)),
        vocab.pick(rng, vocab.PROTEINS),
        vocab.pick(rng, vocab.CELLS),
    )
    preamble = f"Figure {number}. {protein} in {cells}."
    parts = [preamble]
    subcaptions: dict[str, str] = {"preamble": preamble}
    for b in blocks:
        text = what[b.kind].format(
            p=vocab.pick(rng, vocab.PROTEINS),
            q=vocab.pick(rng, vocab.PROTEINS),
            c=vocab.pick(rng, vocab.CELLS),
        )
        if b.members:
            first, last = b.members[0].label, b.members[-1].label
            if rng.random() < 0.5:
                text = f"({first}\u2013{last}) {text}"
                subcaptions.update({m.label: text for m in b.members})
            else:
                pieces = [f"({m.label}) {vocab.pick(rng, vocab.CELLS)}." for m in b.members]
                text = " ".join(pieces)
                subcaptions.update({m.label: piece for m, piece in zip(b.members, pieces, strict=True)})
        elif b.label is not None:
            text = f"({b.label}) {text}"
            subcaptions[b.label] = text
        parts.append(text)
    return " ".join(parts), subcaptions


def _trim(image: Image.Image, margin: int) -> Image.Image:
    """Drop the white below and right of the content (rows drawn shorter than their cell), keeping
    ``margin`` px; the origin stays, so no box moves."""
    ink = ImageChops.invert(image.convert("L")).getbbox()
    if ink is None:
        return image
    return image.crop((0, 0, min(image.width, ink[2] + margin), min(image.height, ink[3] + margin)))


def _out_size(rng: np.random.Generator, opts: RealisticOptions, w: int, h: int) -> tuple[str, float]:
    """The size class and the factor from the drawing to the written figure."""
    size_class = opts.size_class or weighted(rng, SIZE_WEIGHTS)
    lo, hi = SIZE_CLASSES[size_class]
    long_side = opts.long_side or int(rng.integers(lo, hi + 1))
    return size_class, long_side / max(w, h)


def _finish(
    rng: np.random.Generator, opts: RealisticOptions, image: Image.Image, size_class: str, factor: float
) -> tuple[Image.Image, int | None, bool]:
    """Resize, JPEG round trip (web copies and some others), transparency (PNG figures only)."""
    out = (max(1, round(image.width * factor)), max(1, round(image.height * factor)))
    image = image.resize(out, Image.Resampling.LANCZOS) if out != image.size else image
    quality = opts.jpeg_quality
    if quality is None and (size_class == "web" or rng.random() < 0.3):
        quality = int(rng.integers(55, 92))
    transparent = opts.transparent if opts.transparent is not None else bool(rng.random() < 0.25)
    if opts.jpeg is False or (opts.transparent and opts.jpeg is None and opts.jpeg_quality is None):
        quality = None  # told no JPEG, or asked for a transparent PNG
    elif opts.jpeg and quality is None:
        quality = int(rng.integers(55, 92))
    transparent = transparent and quality is None
    if quality is not None:
        buffer = io.BytesIO()
        image.save(buffer, format="JPEG", quality=quality)
        image = Image.open(io.BytesIO(buffer.getvalue())).convert("RGB")
    if transparent:
        image = with_transparent_background(image)
    return image, quality, transparent


def with_transparent_background(image: Image.Image) -> Image.Image:
    """RGBA whose pure-white pixels are fully transparent (and black, as exporters store them), so a
    reader that drops alpha instead of laying the figure on white sees a black page."""
    rgb = image.convert("RGB")
    red, green, blue = rgb.split()
    darkest = ImageChops.darker(ImageChops.darker(red, green), blue)
    alpha = darkest.point([255] * 255 + [0])  # opaque unless every channel is 255
    out = Image.composite(rgb, Image.new("RGB", rgb.size, (0, 0, 0)), alpha)
    out.putalpha(alpha)
    return out


def generate_realistic(seed: int, **options: Any) -> tuple[Image.Image, dict[str, Any]]:
    """A figure of the realistic profile and its truth (the real set's annotation keys)."""
    opts = _options(options)
    rng = np.random.default_rng([int(seed), 0x2EA1])
    blocks, style = _plan(rng, opts)
    width = int(rng.integers(1000, 1700))
    unit = width / 1000.0
    font = vocab.pick(rng, ("DejaVu Sans Bold", "DejaVu Sans Bold", "DejaVu Serif Bold", "STIX Bold"))
    size = round(float(rng.uniform(18, 26)) * unit)
    for b in blocks:
        b.label_text = printed(style, b.label) if b.label is not None else ""
    strip = round(size * 1.25) + 4
    height = _lay_out(rng, blocks, width, unit, strip if style != "none" else 0)
    sheet = Sheet(image=Image.new("RGB", (width, height), "white"), rng=rng, unit=unit)
    sheet.font = vocab.pick(rng, ("DejaVu Sans", "DejaVu Serif"))
    for b in blocks:
        _draw_block(sheet, b, strip, font, size)
    sheet.image = _trim(sheet.image, round(float(rng.uniform(4, 16)) * unit))
    width, height = sheet.image.size
    caption, subcaptions = _caption(rng, blocks)
    size_class, factor = _out_size(rng, opts, width, height)
    image, quality, transparent = _finish(rng, opts, sheet.image, size_class, factor)
    sx, sy = image.width / width, image.height / height
    truth = _truth(blocks, image, (sx, sy), caption, subcaptions)
    truth["title"] = f"Synthetic compound figure, realistic profile (seed {seed})"
    truth["synth"] = {
        "generator": f"p2p.mining.lab.synth realistic {PROFILE_VERSION}",
        "profile": "realistic",
        "seed": int(seed),
        "options": {k: v for k, v in asdict(opts).items() if v is not None},
        "canvas": [width, height],
        "scale": [sx, sy],
        "size_class": size_class,
        "jpeg_quality": quality,
        "transparent": transparent,
        "label_style": style,
        "blocks": [_block_record(b, sx, sy) for b in blocks],
    }
    return image, truth


def _scaled(box: Rect, sx: float, sy: float) -> list[int]:
    return scale_inclusive(to_inclusive(box), sx, sy)


def _block_record(b: _Block, sx: float, sy: float) -> dict[str, Any]:
    assert b.drawn is not None
    return {
        "kind": b.kind,
        "label": b.label,
        "cell": _scaled(b.cell, sx, sy),
        "heading": _scaled(b.heading, sx, sy) if b.heading else None,
        "parts": {name: [_scaled(r, sx, sy) for r in rects] for name, rects in b.drawn.parts.items()},
        "words": b.drawn.words,
    }


def _truth(
    blocks: list[_Block],
    image: Image.Image,
    scale: tuple[float, float],
    caption: str,
    subcaptions: dict[str, str],
) -> dict[str, Any]:
    sx, sy = scale
    panels: list[dict[str, Any]] = []
    label_boxes: list[dict[str, Any]] = []
    for b in blocks:
        assert b.drawn is not None
        for m in b.members or []:
            panels.append({"label": m.label, "box": _scaled(m.box, sx, sy), "type": "image"})
            label_boxes.append({"label": m.label, "box": _scaled(m.label_box, sx, sy)})
        if b.members:
            continue
        panel: dict[str, Any] = {"label": b.label, "box": _scaled(b.drawn.box, sx, sy), "type": b.drawn.type}
        if b.label is not None:
            panel["printed_label"] = b.label_text
        if b.drawn.subtypes:
            panel["subtypes"] = list(b.drawn.subtypes)
        if b.drawn.outer is not None:
            panel["outer_box"] = _scaled(b.drawn.outer, sx, sy)
        panels.append(panel)
        if b.label_box is not None:
            label_boxes.append({"label": b.label, "box": _scaled(b.label_box, sx, sy)})
    pieces = {k: [v] for k, v in subcaptions.items() if k != "preamble"}
    notes = [] if any(b.label for b in blocks) else ["Panels carry no printed labels."]
    return {
        "width": image.width,
        "height": image.height,
        "panels": panels,
        "label_boxes": label_boxes,
        "markers": [],
        "extra_markers": [],
        "scale_bars": [],
        "subcaptions": subcaptions,
        "subcaption_pieces": pieces,
        "shared_trailing": [],
        "caption": caption,
        "article_url": None,
        "license": None,
        "image_url": None,
        "notes": notes,
    }
