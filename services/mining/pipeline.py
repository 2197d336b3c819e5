"""The CPU backend: every stage of the Panel2Patch miner that needs no GPU and no download.

Stages (each replaceable, each timed): panel segmentation, label OCR, panel type, caption
splitting, marker detection (photographic panels only), region fusion, box post-processing.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from p2p.mining.captions import find_marker_mentions, split_caption
from p2p.mining.cpu.colour_bars import without_colour_bar
from p2p.mining.cpu.context import Stage, StageContext, check_order
from p2p.mining.cpu.headings import without_top_heading
from p2p.mining.cpu.imaging import full_size_analysis
from p2p.mining.cpu.labels.read import assign_labels, find_labels, reading_order, warm_up
from p2p.mining.cpu.labels.split import split_at_labels
from p2p.mining.cpu.labels.sub import split_sub_labelled
from p2p.mining.cpu.labels.trim import trim_labels
from p2p.mining.cpu.markers.net import shipped_fusion
from p2p.mining.cpu.markers.net import shipped_net as shipped_marker_net
from p2p.mining.cpu.markers.rules import detect_markers
from p2p.mining.cpu.ownership import own_panels, picture_boxes
from p2p.mining.cpu.panel_type import default_classifier
from p2p.mining.cpu.segmentation.axis_strips import return_axis_strips
from p2p.mining.cpu.segmentation.count_guided import join_unlabelled
from p2p.mining.cpu.segmentation.seam_net import shipped_net as shipped_seam_net
from p2p.mining.cpu.segmentation.seams import default_model as seam_model
from p2p.mining.cpu.segmentation.segment import segment_figure
from p2p.mining.cpu.working_scale import MAX_SIDE, map_back, shrink
from p2p.mining.label_repair import repair_with_caption, repair_with_series
from p2p.mining.params import (
    AxisStripParams,
    CountParams,
    CpuParams,
    HeadingParams,
    LabelParams,
    LabelSplitParams,
    LabelTrimParams,
    MarkerParams,
    PostprocessParams,
    RegionParams,
    load_params,
)
from p2p.mining.postprocess import TextEncoder, postprocess
from p2p.mining.regions import fuse_regions
from p2p.mining.types import FigureContext, MinedPanel, MiningResult, PanelCandidate
from p2p.mining.version import cpu_version
from p2p.shared import geometry

log = logging.getLogger(__name__)

BACKEND = "cpu"


class CpuMiner:
    """Loads its models once; ``mine`` is safe to call from several threads (each figure has its
    own ``StageContext``; nothing is kept between figures)."""

    backend = BACKEND
    prompt_version: str | None = None

    def __init__(
        self,
        params: CpuParams | None = None,
        *,
        text_encoder: TextEncoder | None = None,
        load_text_encoder: bool = True,
    ) -> None:
        self.params = params or load_params()
        self.params_name = self.params.name
        self.version = cpu_version(self.params)
        self._text_encoder = text_encoder
        self._encoder_lock = threading.Lock()
        self.panel_types = default_classifier()
        warm_up()  # OCR models load now, not on the first figure
        shipped_marker_net()  # the marker network too: a missing weights file stops the worker at start
        shipped_fusion()  # and the fusion model stored beside it
        seam_model()  # and the segmenter's seam splitter
        shipped_seam_net()  # with the panel-boundary network it reads
        if load_text_encoder:
            _ = self.text_encoder.model  # the sentence encoder too
        self.stages: tuple[Stage, ...] = cpu_stages(self)

    @property
    def text_encoder(self) -> TextEncoder:
        with self._encoder_lock:
            if self._text_encoder is None:
                self._text_encoder = TextEncoder()
            return self._text_encoder

    def ensure_ready(self) -> None:
        """Nothing external to wait for: the models are loaded in ``__init__``."""

    def mine(self, image: np.ndarray, caption: str, *, context: FigureContext | None = None) -> MiningResult:
        """``context`` (title, abstract) is for backends that read it; this one does not."""
        if image.ndim == 2:
            image = np.stack([image] * 3, axis=-1)
        image = np.ascontiguousarray(image[..., :3])
        small = shrink(image, MAX_SIDE)
        if small is not None:
            return map_back(self.mine(small, caption, context=context), image.shape[1], image.shape[0])
        ctx = StageContext(image=image, caption=caption)
        if ctx.width < 8 or ctx.height < 8:
            ctx.notes.append(f"image is {ctx.width}x{ctx.height} px: too small to mine; kept as one panel")
            return _whole_figure(ctx)
        for stage in self.stages:
            ctx.run(stage)
        return ctx.result()


def _whole_figure(ctx: StageContext) -> MiningResult:
    panel = MinedPanel(
        box=(0.0, 0.0, float(max(ctx.width, 1)), float(max(ctx.height, 1))),
        label=None,
        label_box=None,
        figure_type="image",
        type_confidence=0.0,
        confidence=0.1,
        subcaption=ctx.caption.strip() or None,
    )
    ctx.panels = [panel]
    return ctx.result()


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
    order = reading_order(candidates, labels)
    return [candidates[i] for i in order], [labels[i] for i in order]


def _join_pieces(
    candidates: list[PanelCandidate], labels: list[str | None], named: list[str], params: CountParams
) -> tuple[list[PanelCandidate], list[str | None]]:
    """Pieces without a label joined to the labelled panels beside them, when every label the
    caption names is on a panel already (``count_guided.join_unlabelled``)."""
    boxes = [(int(c.box[0]), int(c.box[1]), int(c.box[2]), int(c.box[3])) for c in candidates]
    joined, joined_labels = join_unlabelled(boxes, labels, named, params=params)
    if len(joined) == len(boxes):
        return candidates, labels
    confidence = {b: c.confidence for b, c in zip(boxes, candidates, strict=True)}
    panels = [
        PanelCandidate(
            box=(float(b[0]), float(b[1]), float(b[2]), float(b[3])),
            confidence=confidence.get(b, params.split_confidence),
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


# --------------------------------------------------------------------------------------------
# the stages, in the order the miner runs them (``cpu_stages``)


def _named(ctx: StageContext) -> None:
    ctx.named = split_caption(ctx.caption).labels_in_order


@dataclass(frozen=True)
class _SegmentStage:
    params: CpuParams

    def __call__(self, ctx: StageContext) -> None:
        p = self.params
        segmentation = segment_figure(
            ctx.image,
            named=len(ctx.named) or None,
            params=p.segment,
            seam_params=p.seams,
            count_params=p.count_guided,
        )
        ctx.candidates, ctx.analysis = segmentation.panels, segmentation.analysis
        if not ctx.candidates:
            ctx.notes.append("no panels found: the whole figure is one panel")
            box = (0.0, 0.0, float(ctx.width), float(ctx.height))
            ctx.candidates = [PanelCandidate(box=box, confidence=0.3)]


@dataclass(frozen=True)
class _LabelStage:
    params: LabelParams

    def __call__(self, ctx: StageContext) -> None:
        ctx.full_look = full_size_analysis(ctx.image, ctx.analysis)
        ctx.detections = find_labels(ctx.image, ctx.candidates, analysis=ctx.full_look, params=self.params)
        ctx.labels = assign_labels(ctx.candidates, ctx.detections, params=self.params)


def _sub_labels(ctx: StageContext) -> None:
    """Grids of pictures labelled picture by picture ("c1", "c2" ...) cut into their pictures."""
    look = ctx.full_look
    assert look is not None  # the label stage made it
    gray, u = look.gray, look.u
    ctx.candidates, ctx.labels, ctx.detections = split_sub_labelled(
        gray, ctx.candidates, ctx.labels, ctx.detections, u=u, named=ctx.named
    )


@dataclass(frozen=True)
class _SplitAtLabelsStage:
    params: LabelSplitParams
    split_confidence: float

    def __call__(self, ctx: StageContext) -> None:
        ctx.candidates, ctx.labels, ctx.detections = split_at_labels(
            ctx.image,
            ctx.candidates,
            ctx.labels,
            ctx.detections,
            named=ctx.named,
            analysis=ctx.analysis,
            params=self.params,
            split_confidence=self.split_confidence,
        )


@dataclass(frozen=True)
class _JoinUnlabelledStage:
    params: CountParams

    def __call__(self, ctx: StageContext) -> None:
        ctx.candidates, ctx.labels = _join_pieces(ctx.candidates, ctx.labels, ctx.named, self.params)


@dataclass(frozen=True)
class _TrimLabelsStage:
    params: LabelTrimParams

    def __call__(self, ctx: StageContext) -> None:
        ctx.candidates = trim_labels(
            ctx.image, ctx.candidates, ctx.labels, ctx.detections, analysis=ctx.analysis, params=self.params
        )


@dataclass(frozen=True)
class _AxisStripStage:
    params: AxisStripParams

    def __call__(self, ctx: StageContext) -> None:
        ctx.candidates = return_axis_strips(
            ctx.image, ctx.candidates, ctx.detections, analysis=ctx.analysis, params=self.params
        )


def _ownership(ctx: StageContext) -> None:
    ctx.candidates, ctx.labels, notes = own_panels(
        ctx.image, ctx.candidates, ctx.labels, ctx.detections, named=ctx.named
    )
    ctx.notes.extend(notes)


@dataclass(frozen=True)
class _HeadingStage:
    params: HeadingParams

    def __call__(self, ctx: StageContext) -> None:
        """A heading printed flush over a panel goes to its outer box (the one ownership set, if
        it set one: that one already holds the headers round a part of pictures)."""
        heights = [d.box[3] - d.box[1] for d in ctx.detections]
        if not heights:
            return
        text_height = float(np.median(heights))
        # the glyphs of labels that head a panel (a label read but given to none may be a
        # heading's own text)
        labels = [box for text, box in ctx.label_boxes.items() if text in ctx.labels]
        out = []
        for cand, (kind, _) in zip(ctx.candidates, ctx.panel_types, strict=True):
            trimmed = without_top_heading(
                ctx.image, cand.box, text_height, params=self.params, plot=kind == "plot", labels=labels
            )
            out.append(
                cand if trimmed is None else replace(cand, box=trimmed, outer_box=cand.outer_box or cand.box)
            )
        ctx.candidates = out


def _colour_bars(ctx: StageContext) -> None:
    """What the conventions leave out of an image panel goes to its outer box: for a panel of
    pictures as the segmenter cut it (ownership set no outer box), the text round its pictures
    (``ownership.picture_boxes``); else a colour bar beside it (``cpu.colour_bars``)."""
    out = []
    bare = [
        kind == "image" and cand.outer_box is None
        for cand, (kind, _) in zip(ctx.candidates, ctx.panel_types, strict=True)
    ]
    found = iter(picture_boxes(ctx.image, [c.box for c, b in zip(ctx.candidates, bare, strict=True) if b]))
    for cand, (kind, _), is_bare in zip(ctx.candidates, ctx.panel_types, bare, strict=True):
        trimmed = next(found) if is_bare else None
        if trimmed is None and kind == "image":
            trimmed = without_colour_bar(ctx.image, cand.box)
        out.append(
            cand if trimmed is None else replace(cand, box=trimmed, outer_box=cand.outer_box or cand.box)
        )
    ctx.candidates = out


def _reading_order(ctx: StageContext) -> None:
    ctx.candidates, ctx.labels = in_reading_order(ctx.candidates, ctx.labels)


@dataclass(frozen=True)
class _CaptionLabelStage:
    params: LabelParams

    def __call__(self, ctx: StageContext) -> None:
        _caption_labels(ctx, grid_area_ratio=self.params.grid_area_ratio)


def _caption_labels(ctx: StageContext, *, grid_area_ratio: float) -> None:
    """The labels completed from the caption's sequence (or, when the caption names none, from
    the printed series), and the caption split on them."""
    labels, candidates = ctx.labels, ctx.candidates
    if any(labels) and len(candidates) > 1:
        # the caption's own labels (``named``, a split without hints: with hints, labels_in_order
        # follows what OCR read, misreadings appended and unread labels left out)
        repaired = repair_with_caption(labels, ctx.named)
        if repaired != labels:
            ctx.notes.append("panel labels completed from the caption's label sequence")
            labels = repaired
        elif len(ctx.named) < 2:
            areas = [geometry.area(c.box) for c in candidates]
            repaired = repair_with_series(labels, areas, grid_ratio=grid_area_ratio)
            if repaired != labels:
                ctx.notes.append("panel labels completed from the printed series in reading order")
                labels = repaired
    known = [label for label in labels if label]
    split = split_caption(ctx.caption, known or None)
    if not any(labels):
        if split.labels_in_order and len(candidates) > 1:
            ctx.notes.append("no panel labels read: caption labels assigned in reading order")
            labels = [
                split.labels_in_order[i] if i < len(split.labels_in_order) else None
                for i in range(len(candidates))
            ]
        elif len(candidates) > 1:
            ctx.notes.append("no panel labels in image or caption: panels are unlabelled")
    missing = [label for label in split.labels_in_order if label not in labels]
    if missing:
        ctx.notes.append(
            f"caption names {len(split.labels_in_order)} panels, {len(candidates)} found; "
            f"no panel for {', '.join(missing)}"
        )
    ctx.labels, ctx.split = labels, split


def _subcaptions(ctx: StageContext) -> None:
    """The mined panels: box, label and its box, type, and the caption's words for each."""
    assert ctx.split is not None
    label_boxes = ctx.label_boxes
    ctx.panels = []
    for candidate, label, (kind, type_conf) in zip(ctx.candidates, ctx.labels, ctx.panel_types, strict=True):
        subcaption = ctx.split.subcaptions.get(label) if label else None
        if subcaption is None and len(ctx.candidates) == 1:
            subcaption = ctx.caption.strip() or None
        ctx.panels.append(
            MinedPanel(
                box=candidate.box,
                label=label,
                label_box=label_boxes.get(label or ""),
                figure_type=kind,
                type_confidence=type_conf,
                confidence=candidate.confidence,
                subcaption=subcaption,
                outer_box=candidate.outer_box,
            )
        )


