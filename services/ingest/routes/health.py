from __future__ import annotations

import asyncio

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from p2p.ingest.deps import RuntimeDep
from p2p.shared.health import readiness_response, run_check

router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(runtime: RuntimeDep) -> JSONResponse:
    names = ("database", "broker", "object_store")
    results = await asyncio.gather(
        run_check(runtime.check_database), run_check(runtime.dispatcher.ping), run_check(runtime.store.ping)
    )
    return readiness_response(dict(zip(names, results, strict=True)))
