"""Durable jobs: the one lifecycle of every job kind (ingest batches, mining jobs, re-index jobs and
training runs).

This module owns, for all four kinds:

* the idempotency lock: a PostgreSQL advisory lock per (kind, id), held on a connection of its own
  for the whole run, so a second delivery of the same job leaves at once;
* the lease: the owner and an expiry that a heartbeat thread renews; a running job whose lease ran
  out has no live owner (its worker was killed, its machine lost) and the recovery sweep re-queues it;
* the lifecycle in one vocabulary (:class:`Phase`), each kind mapping its stored statuses onto it;
* time in queue and time running, retries of transient errors only, failure marking with a reason;
* one structured log line per event, and :class:`JobObserver` hooks (metrics) on the runtime.

The kinds' own modules keep their domain work; they call :func:`claim`, :func:`start`,
:func:`finish`, :func:`requeue` and :func:`mark_failed` around it.
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal, Protocol

import redis.exceptions
from sqlalchemy import func, select, update
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session
from urllib3.exceptions import HTTPError as Urllib3HTTPError

from p2p.shared import logs
from p2p.shared.db.base import utcnow
from p2p.shared.db.models import (
    Batch,
    BatchStatus,
    Figure,
    FigureStatus,
    JobStatus,
    MiningJob,
    ModelStatus,
    ModelVersion,
    TrainingRun,
    TrainingRunStatus,
)
from p2p.shared.queue import (
    EMBEDDING_QUEUE,
    INGEST_QUEUE,
    MINE_FIGURE_TASK,
    REINDEX_TASK,
    RUN_BATCH_TASK,
    TRAIN_RUN_TASK,
    TRAINING_QUEUE,
    mining_queue,
)

log = logging.getLogger(__name__)

# Errors worth a retry (the database, the broker or the store is briefly away); anything else is
# the job's own failure and is marked with its reason at once.
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    OperationalError,
    redis.exceptions.ConnectionError,
    Urllib3HTTPError,
    ConnectionError,
    TimeoutError,
)


def is_transient(exc: BaseException) -> bool:
    return isinstance(exc, TRANSIENT_ERRORS)


class Phase(enum.StrEnum):
    """The one vocabulary of job states, whatever each kind stores."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        return self in (Phase.SUCCEEDED, Phase.FAILED, Phase.CANCELLED)


EventName = Literal["started", "succeeded", "failed", "retry", "requeued", "skipped", "progress"]


@dataclass(frozen=True)
class JobEvent:
    """What observers get: enough for counters and histograms by kind and outcome."""

    kind: str
    job_id: uuid.UUID
    event: EventName
    attempt: int = 0
    queued_s: float | None = None
    running_s: float | None = None
    reason: str | None = None
    # What the kind measured (a mining job's stage times and LVLM cost, a training run's losses...).
    details: dict[str, Any] | None = None


class JobObserver(Protocol):
    """Called on every job event (from worker threads; must not raise, must not block)."""

    def __call__(self, event: JobEvent) -> None: ...


Row = Any  # an ORM row of one of the four job tables (they all carry the LeaseMixin columns)


@dataclass(frozen=True)
class JobKind:
    name: str
    model: type[Any]
    task_name: str
    queue: Callable[[Row], str]
    task_args: Callable[[Row], list[Any]]
    phase: Callable[[Row], Phase]
    queued_status: Any
    running_status: Any
    failed_status: Any
    # Side rows that follow the job's state (a mining job's figure).
    on_state: Callable[[Session, Row, Phase], None] | None = None
    # Rows the sweep considers (status filter on the table), as SQL.
    active_statuses: tuple[Any, ...] = ()
    # started_at is the latest attempt's start (else the first attempt's).
    restart_clock: bool = False
    # What a succeeded job's event reports beside its times (read from the finished row).
    details: Callable[[Row], dict[str, Any]] | None = None

    def lock_key(self, job_id: uuid.UUID) -> int:
        digest = hashlib.blake2b(self.name.encode() + job_id.bytes, digest_size=8).digest()
        return int.from_bytes(digest, "big", signed=True)


