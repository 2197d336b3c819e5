"""Celery tasks of the mining queue. Heavy models load once per process (at worker start)."""

from __future__ import annotations

import logging
import threading
import uuid

from p2p.mining.miner import Miner
from p2p.shared.jobs import MINING
from p2p.shared.queue import EMBED_FIGURES_TASK, EMBEDDING_QUEUE, MINE_FIGURE_TASK, celery_app
from p2p.shared.settings import Settings, get_settings
from p2p.shared.tasks import P2PTask

log = logging.getLogger(__name__)

_miners: dict[str, Miner] = {}
_miners_lock = threading.Lock()


def get_miner(backend: str = "cpu") -> Miner:
    """The process's miner for ``backend`` (models loaded once, shared by threads). The LVLM
    miner wraps the process's CPU miner, which proposes and stands in for it."""
    with _miners_lock:
        from p2p.mining.pipeline import CpuMiner

        cpu = _miners.get("cpu")
        if not isinstance(cpu, CpuMiner):
            cpu = _miners["cpu"] = CpuMiner()
        if backend == "lvlm" and "lvlm" not in _miners:
            from p2p.mining.lvlm.miner import LvlmMiner

            _miners["lvlm"] = LvlmMiner(get_settings().mining.lvlm, cpu=cpu)
        if backend not in _miners:
            raise ValueError(f"unknown mining backend {backend!r}")
        return _miners[backend]


def prepare_worker_process(settings: Settings) -> None:
    """What a mining worker process does before its first figure: torch on the configured threads,
    the CPU miner's models loaded."""
    import torch

    torch.set_num_threads(settings.mining.torch_threads)
    get_miner("cpu")


class MiningTask(P2PTask):
    abstract = True
    job_kind = MINING


@celery_app.task(name=MINE_FIGURE_TASK, base=MiningTask, bind=True)
def mine_figure_task(self: MiningTask, job_id: str) -> None:
    from p2p.mining.jobs import job_backend, mine_job

    backend = job_backend(self.runtime, uuid.UUID(job_id)) or "cpu"
    miner = get_miner(backend)
    last_attempt = self.request.retries >= (self.max_retries or 0)
    fallback = None
    if last_attempt and backend != "cpu":
        fallback = get_miner("cpu")  # the model server stayed away: the CPU backend mines it
    else:
        miner.ensure_ready()  # the model server must be up before this worker takes the figure
    outcome = mine_job(self.runtime, uuid.UUID(job_id), miner, fallback=fallback)
    figure_id = str(outcome.figure_id) if outcome.figure_id is not None else None
    log.info("mining job %s: %s", job_id, outcome, extra={"figure_id": figure_id, "outcome": outcome.status})
    if outcome.figure_id is not None:
        # New panels and regions join the active (and any pending) embedding space.
        self.runtime.dispatcher.send(
            EMBED_FIGURES_TASK, args=[[str(outcome.figure_id)]], queue=EMBEDDING_QUEUE
        )
