"""The embedding and retrieval API, and its web viewer at ``/``.

At startup the process loads the active model version of its space (no cold start on the first
request) into ``app.state.model_state`` with a micro-batcher; a background task re-checks the space
every few seconds and swaps in the new model once a re-index has switched the space. While the space
has no active version the default model (random vision tower) serves embeds and search answers 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import torch
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles

from p2p.embedding_api.batching import BatcherStopped, MicroBatcher
from p2p.embedding_api.calibration import calibrate
from p2p.embedding_api.deps import ModelState
from p2p.embedding_api.routes import classify, embed, health, items, models, search
from p2p.embedding_api.text_cache import TextCache
from p2p.models.modeling import default_spec, load_model
from p2p.models.registry import spec_of
from p2p.shared.api import (
    error_response,
    install_error_handlers,
    install_guards,
    limit_body_size,
    log_startup,
)
from p2p.shared.db.models import EmbeddingSpace, ModelVersion
from p2p.shared.metrics.embedding import BatchObserver, batch_observer
from p2p.shared.recovery import start_embedded_recovery
from p2p.shared.runtime import Runtime, build_runtime, set_process_runtime
from p2p.shared.settings import EmbeddingSettings, Settings, get_settings

log = logging.getLogger(__name__)

MULTIPART_OVERHEAD = 1024 * 1024
STATIC_DIR = Path(__file__).parent / "static"
REFRESH_INTERVAL_S = 5.0
# torch's intra-op threads on the text thread: a search embeds one short text, and on two threads
# MiniLM's batch of one took 10x longer than on one whenever other work held a core (bench/README.md).
TEXT_THREADS = 1
# When the search costs are measured again after a version is loaded (see start_calibration).
RECALIBRATE_AFTER_S = 300.0
# How long a swapped-out model keeps answering the requests that already hold it.
RETIRE_GRACE_S = 30.0
# This service's own routes; the process that serves it may add others' (p2p.apps.embedding).
ROUTERS: tuple[APIRouter, ...] = tuple(m.router for m in (health, embed, search, items, classify, models))


def active_version(runtime: Runtime, space: str) -> ModelVersion | None:
    with runtime.session() as session:
        row = session.get(EmbeddingSpace, space)
        if row is None or row.active_version_id is None:
            return None
        version = session.get(ModelVersion, row.active_version_id)
        if version is not None:
            session.expunge(version)
        return version


def intra_op_threads(settings: EmbeddingSettings) -> int:
    """torch's threads per running batch: the configured threads shared by the image workers."""
    return max(1, settings.torch_threads // settings.image_workers)


def make_batcher(
    model: Any, settings: EmbeddingSettings, *, observe: BatchObserver | None = None
) -> MicroBatcher:
    return MicroBatcher(
        model,
        batch_size=settings.batch_size,
        wait_ms=settings.batch_wait_ms,
        image_workers=settings.image_workers,
        text_thread_init=functools.partial(torch.set_num_threads, TEXT_THREADS),
        observe=observe,
    )


def load_state(runtime: Runtime, space: str) -> ModelState:
    """Load the space's active version (blocking: run it in a thread); the default model when the
    space has none or its version cannot be loaded (the reason is kept for the errors)."""

    settings = runtime.settings.embedding
    observe = batch_observer(runtime.settings)
    version = active_version(runtime, space)
    error = None
    if version is not None:
        try:
            model = load_model(spec_of(version), store=runtime.store, threads=intra_op_threads(settings))
            if model.dim != version.dim:
                raise ValueError(f"model gives {model.dim}-d vectors, the version says {version.dim}")
            batcher = make_batcher(model, settings, observe=observe)
            log.info("serving space %s with %s %s (%d-d)", space, version.name, version.version, model.dim)
            return ModelState(
                model,
                batcher,
                space,
                version.id,
                version.name,
                version.version,
                model.dim,
                text_cache=TextCache(settings.text_cache_entries),
            )
        except Exception as exc:
            error = f"{version.name} {version.version}: {type(exc).__name__}: {exc}"[:500]
            log.error("cannot load the active model of space %s: %s", space, error)
    spec = default_spec()
    model = load_model(spec, store=runtime.store, threads=intra_op_threads(settings))
    batcher = make_batcher(model, settings, observe=observe)
    if error is None:
        log.warning("space %s has no active model version: the default model serves embeds only", space)
    return ModelState(
        model,
        batcher,
        space,
        None,
        spec.name,
        None,
        model.dim,
        load_error=error,
        text_cache=TextCache(settings.text_cache_entries),
    )


def calibrate_search(runtime: Runtime, state: ModelState) -> None:
    """Measure what each search path costs on the state's vector table (blocking, bounded: run it in
    a thread); until it is done, search plans with the default costs."""
    if state.version_id is None:
        return
    try:
        costs = calibrate(runtime.engine, state.version_id)
    except LookupError:
        return  # no vectors yet: nothing to measure, search answers 503 anyway
    except Exception:
        log.exception("calibrating search costs for version %s failed: default costs apply", state.version_id)
        return
    state.search_costs.costs = costs
    log.info("search costs of version %s: %s", state.version_id, costs.as_dict())


async def _calibrate_after(runtime: Runtime, state: ModelState, delay_s: float) -> None:
    await asyncio.sleep(delay_s)
    await asyncio.to_thread(calibrate_search, runtime, state)


def start_calibration(
    runtime: Runtime, state: ModelState, tasks: set[asyncio.Task[None]], *, again_after_s: float
) -> None:
    """Calibrate now, and once more after ``again_after_s``: right after loading, the table and its
    index are mostly not in memory yet, and the graph's costs come out several times too high."""
    for delay, name in ((0.0, "calibrate"), (again_after_s, "recalibrate")):
        task = asyncio.create_task(_calibrate_after(runtime, state, delay), name=name)
        tasks.add(task)
        task.add_done_callback(tasks.discard)


async def _retire(state: ModelState, grace_s: float) -> None:
    await asyncio.sleep(grace_s)
    await state.batcher.stop()


async def refresh_forever(
    app: FastAPI, runtime: Runtime, space: str, interval_s: float, calibrations: set[asyncio.Task[None]]
) -> None:
    """Swap the served model when the space's active version changes (and measure the search costs
    on the new version's table)."""
    loaded: uuid.UUID | None = app.state.model_state.version_id
    retiring: set[asyncio.Task[None]] = set()
    while True:
        await asyncio.sleep(interval_s)
        try:
            version = await asyncio.to_thread(active_version, runtime, space)
            wanted = version.id if version is not None else None
            if wanted == loaded:
                continue
            loaded = wanted  # a version that fails to load is not retried every few seconds
            state = await asyncio.to_thread(load_state, runtime, space)
            state.batcher.start()
            start_calibration(runtime, state, calibrations, again_after_s=RECALIBRATE_AFTER_S)
            old, app.state.model_state = app.state.model_state, state
            old.text_cache.clear()  # its texts embed differently under the new model
            task = asyncio.create_task(_retire(old, RETIRE_GRACE_S))
            retiring.add(task)
            task.add_done_callback(retiring.discard)
        except asyncio.CancelledError:
            for task in retiring:
                task.cancel()
            raise
        except Exception:
            log.exception("checking the active model of space %s failed", space)


def install_batcher_handler(app: FastAPI) -> None:
    @app.exception_handler(BatcherStopped)
    async def _stopped(_: Request, exc: BatcherStopped) -> JSONResponse:
        return error_response(
            status_code=503,
            message=f"{exc}; the model is being replaced, retry",
            error_type="model_unavailable",
        )


def mount_viewer(app: FastAPI) -> None:
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")

    @app.get("/", include_in_schema=False)
    def index_page() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html", media_type="text/html")

    @app.get("/figures/{figure_id}", include_in_schema=False)
    def figure_page(figure_id: uuid.UUID) -> FileResponse:
        return FileResponse(STATIC_DIR / "figure.html", media_type="text/html")


def create_app(
    settings: Settings | None = None,
    runtime: Runtime | None = None,
    *,
    refresh_interval_s: float = REFRESH_INTERVAL_S,
    routers: Sequence[APIRouter] = ROUTERS,
) -> FastAPI:
    settings = runtime.settings if runtime is not None else (settings or get_settings())
    space = settings.embedding.space

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        owned = runtime is None
        rt = runtime or build_runtime(settings)
        app.state.runtime = rt
        set_process_runtime(rt)
        log_startup(settings, "embedding API")
        refresher: asyncio.Task[None] | None = None
        calibrations: set[asyncio.Task[None]] = set()
        sweeper = start_embedded_recovery(rt)
        try:
            app.state.model_state = await asyncio.to_thread(load_state, rt, space)
            app.state.model_state.batcher.start()
            start_calibration(rt, app.state.model_state, calibrations, again_after_s=RECALIBRATE_AFTER_S)
            refresher = asyncio.create_task(refresh_forever(app, rt, space, refresh_interval_s, calibrations))
            yield
        finally:
            # A running calibration is bounded (calibration.BUDGET_S): it finishes before the engine
            # closes; one still waiting for its turn is dropped.
            for task in calibrations:
                if task.get_name() == "recalibrate":
                    task.cancel()
            await asyncio.gather(*calibrations, return_exceptions=True)
            if sweeper is not None:
                sweeper.stop()
            if refresher is not None:
                refresher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await refresher
            state = getattr(app.state, "model_state", None)
            if state is not None:
                await state.batcher.stop()
            if owned:
                rt.close()
                set_process_runtime(None)

    app = FastAPI(
        title="Panel2Patch embedding API",
        version="0.1.0",
        description="Text and image embeddings, figure/panel/region retrieval, zero-shot figure types, "
        "model versions; a web viewer at /.",
        lifespan=lifespan,
    )
    install_error_handlers(app)
    install_batcher_handler(app)
    # Crops may redirect to presigned URLs of the object store: the viewer's images come from there.
    store = settings.s3.endpoint
    img_hosts = f"{'https' if settings.s3.secure else 'http'}://{store}" if store else ""
    install_guards(
        app, auth_required=settings.auth_required, csp_paths=("/static/", "/figures/"), img_hosts=img_hosts
    )
    limit_body_size(app, max_body_bytes=settings.ingest.max_upload_bytes + MULTIPART_OVERHEAD)
    for router in routers:
        app.include_router(router)
    mount_viewer(app)
    return app