def _figure_follows(session: Session, job: MiningJob, phase: Phase) -> None:
    figure = session.get(Figure, job.figure_id)
    if figure is None:
        return
    if figure.status is FigureStatus.MINED and phase is not Phase.SUCCEEDED:
        return  # a re-mine by a newer miner: the older results stand until the new ones are in
    figure.status = {
        Phase.QUEUED: FigureStatus.QUEUED,
        Phase.RUNNING: FigureStatus.MINING,
        Phase.SUCCEEDED: FigureStatus.MINED,
    }.get(phase, FigureStatus.FAILED)


def _model_phase(version: ModelVersion) -> Phase:
    if version.status is ModelStatus.INDEXING:
        return Phase.RUNNING if version.lease_owner else Phase.QUEUED
    return {ModelStatus.READY: Phase.SUCCEEDED, ModelStatus.FAILED: Phase.FAILED}.get(
        version.status, Phase.SUCCEEDED
    )


_TRAINING_PHASES = {
    TrainingRunStatus.QUEUED: Phase.QUEUED,
    TrainingRunStatus.COMPLETED: Phase.SUCCEEDED,
    TrainingRunStatus.FAILED: Phase.FAILED,
    TrainingRunStatus.CANCELLED: Phase.CANCELLED,
}
_BATCH_PHASES = {
    BatchStatus.QUEUED: Phase.QUEUED,
    BatchStatus.RUNNING: Phase.RUNNING,
    BatchStatus.FAILED: Phase.FAILED,
}

MINING = JobKind(
    name="mining",
    model=MiningJob,
    task_name=MINE_FIGURE_TASK,
    queue=lambda job: mining_queue(job.backend),
    task_args=lambda job: [str(job.id)],
    phase=lambda job: Phase(job.status.value),
    queued_status=JobStatus.QUEUED,
    running_status=JobStatus.RUNNING,
    failed_status=JobStatus.FAILED,
    on_state=_figure_follows,
    active_statuses=(JobStatus.QUEUED, JobStatus.RUNNING),
    restart_clock=True,
    details=lambda job: {"backend": job.backend, "stage_seconds": job.stage_timings, "cost": job.cost},
)
INGEST_BATCH = JobKind(
    name="ingest_batch",
    model=Batch,
    task_name=RUN_BATCH_TASK,
    queue=lambda batch: INGEST_QUEUE,
    task_args=lambda batch: [str(batch.id)],
    phase=lambda batch: _BATCH_PHASES.get(batch.status, Phase.SUCCEEDED),
    queued_status=BatchStatus.QUEUED,
    running_status=BatchStatus.RUNNING,
    failed_status=BatchStatus.FAILED,
    active_statuses=(BatchStatus.QUEUED, BatchStatus.RUNNING),
)
REINDEX = JobKind(
    name="reindex",
    model=ModelVersion,
    task_name=REINDEX_TASK,
    queue=lambda version: EMBEDDING_QUEUE,
    task_args=lambda version: [str(version.id), (version.progress or {}).get("space", "default")],
    phase=_model_phase,
    queued_status=ModelStatus.INDEXING,
    running_status=ModelStatus.INDEXING,
    failed_status=ModelStatus.FAILED,
    active_statuses=(ModelStatus.INDEXING,),
    details=lambda version: {
        "items": (version.progress or {}).get("done"),
        "seconds": (version.progress or {}).get("elapsed_s"),
    },
)
TRAINING = JobKind(
    name="training",
    model=TrainingRun,
    task_name=TRAIN_RUN_TASK,
    queue=lambda run: TRAINING_QUEUE,
    task_args=lambda run: [str(run.id)],
    phase=lambda run: _TRAINING_PHASES.get(run.status, Phase.RUNNING),
    queued_status=TrainingRunStatus.QUEUED,
    running_status=TrainingRunStatus.EXPORTING,
    failed_status=TrainingRunStatus.FAILED,
    active_statuses=(
        TrainingRunStatus.QUEUED,
        TrainingRunStatus.EXPORTING,
        TrainingRunStatus.TRAINING,
        TrainingRunStatus.EVALUATING,
    ),
)
KINDS: dict[str, JobKind] = {kind.name: kind for kind in (INGEST_BATCH, MINING, REINDEX, TRAINING)}


