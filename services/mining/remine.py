"""Which miner version produced what, and re-mining what an older version produced.

A figure's standing results are those of its succeeded, not superseded job on a backend; that job's
``miner_version`` says which miner made them. Re-mining queues one job per stale figure keyed by the
current version (on the mining queue, like any other job); the worker replaces the old job's rows in
the transaction that writes the new ones (``jobs._supersede``), so a figure never shows no results
and a re-mine that fails leaves the old ones standing.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from sqlalchemy import Select, func, select, update
from sqlalchemy.orm import Session

from p2p.shared.db.base import utcnow
from p2p.shared.db.models import JobStatus, MiningJob
from p2p.shared.queue import MINE_FIGURE_TASK, TaskDispatcher, mining_queue
from p2p.shared.runtime import Runtime

# Jobs are created and queued in chunks of this many, one transaction each.
CHUNK = 200


def _standing() -> Select[MiningJob]:
    return select(MiningJob).where(
        MiningJob.status == JobStatus.SUCCEEDED, MiningJob.superseded_by_id.is_(None)
    )


def figures_per_version(session: Session) -> list[tuple[str, str | None, int]]:
    """(backend, miner version, figures whose standing results it produced), by backend and version."""
    standing = _standing().subquery()
    rows = session.execute(
        select(standing.c.backend, standing.c.miner_version, func.count(func.distinct(standing.c.figure_id)))
        .group_by(standing.c.backend, standing.c.miner_version)
        .order_by(standing.c.backend, standing.c.miner_version)
    )
    return [(backend, version, int(count)) for backend, version, count in rows]


def _stale(backend: str, version: str) -> Select[MiningJob]:
    return (
        _standing()
        .where(MiningJob.backend == backend, MiningJob.miner_version.is_distinct_from(version))
        .order_by(MiningJob.figure_id)
    )


def count_stale(session: Session, *, backend: str, version: str) -> Counter[str | None]:
    """Figures on ``backend`` whose standing results an other miner version than ``version`` made,
    counted by that version."""
    stale = _stale(backend, version).subquery()
    rows = session.execute(select(stale.c.miner_version, func.count()).group_by(stale.c.miner_version))
    return Counter({v: int(n) for v, n in rows})


@dataclass(frozen=True)
class Queued:
    job_ids: list[uuid.UUID]
    not_sent: int  # jobs the dispatcher could not hand over now (they stay queued in the database)
    error: str | None = None  # the queue failed: the jobs made so far wait; a new run sends them


def _chunks(session: Session, backend: str, version: str, limit: int | None) -> Iterator[list[uuid.UUID]]:
    figure_ids = list(session.scalars(_stale(backend, version).with_only_columns(MiningJob.figure_id)))
    if limit is not None:
        figure_ids = figure_ids[:limit]
    for start in range(0, len(figure_ids), CHUNK):
        yield figure_ids[start : start + CHUNK]


def _job_for(session: Session, figure_id: uuid.UUID, backend: str, version: str) -> MiningJob:
    """The figure's job for ``version``: a new one, or one that version had before (failed, or
    superseded since: a version brought back), queued again to mine anew."""
    job = session.scalar(
        select(MiningJob).where(
            MiningJob.figure_id == figure_id, MiningJob.backend == backend, MiningJob.miner_version == version
        )
    )
    if job is None:
        job = MiningJob(figure_id=figure_id, backend=backend, miner_version=version, status=JobStatus.QUEUED)
        session.add(job)
    elif job.status in (JobStatus.FAILED, JobStatus.SUCCEEDED):
        job.status = JobStatus.QUEUED
        job.error = None
        job.enqueued_at = None
    return job


def queue_remine(runtime: Runtime, *, backend: str, version: str, limit: int | None = None) -> Queued:
    """Queue a job of miner ``version`` for every figure whose standing results an older (any other)
    version made. Figures keep their status and their results until the new job replaces them."""
    job_ids: list[uuid.UUID] = []
    not_sent = 0
    with runtime.session() as session:
        chunks = list(_chunks(session, backend, version, limit))
    for figure_ids in chunks:
        with runtime.session() as session:
            jobs = [_job_for(session, figure_id, backend, version) for figure_id in figure_ids]
            session.commit()
            ids = [job.id for job in jobs if job.status is JobStatus.QUEUED and job.enqueued_at is None]
            job_ids.extend(job.id for job in jobs)
        try:
            not_sent += _send(runtime, runtime.dispatcher, ids, backend)
        except Exception as exc:  # the broker: whatever kombu raises, the operator needs the reason
            return Queued(job_ids=job_ids, not_sent=len(ids) + not_sent, error=f"{type(exc).__name__}: {exc}")
    return Queued(job_ids=job_ids, not_sent=not_sent)


def _send(runtime: Runtime, dispatcher: TaskDispatcher, job_ids: Sequence[uuid.UUID], backend: str) -> int:
    """Hand the jobs to the mining queue; those handed over are marked enqueued (one statement)."""
    sent = [
        job_id
        for job_id in job_ids
        if dispatcher.send(MINE_FIGURE_TASK, args=[str(job_id)], queue=mining_queue(backend))
    ]
    if sent:
        with runtime.session() as session:
            session.execute(
                update(MiningJob)
                .where(MiningJob.id.in_(sent), MiningJob.enqueued_at.is_(None))
                .values(enqueued_at=utcnow())
            )
            session.commit()
    return len(job_ids) - len(sent)


def progress(session: Session, job_ids: Sequence[uuid.UUID]) -> Counter[JobStatus]:
    """How many of ``job_ids`` are in each status."""
    counts: Counter[JobStatus] = Counter()
    for start in range(0, len(job_ids), 1000):
        part = job_ids[start : start + 1000]
        rows = session.execute(
            select(MiningJob.status, func.count()).where(MiningJob.id.in_(part)).group_by(MiningJob.status)
        )
        counts.update({status: int(n) for status, n in rows})
    return counts
