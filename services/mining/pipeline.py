"""The CPU backend: every stage of the Panel2Patch miner that needs no GPU and no download.

Stages (each replaceable, each timed): panel segmentation, label OCR, panel type, caption
splitting, marker detection (photographic panels only), region fusion, box post-processing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from p2p.mining.types import CaptionSplit, LabelDetection, MinedPanel, MiningResult, PanelCandidate, Region
from p2p.shared import geometry

log = logging.getLogger(__name__)

BACKEND = "cpu"
BACKEND_VERSION = "cpu-1"


@dataclass(frozen=True)
class CpuMinerParams:
    tau: float = 0.15  # caption-box gate: normalised distance to a marker centre
    nms_iou: float = 0.7
    merge_cosine: float = 0.9
    max_side: int = 4000  # figures are mined at most this large (longest side), boxes mapped back

    def as_dict(self) -> dict[str, Any]:
        return {
            "tau": self.tau,
            "nms_iou": self.nms_iou,
            "merge_cosine": self.merge_cosine,
            "max_side": self.max_side,
        }


@dataclass
class _Timer:
    seconds: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - started


class CpuMiner:
    """Loads its models once; ``mine`` is safe to call from several threads."""

    backend = BACKEND
    version = BACKEND_VERSION
    prompt_version: str | None = None

    def __init__(
        self,
        params: CpuMinerParams | None = None,
        *,
        text_encoder: Any = None,
        load_text_encoder: bool = True,
    ) -> None:
        from p2p.mining.cpu.labels import warm_up
        from p2p.mining.cpu.marker_net import shipped_fusion, shipped_net
        from p2p.mining.cpu.panel_type import default_classifier
        from p2p.mining.cpu.seam_net import shipped_net as seam_net
        from p2p.mining.cpu.seams import default_model as seam_model

        self.params = params or CpuMinerParams()
        self._text_encoder = text_encoder
        self._encoder_lock = threading.Lock()
        self.panel_types = default_classifier()
        warm_up()  # OCR models load now, not on the first figure
        shipped_net()  # the marker network too: a missing weights file stops the worker at start
        shipped_fusion()  # and the fusion model stored beside it
        seam_model()  # and the segmenter's seam splitter
        seam_net()  # with the panel-boundary network it reads
        if load_text_encoder:
            _ = self.text_encoder.model  # the sentence encoder too

    @property
    def text_encoder(self) -> Any:
        with self._encoder_lock:
            if self._text_encoder is None:
                from p2p.mining.postprocess import TextEncoder

                self._text_encoder = TextEncoder()
            return self._text_encoder

    def ensure_ready(self) -> None:
        """Nothing external to wait for: the models are loaded in ``__init__``."""

    def mine(self, image: np.ndarray, caption: str, *, context: Any = None) -> MiningResult:
        """``context`` (title, abstract) is for backends that read it; this one does not."""
        from p2p.mining.captions import split_caption
        from p2p.mining.cpu.axis_strips import return_axis_strips
        from p2p.mining.cpu.label_split import split_at_labels
        from p2p.mining.cpu.label_trim import trim_labels
        from p2p.mining.cpu.labels import assign_labels, find_labels
        from p2p.mining.cpu.markers import detect_markers
        from p2p.mining.cpu.segment import segment_panels
        from p2p.mining.postprocess import postprocess
        from p2p.mining.regions import fuse_regions

        timer = _Timer()
        notes: list[str] = []
        if image.ndim == 2:
            image = np.stack([image] * 3, axis=-1)
        image = np.ascontiguousarray(image[..., :3])
        height, width = image.shape[:2]
        if width < 8 or height < 8:
            notes.append(f"image is {width}x{height} px: too small to mine; kept as one panel")
            return self._whole_figure(width, height, caption, notes, timer)

        with timer.stage("captions"):
            named = split_caption(caption).labels_in_order
        with timer.stage("segment"):
            candidates: list[PanelCandidate] = segment_panels(image, named=len(named) or None)
        if not candidates:
            notes.append("no panels found: the whole figure is one panel")
            candidates = [PanelCandidate(box=(0.0, 0.0, float(width), float(height)), confidence=0.3)]

        with timer.stage("labels"):
            detections: list[LabelDetection] = find_labels(image, candidates)
            labels = assign_labels(candidates, detections)
            candidates, labels, detections = split_at_labels(
                image, candidates, labels, detections, named=named
            )
            candidates, labels = _join_pieces(candidates, labels, named)
        with timer.stage("segment"):
            candidates = trim_labels(image, candidates, labels, detections)
            candidates = return_axis_strips(image, candidates, detections)
        candidates, labels = in_reading_order(candidates, labels)
        label_boxes = {d.text: d.box for d in detections}

        with timer.stage("captions"):
            if any(labels) and len(candidates) > 1:
                repaired = self._repair_labels(caption, labels)
                if repaired != labels:
                    notes.append("panel labels completed from the caption's label sequence")
                    labels = repaired
            known = [label for label in labels if label]
            split: CaptionSplit = split_caption(caption, known or None)
        if not any(labels):
            if split.labels_in_order and len(candidates) > 1:
                notes.append("no panel labels read: caption labels assigned in reading order")
                labels = [
                    split.labels_in_order[i] if i < len(split.labels_in_order) else None
                    for i in range(len(candidates))
                ]
            elif len(candidates) > 1:
                notes.append("no panel labels in image or caption: panels are unlabelled")
        missing = [label for label in split.labels_in_order if label not in labels]
        if missing:
            notes.append(
                f"caption names {len(split.labels_in_order)} panels, {len(candidates)} found; "
                f"no panel for {', '.join(missing)}"
            )

        panels: list[MinedPanel] = []
        with timer.stage("panel_type"):
            for candidate, label in zip(candidates, labels, strict=True):
                x1, y1, x2, y2 = (round(v) for v in candidate.box)
                crop = image[max(y1, 0) : max(y2, y1 + 1), max(x1, 0) : max(x2, x1 + 1)]
                kind, type_conf = self.panel_types.classify(crop)
                subcaption = split.subcaptions.get(label) if label else None
                if subcaption is None and len(candidates) == 1:
                    subcaption = caption.strip() or None
                panels.append(
                    MinedPanel(
                        box=candidate.box,
                        label=label,
                        label_box=label_boxes.get(label or ""),
                        figure_type=kind,
                        type_confidence=type_conf,
                        confidence=candidate.confidence,
                        subcaption=subcaption,
                    )
                )

        regions: list[Region] = []
        markers = []
        kinds_by_panel: dict[int, set[str]] = {}
        for index, panel in enumerate(panels):
            if panel.figure_type != "image":
                continue
            with timer.stage("markers"):
                found = [
                    m
                    for m in detect_markers(image, panel.box)
                    if not _on_label(m.glyph_box, label_boxes.values())
                ]
            markers.extend(found)
            fragments = split.marker_fragments.get(panel.label or "", []) if panel.label else []
            with timer.stage("regions"):
                fused = fuse_regions(found, [], panel_box=panel.box, tau=self.params.tau, fragments=fragments)
            for region in fused:
                region.panel_index = index
            regions.extend(fused)
            kinds_by_panel[index] = {m.kind for m in found}
        with timer.stage("captions"):
            _marker_notes_to_marked_panels(panels, kinds_by_panel, split.shared_trailing)
        with timer.stage("postprocess"):
            if regions:
                regions = postprocess(
                    regions,
                    image_width=width,
                    image_height=height,
                    nms_iou=self.params.nms_iou,
                    merge_cosine=self.params.merge_cosine,
                    encoder=self.text_encoder if any(r.caption_text for r in regions) else None,
                )
        return MiningResult(
            width=width,
            height=height,
            panels=panels,
            markers=markers,
            regions=regions,
            stage_seconds=timer.seconds,
            notes=notes,
        )

    @staticmethod
    def _repair_labels(caption: str, labels: list[str | None]) -> list[str | None]:
        from p2p.mining.captions import split_caption
        from p2p.mining.label_repair import repair_with_caption

        # The caption's own labels, from a split without hints: with hints, labels_in_order
        # follows what OCR read (misreadings appended, unread labels left out).
        return repair_with_caption(labels, split_caption(caption).labels_in_order)

    def _whole_figure(
        self, width: int, height: int, caption: str, notes: list[str], timer: _Timer
    ) -> MiningResult:
        panel = MinedPanel(
            box=(0.0, 0.0, float(max(width, 1)), float(max(height, 1))),
            label=None,
            label_box=None,
            figure_type="image",
            type_confidence=0.0,
            confidence=0.1,
            subcaption=caption.strip() or None,
        )
        return MiningResult(
            width=width,
            height=height,
            panels=[panel],
            markers=[],
            regions=[],
            stage_seconds=timer.seconds,
            notes=notes,
        )


# Marker words of a caption and the detected kinds that show them (the detector may call an
# arrow an arrowhead, a star an asterisk, a zoomed region's frame a box).
_SHOWN_BY: dict[str, frozenset[str]] = {
    "arrow": frozenset({"arrow", "arrowhead"}),
    "arrowhead": frozenset({"arrow", "arrowhead"}),
    "asterisk": frozenset({"asterisk", "star"}),
    "star": frozenset({"asterisk", "star"}),
    "box": frozenset({"box", "inset"}),
    "square": frozenset({"box"}),
    "inset": frozenset({"inset", "box"}),
    "circle": frozenset({"circle"}),
    "dashed line": frozenset({"box", "circle"}),
    "outlined": frozenset({"box", "circle"}),
    "dotted": frozenset({"box", "circle"}),
}


def in_reading_order(
    candidates: list[PanelCandidate], labels: list[str | None]
) -> tuple[list[PanelCandidate], list[str | None]]:
    """Panels and their read labels in the reading order the labels follow (rows or columns
    first, see ``labels.reading_order``): the caption repair walks this order, so a figure
    labelled column by column has its unread labels filled from the column, not the row."""
    from p2p.mining.cpu.labels import reading_order

    order = reading_order(candidates, labels)
    return [candidates[i] for i in order], [labels[i] for i in order]


def _join_pieces(
    candidates: list[PanelCandidate], labels: list[str | None], named: list[str]
) -> tuple[list[PanelCandidate], list[str | None]]:
    """Pieces without a label joined to the labelled panels beside them, when every label the
    caption names is on a panel already (``count_guided.join_unlabelled``)."""
    from p2p.mining.cpu.count_guided import SPLIT_CONFIDENCE, join_unlabelled

    boxes = [(int(c.box[0]), int(c.box[1]), int(c.box[2]), int(c.box[3])) for c in candidates]
    joined, joined_labels = join_unlabelled(boxes, labels, named)
    if len(joined) == len(boxes):
        return candidates, labels
    confidence = {b: c.confidence for b, c in zip(boxes, candidates, strict=True)}
    panels = [
        PanelCandidate(
            box=(float(b[0]), float(b[1]), float(b[2]), float(b[3])),
            confidence=confidence.get(b, SPLIT_CONFIDENCE),
        )
        for b in joined
    ]
    return panels, joined_labels


def _marker_notes_to_marked_panels(
    panels: list[MinedPanel], kinds_by_panel: dict[int, set[str]], shared: list[str]
) -> None:
    """A closing note on markers that names no panel ("Arrows indicate necrosis.") is about the
    panels that show such markers, which the caption leaves open and the image settles: it is
    taken out of the subcaptions of the other panels. When no panel shows them (the detector
    missed them), the note stays with every panel, as the caption alone would have it."""
    from p2p.mining.captions import find_marker_mentions

    for note in shared:
        kinds = frozenset().union(*(_SHOWN_BY.get(word, frozenset()) for word in find_marker_mentions(note)))
        if not kinds:
            continue
        marked = {i for i, found in kinds_by_panel.items() if found & kinds}
        if not marked:
            continue
        for i, panel in enumerate(panels):
            if i not in marked and panel.subcaption and note in panel.subcaption:
                panel.subcaption = " ".join(panel.subcaption.replace(note, " ").split()) or None


def _on_label(glyph: geometry.Box, label_boxes: Iterable[geometry.Box]) -> bool:
    """A panel label's own frame or backing square is not a marker."""
    glyph_area = geometry.area(glyph) or 1.0
    grown = [(b[0] - 4, b[1] - 4, b[2] + 4, b[3] + 4) for b in label_boxes]
    return any(geometry.intersection(glyph, b) >= 0.5 * glyph_area for b in grown)
