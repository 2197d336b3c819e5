"""Base class for every Celery task of the project.

It owns the process runtime (database, store), retries only transient failures with backoff, and
logs one line of timing per run. Tasks take ids, never objects; state lives in Postgres. A task of
a job kind (``job_kind``) takes the job's id first: a retry puts the job back to queued and a final
failure marks it failed with the reason (``p2p.shared.jobs``), so no job is left "running".
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

from celery import Task

from p2p.shared import jobs
from p2p.shared.jobs import TRANSIENT_ERRORS
from p2p.shared.runtime import Runtime, get_process_runtime

log = logging.getLogger(__name__)


class P2PTask(Task):
    abstract = True
    acks_late = True
    reject_on_worker_lost = True
    autoretry_for = TRANSIENT_ERRORS
    retry_backoff = 2
    retry_backoff_max = 300
    retry_jitter = True
    max_retries = 8
    job_kind: jobs.JobKind | None = None

    @property
    def runtime(self) -> Runtime:
        return get_process_runtime()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return super().__call__(*args, **kwargs)
        finally:
            log.info("task %s%s took %.3f s", self.name, args, time.perf_counter() - started)

    def _job_id(self, args: Any) -> uuid.UUID | None:
        try:
            return uuid.UUID(str(args[0])) if self.job_kind is not None and args else None
        except ValueError:
            return None

    def on_retry(self, exc: BaseException, task_id: str, args: Any, kwargs: Any, einfo: Any) -> None:
        job_id = self._job_id(args)
        if job_id is not None and self.job_kind is not None:
            try:
                jobs.requeue(self.runtime, self.job_kind, job_id, f"{type(exc).__name__}: {exc}")
            except Exception:
                log.exception("could not put %s job %s back to queued", self.job_kind.name, job_id)

    def on_failure(self, exc: BaseException, task_id: str, args: Any, kwargs: Any, einfo: Any) -> None:
        # Out of retries, over its time limit, or an unexpected error: failed with its reason.
        job_id = self._job_id(args)
        if job_id is not None and self.job_kind is not None:
            try:
                jobs.mark_failed(self.runtime, self.job_kind, job_id, f"{type(exc).__name__}: {exc}")
            except Exception:
                log.exception("could not record the failure of %s job %s", self.job_kind.name, job_id)
