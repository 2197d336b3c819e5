"""Queue and job gauges, read at scrape time and reused for ``cache_s`` so scrapes stay cheap.

Only the process that serves the scrape reads them, with connections that live for one read (a
short-lived Redis client; the API's own engine, or a pool-less engine in a worker's metrics
server): nothing here holds a socket that a forked pool child could inherit and use.
"""

from __future__ import annotations

import enum
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import timedelta
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric
from sqlalchemy import Engine, create_engine, func, select
from sqlalchemy.pool import NullPool

from p2p.shared.db.base import utcnow
from p2p.shared.db.models import Figure, FigureStatus
from p2p.shared.jobs import KINDS, JobKind
from p2p.shared.metrics import broker
from p2p.shared.settings import Settings

log = logging.getLogger(__name__)

# The queue whose hard time limit bounds a kind's run; kinds without one are never "too long".
KIND_QUEUES = {"ingest_batch": ("ingest",), "mining": ("mining", "mining-lvlm"), "reindex": ("embedding",)}


class BacklogCollector:
    """A Prometheus collector whose families come from its readers (one per source: broker,
    database), read at most once per ``cache_s``; a source that fails is reported down."""

    def __init__(self, readers: dict[str, Callable[[], list[Metric]]], cache_s: float) -> None:
        self.readers, self.cache_s = readers, cache_s
        self._lock = threading.Lock()
        self._at = -float("inf")
        self._families: list[Metric] = []

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            now = time.monotonic()
            if now - self._at >= self.cache_s:
                self._families = self._read_all()
                self._at = now
            yield from self._families

    def _read_all(self) -> list[Metric]:
        up = GaugeMetricFamily(
            "p2p_backlog_up", "1 when the last read of a source worked.", labels=["source"]
        )
        families: list[Metric] = []
        for source, read in self.readers.items():
            try:
                families.extend(read())
                up.add_metric([source], 1)
            except Exception as exc:  # the scrape still answers: the source is reported down
                log.warning("metrics: reading the %s failed: %s", source, exc)
                up.add_metric([source], 0)
        return [*families, up]


def queue_families(redis_url: str, queues: Iterable[str] = broker.QUEUES) -> list[Metric]:
    depth = GaugeMetricFamily("p2p_queue_messages", "Messages waiting in a queue.", labels=["queue"])
    age = GaugeMetricFamily(
        "p2p_queue_oldest_message_age_seconds",
        "Age of a queue's oldest message (0 when empty).",
        labels=["queue"],
    )
    client = broker.open_client(redis_url)
    try:
        states = broker.read_queues(client, queues)
        unacked = broker.unacked(client)
    finally:
        client.close()
    for state in states:
        depth.add_metric([state.name], state.depth)
        age.add_metric([state.name], state.oldest_age_s or 0.0)
    unacked_family = GaugeMetricFamily(
        "p2p_queue_unacked_messages", "Messages delivered to workers and not yet acknowledged."
    )
    unacked_family.add_metric([], unacked)
    return [depth, age, unacked_family]


def _limit_s(settings: Settings, kind: str) -> float | None:
    limits = [
        settings.queue.time_limits_s[q][1]
        for q in KIND_QUEUES.get(kind, ())
        if q in settings.queue.time_limits_s
    ]
    return float(max(limits)) if limits else None


def _stuck_counts(conn: Any, kind: JobKind, limit_s: float | None) -> dict[str, int]:
    model, now = kind.model, utcnow()
    expired = conn.scalar(
        select(func.count())
        .select_from(model)
        .where(model.lease_owner.is_not(None), model.lease_expires_at < now)
    )
    counts = {"lease_expired": int(expired or 0)}
    if limit_s is not None and hasattr(model, "started_at"):
        too_long = conn.scalar(
            select(func.count())
            .select_from(model)
            .where(model.status == kind.running_status, model.started_at < now - timedelta(seconds=limit_s))
        )
        counts["running_too_long"] = int(too_long or 0)
    return counts


def _status_counts(conn: Any, model: Any, statuses: type[enum.Enum]) -> dict[str, int]:
    """Rows per status, every status present (0 when none): a series never vanishes."""
    counts = dict.fromkeys((str(status.value) for status in statuses), 0)
    for status, count in conn.execute(select(model.status, func.count()).group_by(model.status)):
        counts[str(status.value)] = int(count)
    return counts


def job_families(engine: Engine, settings: Settings) -> list[Metric]:
    jobs = GaugeMetricFamily(
        "p2p_jobs", "Durable jobs, by kind and stored status.", labels=["kind", "status"]
    )
    stuck = GaugeMetricFamily(
        "p2p_jobs_stuck",
        "Jobs whose lease ran out or that run past their time limit.",
        labels=["kind", "reason"],
    )
    figures = GaugeMetricFamily("p2p_figures", "Figures, by status.", labels=["status"])
    with engine.connect() as conn:
        for name, kind in KINDS.items():
            for status, count in _status_counts(conn, kind.model, type(kind.queued_status)).items():
                jobs.add_metric([name, status], count)
            for reason, count in _stuck_counts(conn, kind, _limit_s(settings, name)).items():
                stuck.add_metric([name, reason], count)
        for status, count in _status_counts(conn, Figure, FigureStatus).items():
            figures.add_metric([status], count)
    return [jobs, stuck, figures]


class OwnEngine:
    """A pool-less engine of this process (rebuilt after a fork): each read opens and closes."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._engine: Engine | None = None
        self._pid = 0

    def __call__(self) -> Engine:
        if self._engine is None or self._pid != os.getpid():
            self._engine, self._pid = create_engine(self.url, poolclass=NullPool), os.getpid()
        return self._engine


def backlog_collector(settings: Settings, engine: Callable[[], Engine] | None) -> BacklogCollector:
    """Queue gauges when there is a broker, job gauges when there is a database."""
    readers: dict[str, Callable[[], list[Metric]]] = {}
    redis_url = settings.redis.url
    if redis_url:
        readers["broker"] = lambda: queue_families(redis_url)
    if engine is not None:
        readers["database"] = lambda: job_families(engine(), settings)
    return BacklogCollector(readers, settings.metrics.cache_s)
