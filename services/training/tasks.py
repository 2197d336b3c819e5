"""Celery task of the training queue: execute (or resume) one training run."""

from __future__ import annotations

import logging
import uuid

from p2p.shared.jobs import TRAINING
from p2p.shared.queue import TRAIN_RUN_TASK, celery_app
from p2p.shared.tasks import P2PTask

log = logging.getLogger(__name__)

INTERRUPTED_RETRY_S = 10


# Lazy, as in the other task modules: every worker imports this one, only training workers run it.


class TrainingTask(P2PTask):
    abstract = True
    job_kind = TRAINING


@celery_app.task(name=TRAIN_RUN_TASK, base=TrainingTask, bind=True, max_retries=20)
def run_training_task(self: TrainingTask, run_id: str) -> None:
    from p2p.training.jobs import TrainingInterrupted, execute_run

    try:
        status = execute_run(self.runtime, uuid.UUID(run_id))
    except TrainingInterrupted as exc:
        # The worker is going away: the run goes back on the queue and resumes from its checkpoint.
        raise self.retry(exc=exc, countdown=INTERRUPTED_RETRY_S) from exc
    log.info("training run %s: %s", run_id, status.value if status is not None else "held by another worker")
