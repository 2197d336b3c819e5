from __future__ import annotations

import uuid

from p2p.ingest.batches import run_batch
from p2p.shared.queue import RUN_BATCH_TASK, celery_app
from p2p.shared.tasks import P2PTask


@celery_app.task(name=RUN_BATCH_TASK, base=P2PTask, bind=True)
def run_batch_task(self: P2PTask, batch_id: str) -> None:
    run_batch(self.runtime, uuid.UUID(batch_id))
