"""What operators see of the durable jobs (``p2p jobs``): every kind in the one lifecycle vocabulary
(:class:`~p2p.shared.jobs.Phase`), filtered by phase, kind and age, with each job's timings.

Read-only: re-queueing a failed job is :func:`p2p.shared.jobs.retry_failed`.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select

from p2p.shared.db.base import utcnow
from p2p.shared.jobs import KINDS, JobKind, Phase

SCAN_LIMIT = 5000  # rows read per kind when the stored status alone cannot tell the phase
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str) -> timedelta:
    """``90s``, ``15m``, ``1h``, ``2d``, ``1w``, ``1h30m``, or plain seconds; ValueError otherwise."""
    value = text.strip().lower()
    if re.fullmatch(r"\d+(?:\.\d+)?", value):
        return timedelta(seconds=float(value))
    parts = _DURATION_PART.findall(value)
    if not parts or "".join(n + u for n, u in parts) != value:
        raise ValueError(f"bad duration {text!r}: use e.g. 90s, 15m, 1h, 2d, 1h30m")
    return timedelta(seconds=sum(float(n) * _UNIT_S[u] for n, u in parts))


def parse_kinds(names: Sequence[str] | None) -> list[str]:
    unknown = sorted(set(names or ()) - set(KINDS))
    if unknown:
        raise ValueError(f"unknown job kind {', '.join(unknown)}; known: {', '.join(KINDS)}")
    return list(names) if names else list(KINDS)


def parse_phases(names: Sequence[str] | None) -> list[Phase]:
    known = [p.value for p in Phase]
    unknown = sorted(set(names or ()) - set(known))
    if unknown:
        raise ValueError(f"unknown status {', '.join(unknown)}; known: {', '.join(known)}")
    return [Phase(n) for n in names] if names else list(Phase)


@dataclass(frozen=True)
class JobInfo:
    kind: str
    job_id: uuid.UUID
    phase: Phase
    status: str  # as the kind stores it
    queue: str
    created_at: datetime | None
    enqueued_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    attempts: int
    error: str | None
    request_id: str | None
    lease_owner: str | None
    as_of: datetime

    @property
    def queued_s(self) -> float | None:
        """Time in queue: from the last send (else creation) to the start, or until now while queued."""
        since = self.enqueued_at or self.created_at
        if since is None:
            return None
        if self.started_at is not None and self.started_at >= since:
            return _seconds(since, self.started_at)
        return _seconds(since, self.as_of) if self.phase is Phase.QUEUED else None

    @property
    def running_s(self) -> float | None:
        if self.started_at is None or self.phase is Phase.QUEUED:
            return None
        return _seconds(self.started_at, self.finished_at or self.as_of)

    def as_dict(self) -> dict[str, Any]:
        def iso(value: datetime | None) -> str | None:
            return value.isoformat() if value is not None else None

        return {
            "kind": self.kind,
            "id": str(self.job_id),
            "status": self.phase.value,
            "stored_status": self.status,
            "queue": self.queue,
            "created_at": iso(self.created_at),
            "enqueued_at": iso(self.enqueued_at),
            "started_at": iso(self.started_at),
            "finished_at": iso(self.finished_at),
            "queued_s": self.queued_s,
            "running_s": self.running_s,
            "attempts": self.attempts,
            "error": self.error,
            "request_id": self.request_id,
            "lease_owner": self.lease_owner,
        }


def _seconds(start: datetime, end: datetime) -> float:
    return round(max((end - start).total_seconds(), 0.0), 3)


def _finished_at(row: Any) -> datetime | None:
    if hasattr(type(row), "finished_at"):
        return row.finished_at  # type: ignore[no-any-return]
    stamp = (getattr(row, "progress", None) or {}).get("finished_at")  # a model version keeps it there
    try:
        return datetime.fromisoformat(stamp) if isinstance(stamp, str) else None
    except ValueError:
        return None


def describe(kind: JobKind, row: Any, *, now: datetime) -> JobInfo:
    status = getattr(row.status, "value", row.status)
    return JobInfo(
        kind=kind.name,
        job_id=row.id,
        phase=kind.phase(row),
        status=str(status),
        queue=kind.queue(row),
        created_at=row.created_at,
        enqueued_at=row.enqueued_at,
        started_at=getattr(row, "started_at", None),
        finished_at=_finished_at(row),
        attempts=row.attempts or 0,
        error=row.error,
        request_id=row.request_id,
        lease_owner=row.lease_owner,
        as_of=now,
    )


def _statuses(kind: JobKind, phases: Sequence[Phase]) -> tuple[list[Any], bool]:
    """The stored statuses that can be in ``phases``, and whether the status alone decides."""
    enum_class = kind.model.__table__.c.status.type.enum_class
    wanted, exact = [], True
    for status in enum_class:
        seen = {kind.phase(kind.model(status=status, lease_owner=owner)) for owner in (None, "owner")}
        if seen & set(phases):
            wanted.append(status)
            exact = exact and seen <= set(phases)
    return wanted, exact


def list_jobs(
    runtime: Any,
    *,
    kinds: Sequence[str] | None = None,
    phases: Sequence[Phase] | None = None,
    older_than: timedelta | None = None,
    request_id: str | None = None,
    limit: int = 50,
) -> list[JobInfo]:
    """The newest jobs matching every filter, newest first."""
    now = utcnow()
    wanted_phases = list(phases) if phases else list(Phase)
    found: list[JobInfo] = []
    for name in kinds or list(KINDS):
        kind = KINDS[name]
        statuses, exact = _statuses(kind, wanted_phases)
        if not statuses:
            continue
        model = kind.model
        query = select(model).where(model.status.in_(statuses)).order_by(model.created_at.desc())
        if older_than is not None:
            query = query.where(model.created_at <= now - older_than)
        if request_id is not None:
            query = query.where(model.request_id == request_id)
        with runtime.session() as session:
            rows = list(session.scalars(query.limit(limit if exact else SCAN_LIMIT)))
            infos = [describe(kind, row, now=now) for row in rows]
        found.extend(info for info in infos if info.phase in wanted_phases)
    found.sort(key=lambda info: info.created_at or now, reverse=True)
    return found[:limit]


def get_job(runtime: Any, kind_name: str, job_id: uuid.UUID) -> JobInfo | None:
    kind = KINDS[kind_name]
    with runtime.session() as session:
        row = session.get(kind.model, job_id)
        return describe(kind, row, now=utcnow()) if row is not None else None
