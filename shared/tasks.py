"""Base class for every Celery task of the project.

It owns the process runtime (database, store), retries only transient failures with backoff, and
logs one line of timing per run. Tasks take ids, never objects; state lives in Postgres.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import redis.exceptions
from celery import Task
from sqlalchemy.exc import OperationalError
from urllib3.exceptions import HTTPError as Urllib3HTTPError

from p2p.shared.runtime import Runtime, get_process_runtime

log = logging.getLogger(__name__)


TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    OperationalError,
    redis.exceptions.ConnectionError,
    Urllib3HTTPError,
    ConnectionError,
    TimeoutError,
)


class P2PTask(Task):
    abstract = True
    acks_late = True
    reject_on_worker_lost = True
    autoretry_for = TRANSIENT_ERRORS
    retry_backoff = 2
    retry_backoff_max = 300
    retry_jitter = True
    max_retries = 8

    @property
    def runtime(self) -> Runtime:
        return get_process_runtime()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return super().__call__(*args, **kwargs)
        finally:
            log.info("task %s%s took %.3f s", self.name, args, time.perf_counter() - started)
