"""The LVLM stages of the paper (Sec. 3.1): multi-view panel decomposition, marker detection,
caption-grounded objects, and crop descriptions. Each returns what it found in figure pixels,
or None when the model gave nothing usable (the caller falls back to the CPU backend)."""

from __future__ import annotations

import asyncio
import re
import zlib
from dataclasses import dataclass

import numpy as np

from p2p.mining.lvlm.coords import ViewFrame, interpret_boxes, prepare_view
from p2p.mining.lvlm.prompts import FigureContext, Mark, build_context
from p2p.mining.lvlm.run import FigureRun
from p2p.mining.lvlm.schemas import (
    DescribeAnswer,
    DescribeMarksAnswer,
    MarkersAnswer,
    ObjectsAnswer,
    PanelsAnswer,
    VerifyPanelsAnswer,
)
from p2p.mining.lvlm.voting import PanelVote, ViewSpec, VotedPanel, aggregate_panels, make_views
from p2p.mining.types import MARKER_KINDS, Marker
from p2p.shared.geometry import Box, center
from p2p.shared.settings import LvlmSettings

MARKER_CONFIDENCE = 0.8  # an LVLM marker: no pixel evidence of the glyph, the model's word for it
REGION_MAX_PIXELS = 28 * 28 * 64
MARK_TEXT_CHARS = 100  # region crops are small; a fixed small budget keeps them cheap


