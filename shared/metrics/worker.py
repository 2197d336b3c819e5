"""Metrics of Celery workers: task counts and times from Celery's signals, and the worker's own
metrics server.

Pool processes are forked from the worker's main process, so each writes its values to files in
the multiprocess folder (``PROMETHEUS_MULTIPROC_DIR``), which :func:`prepare_multiproc_dir` sets
before any metric exists. The main process serves the sum of them all on the metrics port (and, with
``worker_backlog``, the queue and job gauges that only it reads, with connections of its own).

Files of processes that are gone stay while the worker runs, so counters never go backwards;
their live gauges (requests in flight) are dropped at each scrape. A worker that starts removes the
files of dead processes it finds (a restarted worker starts its counters afresh).
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
from prometheus_client.core import Metric

from p2p.shared.settings import Settings

log = logging.getLogger(__name__)

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
REGISTRY_MODULE = "p2p.shared.metrics.registry"


def prepare_multiproc_dir(settings: Settings) -> Path | None:
    """Point this process (and the pool it forks) at its metric-file folder; None when metrics are off."""
    if not settings.metrics.enabled:
        return None
    if REGISTRY_MODULE in sys.modules and not os.environ.get(MULTIPROC_ENV):
        log.warning("metrics were created before the multiprocess folder was set: pool processes' go unseen")
    configured = os.environ.get(MULTIPROC_ENV) or settings.metrics.multiproc_dir
    path = Path(configured) if configured else Path(tempfile.mkdtemp(prefix="p2p-metrics-"))
    path.mkdir(parents=True, exist_ok=True)
    os.environ[MULTIPROC_ENV] = str(path)
    remove_dead_files(path)
    return path


def _file_pid(path: Path) -> int | None:
    try:
        return int(path.stem.rsplit("_", 1)[1])
    except (IndexError, ValueError):
        return None


def remove_dead_files(path: Path) -> int:
    """Delete the metric files of processes that no longer run; how many were removed."""
    removed = 0
    for file in path.glob("*.db"):
        pid = _file_pid(file)
        if pid is not None and not psutil.pid_exists(pid):
            file.unlink(missing_ok=True)
            removed += 1
    return removed


class DeadProcessSweep:
    """Registered before the multiprocess collector: drops dead processes' live gauges at each scrape."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.multiprocess import mark_process_dead

        for file in self.path.glob("gauge_live*.db"):
            pid = _file_pid(file)
            if pid is not None and not psutil.pid_exists(pid):
                mark_process_dead(pid, str(self.path))  # type: ignore[no-untyped-call]
        yield from ()


# --- Celery signals ----------------------------------------------------------------------------

_started: dict[str, float] = {}


def _queue_of(task: Any) -> str:
    info = getattr(getattr(task, "request", None), "delivery_info", None) or {}
    return str(info.get("routing_key") or "unknown")


def task_started(task_id: str | None = None, task: Any = None, **_: Any) -> None:
    from p2p.shared.metrics import registry as m

    if task_id is not None:
        _started[task_id] = time.perf_counter()
    # The retry counter exists (at 0) from a task's first run: rate() sees its first retry.
    m.TASK_RETRIES.labels(_queue_of(task), str(getattr(task, "name", "unknown")))


def task_ended(task_id: str | None = None, task: Any = None, state: str | None = None, **_: Any) -> None:
    from p2p.shared.metrics import registry as m

    started = _started.pop(task_id, None) if task_id is not None else None
    labels = (_queue_of(task), str(getattr(task, "name", "unknown")), (state or "unknown").lower())
    m.TASKS.labels(*labels).inc()
    if started is not None:
        m.TASK_DURATION.labels(*labels).observe(time.perf_counter() - started)


def task_retried(sender: Any = None, request: Any = None, **_: Any) -> None:
    from p2p.shared.metrics import registry as m

    info = getattr(request, "delivery_info", None) or {}
    m.TASK_RETRIES.labels(
        str(info.get("routing_key") or "unknown"), str(getattr(sender, "name", "unknown"))
    ).inc()


def process_ending(**_: Any) -> None:
    from prometheus_client.multiprocess import mark_process_dead

    path = os.environ.get(MULTIPROC_ENV)
    if path:
        mark_process_dead(os.getpid(), path)  # type: ignore[no-untyped-call]


# --- the metrics server ------------------------------------------------------------------------


class MetricsServer:
    """The worker's ``/metrics`` (any path answers) on ``worker_host:worker_port``, in the main process."""

    def __init__(self, settings: Settings, path: Path) -> None:
        self.settings, self.path = settings, path
        self._server: Any = None
        self.port: int | None = None

    def start(self) -> MetricsServer:
        from prometheus_client import CollectorRegistry, start_http_server
        from prometheus_client.multiprocess import MultiProcessCollector

        from p2p.shared.metrics.backlog import OwnEngine, backlog_collector

        registry = CollectorRegistry(auto_describe=False)
        registry.register(DeadProcessSweep(self.path))
        MultiProcessCollector(registry, str(self.path))  # type: ignore[no-untyped-call]
        db_url = self.settings.db.url
        if self.settings.metrics.worker_backlog:  # off by default: every worker would read the same
            registry.register(backlog_collector(self.settings, OwnEngine(db_url) if db_url else None))
        host, port = self.settings.metrics.worker_host, self.settings.metrics.worker_port
        try:
            self._server, _ = start_http_server(port, addr=host, registry=registry)
        except OSError as exc:  # another worker on this host holds the port: work on, unscraped
            log.warning("worker metrics server cannot listen on %s:%s: %s", host, port, exc)
            return self
        self.port = int(self._server.server_port)
        log.info("worker metrics on http://%s:%d/metrics (files in %s)", host, self.port, self.path)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def install(settings: Settings) -> Path | None:
    """Set the multiprocess folder and count tasks (a worker's main process, before its pool forks)."""
    from celery.signals import task_postrun, task_prerun, task_retry, worker_process_shutdown

    path = prepare_multiproc_dir(settings)
    if path is None:
        return None
    task_prerun.connect(task_started, weak=False)
    task_postrun.connect(task_ended, weak=False)
    task_retry.connect(task_retried, weak=False)
    worker_process_shutdown.connect(process_ending, weak=False)
    return path
