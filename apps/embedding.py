"""The embedding API process: the embedding service's routers and the training-run routes."""

from __future__ import annotations

from fastapi import FastAPI

from p2p.apps.tasks import register_tasks
from p2p.embedding_api import app as embedding_app_module
from p2p.shared.metrics.http import install_metrics, no_collectors
from p2p.shared.runtime import Runtime
from p2p.shared.settings import Settings, get_settings
from p2p.training import routes as training_routes

# Training runs end in a model version of the embedding API, so the embedding process answers
# them beside /v1/models; the training service itself runs on the training queue only.
ROUTERS = (*embedding_app_module.ROUTERS, training_routes.router)


def embedding_app(
    settings: Settings | None = None,
    runtime: Runtime | None = None,
    *,
    refresh_interval_s: float = embedding_app_module.REFRESH_INTERVAL_S,
) -> FastAPI:
    register_tasks()
    app = embedding_app_module.create_app(
        settings, runtime, refresh_interval_s=refresh_interval_s, routers=ROUTERS
    )
    effective = runtime.settings if runtime is not None else (settings or get_settings())
    if effective.metrics.enabled:
        install_metrics(app, service="embedding", collectors=no_collectors)
    return app
