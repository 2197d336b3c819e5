"""Known synthetic figures with their ground truth, found by caption, and located views of them."""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from p2p.mining.lab.synth.dataset import load_annotations
from p2p.shared.geometry import from_inclusive
from tests.lvlm_sim.locate import FigureIndex, Placement, locate

Box = tuple[float, float, float, float]


def normalize_caption(text: str) -> str:
    return " ".join(text.split())


@dataclass(frozen=True)
class GtPanel:
    label: str
    box: Box  # figure pixels, exclusive corners
    type: str
    modality: str
    subcaption: str


@dataclass(frozen=True)
class GtMarker:
    kind: str
    glyph_box: Box
    target_box: Box
    target_point: tuple[float, float]  # pixel centre, figure pixels
    panel: str
    text: str | None


@dataclass
class Figure:
    name: str
    path: Path
    caption: str
    width: int
    height: int
    panels: list[GtPanel]
    markers: list[GtMarker]
    entry: dict[str, Any]
    _index: FigureIndex | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def key(self) -> str:
        return str(self.path)

    def index(self) -> FigureIndex:
        with self._lock:
            if self._index is None:
                pixels = np.asarray(Image.open(self.path).convert("RGB"))
                self._index = FigureIndex(pixels)
                self.width, self.height = self._index.width, self._index.height
            return self._index

    def panel(self, label: str) -> GtPanel | None:
        return next((p for p in self.panels if p.label == label), None)


REAL_TARGET_SIDE = 0.05  # of the figure's shorter side: the structure a real marker points at


def figure_from_entry(folder: Path, name: str, entry: dict[str, Any]) -> Figure:
    subcaptions: dict[str, str] = entry.get("subcaptions") or {}
    panels = [
        GtPanel(
            label=str(p["label"]) if p.get("label") is not None else "",
            box=from_inclusive(p["box"]),
            type=str(p.get("type") or "image"),
            modality=str(p.get("modality") or ""),
            subcaption=str(subcaptions.get(str(p["label"]), "")),
        )
        for p in entry.get("panels", [])
    ]
    markers = []
    side = REAL_TARGET_SIDE * min(int(entry.get("width", 0)), int(entry.get("height", 0)))
    for m in entry.get("markers", []):
        tx, ty = m["target_point"]
        # real annotations give the target point only: a small box round it is the structure
        target = (tx - side / 2, ty - side / 2, tx + side / 2, ty + side / 2)
        markers.append(
            GtMarker(
                kind=str(m.get("kind") or "other"),
                glyph_box=from_inclusive(m["glyph_box"]) if m.get("glyph_box") else (0.0, 0.0, 0.0, 0.0),
                target_box=from_inclusive(m["target_box"]) if m.get("target_box") else target,
                target_point=(float(tx) + 0.5, float(ty) + 0.5),
                panel=str(m.get("panel") or ""),
                text=m.get("text") or None,
            )
        )
    return Figure(
        name=name,
        path=folder / name,
        caption=normalize_caption(str(entry.get("caption") or "")),
        width=int(entry.get("width", 0)),
        height=int(entry.get("height", 0)),
        panels=panels,
        markers=markers,
        entry=entry,
    )


class Registry:
    """Figures of one or more synthetic folders, found by caption; located views are cached."""

    def __init__(self, folders: list[Path] | None = None, *, cache_size: int = 4096) -> None:
        self.by_caption: dict[str, list[Figure]] = {}
        self.figures: list[Figure] = []
        self._cache: OrderedDict[tuple[str, str], Placement | None] = OrderedDict()
        self._cache_size = cache_size
        self._cache_lock = threading.Lock()
        self._key_locks: dict[tuple[str, str], threading.Lock] = {}
        for folder in folders or []:
            self.add_folder(folder)

    def add_folder(self, folder: Path) -> int:
        folder = Path(folder)
        added = 0
        for name, entry in sorted(load_annotations(folder).items()):
            if not (folder / name).is_file():
                continue
            figure = figure_from_entry(folder, name, entry)
            self.figures.append(figure)
            self.by_caption.setdefault(figure.caption, []).append(figure)
            added += 1
        return added

    def find(self, caption: str) -> list[Figure]:
        return self.by_caption.get(normalize_caption(caption), [])

    def locate(self, figure: Figure, image: np.ndarray, digest: str | None = None) -> Placement | None:
        """Where ``image`` lies in ``figure`` (cached per figure and image digest)."""
        if digest is None:
            digest = hashlib.sha1(np.ascontiguousarray(image).tobytes()).hexdigest()
        key = (figure.key, digest)
        with self._cache_lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
            key_lock = self._key_locks.setdefault(key, threading.Lock())
        with key_lock:  # identical concurrent requests compute once
            with self._cache_lock:
                if key in self._cache:
                    return self._cache[key]
            placement = locate(figure.index(), image, [p.box for p in figure.panels])
            with self._cache_lock:
                self._cache[key] = placement
                while len(self._cache) > self._cache_size:
                    self._cache.popitem(last=False)
                self._key_locks.pop(key, None)
        return placement

    def identify(
        self, caption: str, image: np.ndarray, digest: str | None = None
    ) -> tuple[Figure, Placement] | tuple[Figure | None, None]:
        """The figure with this caption that the image shows, and where; (figure|None, None) if not."""
        candidates = self.find(caption)
        best: tuple[Figure, Placement] | None = None
        for figure in candidates:
            placement = self.locate(figure, image, digest)
            if placement is not None and (best is None or placement.score > best[1].score):
                best = (figure, placement)
        if best is not None:
            return best
        return (candidates[0] if candidates else None), None