@dataclass(frozen=True)
class _MarkerStage:
    """Markers on the photographic panels (a label's own frame is no marker)."""

    params: MarkerParams

    def __call__(self, ctx: StageContext) -> None:
        label_boxes = ctx.label_boxes.values()
        ctx.markers_by_panel = {
            index: [
                m
                # looked for in all the panel's label owns (pictures with their headers), kept
                # when they point into the panel
                for m in detect_markers(ctx.image, panel.outer_box or panel.box, params=self.params)
                if not _on_label(m.glyph_box, label_boxes)
                and geometry.contains_point(panel.box, *m.target_point)
            ]
            for index, panel in enumerate(ctx.panels)
            if panel.figure_type == "image"
        }


def _marker_notes(ctx: StageContext) -> None:
    assert ctx.split is not None
    kinds_by_panel = {index: {m.kind for m in found} for index, found in ctx.markers_by_panel.items()}
    _marker_notes_to_marked_panels(ctx.panels, kinds_by_panel, ctx.split.shared_trailing)


@dataclass(frozen=True)
class _RegionStage:
    params: RegionParams

    def __call__(self, ctx: StageContext) -> None:
        assert ctx.split is not None
        ctx.regions = []
        for index, found in ctx.markers_by_panel.items():
            panel = ctx.panels[index]
            fragments = ctx.split.marker_fragments.get(panel.label or "", []) if panel.label else []
            fused = fuse_regions(found, [], panel_box=panel.box, tau=self.params.tau, fragments=fragments)
            for region in fused:
                region.panel_index = index
            ctx.regions.extend(fused)


