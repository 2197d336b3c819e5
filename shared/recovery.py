"""The recovery sweep: jobs and batches left "queued" or "running" with no live owner go back on
their queue.

A running job has a live owner while its advisory lock is held (a killed worker's connection
closes and frees it at once) and its lease is renewed (a lost machine stops renewing). A queued job
whose message was lost (a broker restarted without persistence, an embedded process killed) is sent
again once it has waited ``requeue_after_s`` and, where the broker can be read (Redis), its message
is neither on its queue nor reserved by a worker (:mod:`p2p.shared.broker_view`): under a backlog a
job waits longer than ``requeue_after_s`` with its message in line, and a copy would only be a
duplicate. Sending again is always safe: a job runs under its
lock, a finished one is not run again, and re-running replaces its rows, never adds to them.

It runs periodically in every worker (one sweep at a time across the cluster, by a lock of its own),
at start-up in the embedded profile, and on demand (``p2p recover``, with a dry run).
"""

from __future__ import annotations

import logging
import threading
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import func, select, update

from p2p.shared import logs
from p2p.shared.broker_view import BrokerView, open_broker_view
from p2p.shared.db.base import utcnow
from p2p.shared.jobs import KINDS, JobEvent, JobKind, Phase, emit, mark_failed, send, stalled

log = logging.getLogger(__name__)

SWEEP_LOCK_KEY = 0x7032_7053_5745_4550  # "p2pSWEEP": one sweep at a time across the cluster
SCAN_LIMIT = 5000

Action = Literal["requeue", "send", "fail"]


@dataclass(frozen=True)
class StuckJob:
    kind: str
    job_id: uuid.UUID
    phase: Phase
    reason: str
    action: Action
    done: bool = False


def _lock_free(runtime: Any, kind: JobKind, job_id: uuid.UUID) -> bool:
    """True when no live process holds the job's lock (so whoever ran it is gone)."""
    key = kind.lock_key(job_id)
    with runtime.engine.connect() as conn:
        got = bool(conn.scalar(select(func.pg_try_advisory_lock(key))))
        if got:
            conn.scalar(select(func.pg_advisory_unlock(key)))
        conn.commit()
        return got


def find_stuck(
    runtime: Any,
    *,
    requeue_after_s: float | None = None,
    startup: bool = False,
    kinds: list[str] | None = None,
) -> list[StuckJob]:
    """Jobs that need sending again (``startup``: every queued job, this process's queue was memory).

    A queued job's broker is read (one snapshot per queue, after the rows) unless at start-up."""
    settings = runtime.settings.queue
    after = settings.requeue_after_s if requeue_after_s is None else requeue_after_s
    now = utcnow()
    found: list[StuckJob] = []
    broker = None if startup else open_broker_view(runtime)
    try:
        for name in kinds or list(KINDS):
            kind = KINDS[name]
            with runtime.session() as session:
                rows = list(
                    session.scalars(
                        select(kind.model)
                        .where(kind.model.status.in_(kind.active_statuses))
                        .order_by(kind.model.created_at)
                        .limit(SCAN_LIMIT)
                    )
                )
                session.expunge_all()
            for row in rows:
                found.extend(
                    _judge(runtime, kind, row, now=now, after=0.0 if startup else after, broker=broker)
                )
    finally:
        if broker is not None:
            broker.close()
    return found


def _judge(
    runtime: Any, kind: JobKind, row: Any, *, now: datetime, after: float, broker: BrokerView | None = None
) -> list[StuckJob]:
    phase = kind.phase(row)
    reason = stalled(kind, row, now=now, queued_after_s=after)
    if phase is Phase.RUNNING:
        if reason is None and _lock_free(runtime, kind, row.id):
            reason = "its worker is gone (lock free)"
        elif reason is not None and not _lock_free(runtime, kind, row.id):
            return []  # lease late but the owner still holds the lock: it is alive, only slow
        if reason is None:
            return []
        too_many = (row.attempts or 0) >= runtime.settings.queue.max_attempts
        action: Action = "fail" if too_many else "requeue"
        return [StuckJob(kind.name, row.id, phase, reason, action)]
    if phase is Phase.QUEUED and reason is not None:
        reason = _message_lost(kind, row, reason, after=after, broker=broker)
        if reason is not None:
            return [StuckJob(kind.name, row.id, phase, reason, "send")]
    return []


def _message_lost(
    kind: JobKind, row: Any, reason: str, *, after: float, broker: BrokerView | None
) -> str | None:
    """A queued job past ``after``: why its message counts as lost, or None while the broker shows it
    waiting (or reserved by a worker for less than ``after``). Without a readable broker (in-process
    queue, another transport, Redis away) or for a job never sent, time alone decides, as before."""
    if broker is None or row.enqueued_at is None:
        return reason
    seen = broker.locate(kind.queue(row), row.id, row.enqueued_at)
    if seen is None:
        return reason
    if seen.where == "waiting":
        return None
    if seen.where == "reserved":
        if seen.reserved_for_s is not None and seen.reserved_for_s < after:
            return None
        return f"{reason}: {seen.detail} and never started (that worker is gone)"
    return f"{reason}: {seen.detail}"


