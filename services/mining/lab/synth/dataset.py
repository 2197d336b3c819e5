"""Write a folder of synthetic figures in the real development set's layout.

``out_dir`` gets ``NAME.png`` or ``NAME.jpg`` plus ``NAME.json`` per figure, and one
``annotations.json`` mapping file name -> entry (keys starting with ``_`` are notes), so the same
evaluator reads this folder and /work/shared/data/real-figures.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from p2p.mining.lab.synth.figure import generate_figure

NOTES = {
    "coordinates": (
        "As in the real set: absolute pixels of the written image, boxes [x1, y1, x2, y2] inclusive, "
        "points [x, y]. Boxes were scaled with the image when it was rescaled (exclusive extent scaled, "
        "then rounded)."
    ),
    "panels": (
        "One entry per panel in reading order (label order); label normalised without punctuation "
        "(printed_label has it), null when the figure has no printed labels. box = tight content box: "
        "image extent for images (a nested group of sub-images under one label is one panel; subimages "
        "lists them), ink box (min RGB < 225) for plots, schematics and tables. The printed label is "
        "never inside a plot's box; inside labels sit on image pixels. type is "
        "image/plot/schematic/table; modality/content say what was drawn."
    ),
    "label_boxes": (
        "Tight box of the printed label glyphs, punctuation included, and of the circle when circled."
    ),
    "markers": (
        "Glyphs on image panels: arrow (target_point = tip pixel, direction_deg = travel direction "
        "tail->tip, 0 = +x, 90 = +y/down), arrowhead (same), asterisk, star (target_point = glyph "
        "centre), box, circle (target_point = centre), inset (framed zoomed copy; target_point = its "
        "centre; its source region has its own 'box' marker). target_box = the structure pointed at / "
        "enclosed / magnified. glyph_box excludes text tags (tag, tag_box). text = the phrase the caption"
        " uses for what the marker shows (null if not mentioned)."
    ),
    "subcaptions": (
        "Real-set convention: verbatim caption pieces, label tokens kept; a fragment naming several "
        "panels goes to each; shared trailing sentences are separate pieces given to each panel they "
        "name, or to every labelled panel when they name none. Where the last fragment ends follows "
        "the text: sentences after it naming only its panels stay with it (all its panels) until one "
        "names another panel or none. preamble = text before the first label."
    ),
    "synth": (
        "How the figure was made (seed, options, layout, label style, sources, scale bars, text "
        "overlays). generate_figure(synth.seed, **synth.options) reproduces the image (write_dataset "
        "saves it as PNG or JPEG afterwards)."
    ),
}


REALISTIC_PANEL_NOTE = (
    "As in the real set's _notes: one entry per printed label in reading order (label null when the "
    "figure has none; then each visually separate panel is one, a lone diagram one). box = the "
    "union of the image extents for images (a grid of sub-images under one letter is ONE panel), "
    "everything printed under the letter for blots (lane table, band names, kDa marks), the ink of "
    "plots and diagrams; mixed content is typed by the larger part, subtypes lists both. Row and "
    "column headers, headings, subplot titles and colour bars are not in box; outer_box (present "
    "only when it differs) takes them in. synth.blocks records each panel's parts (subimages, "
    "headers, colour_bar, subplots, titles, chart, blot) and its heading."
)


def figure_seed(seed: int, index: int) -> int:
    return int(np.random.SeedSequence([int(seed), int(index)]).generate_state(1)[0] & 0x7FFFFFFF)


def write_dataset(
    out_dir: Path,
    count: int,
    seed: int,
    *,
    size: tuple[int, int] = (1000, 800),
    jpeg_quality_range: tuple[int, int] = (45, 95),
    jpeg_fraction: float = 0.7,
    scale_range: tuple[float, float] = (0.55, 1.0),
    rescale_fraction: float = 0.6,
    prefix: str = "synth",
    figure_options: dict[str, Any] | None = None,
    profile: str = "classic",
) -> list[Path]:
    """Generate ``count`` figures; returns the image paths in order. Deterministic by ``seed``.

    Each figure ``i`` uses ``figure_seed(seed, i)``. With probability ``rescale_fraction`` the figure
    is rescaled by a factor from ``scale_range``; with probability ``jpeg_fraction`` it is written as
    JPEG with a quality from ``jpeg_quality_range`` (a third of those are JPEG-compressed twice, as a
    re-published figure is), else as PNG.

    ``profile="realistic"`` writes that profile's figures instead; they choose their own size and
    JPEG round trip (the size, scale and JPEG arguments do not apply): a figure that went through
    JPEG is written as JPEG at its quality, the others as PNG (RGBA when transparent).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if profile == "realistic":
        return _write_realistic(out, count, seed, prefix=prefix, figure_options=figure_options or {})
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 0x5EED]))
    annotations: dict[str, Any] = {
        "_source": f"p2p.mining.synth write_dataset(count={count}, seed={seed}, size={size[0]}x{size[1]})",
        "_notes": NOTES,
    }
    paths: list[Path] = []
    width = len(str(max(count - 1, 0)))
    for i in range(count):
        fseed = figure_seed(seed, i)
        scale = float(rng.uniform(*scale_range)) if rng.random() < rescale_fraction else 1.0
        as_jpeg = bool(rng.random() < jpeg_fraction)
        quality = int(rng.integers(jpeg_quality_range[0], jpeg_quality_range[1] + 1))
        pre_quality = int(rng.integers(60, 96)) if as_jpeg and rng.random() < 0.33 else None
        options = dict(figure_options or {})
        options.update(width=size[0], height=size[1], scale=round(scale, 4), jpeg_quality=pre_quality)
        image, gt = generate_figure(fseed, **options)
        gt["synth"]["file_jpeg_quality"] = quality if as_jpeg else None
        name = f"{prefix}_{i:0{max(width, 5)}d}"
        paths.append(_save(out, name, image, gt, quality if as_jpeg else None, annotations))
    _save_annotations(out, annotations)
    return paths


