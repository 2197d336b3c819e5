"""What `p2p ingest PATH...` makes of each path it is given."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from p2p.shared.db.models import BatchKind

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".tif", ".tiff", ".gif", ".bmp", ".webp"}


@dataclass(frozen=True)
class BatchSource:
    kind: BatchKind
    path: Path


@dataclass(frozen=True)
class LooseImage:
    path: Path
    caption: str


def caption_beside(image: Path) -> str:
    """A loose image's caption: ``name.txt`` beside it, else the ``caption`` of ``name.json``."""

    text_file, json_file = image.with_suffix(".txt"), image.with_suffix(".json")
    if text_file.is_file():
        return text_file.read_text(encoding="utf-8").strip()
    if json_file.is_file():
        data = json.loads(json_file.read_text(encoding="utf-8"))
        if isinstance(data, dict) and isinstance(data.get("caption"), str):
            return str(data["caption"]).strip()
    return ""


def plan(paths: list[Path]) -> list[BatchSource | LooseImage]:
    planned: list[BatchSource | LooseImage] = []
    for path in paths:
        if not path.exists():
            raise FileNotFoundError(f"{path} does not exist")
        name = path.name.lower()
        if path.is_dir():
            if (path / "manifest.jsonl").is_file():
                planned.append(BatchSource(BatchKind.MANIFEST, path))
                continue
            shards = sorted(path.glob("*.tar"))
            packages = sorted([*path.glob("*.tar.gz"), *path.glob("*.tgz")])
            images = sorted(p for p in path.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
            if shards:
                planned.append(BatchSource(BatchKind.WEBDATASET, path))
            planned.extend(BatchSource(BatchKind.PMC, p) for p in packages)
            planned.extend(LooseImage(p, caption_beside(p)) for p in images)
        elif name.endswith((".tar.gz", ".tgz")):
            planned.append(BatchSource(BatchKind.PMC, path))
        elif name.endswith(".tar"):
            planned.append(BatchSource(BatchKind.WEBDATASET, path))
        elif name.endswith(".jsonl"):
            planned.append(BatchSource(BatchKind.MANIFEST, path))
        elif path.suffix.lower() in IMAGE_SUFFIXES:
            planned.append(LooseImage(path, caption_beside(path)))
        else:
            raise ValueError(
                f"{path}: not an image, manifest (.jsonl), shard (.tar) or PMC package (.tar.gz)"
            )
    return planned