def recover(
    runtime: Any,
    *,
    dry_run: bool = False,
    requeue_after_s: float | None = None,
    startup: bool = False,
    kinds: list[str] | None = None,
) -> list[StuckJob]:
    """Find stuck jobs and (unless ``dry_run``) send them again; returns what it found and did."""
    stuck = find_stuck(runtime, requeue_after_s=requeue_after_s, startup=startup, kinds=kinds)
    if dry_run:
        return stuck
    return [_recover_one(runtime, job) for job in stuck]


def _recover_one(runtime: Any, job: StuckJob) -> StuckJob:
    kind = KINDS[job.kind]
    if job.action == "fail":
        attempts = runtime.settings.queue.max_attempts
        done = mark_failed(runtime, kind, job.job_id, f"its worker was lost {attempts} times: {job.reason}")
        return StuckJob(job.kind, job.job_id, job.phase, job.reason, job.action, done)
    model = kind.model
    with runtime.session() as session:
        if job.action == "requeue":
            # Only while still running: a worker that finished meanwhile keeps its result.
            taken = session.execute(
                update(model)
                .where(model.id == job.job_id, model.status.in_(kind.active_statuses))
                .values(status=kind.queued_status, lease_owner=None, lease_expires_at=None)
                .returning(model.id)
            ).first()
            if taken is None:
                session.rollback()
                return job
        row = session.get(model, job.job_id)
        if row is None or kind.phase(row) is not Phase.QUEUED:
            session.rollback()
            return job
        if kind.on_state is not None:
            kind.on_state(session, row, Phase.QUEUED)
        try:
            sent = send(runtime, kind, row)
        except Exception as exc:  # the broker is away: the job stays queued for the next sweep
            log.warning("could not re-send %s job %s: %s", kind.name, job.job_id, exc)
            sent = False
        session.commit()
    emit(runtime, JobEvent(kind.name, job.job_id, "requeued", reason=job.reason))
    return StuckJob(job.kind, job.job_id, job.phase, job.reason, job.action, sent)


def sweep_once(runtime: Any, *, startup: bool = False) -> list[StuckJob]:
    """One sweep unless another process is sweeping right now."""
    with runtime.engine.connect() as conn:
        if not conn.scalar(select(func.pg_try_advisory_lock(SWEEP_LOCK_KEY))):
            conn.commit()
            return []
        conn.commit()
        try:
            return recover(runtime, startup=startup)
        finally:
            conn.scalar(select(func.pg_advisory_unlock(SWEEP_LOCK_KEY)))
            conn.commit()


def start_embedded_recovery(runtime: Any) -> SweepTimer | None:
    """Embedded profile: its queue lived in the memory of a process that may have been killed, so
    everything queued or running without an owner is sent again at start-up, then swept as in
    production."""
    if not runtime.settings.embedded_queue or not runtime.settings.queue.recover_on_start:
        return None

    def at_start() -> None:
        try:
            recovered = _done(sweep_once(runtime, startup=True))
            if recovered:
                log.warning("start-up recovery re-sent %d jobs left by a previous process", recovered)
        except Exception:
            log.exception("start-up recovery failed")

    threading.Thread(target=at_start, name="p2p-startup-recovery", daemon=True).start()
    return SweepTimer(runtime, runtime.settings.queue.sweep_interval_s).start()


def _done(found: list[StuckJob]) -> int:
    """How many were acted on: a running job found with its lock free may have just finished (the
    lock is read after the row), and then nothing is sent."""
    return sum(job.done for job in found)


class SweepTimer:
    """Runs :func:`sweep_once` every ``interval_s`` on a daemon thread (in every worker process)."""

    def __init__(self, runtime: Any, interval_s: float) -> None:
        self.runtime, self.interval_s = runtime, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="p2p-recovery-sweep", daemon=True)

    def start(self) -> SweepTimer:
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                recovered = _done(sweep_once(self.runtime))
                if recovered:
                    log.warning("recovery sweep re-sent %d stuck jobs", recovered)
            except Exception:
                log.exception("recovery sweep failed")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def resend_if_stalled(session: Any, *, dispatcher: Any, settings: Any, kind: JobKind, row: Any) -> str | None:
    """A client sent the job's input again: if the job is stalled, put it back on its queue now
    (in ``session``'s transaction, committed by the caller). Returns why, or None."""
    now = utcnow()
    reason = stalled(kind, row, now=now, queued_after_s=settings.queue.requeue_after_s)
    phase = kind.phase(row)
    if phase is Phase.RUNNING:
        key = kind.lock_key(row.id)
        free = bool(session.scalar(select(func.pg_try_advisory_lock(key))))
        if free:
            session.scalar(select(func.pg_advisory_unlock(key)))
            reason = reason or "its worker is gone (lock free)"
        else:
            return None
        row.status, row.lease_owner, row.lease_expires_at = kind.queued_status, None, None
        if kind.on_state is not None:
            kind.on_state(session, row, Phase.QUEUED)
    elif phase is not Phase.QUEUED or reason is None:
        return None
    with logs.bound(request_id=row.request_id):
        accepted = dispatcher.send(kind.task_name, args=kind.task_args(row), queue=kind.queue(row))
    if accepted:
        row.enqueued_at = now
    return reason
