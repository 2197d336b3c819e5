"""The LVLM miner: paper-faithful or hybrid, with the CPU backend as proposer and fallback.

* ``paper``: every stage asks the model, as the paper does: multi-view panel decomposition, marker
  detection and caption-grounded objects per photographic panel, a description per region and
  per panel. The CPU backend is used only where an answer stays unusable.
* ``hybrid``: the CPU backend proposes panels, labels, markers and regions; the model verifies the
  panels in one set-of-mark request and describes everything in a second. Only a figure whose
  CPU panels the model disputes is decomposed by multi-view voting.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from p2p.mining.captions import split_caption
from p2p.mining.cpu.labels.read import normalize_label
from p2p.mining.cpu.markers.rules import detect_markers
from p2p.mining.lvlm.client import LvlmClient
from p2p.mining.lvlm.loop import LoopThread
from p2p.mining.lvlm.prompts import FigureContext, prompt_versions
from p2p.mining.lvlm.run import FigureRun
from p2p.mining.lvlm.stages import (
    decompose_panels,
    describe_crop,
    describe_marks,
    find_in_panel,
    verify_panels,
)
from p2p.mining.lvlm.voting import VotedPanel
from p2p.mining.params import CpuParams
from p2p.mining.pipeline import CpuMiner
from p2p.mining.postprocess import postprocess
from p2p.mining.regions import fuse_regions
from p2p.mining.types import CaptionSplit, MinedPanel, MiningResult, Region
from p2p.shared import geometry
from p2p.shared.settings import LvlmSettings

log = logging.getLogger(__name__)

BACKEND = "lvlm"
BACKEND_VERSION = "lvlm-1"
AGREE_IOU = 0.9  # a CPU panel and the model's box for it agree when they overlap this much
SNAP_IOU = 0.9  # a voted panel takes the CPU's pixel-exact box when they overlap this much


@dataclass(frozen=True)
class LvlmParams:
    cpu: CpuParams
    settings: LvlmSettings

    def as_dict(self) -> dict[str, Any]:
        s = self.settings
        return {
            **self.cpu.as_dict(),
            "mode": s.mode,
            "model": s.model,
            "views": s.views,
            "max_pixels": s.max_pixels,
            "temperature": s.temperature,
            "top_p": s.top_p,
            "top_k": s.top_k,
            "repetition_penalty": s.repetition_penalty,
            "tau": s.tau,
            "hybrid_min_confidence": s.hybrid_min_confidence,
            "hybrid_views": s.hybrid_views,
            "hybrid_max_pixels": s.hybrid_max_pixels,
            "prompts": prompt_versions(),
        }


async def _new_client(settings: LvlmSettings) -> LvlmClient:
    return LvlmClient(settings)


class LvlmMiner:
    """Thread-safe ``mine``: every call runs on the miner's event loop, sharing one client."""

    backend = BACKEND

    def __init__(self, settings: LvlmSettings, *, cpu: CpuMiner | None = None) -> None:
        self.settings = settings
        self.cpu = cpu if cpu is not None else CpuMiner()
        self.params = LvlmParams(self.cpu.params, settings)
        # the CPU miner proposes (hybrid) and stands in (paper): its version is part of this one
        self.version = f"{BACKEND_VERSION}-{settings.mode}+{self.cpu.version}"
        self.params_name = self.cpu.params_name
        tags = prompt_versions()
        self.prompt_version = (
            "prompts-" + hashlib.sha256(repr(sorted(tags.items())).encode()).hexdigest()[:12]
        )
        self._loop = LoopThread()
        self.client = self._loop.run(_new_client(settings))

    def close(self) -> None:
        self._loop.run(self.client.aclose())
        self._loop.close()

    def ensure_ready(self) -> None:
        """Raises ``LvlmUnavailable`` unless the server is up and serves the model."""
        self._loop.run(self.client.ensure_healthy())

    def mine(self, image: np.ndarray, caption: str, *, context: FigureContext | None = None) -> MiningResult:
        return self._loop.run(self.mine_async(image, caption, context=context))

    async def mine_async(
        self, image: np.ndarray, caption: str, *, context: FigureContext | None = None
    ) -> MiningResult:
        if image.ndim == 2:
            image = np.stack([image] * 3, axis=-1)
        image = np.ascontiguousarray(image[..., :3])
        height, width = image.shape[:2]
        if width < 28 or height < 28:
            result = await asyncio.to_thread(self.cpu.mine, image, caption)
            result.notes.append(f"image is {width}x{height} px: too small for the model; CPU backend used")
            return result
        ctx = context or FigureContext(caption=caption)
        run = FigureRun(self.client)
        await self.client.ensure_healthy()
        started = time.perf_counter()
        if self.settings.mode == "paper":
            result = await self._paper(run, image, ctx)
        else:
            result = await self._hybrid(run, image, ctx)
        result.stage_seconds["lvlm_total"] = time.perf_counter() - started
        result.notes.extend(n for n in run.notes if n not in result.notes)
        result.cost = {**run.ledger.as_dict(), **run.gate, "outcomes": dict(run.outcomes)}
        result.provenance = {
            "backend": BACKEND,
            "mode": self.settings.mode,
            "model": self.settings.model,
            "prompts": prompt_versions(),
            "outcomes": dict(run.outcomes),
        }
        return result

    # -- paper-faithful -------------------------------------------------------------------------

    async def _paper(self, run: FigureRun, image: np.ndarray, ctx: FigureContext) -> MiningResult:
        s = self.settings
        timer: dict[str, float] = {}
        height, width = image.shape[:2]
        t0 = time.perf_counter()
        voted = await decompose_panels(run, image, ctx, s)
        timer["panels"] = time.perf_counter() - t0
        if voted is None:
            run.fallback("panels", "no usable panel decomposition")
            cpu_result = await asyncio.to_thread(self.cpu.mine, image, ctx.caption)
            panels = cpu_result.panels
            run.notes.extend(cpu_result.notes)
        else:
            panels = await asyncio.to_thread(self._panels_from_votes, image, voted, ctx.caption, run)
        split = split_caption(ctx.caption, [p.label for p in panels if p.label] or None)

        t0 = time.perf_counter()
        regions, markers = await self._regions(run, image, panels, split, ctx)
        timer["regions"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        regions = await asyncio.to_thread(self._postprocess, regions, width, height)
        timer["postprocess"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        if s.describe_regions:  # after post-processing: no request for a box that NMS drops
            await self._describe_each(run, image, panels, regions, ctx)
        timer["describe"] = time.perf_counter() - t0
        return MiningResult(width, height, panels, markers, regions, timer, notes=[])

    def _panels_from_votes(
        self, image: np.ndarray, voted: list[VotedPanel], caption: str, run: FigureRun
    ) -> list[MinedPanel]:
        split, mentioned = caption_labels(caption, [v.panel_id for v in voted])
        labels = _reconcile_labels([v.panel_id for v in voted], mentioned, run)
        if labels != [v.panel_id for v in voted]:
            split, _ = caption_labels(caption, labels)
        panels: list[MinedPanel] = []
        for vote, label in zip(voted, labels, strict=True):
            subcaption = vote.subcaption.strip()
            if subcaption and not _is_verbatim(subcaption, caption):
                run.note(f"panel {label or '?'}: the model's subcaption is not caption text; splitter used")
                subcaption = ""
            if not subcaption:
                subcaption = split.subcaptions.get(label or "", "") or (caption if len(voted) == 1 else "")
            kind, type_conf = self.cpu.panel_types.classify(_crop(image, vote.box))
            panels.append(
                MinedPanel(
                    box=vote.box,
                    label=label,
                    label_box=None,
                    figure_type=kind,
                    type_confidence=type_conf,
                    confidence=vote.confidence,
                    subcaption=subcaption or None,
                    description=vote.description or None,
                )
            )
        return panels

    async def _regions(
        self,
        run: FigureRun,
        image: np.ndarray,
        panels: list[MinedPanel],
        split: CaptionSplit,
        ctx: FigureContext,
    ) -> tuple[list[Region], list[Any]]:
        s = self.settings
        image_panels = [i for i, p in enumerate(panels) if p.figure_type == "image"]
        findings = await asyncio.gather(
            *(
                find_in_panel(run, image, panels[i].box, panels[i].subcaption or "", ctx, s)
                for i in image_panels
            )
        )
        regions: list[Region] = []
        all_markers: list[Any] = []
        proposed = kept = 0
        for index, found in zip(image_panels, findings, strict=True):
            panel = panels[index]
            markers = found.markers
            if not found.markers_ok:
                run.fallback("markers", "no usable marker answer", whole_stage=False)
                markers = await asyncio.to_thread(
                    detect_markers, image, panel.box, params=self.cpu.params.markers
                )
            fragments: list[Any] = list(split.marker_fragments.get(panel.label or "", []))
            fragments.extend(found.marker_captions)
            fused = fuse_regions(
                markers,
                found.caption_boxes,
                panel_box=panel.box,
                tau=self.settings.tau,
                fragments=fragments,
                panel_index=index,
            )
            proposed += len(found.caption_boxes)
            kept += sum(r.kind == "caption" for r in fused)
            all_markers.extend(markers)
            regions.extend(fused)
        run.gate = {"caption_boxes": proposed, "caption_boxes_kept": kept}
        return regions, all_markers

    async def _describe_each(
        self,
        run: FigureRun,
        image: np.ndarray,
        panels: list[MinedPanel],
        regions: list[Region],
        ctx: FigureContext,
    ) -> None:
        s = self.settings
        region_texts = await asyncio.gather(
            *(describe_crop(run, image, r.box, r.caption_text or "", ctx, s, region=True) for r in regions)
        )
        # Each panel is described from its own crop and its subcaption (the decomposition's one-line
        # description, made from the whole figure, stays only where this answer is unusable).
        panel_texts = await asyncio.gather(
            *(describe_crop(run, image, p.box, p.subcaption or "", ctx, s, region=False) for p in panels)
        )
        for region, text in zip(regions, region_texts, strict=True):
            region.description = text
        for panel, text in zip(panels, panel_texts, strict=True):
            panel.description = text or panel.description
        if any(t is None for t in (*region_texts, *panel_texts)):
            run.note("describe: some crops got no usable description")

    def _postprocess(self, regions: list[Region], width: int, height: int) -> list[Region]:
        if not regions:
            return regions
        p = self.cpu.params
        encoder = self.cpu.text_encoder if any(r.caption_text for r in regions) else None
        return postprocess(
            regions,
            image_width=width,
            image_height=height,
            nms_iou=p.nms_iou,
            merge_cosine=p.merge_cosine,
            encoder=encoder,
        )

    # -- hybrid ---------------------------------------------------------------------------------

    async def _hybrid(self, run: FigureRun, image: np.ndarray, ctx: FigureContext) -> MiningResult:
        s = self.settings
        height, width = image.shape[:2]
        cpu_result = await asyncio.to_thread(self.cpu.mine, image, ctx.caption)
        timer = {f"cpu_{k}": v for k, v in cpu_result.stage_seconds.items()}
        panels, regions = cpu_result.panels, cpu_result.regions
        boxes = [p.box for p in panels]

        t0 = time.perf_counter()
        verdict = await verify_panels(run, image, boxes, ctx, s)
        decompose = False
        if verdict is None:
            run.fallback("verify", "no usable verification of the CPU panels")
            confidence = float(np.mean([p.confidence for p in panels])) if panels else 0.0
            decompose = confidence < s.hybrid_min_confidence
        else:
            answer, own = verdict
            by_mark = {v.mark: v for v in answer.marks}
            hints = [p.label for p in panels] + [v.panel_id for v in answer.marks]
            _, mentioned = caption_labels(ctx.caption, hints)
            relabelled = False
            agree = 0
            rejected = 0
            for i, panel in enumerate(panels):
                v = by_mark.get(i + 1)
                if v is not None and not v.is_panel:
                    rejected += 1
                    continue
                box = own[i]
                if box is not None and geometry.iou(box, panel.box) >= AGREE_IOU:
                    agree += 1
                if v is not None and v.panel_id != panel.label and _takes_label(v.panel_id, mentioned):
                    panel.label, relabelled = v.panel_id, True
            confidence = agree / len(panels) if panels else 0.0
            decompose = confidence < s.hybrid_min_confidence or answer.missing_panels > 0 or rejected > 0
            for panel in panels:
                panel.confidence = min(panel.confidence, 1.0) * (0.5 + 0.5 * confidence)
            if relabelled:
                run.note("hybrid: panel labels corrected by the model; subcaptions re-split")
                split, _ = caption_labels(ctx.caption, [p.label for p in panels])
                for panel in panels:
                    panel.subcaption = split.subcaptions.get(panel.label or "") or panel.subcaption
        timer["verify"] = time.perf_counter() - t0

        if decompose:
            run.note(f"hybrid: the model disputes the CPU panels (agreement {confidence:.2f}); decomposed")
            t0 = time.perf_counter()
            voted = await decompose_panels(
                run, image, ctx, s, views=s.hybrid_views, max_pixels=s.hybrid_max_pixels
            )
            timer["panels"] = time.perf_counter() - t0
            if voted:
                snapped = [_snap(v, boxes) for v in voted]
                new_panels = await asyncio.to_thread(
                    self._panels_from_votes, image, snapped, ctx.caption, run
                )
                regions = _reassign(regions, new_panels)
                panels = new_panels
            else:
                run.fallback("panels", "no usable decomposition: CPU panels kept")
        else:
            run.outcome("panels", "skipped")

        t0 = time.perf_counter()
        items = [("panel", p.box, p.subcaption or "") for p in panels]
        items += [("region", r.box, r.caption_text or r.marker_type or "") for r in regions]
        described = await describe_marks(run, image, items, ctx, s) if items else None
        if described is None and items:
            run.fallback("describe", "no usable descriptions")
        elif described is not None:
            descriptions = {d.mark: d for d in described.descriptions}
            dropped = []
            for i, panel in enumerate(panels):
                d = descriptions.get(i + 1)
                panel.description = (d.description.strip() or None) if d else None
            kept_regions = []
            for j, region in enumerate(regions):
                d = descriptions.get(len(panels) + j + 1)
                if d is not None and not d.keep:
                    dropped.append(j)
                    continue
                region.description = (d.description.strip() or None) if d else None
                kept_regions.append(region)
            if dropped:
                run.note(f"hybrid: the model rejected {len(dropped)} CPU region(s) as false markers")
            regions = kept_regions
        timer["describe"] = time.perf_counter() - t0
        notes = list(cpu_result.notes)
        return MiningResult(width, height, panels, cpu_result.markers, regions, timer, notes=notes)


def _takes_label(panel_id: str | None, mentioned: list[str]) -> bool:
    """Whether the model's label for a CPU panel replaces the CPU's: one the caption speaks about,
    or, when the caption names no panel at all (no caption, or a caption without labels), any
    label as figures print them: the model reads the printed label, which is all there is."""
    if not panel_id:
        return False
    if mentioned:
        return panel_id in mentioned
    return normalize_label(panel_id) == panel_id


def caption_labels(caption: str, labels: list[str | None]) -> tuple[CaptionSplit, list[str]]:
    """The caption split with ``labels`` as hints, and those of the labels the caption really
    speaks about (a hinted label gets a subcaption either way; only a mentioned one has text of
    its own)."""
    hints = list(dict.fromkeys(label for label in labels if label))
    split = split_caption(caption, hints or None)
    mentioned = [label for label in split.labels_in_order if split.own_fragments.get(label)]
    return split, mentioned


def _crop(image: np.ndarray, box: geometry.Box) -> np.ndarray:
    h, w = image.shape[:2]
    x1, y1, x2, y2 = (round(v) for v in geometry.clip(box, w, h))
    return image[y1 : max(y2, y1 + 1), x1 : max(x2, x1 + 1)]


def _snap(vote: VotedPanel, cpu_boxes: list[geometry.Box]) -> VotedPanel:
    best = max(cpu_boxes, key=lambda b: geometry.iou(b, vote.box), default=None)
    if best is not None and geometry.iou(best, vote.box) >= SNAP_IOU:
        return VotedPanel(
            vote.panel_id,
            best,
            vote.confidence,
            vote.support,
            vote.subcaption,
            vote.description,
            vote.views_seen,
        )
    return vote


def _reassign(regions: list[Region], new: list[MinedPanel]) -> list[Region]:
    """Regions found on the CPU panels, moved to the new panel that holds most of each."""
    out = []
    for region in regions:
        overlaps = [geometry.intersection(region.box, p.box) for p in new]
        if not overlaps or max(overlaps) <= 0:
            continue
        index = int(np.argmax(overlaps))
        if new[index].figure_type != "image":
            continue
        region.panel_index = index
        out.append(region)
    return out


def _reconcile_labels(
    labels: list[str | None], caption_labels: list[str], run: FigureRun
) -> list[str | None]:
    """Model labels checked against the caption: unknown ones dropped, case fixed, duplicates
    cleared, and unlabelled panels given the caption's remaining labels in reading order when the
    counts match."""
    if not caption_labels:
        return labels
    lower = {c.lower(): c for c in caption_labels}
    out: list[str | None] = []
    used: set[str] = set()
    for label in labels:
        fixed = label if label in caption_labels else lower.get((label or "").lower()) if label else None
        if label and fixed is None:
            run.note(f"panel label {label!r} is not in the caption; dropped")
        if fixed in used:
            run.note(f"panel label {fixed!r} given twice; the second dropped")
            fixed = None
        if fixed:
            used.add(fixed)
        out.append(fixed)
    remaining = [c for c in caption_labels if c not in used]
    blanks = [i for i, label in enumerate(out) if label is None]
    if blanks and len(blanks) == len(remaining):
        for i, label in zip(blanks, remaining, strict=True):
            out[i] = label
        run.note("caption labels assigned to unlabelled panels in reading order")
    return out


_PIECE = re.compile(r"[^.;:]+")


def _is_verbatim(text: str, caption: str) -> bool:
    """The model copied caption text (pieces may be joined from several places), not its own words."""
    flat = " ".join(caption.split()).lower()
    pieces = [" ".join(p.split()).lower() for p in _PIECE.findall(text)]
    pieces = [p for p in pieces if len(p) > 3]
    return bool(pieces) and all(p in flat for p in pieces)
