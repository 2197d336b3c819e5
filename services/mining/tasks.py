"""Celery tasks of the mining queue. Heavy models load on the first task of each process."""

from __future__ import annotations

import logging
import threading
import uuid
from typing import Any

from p2p.shared.queue import MINE_FIGURE_TASK, celery_app
from p2p.shared.tasks import P2PTask

log = logging.getLogger(__name__)

_miner: Any = None
_miner_lock = threading.Lock()


def get_miner() -> Any:
    """The process's CPU miner (models loaded once, shared by threads)."""
    global _miner
    with _miner_lock:
        if _miner is None:
            from p2p.mining.pipeline import CpuMiner

            _miner = CpuMiner()
        return _miner


class MiningTask(P2PTask):
    abstract = True

    def on_failure(self, exc: BaseException, task_id: str, args: Any, kwargs: Any, einfo: Any) -> None:
        # Out of retries or an unexpected error: the job is failed with its reason, not left "running".
        from p2p.mining.jobs import mark_failed

        try:
            mark_failed(self.runtime, uuid.UUID(args[0]), f"{type(exc).__name__}: {exc}")
        except Exception:
            log.exception("could not record the failure of mining job %s", args)


@celery_app.task(name=MINE_FIGURE_TASK, base=MiningTask, bind=True)
def mine_figure_task(self: MiningTask, job_id: str) -> None:
    from p2p.mining.jobs import mine_job

    outcome = mine_job(self.runtime, uuid.UUID(job_id), get_miner())
    log.info("mining job %s: %s", job_id, outcome)