# --- events -----------------------------------------------------------------------------------


def emit(runtime: Any, event: JobEvent) -> None:
    level = {"failed": logging.WARNING, "requeued": logging.WARNING, "progress": logging.DEBUG}.get(
        event.event, logging.INFO
    )
    log.log(
        level,
        "job %s %s %s%s",
        event.kind,
        event.job_id,
        event.event,
        f": {event.reason}" if event.reason else "",
        extra=_event_fields(event),
    )
    for observer in getattr(runtime, "job_observers", ()):
        try:
            observer(event)
        except Exception:
            log.exception("job observer %r failed on %s", observer, event)


def _event_fields(event: JobEvent) -> dict[str, Any]:
    """The event as flat log fields (the JSON lines' job_kind, job_id, outcome, durations...)."""
    fields = {
        "job_kind": event.kind,
        "job_id": str(event.job_id),
        "outcome": event.event,
        "attempt": event.attempt,
        "queued_s": event.queued_s,
        "running_s": event.running_s,
        "reason": event.reason,
    }
    return {k: v for k, v in fields.items() if v is not None}


def _seconds(start: datetime | None, end: datetime | None) -> float | None:
    return round((end - start).total_seconds(), 3) if start is not None and end is not None else None


# --- lock and lease ---------------------------------------------------------------------------


def owner_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}"[:128]


@dataclass
class Lease:
    """A claimed job: its lock is held and its lease renewed until the ``claim`` block ends."""

    runtime: Any
    kind: JobKind
    job_id: uuid.UUID
    owner: str
    lease_s: float
    started: float = field(default_factory=time.monotonic)

    def renew(self) -> bool:
        """Push the lease forward; False when the job is no longer ours (the sweep took it)."""
        now = utcnow()
        model = self.kind.model
        with self.runtime.session() as session:
            result = session.execute(
                update(model)
                .where(model.id == self.job_id, model.lease_owner == self.owner)
                .values(heartbeat_at=now, lease_expires_at=now + timedelta(seconds=self.lease_s))
            )
            session.commit()
            return bool(result.rowcount)


@contextlib.contextmanager
def claim(runtime: Any, kind: JobKind, job_id: uuid.UUID) -> Iterator[Lease | None]:
    """Lock the job and take its lease for the block; yields None when another worker holds it."""
    lease_s = float(runtime.settings.queue.lease_s)
    with logs.bound(job_kind=kind.name, job_id=str(job_id)), runtime.engine.connect() as lock_conn:
        key = kind.lock_key(job_id)
        locked = bool(lock_conn.scalar(select(func.pg_try_advisory_lock(key))))
        lock_conn.commit()
        if not locked:
            emit(runtime, JobEvent(kind.name, job_id, "skipped", reason="held by another worker"))
            yield None
            return
        lease = Lease(runtime, kind, job_id, owner_id(), lease_s)
        stop = threading.Event()
        beat = threading.Thread(target=_heartbeat, args=(lease, stop), name=f"lease-{job_id}", daemon=True)
        try:
            _take(lease)
            beat.start()
            yield lease
        finally:
            stop.set()
            if beat.is_alive():
                beat.join(timeout=10)
            with contextlib.suppress(Exception):
                _release(lease)
            with contextlib.suppress(Exception):
                lock_conn.scalar(select(func.pg_advisory_unlock(key)))
                lock_conn.commit()


def _take(lease: Lease) -> None:
    model, now = lease.kind.model, utcnow()
    with lease.runtime.session() as session:
        session.execute(
            update(model)
            .where(model.id == lease.job_id)
            .values(
                lease_owner=lease.owner,
                heartbeat_at=now,
                lease_expires_at=now + timedelta(seconds=lease.lease_s),
            )
        )
        session.commit()


