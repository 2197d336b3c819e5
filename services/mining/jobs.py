"""Run one mining job: lock it, mine the figure, replace its panels and regions, record the outcome.

Idempotency is explicit: a job is unique per (figure, backend, miner version); the durable-job claim
(``p2p.shared.jobs``: advisory lock and lease) keeps two deliveries of it from running at once; a
finished job, succeeded or failed, is not mined again (``p2p jobs retry`` queues a failed one
first); and a re-run replaces the job's rows in one transaction, never adding to them. A job of a
newer miner (``p2p mine --stale``) replaces the rows of the figure's older job in that same
transaction, so the old results stand until the new ones are complete.
"""

from __future__ import annotations

import hashlib
import io
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image
from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from p2p.mining.lvlm.client import LvlmUnavailable
from p2p.mining.lvlm.prompts import FigureContext
from p2p.mining.miner import Miner
from p2p.mining.types import MiningResult
from p2p.shared import geometry
from p2p.shared import jobs as durable
from p2p.shared.db.models import (
    Article,
    Figure,
    JobStatus,
    MiningJob,
    Panel,
    Region,
    RegionKind,
)
from p2p.shared.images import flatten_on_white
from p2p.shared.runtime import Runtime
from p2p.shared.storage import ObjectStore, put_bytes

log = logging.getLogger(__name__)


class PermanentMiningError(Exception):
    """The figure cannot be mined (undecodable image...): retrying will not help."""


@dataclass(frozen=True)
class JobOutcome:
    job_id: uuid.UUID
    status: JobStatus
    panels: int = 0
    regions: int = 0
    skipped: str | None = None
    figure_id: uuid.UUID | None = None


def job_backend(runtime: Runtime, job_id: uuid.UUID) -> str | None:
    with runtime.session() as session:
        return session.scalar(select(MiningJob.backend).where(MiningJob.id == job_id))


def mine_job(
    runtime: Runtime, job_id: uuid.UUID, miner: Miner, *, fallback: Miner | None = None
) -> JobOutcome:
    """Mine one job with ``miner`` (a CpuMiner or an LvlmMiner).

    When the model server is unavailable the job goes back to "queued" and the error propagates
    (the task retries later); on the last attempt the caller passes ``fallback`` (the CPU miner)
    and the figure is mined by it instead, with a note saying so.
    """
    with durable.claim(runtime, durable.MINING, job_id) as lease:
        if lease is None:
            log.info("job %s is being mined by another worker; this delivery does nothing", job_id)
            return JobOutcome(job_id, JobStatus.RUNNING, skipped="locked")
        return _mine_locked(runtime, lease, miner, fallback)


def _mine_locked(runtime: Runtime, lease: durable.Lease, miner: Miner, fallback: Miner | None) -> JobOutcome:
    job_id = lease.job_id
    with runtime.session() as session:
        job = session.get(MiningJob, job_id)
        if job is None:
            return JobOutcome(job_id, JobStatus.FAILED, skipped="no such job")
        if job.status is JobStatus.SUCCEEDED:
            return JobOutcome(job_id, job.status, skipped="already mined")
        if job.status is JobStatus.FAILED:
            # A second message of it (the sweep re-sends one reserved too long) must not restart it.
            return JobOutcome(job_id, job.status, skipped="already failed")
        figure = session.get(Figure, job.figure_id)
        assert figure is not None
        target = job.miner_version
        if target is not None and target != miner.version:
            session.rollback()
            mark_failed(runtime, job_id, _wrong_version(target, miner.version))
            return JobOutcome(job_id, JobStatus.FAILED)
        durable.start(session, lease, job)  # a re-mine leaves a mined figure's status: old results stand
        session.commit()
        durable.flush_events(runtime, session)
        object_key, caption, figure_id = figure.object_key, figure.caption, figure.id
        article = session.get(Article, figure.article_id) if figure.article_id else None
        context = FigureContext(
            caption=caption,
            title=(article.title or "") if article else "",
            abstract=(article.abstract or "") if article else "",
        )

    started = time.perf_counter()
    data = runtime.store.get_bytes(object_key)  # transient store errors propagate: the task retries
    try:
        image = _decode(data)
        try:
            result = miner.mine(image, caption, context=context)
        except LvlmUnavailable as exc:
            if fallback is None or target not in (None, fallback.version):
                _requeue(runtime, job_id, f"model server unavailable: {exc}")
                raise
            miner = fallback
            result = miner.mine(image, caption, context=context)
            result.notes.append(f"model server unavailable ({exc}); mined with the CPU backend")
    except PermanentMiningError as exc:
        mark_failed(runtime, job_id, str(exc))
        return JobOutcome(job_id, JobStatus.FAILED)
    with_crops = time.perf_counter()
    panel_keys, region_keys = _store_crops(runtime.store, image, result)
    result.stage_seconds["crops"] = time.perf_counter() - with_crops
    total = time.perf_counter() - started
    params = miner.params.as_dict()
    provenance = _provenance(miner, params, job_id, result)

    with runtime.session() as session:
        job = session.get(MiningJob, job_id)
        figure = session.get(Figure, figure_id, with_for_update=True)  # one writer per figure
        assert job is not None and figure is not None
        session.execute(delete(Panel).where(Panel.mining_job_id == job_id))
        _supersede(session, job)
        job.miner_version = miner.version
        panel_rows = []
        for index, (panel, crop_key) in enumerate(zip(result.panels, panel_keys, strict=True)):
            row = Panel(
                figure_id=figure_id,
                mining_job_id=job_id,
                ordinal=index,
                label=panel.label,
                box=[round(v, 2) for v in panel.box],
                crop_key=crop_key,
                subcaption=panel.subcaption,
                description=panel.description,
                figure_type=panel.figure_type,
                confidence=round(panel.confidence, 4),
                provenance={
                    **provenance,
                    "type_confidence": round(panel.type_confidence, 4),
                    "label_box": list(panel.label_box) if panel.label_box else None,
                },
            )
            session.add(row)
            panel_rows.append(row)
        session.flush()
        for ordinal, (region, crop_key) in enumerate(zip(result.regions, region_keys, strict=True)):
            parent = panel_rows[region.panel_index]
            panel_box = result.panels[region.panel_index].box
            session.add(
                Region(
                    panel_id=parent.id,
                    ordinal=ordinal,
                    box_in_figure=[round(v, 2) for v in region.box],
                    box_in_panel=[
                        round(v, 2) for v in geometry.translate(region.box, -panel_box[0], -panel_box[1])
                    ],
                    kind=RegionKind(region.kind),
                    marker_type=region.marker_type,
                    crop_key=crop_key,
                    caption_text=region.caption_text,
                    description=region.description,
                    confidence=round(region.confidence, 4),
                    provenance=provenance,
                )
            )
        job.params = {**params, "miner_version": miner.version}
        job.prompt_version = miner.prompt_version
        job.stage_timings = {k: round(v, 4) for k, v in result.stage_seconds.items()}
        job.cost = {
            "requests": 0,
            "prompt_tokens": 0,
            "completion_tokens": 0,
            **result.cost,
            "seconds": round(total, 4),
        }
        job.notes = result.notes
        durable.finish(session, lease, job, status=JobStatus.SUCCEEDED)
        session.commit()
        durable.flush_events(runtime, session)
    return JobOutcome(
        job_id,
        JobStatus.SUCCEEDED,
        panels=len(result.panels),
        regions=len(result.regions),
        figure_id=figure_id,
    )