@dataclass(frozen=True)
class _PanelTypeStage:
    classify: Any  # PanelTypeClassifier.classify: crop -> (type, confidence)

    def __call__(self, ctx: StageContext) -> None:
        ctx.panel_types = []
        for candidate in ctx.candidates:
            x1, y1, x2, y2 = (round(v) for v in candidate.box)
            crop = ctx.image[max(y1, 0) : max(y2, y1 + 1), max(x1, 0) : max(x2, x1 + 1)]
            ctx.panel_types.append(self.classify(crop))


@dataclass(frozen=True)
class _PostprocessStage:
    params: PostprocessParams
    miner: CpuMiner  # its text encoder, loaded when first needed

    def __call__(self, ctx: StageContext) -> None:
        if not ctx.regions:
            return
        params = self.params
        ctx.regions = postprocess(
            ctx.regions,
            image_width=ctx.width,
            image_height=ctx.height,
            nms_iou=params.nms_iou,
            merge_cosine=params.merge_cosine,
            encoder=self.miner.text_encoder if any(r.caption_text for r in ctx.regions) else None,
        )


def cpu_stages(miner: CpuMiner) -> tuple[Stage, ...]:
    """The CPU miner's stages in order, each with its own parameters (``miner.params``).
    ``panels_*`` stages move panel boxes after segmentation."""
    p = miner.params
    stages = (
        Stage("caption_names", ("caption",), ("named",), _named),
        Stage("segment", ("image", "named"), ("candidates", "analysis"), _SegmentStage(p)),
        Stage(
            "labels",
            ("image", "candidates", "analysis"),
            ("detections", "labels", "full_look"),
            _LabelStage(p.labels),
        ),
        Stage(
            "panels_sub_labels",
            ("image", "candidates", "labels", "detections", "named", "full_look"),
            ("candidates", "labels", "detections"),
            _sub_labels,
        ),
        Stage(
            "panels_split_at_labels",
            ("image", "candidates", "labels", "detections", "named", "analysis"),
            ("candidates", "labels", "detections"),
            _SplitAtLabelsStage(p.label_split, p.count_guided.split_confidence),
        ),
        Stage(
            "panels_join_unlabelled",
            ("candidates", "labels", "named"),
            ("candidates", "labels"),
            _JoinUnlabelledStage(p.count_guided),
        ),
        Stage(
            "panels_trim_labels",
            ("image", "candidates", "labels", "detections", "analysis"),
            ("candidates",),
            _TrimLabelsStage(p.label_trim),
        ),
        Stage(
            "panels_axis_strips",
            ("image", "candidates", "detections", "analysis"),
            ("candidates",),
            _AxisStripStage(p.axis_strips),
        ),
        Stage(
            "panels_ownership",
            ("image", "candidates", "labels", "detections", "named"),
            ("candidates", "labels"),
            _ownership,
        ),
        Stage("reading_order", ("candidates", "labels"), ("candidates", "labels"), _reading_order),
        Stage(
            "captions",
            ("caption", "named", "candidates", "labels"),
            ("labels", "split"),
            _CaptionLabelStage(p.labels),
        ),
        Stage(
            "panel_type",
            ("image", "candidates"),
            ("panel_types",),
            _PanelTypeStage(miner.panel_types.classify),
        ),
        Stage(
            "panels_headings",
            ("image", "candidates", "labels", "detections", "panel_types"),
            ("candidates",),
            _HeadingStage(p.headings),
        ),
        Stage("panels_colour_bars", ("image", "candidates", "panel_types"), ("candidates",), _colour_bars),
        Stage(
            "subcaptions",
            ("caption", "candidates", "labels", "detections", "panel_types", "split"),
            ("panels",),
            _subcaptions,
        ),
        Stage("markers", ("image", "panels", "detections"), ("markers_by_panel",), _MarkerStage(p.markers)),
        Stage("regions", ("panels", "markers_by_panel", "split"), ("regions",), _RegionStage(p.regions)),
        Stage("marker_notes", ("panels", "markers_by_panel", "split"), ("panels",), _marker_notes),
        Stage("postprocess", ("regions",), ("regions",), _PostprocessStage(p.postprocess, miner)),
    )
    check_order(stages)
    return stages
