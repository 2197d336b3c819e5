from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from p2p.ingest.deps import RuntimeDep
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


@router.get("/readyz")
async def readyz(runtime: RuntimeDep) -> JSONResponse:
    names = ("database", "broker", "object_store")
    results = await asyncio.gather(
        _check(runtime.check_database), _check(runtime.dispatcher.ping), _check(runtime.store.ping)
    )
    checks = dict(zip(names, results, strict=True))
    if all(value == "ok" for value in checks.values()):
        return JSONResponse({"status": "ready", "checks": checks})
    failing = ", ".join(f"{name}: {value}" for name, value in checks.items() if value != "ok")
    body = error_body(message=f"not ready: {failing}", error_type="not_ready", status_code=503)
    return JSONResponse({**body, "status": "unavailable", "checks": checks}, status_code=503)
