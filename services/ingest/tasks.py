from __future__ import annotations

import uuid

from p2p.ingest.batches import run_batch
from p2p.shared.jobs import INGEST_BATCH
from p2p.shared.queue import RUN_BATCH_TASK, celery_app
from p2p.shared.tasks import P2PTask


class IngestTask(P2PTask):
    abstract = True
    job_kind = INGEST_BATCH


@celery_app.task(name=RUN_BATCH_TASK, base=IngestTask, bind=True)
def run_batch_task(self: IngestTask, batch_id: str) -> None:
    run_batch(self.runtime, uuid.UUID(batch_id))
