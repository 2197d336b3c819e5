"""Celery: one app for every service, queues per service, and how work is dispatched.

Celery carries work, never results: there is no result backend and task state lives in
Postgres. In the embedded profile the same task code runs on an in-process thread pool.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol
from urllib.parse import urlsplit

from celery import Celery
from celery.signals import before_task_publish

from p2p.shared.logs import TASK_HEADER, current_request_id
from p2p.shared.settings import Settings

log = logging.getLogger(__name__)

INGEST_QUEUE = "ingest"
MINING_QUEUE = "mining"
# LVLM jobs wait on their own queue: only workers configured for the model server take them.
MINING_LVLM_QUEUE = "mining-lvlm"
TRAINING_QUEUE = "training"
EMBEDDING_QUEUE = "embedding"


def mining_queue(backend: str) -> str:
    return MINING_LVLM_QUEUE if backend == "lvlm" else MINING_QUEUE


RUN_BATCH_TASK = "p2p.ingest.run_batch"
MINE_FIGURE_TASK = "p2p.mining.mine_figure"
REINDEX_TASK = "p2p.embedding.reindex"
EMBED_FIGURES_TASK = "p2p.embedding.embed_figures"
TRAIN_RUN_TASK = "p2p.training.run"

# The task modules are named by the composition layer (``p2p.apps.tasks``), not here: shared code
# knows the task names (the contract between services), never the services' modules.
celery_app = Celery("p2p")


VISIBILITY_MARGIN_S = 300


def visibility_timeout_s(settings: Settings) -> int:
    """From the longest task: a message is re-delivered only once its task must have ended."""
    configured = settings.queue.visibility_timeout_s
    if configured is not None:
        return configured
    return max(hard for _, hard in settings.queue.time_limits_s.values()) + VISIBILITY_MARGIN_S


def time_limits(settings: Settings, queue: str) -> dict[str, int]:
    limits = settings.queue.time_limits_s.get(queue)
    return {"soft_time_limit": limits[0], "time_limit": limits[1]} if limits else {}


def celery_config(settings: Settings) -> dict[str, Any]:
    return {
        "broker_url": settings.redis.url or "memory://",
        "result_backend": None,
        "task_ignore_result": True,
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        "broker_transport_options": {"visibility_timeout": visibility_timeout_s(settings)},
        "worker_max_memory_per_child": settings.queue.worker_max_memory_mb * 1024,  # KiB
        "broker_connection_retry_on_startup": True,
        "task_default_queue": INGEST_QUEUE,
        "task_routes": {
            "p2p.ingest.*": {"queue": INGEST_QUEUE},
            "p2p.mining.*": {"queue": MINING_QUEUE},
            "p2p.training.*": {"queue": TRAINING_QUEUE},
            "p2p.embedding.*": {"queue": EMBEDDING_QUEUE},
        },
        "task_serializer": "json",
        "accept_content": ["json"],
        "worker_hijack_root_logger": False,
    }


PUBLISHED_HEADER = "p2p_published_at"


def stamp_published(headers: dict[str, Any] | None = None, **_: Any) -> None:
    """``before_task_publish`` handler: the publish time travels with the message, so the age of a
    queue's oldest message can be read from the broker (``p2p.shared.metrics.broker``)."""
    if headers is not None:
        headers.setdefault(PUBLISHED_HEADER, time.time())


def configure_celery(settings: Settings) -> Celery:
    celery_app.conf.update(celery_config(settings))
    before_task_publish.connect(stamp_published, weak=False, dispatch_uid="p2p-published-at")
    return celery_app


def include_task_modules(modules: Iterable[str]) -> None:
    """Add task modules to those that workers and in-process dispatchers import."""
    included = list(celery_app.conf.include or ())
    celery_app.conf.include = included + [m for m in modules if m not in included]


def import_task_modules() -> None:
    celery_app.loader.import_default_modules()


def task_headers() -> dict[str, str]:
    """Message headers of a task sent here and now: the request id it works for (see p2p.shared.logs)."""
    request_id = current_request_id()
    return {TASK_HEADER: request_id} if request_id is not None else {}


class TaskDispatcher(Protocol):
    def send(self, task_name: str, *, args: list[Any], queue: str) -> bool:
        """Hand a task over; False when nothing can run it here yet."""
        ...

    def accepts(self, task_name: str, queue: str) -> bool:
        """Whether :meth:`send` would hand the task over (False: it stays queued here), without
        sending anything. A broker that cannot be reached still counts as accepting."""
        ...

    def ping(self) -> None: ...

    def close(self) -> None: ...


