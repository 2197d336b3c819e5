"""Entry point of Celery worker processes: `celery -A p2p.apps.worker:celery_app worker -Q <queue>`.

Settings are read and validated here, once, when the worker starts.
"""

from __future__ import annotations

import logging
from typing import Any

from celery.signals import (
    celeryd_after_setup,
    celeryd_init,
    setup_logging,
    worker_ready,
    worker_shutting_down,
)

from p2p.apps.tasks import register_tasks
from p2p.mining.tasks import get_miner, prepare_worker_process
from p2p.shared.logs import configure_logging
from p2p.shared.metrics import worker as worker_metrics
from p2p.shared.queue import (
    MINING_LVLM_QUEUE,
    MINING_QUEUE,
    celery_app,
    configure_celery,
    import_task_modules,
)
from p2p.shared.settings import get_settings

configure_celery(get_settings())
configure_logging(get_settings(), service="worker")
register_tasks()
import_task_modules()


@setup_logging.connect
def _keep_project_logging(**_: Any) -> None:
    # Connected, this signal tells Celery not to install handlers of its own: the worker's lines
    # (Celery's included) keep the project's format and carry each task's context. The level is
    # P2P_LOG_LEVEL's, not --loglevel's.
    configure_logging(get_settings(), service="worker")


@celeryd_after_setup.connect
def _preload_models(sender: str, instance: Any, **_: Any) -> None:
    # A mining worker loads its models before it takes the first figure; an LVLM worker also
    # checks the model server (it starts anyway when the server is not up yet: each task checks).
    queues = set(instance.app.amqp.queues.consume_from or {})
    if MINING_QUEUE in queues or MINING_LVLM_QUEUE in queues:
        prepare_worker_process(get_settings())
    if MINING_LVLM_QUEUE in queues:
        try:
            get_miner("lvlm").ensure_ready()
        except ConnectionError as exc:
            logging.getLogger(__name__).warning("model server not ready: %s", exc)


_sweepers: list[Any] = []
_metrics_servers: list[worker_metrics.MetricsServer] = []
_metrics_dirs: list[Any] = []


@celeryd_init.connect
def _prepare_metrics(**_: Any) -> None:
    # In the worker's main process only (not in `celery inspect`), before the pool forks.
    path = worker_metrics.install(get_settings())
    if path is not None:
        _metrics_dirs.append(path)


@worker_ready.connect
def _serve_metrics(**_: Any) -> None:
    if _metrics_dirs:
        _metrics_servers.append(worker_metrics.MetricsServer(get_settings(), _metrics_dirs[0]).start())


@worker_ready.connect
def _start_recovery_sweep(sender: Any = None, **_: Any) -> None:
    # Every worker sweeps (one at a time across the cluster, by a lock): no beat process needed.
    from p2p.shared.recovery import SweepTimer
    from p2p.shared.runtime import get_process_runtime

    settings = get_settings()
    _sweepers.append(SweepTimer(get_process_runtime(), settings.queue.sweep_interval_s).start())


@worker_shutting_down.connect
def _stop_recovery_sweep(**_: Any) -> None:
    while _sweepers:
        _sweepers.pop().stop()
    while _metrics_servers:
        _metrics_servers.pop().stop()


__all__ = ["celery_app"]
