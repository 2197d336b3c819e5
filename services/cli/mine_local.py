"""`p2p mine IMAGE...`: decompose figures here with the CPU backend, no server.

For researchers who want to look before they ingest a corpus: a table per figure, ``--json``
one object per figure in the shape ``GET /v1/figures/{id}`` returns (ids and crop keys null:
nothing is stored), ``--draw`` each figure with its boxes drawn on it. Captions come from
``NAME.txt`` or ``NAME.json`` beside an image, as ``p2p ingest`` reads them, unless one is given.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import typer
from rich.console import Console
from rich.table import Table

from p2p.cli.ingest_paths import IMAGE_SUFFIXES, caption_beside
from p2p.mining.types import MiningResult
from p2p.shared import geometry

console = Console(stderr=True)
out = Console()

PANEL_COLOUR = (220, 30, 30)
REGION_COLOUR = (30, 90, 230)
SUBCAPTION_WIDTH = 70  # characters of a subcaption shown in the table


def image_paths(paths: list[Path]) -> list[Path]:
    """The images named, and those directly inside folders named, in order; an error for a
    path that is neither."""
    found: list[Path] = []
    for path in paths:
        if path.is_dir():
            found.extend(
                sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
            )
        elif path.is_file() and path.suffix.lower() in IMAGE_SUFFIXES:
            found.append(path)
        elif path.exists():
            raise ValueError(f"{path}: not an image ({', '.join(sorted(IMAGE_SUFFIXES))}) or a folder")
        else:
            raise ValueError(f"{path} does not exist")
    return found


def load_rgb(path: Path) -> np.ndarray:
    """The image as RGB; transparent parts laid on white, as a reader sees them on a page."""
    from PIL import Image

    from p2p.shared.images import flatten_on_white

    with Image.open(path) as img:
        return np.asarray(flatten_on_white(img))


def figure_json(path: Path, caption: str, result: MiningResult, miner_version: str) -> dict[str, Any]:
    """One figure as ``GET /v1/figures/{id}`` shows it, with the miner's version and notes."""
    panels = []
    for index, panel in enumerate(result.panels):
        regions: list[dict[str, Any]] = [
            {
                "id": None,
                "box_in_panel": [
                    round(v, 2) for v in geometry.translate(r.box, -panel.box[0], -panel.box[1])
                ],
                "box_in_figure": [round(v, 2) for v in r.box],
                "kind": r.kind,
                "marker_type": r.marker_type,
                "crop_key": None,
                "caption_text": r.caption_text,
                "description": r.description,
                "confidence": round(r.confidence, 4),
                "provenance": {},
            }
            for r in result.regions
            if r.panel_index == index
        ]
        panels.append(
            {
                "id": None,
                "label": panel.label,
                "box": [round(v, 2) for v in panel.box],
                "crop_key": None,
                "subcaption": panel.subcaption,
                "description": panel.description,
                "figure_type": panel.figure_type,
                "modality": None,
                "confidence": round(panel.confidence, 4),
                "provenance": {
                    "type_confidence": round(panel.type_confidence, 4),
                    "label_box": [round(v, 2) for v in panel.label_box] if panel.label_box else None,
                    "outer_box": [round(v, 2) for v in panel.outer_box] if panel.outer_box else None,
                },
                "regions": regions,
            }
        )
    return {
        "id": None,
        "file": str(path),
        "width": result.width,
        "height": result.height,
        "caption": caption,
        "panels": panels,
        "miner": {"backend": "cpu", "version": miner_version},
        "notes": result.notes,
        "stage_timings": {k: round(v, 4) for k, v in result.stage_seconds.items()},
    }


def figure_table(path: Path, result: MiningResult) -> Table:
    table = Table(title=f"{path.name}  {result.width}x{result.height}  {len(result.panels)} panels")
    for column in ("#", "label", "type", "box", "conf", "regions", "subcaption"):
        table.add_column(column, justify="right" if column in ("#", "conf", "regions") else "left")
    for index, panel in enumerate(result.panels):
        sub = " ".join((panel.subcaption or "").split())
        if len(sub) > SUBCAPTION_WIDTH:
            sub = sub[: SUBCAPTION_WIDTH - 3] + "..."
        table.add_row(
            str(index + 1),
            panel.label or "-",
            panel.figure_type,
            ",".join(str(round(v)) for v in panel.box),
            f"{panel.confidence:.2f}",
            str(sum(1 for r in result.regions if r.panel_index == index)),
            sub or "-",
        )
    if result.notes:
        table.caption = "notes: " + "; ".join(result.notes)
    return table


def draw(image: np.ndarray, result: MiningResult, target: Path) -> None:
    """The figure with its panel boxes (labels beside them) and region boxes drawn on it."""
    from PIL import Image, ImageDraw

    canvas = Image.fromarray(image)
    pen = ImageDraw.Draw(canvas)
    width = max(2, round(max(image.shape[:2]) / 400))
    for region in result.regions:
        pen.rectangle([round(v) for v in region.box], outline=REGION_COLOUR, width=max(1, width // 2))
    for index, panel in enumerate(result.panels):
        x1, y1, x2, y2 = (round(v) for v in panel.box)
        pen.rectangle([x1, y1, max(x1, x2 - 1), max(y1, y2 - 1)], outline=PANEL_COLOUR, width=width)
        pen.text((x1 + width + 2, y1 + width + 2), f"{index + 1}:{panel.label or '-'}", fill=PANEL_COLOUR)
    target.parent.mkdir(parents=True, exist_ok=True)
    canvas.save(target)


def mine_here(
    images: list[Path],
    *,
    caption: str | None,
    caption_file: Path | None,
    as_json: bool,
    draw_dir: Path | None,
) -> None:
    """Mine images here with the CPU backend: panels, labels, types, subcaptions, regions."""
    from p2p.mining.pipeline import CpuMiner

    if caption is not None and caption_file is not None:
        console.print("[red]give --caption or --caption-file, not both[/red]")
        raise typer.Exit(2)
    try:
        paths = image_paths(images)
        given = caption_file.read_text(encoding="utf-8").strip() if caption_file is not None else caption
    except (ValueError, OSError) as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from exc
    if not paths:
        console.print("[red]no images found[/red]")
        raise typer.Exit(2)
    miner: CpuMiner | None = None  # loaded once the first image reads
    failed = 0
    for path in paths:
        try:
            image = load_rgb(path)
            text = given if given is not None else caption_beside(path)
        except (OSError, ValueError) as exc:
            console.print(f"[red]{path}: cannot be read: {exc}[/red]")
            failed += 1
            continue
        if miner is None:
            miner = CpuMiner(load_text_encoder=False)
        version = str(getattr(miner, "revision", None) or miner.version)
        result = miner.mine(image, text)
        if as_json:
            sys.stdout.write(json.dumps(figure_json(path, text, result, version), ensure_ascii=False) + "\n")
            sys.stdout.flush()
        else:
            out.print(figure_table(path, result))
        if draw_dir is not None:
            draw(image, result, draw_dir / f"{path.stem}.png")
    if failed:
        raise typer.Exit(1)