def _save(
    out: Path, name: str, image: Any, gt: dict[str, Any], quality: int | None, annotations: dict[str, Any]
) -> Path:
    """Write NAME.jpg (at ``quality``) or NAME.png and NAME.json; record the entry."""
    path = out / (name + (".jpg" if quality is not None else ".png"))
    if quality is not None:
        image.save(path, format="JPEG", quality=quality)
    else:
        image.save(path, format="PNG", compress_level=3)
    (out / f"{name}.json").write_text(json.dumps(gt, ensure_ascii=False, indent=1), encoding="utf-8")
    annotations[path.name] = gt
    return path


def _save_annotations(out: Path, annotations: dict[str, Any]) -> None:
    (out / "annotations.json").write_text(
        json.dumps(annotations, ensure_ascii=False, indent=1), encoding="utf-8"
    )


def _write_realistic(
    out: Path, count: int, seed: int, *, prefix: str, figure_options: dict[str, Any]
) -> list[Path]:
    annotations: dict[str, Any] = {
        "_source": f"p2p.mining.synth write_dataset(count={count}, seed={seed}, profile=realistic)",
        "_notes": {**NOTES, "panels": REALISTIC_PANEL_NOTE},
    }
    paths: list[Path] = []
    width = max(len(str(max(count - 1, 0))), 5)
    for i in range(count):
        image, gt = generate_figure(figure_seed(seed, i), profile="realistic", **figure_options)
        name = f"{prefix}_{i:0{width}d}"
        paths.append(_save(out, name, image, gt, gt["synth"]["jpeg_quality"], annotations))
    _save_annotations(out, annotations)
    return paths


def load_annotations(folder: Path) -> dict[str, Any]:
    """The entries of a folder's annotations.json without the ``_`` notes."""
    data = json.loads((Path(folder) / "annotations.json").read_text(encoding="utf-8"))
    return {k: v for k, v in data.items() if not k.startswith("_")}


def parse_size(text: str) -> tuple[int, int]:
    """'1000x800' -> (1000, 800)."""
    parts: Sequence[str] = text.lower().replace("\u00d7", "x").split("x")
    if len(parts) != 2:
        raise ValueError(f"size must look like 1000x800, not {text!r}")
    w, h = int(parts[0]), int(parts[1])
    if w < 120 or h < 90:
        raise ValueError("size must be at least 120x90")
    return w, h
