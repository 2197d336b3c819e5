"""Entry point of Celery worker processes: `celery -A p2p.apps.worker:celery_app worker -Q <queue>`.

Settings are read and validated here, once, when the worker starts.
"""

from __future__ import annotations

import logging
from typing import Any

from celery.signals import celeryd_after_setup

from p2p.apps.tasks import register_tasks
from p2p.mining.tasks import get_miner, prepare_worker_process
from p2p.shared.queue import (
    MINING_LVLM_QUEUE,
    MINING_QUEUE,
    celery_app,
    configure_celery,
    import_task_modules,
)
from p2p.shared.settings import get_settings

configure_celery(get_settings())
register_tasks()
import_task_modules()


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


__all__ = ["celery_app"]