def _release(lease: Lease) -> None:
    model = lease.kind.model
    with lease.runtime.session() as session:
        session.execute(
            update(model)
            .where(model.id == lease.job_id, model.lease_owner == lease.owner)
            .values(lease_owner=None, lease_expires_at=None)
        )
        session.commit()


def _heartbeat(lease: Lease, stop: threading.Event) -> None:
    interval = max(lease.lease_s / 3, 0.2)
    while not stop.wait(interval):
        try:
            if not lease.renew():
                log.warning("job %s %s: lease lost to the recovery sweep", lease.kind.name, lease.job_id)
                return
        except Exception as exc:  # the database is away: try again next beat, the lease may run out
            log.warning("job %s %s: heartbeat failed: %s", lease.kind.name, lease.job_id, exc)


# --- lifecycle --------------------------------------------------------------------------------


def start(session: Session, lease: Lease, row: Row, *, status: Any = None) -> None:
    """Mark the claimed row running (in the caller's transaction) and report its time in queue."""
    now = utcnow()
    row.status = status if status is not None else lease.kind.running_status
    row.attempts = (row.attempts or 0) + 1
    if hasattr(type(row), "started_at"):  # a model version (re-index) keeps times in its progress
        row.started_at = now if lease.kind.restart_clock else (row.started_at or now)
    row.error = None
    if lease.kind.on_state is not None:
        lease.kind.on_state(session, row, Phase.RUNNING)
    queued_from = row.enqueued_at or row.created_at
    session.info.setdefault("job_events", []).append(
        JobEvent(lease.kind.name, lease.job_id, "started", row.attempts, queued_s=_seconds(queued_from, now))
    )


def finish(session: Session, lease: Lease, row: Row, *, status: Any, phase: Phase = Phase.SUCCEEDED) -> None:
    """Mark the claimed row finished (in the caller's transaction)."""
    row.status = status
    if hasattr(type(row), "finished_at"):
        row.finished_at = utcnow()
    if lease.kind.on_state is not None:
        lease.kind.on_state(session, row, phase)
    event: EventName = "succeeded" if phase is Phase.SUCCEEDED else "failed"
    details = lease.kind.details(row) if lease.kind.details is not None and phase is Phase.SUCCEEDED else None
    session.info.setdefault("job_events", []).append(
        JobEvent(
            lease.kind.name,
            lease.job_id,
            event,
            row.attempts or 0,
            running_s=round(time.monotonic() - lease.started, 3),
            reason=getattr(row, "error", None),
            details=details,
        )
    )


def flush_events(runtime: Any, session: Session) -> None:
    """Emit the events recorded in a session once its transaction committed."""
    for event in session.info.pop("job_events", []):
        emit(runtime, event)


def requeue(runtime: Any, kind: JobKind, job_id: uuid.UUID, reason: str) -> None:
    """Back to queued while the task waits for its retry (a transient error): never left running."""
    with runtime.session() as session:
        row = session.get(kind.model, job_id)
        if row is None or kind.phase(row) is not Phase.RUNNING:
            return
        row.status = kind.queued_status
        row.error = reason[:2000]
        if kind.on_state is not None:
            kind.on_state(session, row, Phase.QUEUED)
        session.commit()
        attempt = row.attempts or 0
    emit(runtime, JobEvent(kind.name, job_id, "retry", attempt, reason=reason[:300]))


def mark_failed(runtime: Any, kind: JobKind, job_id: uuid.UUID, reason: str) -> bool:
    """Failed with its reason, unless it already finished; True when this call failed it."""
    with runtime.session() as session:
        row = session.get(kind.model, job_id)
        if row is None or kind.phase(row).finished:
            return False
        row.status = kind.failed_status
        row.error = reason[:2000]
        if hasattr(type(row), "finished_at"):
            row.finished_at = utcnow()
        row.lease_owner = row.lease_expires_at = None
        if kind.on_state is not None:
            kind.on_state(session, row, Phase.FAILED)
        extra = _failed_extra.get(kind.name)
        if extra is not None:
            extra(session, row)
        session.commit()
        attempt = row.attempts or 0
    emit(runtime, JobEvent(kind.name, job_id, "failed", attempt, reason=reason[:300]))
    return True


