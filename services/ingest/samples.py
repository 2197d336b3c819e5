"""Sample compound figures drawn by the project itself, for the demo and smoke checks.

Each figure is a grid of labelled panels (textured "micrographs", bar and line charts) with arrows
and asterisks on some image panels, and a caption in the "(A) ..., (B) ..." convention.
"""

from __future__ import annotations

import io
import json
import math
import random
import tarfile
from dataclasses import dataclass
from pathlib import Path

from PIL import Image, ImageDraw, ImageFilter, ImageFont

STAINS = [("H&E staining", (190, 90, 150)), ("immunofluorescence", (40, 200, 90)), ("DAPI", (60, 80, 230))]
TISSUES = ["liver", "kidney", "lung", "tumour", "skin", "colon"]


@dataclass(frozen=True)
class SampleFigure:
    name: str
    image: bytes
    caption: str


def _micrograph(rng: random.Random, size: tuple[int, int], tint: tuple[int, int, int]) -> Image.Image:
    w, h = size
    img = Image.new("RGB", size, tuple(c // 6 for c in tint))
    draw = ImageDraw.Draw(img)
    for _ in range(rng.randint(25, 60)):
        x, y, r = rng.uniform(0, w), rng.uniform(0, h), rng.uniform(4, min(w, h) / 9)
        shade = tuple(min(255, int(c * rng.uniform(0.5, 1.1))) for c in tint)
        draw.ellipse((x - r, y - r * rng.uniform(0.6, 1.2), x + r, y + r), fill=shade)
    return img.filter(ImageFilter.GaussianBlur(1.5))


def _axes(size: tuple[int, int]) -> tuple[Image.Image, ImageDraw.ImageDraw]:
    w, h = size
    img = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(img)
    draw.line((30, 10, 30, h - 25), fill="black", width=2)
    draw.line((30, h - 25, w - 10, h - 25), fill="black", width=2)
    return img, draw


def _bar_chart(rng: random.Random, size: tuple[int, int]) -> Image.Image:
    w, h = size
    img, draw = _axes(size)
    bars = rng.randint(3, 6)
    step = (w - 50) / bars
    for i in range(bars):
        top = rng.uniform(20, h - 40)
        draw.rectangle((40 + i * step, top, 40 + i * step + step * 0.6, h - 26), fill=(70, 110, 180))
    return img


def _line_chart(rng: random.Random, size: tuple[int, int]) -> Image.Image:
    w, h = size
    img, draw = _axes(size)
    phase = rng.uniform(0, math.pi)
    points = [(30 + x, (h - 30) / 2 + math.sin(x / 25 + phase) * (h / 4)) for x in range(0, w - 45, 4)]
    draw.line(points, fill=(200, 60, 40), width=3)
    return img


def _arrow(draw: ImageDraw.ImageDraw, tip: tuple[float, float], length: float, angle: float) -> None:
    tx, ty = tip
    bx, by = tx - length * math.cos(angle), ty - length * math.sin(angle)
    draw.line((bx, by, tx, ty), fill="yellow", width=4)
    for side in (-0.5, 0.5):
        draw.line(
            (tx, ty, tx - 14 * math.cos(angle + side), ty - 14 * math.sin(angle + side)),
            fill="yellow",
            width=4,
        )


def make_figure(seed: int, *, panel_size: tuple[int, int] = (320, 260)) -> SampleFigure:
    rng = random.Random(seed)
    cols, rows = rng.choice([(2, 1), (2, 2), (3, 1), (3, 2)])
    gutter = 16
    pw, ph = panel_size
    canvas = Image.new("RGB", (cols * pw + (cols + 1) * gutter, rows * ph + (rows + 1) * gutter), "white")
    draw = ImageDraw.Draw(canvas)
    tissue = rng.choice(TISSUES)
    parts = []
    for index in range(cols * rows):
        label = chr(ord("A") + index)
        col, row = index % cols, index // cols
        x0, y0 = gutter + col * (pw + gutter), gutter + row * (ph + gutter)
        kind = rng.choice(["micrograph", "micrograph", "bar", "line"])
        if kind == "micrograph":
            stain, tint = rng.choice(STAINS)
            panel = _micrograph(rng, panel_size, tint)
            pdraw = ImageDraw.Draw(panel)
            if rng.random() < 0.6:
                _arrow(pdraw, (rng.uniform(80, pw - 40), rng.uniform(80, ph - 40)), 50, rng.uniform(0.3, 1.2))
                text = f"{stain} of {tissue} sections; the arrow indicates an infiltrating cell cluster"
            else:
                pdraw.text(
                    (rng.uniform(40, pw - 40), rng.uniform(40, ph - 40)),
                    "*",
                    fill="white",
                    font=ImageFont.load_default(size=40),
                )
                text = f"{stain} of {tissue}; the asterisk marks a necrotic area"
        elif kind == "bar":
            panel = _bar_chart(rng, panel_size)
            n = rng.randint(3, 9)
            text = f"quantification of positive cells per field in {tissue} (mean ± s.d., n = {n})"
        else:
            panel = _line_chart(rng, panel_size)
            text = f"time course of signal intensity in {tissue} over {rng.randint(6, 48)} h"
        canvas.paste(panel, (x0, y0))
        draw.rectangle((x0 + 4, y0 + 4, x0 + 26, y0 + 28), fill="white")
        draw.text((x0 + 8, y0 + 5), label, fill="black", font=ImageFont.load_default(size=20))
        parts.append(f"({label}) {text[0].upper()}{text[1:]}.")
    caption = f"Characterisation of {tissue} samples. " + " ".join(parts) + " Scale bars, 50 µm."
    buffer = io.BytesIO()
    canvas.save(
        buffer, format="PNG" if seed % 3 == 0 else "JPEG", **({} if seed % 3 == 0 else {"quality": 90})
    )
    return SampleFigure(
        name=f"sample_{seed:03d}.{'png' if seed % 3 == 0 else 'jpg'}",
        image=buffer.getvalue(),
        caption=caption,
    )


def write_manifest_folder(folder: Path, count: int, first_seed: int = 1) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    for seed in range(first_seed, first_seed + count):
        fig = make_figure(seed)
        (folder / fig.name).write_bytes(fig.image)
        lines.append(
            json.dumps(
                {"image": fig.name, "caption": fig.caption, "figure_label": f"Figure {seed - first_seed + 1}"}
            )
        )
    manifest = folder / "manifest.jsonl"
    manifest.write_text("\n".join(lines) + "\n")
    return manifest


def write_pmc_package(path: Path, *, pmcid: str = "PMC9000001", seeds: tuple[int, ...] = (101, 102)) -> Path:
    """A small PMC Open Access style package: JATS nxml plus the figure images."""
    figures = [make_figure(seed) for seed in seeds]
    fig_xml = []
    for i, fig in enumerate(figures, start=1):
        stem = fig.name.rsplit(".", 1)[0]
        fig_xml.append(
            f'<fig id="F{i}"><label>Figure {i}</label><caption><p>{_xml(fig.caption)}</p></caption>'
            f'<graphic xlink:href="{stem}"/></fig>'
        )
    nxml = f"""<?xml version="1.0" encoding="UTF-8"?>
<article xmlns:xlink="http://www.w3.org/1999/xlink" article-type="research-article">
<front><journal-meta><journal-title-group><journal-title>Panel2Patch Demo Journal</journal-title></journal-title-group></journal-meta>
<article-meta><article-id pub-id-type="pmc">{pmcid[3:]}</article-id><article-id pub-id-type="pmid">99000001</article-id>
<article-id pub-id-type="doi">10.5555/p2p.demo.1</article-id>
<title-group><article-title>Synthetic tissue atlas for the Panel2Patch demo</article-title></title-group>
<pub-date pub-type="epub"><year>2026</year></pub-date>
<permissions><license xlink:href="http://creativecommons.org/licenses/by/4.0/"><license-p>CC BY 4.0</license-p></license></permissions>
<abstract><p>Demonstration article whose figures are drawn by Panel2Patch itself.</p></abstract>
</article-meta></front>
<body><sec><p>Tissue architecture is shown in <xref ref-type="fig" rid="F1">Fig. 1</xref>.</p>
<p>Quantification follows in <xref ref-type="fig" rid="F1 F2">Figs. 1 and 2</xref>.</p>{"".join(fig_xml)}</sec></body>
</article>"""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as tar:
        _add(tar, f"{pmcid}/article.nxml", nxml.encode())
        for fig in figures:
            _add(tar, f"{pmcid}/{fig.name}", fig.image)
    return path


def _xml(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))
