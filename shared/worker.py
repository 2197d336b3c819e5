"""Entry point of Celery worker processes: `celery -A p2p.shared.worker:celery_app worker -Q <queue>`.

Settings are read and validated here, once, when the worker starts.
"""

from __future__ import annotations

from p2p.shared.queue import celery_app, configure_celery, import_task_modules
from p2p.shared.settings import get_settings

configure_celery(get_settings())
import_task_modules()

__all__ = ["celery_app"]
