"""The ingest API: figures and captions in, one by one or in bulk."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from p2p.ingest.routes import batches, crops, figures, health, jobs
from p2p.shared.api import (
    install_error_handlers,
    install_guards,
    limit_body_size,
    log_startup,
)
from p2p.shared.recovery import start_embedded_recovery
from p2p.shared.runtime import Runtime, build_runtime, set_process_runtime
from p2p.shared.settings import Settings, get_settings

log = logging.getLogger(__name__)

MULTIPART_OVERHEAD = 1024 * 1024


def create_app(settings: Settings | None = None, runtime: Runtime | None = None) -> FastAPI:
    settings = runtime.settings if runtime is not None else (settings or get_settings())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        owned = runtime is None
        app.state.runtime = runtime or build_runtime(settings)
        set_process_runtime(app.state.runtime)
        log_startup(settings, "ingest API")
        sweeper = start_embedded_recovery(app.state.runtime)
        try:
            yield
        finally:
            if sweeper is not None:
                sweeper.stop()
            if owned:
                app.state.runtime.close()
                set_process_runtime(None)

    app = FastAPI(
        title="Panel2Patch ingest",
        version="0.1.0",
        description="Figures and captions in: single uploads, manifests, WebDataset shards, PMC OA packages.",
        lifespan=lifespan,
    )
    install_error_handlers(app)
    install_guards(app, auth_required=settings.auth_required)
    body_cap = settings.ingest.max_upload_bytes + settings.ingest.max_metadata_bytes + MULTIPART_OVERHEAD
    limit_body_size(
        app,
        max_body_bytes=body_cap,
        per_path={"/v1/batches/upload": settings.ingest.max_package_upload_bytes + MULTIPART_OVERHEAD},
    )
    for module in (health, figures, crops, jobs, batches):
        app.include_router(module.router)
    return app
