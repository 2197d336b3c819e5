from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from p2p.embedding_api.deps import ModelState, RuntimeDep
from p2p.shared.errors import error_body

router = APIRouter(tags=["health"])

CHECK_TIMEOUT_S = 3.0


@router.get("/healthz")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


async def _check(fn: Callable[[], Any]) -> str:
    try:
        await asyncio.wait_for(asyncio.to_thread(fn), CHECK_TIMEOUT_S)
        return "ok"
    except TimeoutError:
        return f"timed out after {CHECK_TIMEOUT_S:.0f} s"
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"[:300]


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
    database, store = await asyncio.gather(_check(runtime.check_database), _check(runtime.store.ping))
    model, space = _model_check(getattr(request.app.state, "model_state", None))
    checks = {"database": database, "object_store": store, "model": model}
    if all(value == "ok" for value in checks.values()):
        return JSONResponse({"status": "ready", "checks": checks, "space": space})
    failing = ", ".join(f"{name}: {value}" for name, value in checks.items() if value != "ok")
    body = error_body(message=f"not ready: {failing}", error_type="not_ready", status_code=503)
    return JSONResponse({**body, "status": "unavailable", "checks": checks, "space": space}, status_code=503)
