"""The ingest API process: its routers are the ingest service's own (``p2p.ingest.app``).

Kept apart from ``p2p.apps.embedding``: the ingest image installs no ML libraries.
"""

from __future__ import annotations

from fastapi import FastAPI

from p2p.apps.tasks import register_tasks
from p2p.ingest import app as ingest_app_module
from p2p.shared.metrics.http import api_collectors, install_metrics
from p2p.shared.runtime import Runtime
from p2p.shared.settings import Settings, get_settings


def ingest_app(settings: Settings | None = None, runtime: Runtime | None = None) -> FastAPI:
    register_tasks()  # the embedded profile mines (and embeds) on the API's in-process pool
    app = ingest_app_module.create_app(settings, runtime)
    effective = runtime.settings if runtime is not None else (settings or get_settings())
    if effective.metrics.enabled:
        # The queue and job gauges are served here (and by the workers' metrics servers).
        install_metrics(app, service="ingest", collectors=api_collectors)
    return app