def _provenance(
    miner: Miner, params: dict[str, Any], job_id: uuid.UUID, result: MiningResult
) -> dict[str, Any]:
    """What every panel and region of the job records about the miner that made it."""
    provenance: dict[str, Any] = {
        "backend": miner.backend,
        "miner_version": miner.version,
        "params": params,
        "job_id": str(job_id),
        **{k: v for k, v in result.provenance.items() if k not in ("backend", "prompts")},
    }
    if miner.prompt_version:
        provenance["prompt_version"] = miner.prompt_version
    return provenance


def _wrong_version(wanted: str, running: str) -> str:
    return (
        f"the job asks for miner {wanted}, this worker runs {running}: "
        "run `p2p mine --stale` again once every worker runs one version"
    )


def _supersede(session: Session, job: MiningJob) -> None:
    """The figure's other standing jobs on this backend lose their rows to ``job`` (same transaction)."""
    older = list(
        session.scalars(
            select(MiningJob).where(
                MiningJob.figure_id == job.figure_id,
                MiningJob.backend == job.backend,
                MiningJob.id != job.id,
                MiningJob.status == JobStatus.SUCCEEDED,
                MiningJob.superseded_by_id.is_(None),
            )
        )
    )
    if older:
        session.execute(delete(Panel).where(Panel.mining_job_id.in_([o.id for o in older])))
        for old in older:
            old.superseded_by_id = job.id
    job.superseded_by_id = None  # a version brought back (a rollback) stands again


def _requeue(runtime: Runtime, job_id: uuid.UUID, reason: str) -> None:
    """Back to "queued" while the task waits to retry: never left "running"."""
    durable.requeue(runtime, durable.MINING, job_id, reason)


def mark_failed(runtime: Runtime, job_id: uuid.UUID, reason: str) -> None:
    durable.mark_failed(runtime, durable.MINING, job_id, reason)


def _decode(data: bytes) -> np.ndarray:
    try:
        with Image.open(io.BytesIO(data)) as img:
            img.load()
            return np.asarray(flatten_on_white(img))
    except (OSError, ValueError, Image.DecompressionBombError) as exc:
        raise PermanentMiningError(f"stored image cannot be decoded: {exc}") from exc


def _put_png(store: ObjectStore, crop: np.ndarray) -> str | None:
    if crop.size == 0:
        return None
    buffer = io.BytesIO()
    Image.fromarray(crop).save(buffer, format="PNG", compress_level=1)
    data = buffer.getvalue()
    sha = hashlib.sha256(data).hexdigest()
    key = f"crops/{sha[:2]}/{sha}.png"
    if not store.exists(key):
        put_bytes(store, key, data, "image/png")
    return key


def _crop(image: np.ndarray, box: geometry.Box) -> np.ndarray:
    h, w = image.shape[:2]
    x1, y1, x2, y2 = (round(v) for v in geometry.clip(box, w, h))
    return image[y1:y2, x1:x2]


def _store_crops(store: ObjectStore, image: np.ndarray, result: MiningResult) -> tuple[list[Any], list[Any]]:
    panel_keys = [_put_png(store, _crop(image, p.box)) for p in result.panels]
    region_keys = [_put_png(store, _crop(image, r.box)) for r in result.regions]
    return panel_keys, region_keys