def _reindex_failed(session: Session, version: ModelVersion) -> None:
    from p2p.shared.db.models import EmbeddingSpace

    version.progress = {**(version.progress or {}), "state": "failed"}
    space = session.get(EmbeddingSpace, (version.progress or {}).get("space", "default"))
    if space is not None and space.pending_version_id == version.id:
        space.pending_version_id = None


_failed_extra: dict[str, Callable[[Session, Any], None]] = {"reindex": _reindex_failed}


def retry_failed(runtime: Any, kind: JobKind, job_id: uuid.UUID, *, reason: str = "retried") -> bool:
    """A failed job back to queued and sent to its queue again (``p2p jobs retry``); False when it
    is not failed (any more). Its attempts and last error stay until a worker starts it; a broker
    that cannot take it now leaves it queued, and the recovery sweep sends it later."""
    with runtime.session() as session:
        row = session.get(kind.model, job_id, with_for_update=True)
        if row is None or kind.phase(row) is not Phase.FAILED:
            return False
        row.status = kind.queued_status
        row.lease_owner = row.lease_expires_at = row.enqueued_at = None
        if hasattr(type(row), "finished_at"):
            row.finished_at = None
        if kind.on_state is not None:
            kind.on_state(session, row, Phase.QUEUED)
        extra = _retry_extra.get(kind.name)
        if extra is not None:
            extra(session, row)
        session.commit()  # queued before it is sent: the worker that takes it finds it so
        try:
            if send(runtime, kind, row):
                session.commit()
        except Exception as exc:
            log.warning("%s job %s is queued again but could not be sent yet: %s", kind.name, job_id, exc)
    emit(runtime, JobEvent(kind.name, job_id, "requeued", reason=reason))
    return True


def _reindex_retried(session: Session, version: ModelVersion) -> None:
    from p2p.shared.db.models import EmbeddingSpace

    version.progress = {**(version.progress or {}), "state": "queued"}
    space = session.get(EmbeddingSpace, (version.progress or {}).get("space", "default"))
    if space is not None and space.pending_version_id is None:
        space.pending_version_id = version.id


_retry_extra: dict[str, Callable[[Session, Any], None]] = {"reindex": _reindex_retried}


def send(runtime: Any, kind: JobKind, row: Row) -> bool:
    """Hand the job to its queue and note when; raises when the broker cannot take it. The task
    carries the request id of the job (whoever sends it: the sweep, an operator's retry)."""
    with logs.bound(request_id=getattr(row, "request_id", None)):
        accepted = bool(
            runtime.dispatcher.send(kind.task_name, args=kind.task_args(row), queue=kind.queue(row))
        )
    if accepted:
        row.enqueued_at = utcnow()
    return accepted


def stalled(kind: JobKind, row: Row, *, now: datetime, queued_after_s: float) -> str | None:
    """Why a job has no live owner and needs sending again, or None."""
    phase = kind.phase(row)
    if phase is Phase.RUNNING:
        expires = row.lease_expires_at
        if expires is None:
            started = row.started_at or row.created_at
            if started is not None and (now - started).total_seconds() > queued_after_s:
                return "running without a lease"
            return None
        if expires < now:
            return f"lease expired {(now - expires).total_seconds():.0f} s ago (owner {row.lease_owner})"
        return None
    if phase is Phase.QUEUED:
        since = row.enqueued_at or row.created_at
        if since is not None and (now - since).total_seconds() >= queued_after_s:
            sent = "sent" if row.enqueued_at else "created, never sent,"
            return f"{sent} {(now - since).total_seconds():.0f} s ago and not started"
    return None
