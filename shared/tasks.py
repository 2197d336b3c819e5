"""Base class for every Celery task of the project.

It owns the process runtime (database, store), retries only transient failures with backoff, and
logs one line of timing per run. Each run has the log context of the request that queued it (the
request id of its message headers), its task name and id, its queue and its job. Tasks take ids,
never objects; state lives in Postgres. A task of a job kind (``job_kind``) takes the job's id
first: a retry puts the job back to queued and a final failure marks it failed with the reason
(``p2p.shared.jobs``), so no job is left "running".
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

from celery import Task
from celery.signals import task_postrun, task_prerun

from p2p.shared import jobs, logs
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
        outcome = "error"
        try:
            result = super().__call__(*args, **kwargs)
            outcome = "ok"
            return result
        finally:
            took = time.perf_counter() - started
            log.info(
                "task %s%s took %.3f s", self.name, args, took, extra={"outcome": outcome, "duration_s": took}
            )

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


# --- log context of a task run ----------------------------------------------------------------

# Tokens of the runs in progress, by task id: postrun restores the context prerun replaced.
_run_contexts: dict[str, Any] = {}


def _header(request: Any, name: str) -> str | None:
    headers = getattr(request, "headers", None) or {}
    value = headers.get(name) if isinstance(headers, dict) else None
    return logs.valid_request_id(value or getattr(request, name, None))


def run_context(task: Any, task_id: str, args: Any) -> dict[str, Any]:
    """The log fields of one run of ``task``: request id (message header), task, queue, job."""
    request = task.request
    fields: dict[str, Any] = {
        "request_id": _header(request, logs.TASK_HEADER),
        "task_name": task.name,
        "task_id": task_id,
        "queue": (getattr(request, "delivery_info", None) or {}).get("routing_key"),
    }
    kind = getattr(task, "job_kind", None)
    if kind is not None and args:
        fields.update(job_kind=kind.name, job_id=str(args[0]))
    return fields


@task_prerun.connect(weak=False)
def _bind_run_context(
    sender: Any = None, task_id: str = "", task: Any = None, args: Any = (), **_: Any
) -> None:
    if task is not None and task_id:
        _run_contexts[task_id] = logs.bind(**run_context(task, task_id, args))


@task_postrun.connect(weak=False)
def _unbind_run_context(sender: Any = None, task_id: str = "", **_: Any) -> None:
    token = _run_contexts.pop(task_id, None)
    if token is not None:
        try:
            logs.unbind(token)
        except ValueError:  # made in another context (a pool that moved the run): drop it instead
            logs.clear()