def figure_seed(image: np.ndarray) -> int:
    """Views are random but reproducible: the same figure gets the same views on a re-run."""
    step_y, step_x = max(1, image.shape[0] // 64), max(1, image.shape[1] // 64)
    return (
        zlib.crc32(np.ascontiguousarray(image[::step_y, ::step_x]).tobytes())
        ^ image.shape[0] << 16
        ^ image.shape[1]
    )


def _short(text: str, limit: int = MARK_TEXT_CHARS) -> str:
    """A mark's text is a reminder of which caption piece it is; the whole caption is in the context."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1].rsplit(" ", 1)[0] + "…"


def _view(
    image: np.ndarray, crop: Box | None, max_pixels: int, s: LvlmSettings
) -> tuple[np.ndarray, ViewFrame]:
    return prepare_view(image, crop, max_pixels=max_pixels, min_pixels=s.min_pixels)


async def decompose_panels(
    run: FigureRun,
    image: np.ndarray,
    ctx: FigureContext,
    s: LvlmSettings,
    *,
    views: int | None = None,
    max_pixels: int | None = None,
) -> list[VotedPanel] | None:
    height, width = image.shape[:2]
    rng = np.random.default_rng(figure_seed(image))
    specs: list[ViewSpec] = make_views(
        width,
        height,
        count=views or s.views,
        max_pixels=max_pixels or s.max_pixels,
        rng=rng,
        min_side=s.view_min_side,
        scale_min=s.view_scale_min,
    )

    async def one(index: int, spec: ViewSpec) -> tuple[list[PanelVote], bool] | None:
        view, frame = await asyncio.to_thread(_view, image, spec.crop, spec.max_pixels, s)
        context = build_context(ctx, image_size=(frame.sent_width, frame.sent_height))
        answer = await run.ask("panels", "panels", view, context)
        if not isinstance(answer, PanelsAnswer):
            return None
        boxes, notes = interpret_boxes([p.bbox for p in answer.panels], frame)
        for note in notes:
            run.note(f"panels (view {index}): {note}")
        votes = [
            PanelVote(
                view=index, panel_id=p.panel_id, box=box, subcaption=p.subcaption, description=p.description
            )
            for p, box in zip(answer.panels, boxes, strict=True)
            if box is not None
        ]
        return votes, answer.single_panel

    answers = await asyncio.gather(*(one(i, spec) for i, spec in enumerate(specs)))
    usable = [a for a in answers if a is not None]
    if not usable:
        return None
    if len(usable) < len(specs):
        run.note(f"panels: {len(specs) - len(usable)} of {len(specs)} views gave no usable answer")
    votes = [v for a in usable for v in a[0]]
    voted = aggregate_panels(votes, [specs[i] for i, a in enumerate(answers) if a is not None])
    if not voted and sum(single for _, single in usable) * 2 > len(usable):
        whole: Box = (0.0, 0.0, float(width), float(height))
        return [VotedPanel(None, whole, 1.0, len(usable), ctx.caption, "", len(usable))]
    return voted or None


@dataclass
class PanelFindings:
    markers: list[Marker]
    caption_boxes: list[tuple[Box, str]]
    marker_captions: list[str]
    markers_ok: bool
    objects_ok: bool


def _marker_kind(name: str) -> str:
    word = re.sub(r"[^a-z]", "", name.lower())
    for kind in MARKER_KINDS:
        if word.startswith(kind):
            return kind
    return {"rectangle": "box", "square": "box", "oval": "circle", "ellipse": "circle"}.get(word, "arrow")


async def find_in_panel(
    run: FigureRun, image: np.ndarray, panel_box: Box, subcaption: str, ctx: FigureContext, s: LvlmSettings
) -> PanelFindings:
    view, frame = await asyncio.to_thread(_view, image, panel_box, s.max_pixels, s)
    context = build_context(ctx, image_size=(frame.sent_width, frame.sent_height), subcaption=subcaption)
    markers_answer, objects_answer = await asyncio.gather(
        run.ask("markers", "markers", view, context), run.ask("objects", "objects", view, context)
    )
    markers: list[Marker] = []
    captions: list[str] = []
    if isinstance(markers_answer, MarkersAnswer):
        boxes, notes = interpret_boxes([m.target_bbox for m in markers_answer.markers], frame)
        for note in notes:
            run.note(f"markers: {note}")
        for item, box in zip(markers_answer.markers, boxes, strict=True):
            if box is None:
                continue
            markers.append(
                Marker(
                    kind=_marker_kind(item.type),
                    glyph_box=box,  # the model reports where the marker points, not the glyph
                    target_point=center(box),
                    target_box=box,
                    confidence=MARKER_CONFIDENCE,
                )
            )
            if item.caption.strip():
                captions.append(item.caption.strip())
    caption_boxes: list[tuple[Box, str]] = []
    if isinstance(objects_answer, ObjectsAnswer):
        boxes, notes = interpret_boxes([o.bbox for o in objects_answer.objects], frame)
        for note in notes:
            run.note(f"objects: {note}")
        caption_boxes = [
            (box, item.phrase or item.type)
            for item, box in zip(objects_answer.objects, boxes, strict=True)
            if box is not None
        ]
    return PanelFindings(
        markers=markers,
        caption_boxes=caption_boxes,
        marker_captions=captions,
        markers_ok=isinstance(markers_answer, MarkersAnswer),
        objects_ok=isinstance(objects_answer, ObjectsAnswer),
    )


async def describe_crop(
    run: FigureRun,
    image: np.ndarray,
    box: Box,
    text: str,
    ctx: FigureContext,
    s: LvlmSettings,
    *,
    region: bool,
) -> str | None:
    budget = min(REGION_MAX_PIXELS, s.max_pixels) if region else s.max_pixels
    view, frame = await asyncio.to_thread(_view, image, box, budget, s)
    context = build_context(ctx, image_size=(frame.sent_width, frame.sent_height), subcaption=text)
    answer = await run.ask("describe", "describe", view, context)
    if isinstance(answer, DescribeAnswer) and answer.description.strip():
        return answer.description.strip()
    return None


async def verify_panels(
    run: FigureRun, image: np.ndarray, boxes: list[Box], ctx: FigureContext, s: LvlmSettings
) -> tuple[VerifyPanelsAnswer, list[Box | None]] | None:
    """Hybrid: the CPU panels drawn as numbered marks; the model judges each and gives its own box."""
    from p2p.mining.lvlm.marks import draw_marks

    view, frame = await asyncio.to_thread(_view, image, None, s.hybrid_max_pixels, s)
    marks = [Mark(i + 1, "panel", frame.from_original(box)) for i, box in enumerate(boxes)]
    drawn = await asyncio.to_thread(draw_marks, view, marks)
    context = build_context(ctx, image_size=(frame.sent_width, frame.sent_height), marks=marks)
    answer = await run.ask("verify", "verify_panels", drawn, context)
    if not isinstance(answer, VerifyPanelsAnswer):
        return None
    own: list[Box | None] = [None] * len(boxes)
    given = [(v.mark, v.bbox) for v in answer.marks if v.bbox is not None and 1 <= v.mark <= len(boxes)]
    mapped, notes = interpret_boxes([b for _, b in given if b is not None], frame)
    for note in notes:
        run.note(f"verify: {note}")
    for (mark, _), box in zip(given, mapped, strict=True):
        own[mark - 1] = box
    return answer, own


async def describe_marks(
    run: FigureRun, image: np.ndarray, items: list[tuple[str, Box, str]], ctx: FigureContext, s: LvlmSettings
) -> DescribeMarksAnswer | None:
    """Hybrid: one request describes every panel and region of the figure (kind, box, text)."""
    from p2p.mining.lvlm.marks import draw_marks

    view, frame = await asyncio.to_thread(_view, image, None, s.hybrid_max_pixels, s)
    marks = [
        Mark(i + 1, kind, frame.from_original(box), _short(text)) for i, (kind, box, text) in enumerate(items)
    ]
    drawn = await asyncio.to_thread(draw_marks, view, marks)
    context = build_context(ctx, image_size=(frame.sent_width, frame.sent_height), marks=marks)
    answer = await run.ask("describe", "describe_marks", drawn, context)
    return answer if isinstance(answer, DescribeMarksAnswer) else None