def _publishing_transport() -> type[Any]:
    """kombu's Redis transport with a channel that keeps its synchronous Redis client: kombu's own
    builds a ``redis.Redis`` for every publish (registering its ~170 response callbacks each time:
    a quarter of a publish's CPU, bench/README.md, ingest). The client is a handle on the
    channel's connection pool, which stays the channel's; a channel is used by one thread at a
    time (the dispatcher's connection pool hands each connection to one sender)."""
    from kombu.transport import redis as kombu_redis

    class Channel(kombu_redis.Channel):
        _kept_client: Any = None

        def _create_client(self, asynchronous: bool = False) -> Any:
            if asynchronous:
                return super()._create_client(asynchronous=True)  # type: ignore[no-untyped-call]
            if self._kept_client is None:
                self._kept_client = super()._create_client()  # type: ignore[no-untyped-call]
            return self._kept_client

    class Transport(kombu_redis.Transport):
        pass

    Transport.Channel = Channel
    return Transport


def _write_connection(app: Celery, broker_url: str) -> Any:
    if urlsplit(broker_url).scheme in ("redis", "rediss"):
        return app.connection_for_write(broker_url, transport=_publishing_transport())
    return app.connection_for_write(broker_url)


class CeleryDispatcher:
    """Publishes to the broker through a connection pool of its own, so a process can hold
    dispatchers for different brokers without touching the app's global configuration."""

    def __init__(
        self, app: Celery, broker_url: str, pool_limit: int = 16, settings: Settings | None = None
    ) -> None:
        self.app = app
        self.settings = settings
        self.broker_url = broker_url  # read by the recovery sweep to look for a job's message
        self._connection = _write_connection(app, broker_url)
        self._pool = self._connection.Pool(limit=pool_limit)

    def send(self, task_name: str, *, args: list[Any], queue: str) -> bool:
        with self._pool.acquire(block=True, timeout=10) as conn:
            conn.ensure_connection(max_retries=2, interval_start=0.2, timeout=5)
            limits = time_limits(self.settings, queue) if self.settings is not None else {}
            self.app.send_task(
                task_name, args=args, queue=queue, connection=conn, headers=task_headers(), **limits
            )
        return True

    def accepts(self, task_name: str, queue: str) -> bool:
        return True

    def ping(self) -> None:
        with self._pool.acquire(block=True, timeout=2) as conn:
            conn.ensure_connection(max_retries=1, timeout=2)

    def close(self) -> None:
        self._pool.force_close_all()
        self._connection.release()


class InProcessDispatcher:
    """Runs registered Celery tasks on local threads (embedded profile)."""

    def __init__(self, app: Celery, workers: int = 2, queues: list[str] | None = None) -> None:
        self.app = app
        self.queues = set(queues) if queues is not None else None
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="p2p-task")
        self._lock = threading.Lock()
        self._pending = 0
        self._idle = threading.Condition(self._lock)
        if not app.conf.include:
            log.warning("no task modules registered (p2p.apps.tasks.register_tasks): tasks stay queued here")
        import_task_modules()

    def accepts(self, task_name: str, queue: str) -> bool:
        return (self.queues is None or queue in self.queues) and task_name in self.app.tasks

    def send(self, task_name: str, *, args: list[Any], queue: str) -> bool:
        task = self.app.tasks.get(task_name)
        if self.queues is not None and queue not in self.queues:
            log.info("queue %s is not served in-process; %s stays queued", queue, task_name)
            return False
        if task is None:
            log.info("no in-process worker for %s on queue %s yet; it stays queued", task_name, queue)
            return False
        with self._lock:
            self._pending += 1
        # A fresh context per task: the task's log context never leaks into the pool's thread.
        self._pool.submit(contextvars.Context().run, self._run, task, args, task_headers())
        return True

    def _run(self, task: Any, args: list[Any], headers: dict[str, str]) -> None:
        try:
            result = task.apply(args=args, headers=headers)
            if result.failed():
                log.error("in-process task %s%s failed: %s", task.name, args, result.result)
        finally:
            with self._lock:
                self._pending -= 1
                if self._pending == 0:
                    self._idle.notify_all()

    def wait_idle(self, timeout: float | None = None) -> bool:
        with self._lock:
            return self._idle.wait_for(lambda: self._pending == 0, timeout)

    def ping(self) -> None:
        pass

    def close(self) -> None:
        self._pool.shutdown(wait=True)
