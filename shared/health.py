"""Readiness checks shared by the service APIs: each dependency checked off the event loop with a
timeout, and one answer shape (200 ready, or 503 in the error envelope with per-check reasons)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from fastapi.responses import JSONResponse

from p2p.shared.errors import error_body

CHECK_TIMEOUT_S = 3.0


async def run_check(fn: Callable[[], Any], timeout_s: float = CHECK_TIMEOUT_S) -> str:
    """ "ok", or why ``fn`` failed or did not answer in time."""
    try:
        await asyncio.wait_for(asyncio.to_thread(fn), timeout_s)
        return "ok"
    except TimeoutError:
        return f"timed out after {timeout_s:.0f} s"
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"[:300]


def readiness_response(checks: dict[str, str], **extra: Any) -> JSONResponse:
    if all(value == "ok" for value in checks.values()):
        return JSONResponse({"status": "ready", "checks": checks, **extra})
    failing = ", ".join(f"{name}: {value}" for name, value in checks.items() if value != "ok")
    body = error_body(message=f"not ready: {failing}", error_type="not_ready", status_code=503)
    return JSONResponse({**body, "status": "unavailable", "checks": checks, **extra}, status_code=503)
