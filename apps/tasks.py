"""The task modules of every service, registered with the project's Celery app in one place."""

from __future__ import annotations

from p2p.shared.queue import include_task_modules

TASK_MODULES = ("p2p.ingest.tasks", "p2p.mining.tasks", "p2p.embedding_api.tasks", "p2p.training.tasks")


def register_tasks() -> None:
    """Let workers and in-process dispatchers find every task (idempotent; modules load lazily)."""
    include_task_modules(TASK_MODULES)
