from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from p2p.embedding_api.deps import ModelState, RuntimeDep
from p2p.shared.health import readiness_response, run_check

router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


def _model_check(state: ModelState | None) -> tuple[str, dict[str, Any]]:
    if state is None:
        return "not loaded", {}
    space = {
        "name": state.space,
        "version_id": str(state.version_id) if state.version_id else None,
        "model": f"{state.name} {state.version}" if state.version else state.name,
        "search": "ready" if state.version_id else "no active model version: embeds only",
    }
    if state.load_error:
        space["load_error"] = state.load_error
    return "ok", space


@router.get("/readyz")
async def readyz(request: Request, runtime: RuntimeDep) -> JSONResponse:
    """Ready when the database and object store answer and a model is loaded. Search additionally
    needs an active model version in the space (reported under ``space``)."""
    database, store = await asyncio.gather(run_check(runtime.check_database), run_check(runtime.store.ping))
    model, space = _model_check(getattr(request.app.state, "model_state", None))
    return readiness_response({"database": database, "object_store": store, "model": model}, space=space)
