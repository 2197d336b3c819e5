"""What every FastAPI service of the project shares: the error envelope and the body size cap."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from p2p.shared.errors import P2PError, error_body
from p2p.shared.settings import Settings

log = logging.getLogger(__name__)

_HTTP_TYPES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    413: "payload_too_large",
    415: "unsupported_format",
}


def error_response(
    *, status_code: int, message: str, error_type: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse(
        error_body(message=message, error_type=error_type, status_code=status_code),
        status_code=status_code,
        headers=headers,
    )


def _describe_validation(errors: list[Any]) -> tuple[str, str]:
    parts = []
    error_type = "validation_error"
    for err in errors[:5]:
        loc = ".".join(str(p) for p in err.get("loc", ()) if p not in ("body",))
        parts.append(f"{loc}: {err.get('msg')}" if loc else str(err.get("msg")))
        if err.get("type") == "extra_forbidden":
            error_type = "unknown_field"
    return "; ".join(parts), error_type


def startup_notice(settings: Settings, service: str) -> str:
    """What a service says when it starts: where its data lives, and loudly when keys are off."""
    parts = [
        f"profile={settings.profile}",
        "database=embedded PostgreSQL" if settings.embedded_db else "database=configured server",
        "objects=local folder" if settings.embedded_store else f"objects=s3 {settings.s3.endpoint}",
        "queue=in-process" if settings.embedded_queue else "queue=redis",
    ]
    if not settings.auth_required:
        parts.append("AUTH DISABLED: API keys are off, every endpoint is open; bind to 127.0.0.1 only")
    return f"{service}: " + ", ".join(parts)


def log_startup(settings: Settings, service: str) -> None:
    log.log(logging.INFO if settings.auth_required else logging.WARNING, startup_notice(settings, service))


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(P2PError)
    async def _p2p_error(_: Request, exc: P2PError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status_code == 401 else None
        return error_response(
            status_code=exc.status_code, message=exc.message, error_type=exc.error_type, headers=headers
        )

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        message, error_type = _describe_validation(list(exc.errors()))
        return error_response(status_code=422, message=message, error_type=error_type)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        error_type = getattr(exc, "error_type", None) or _HTTP_TYPES.get(exc.status_code, "http_error")
        return error_response(status_code=exc.status_code, message=str(exc.detail), error_type=error_type)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_response(status_code=500, message="internal server error", error_type="internal_error")


class BodyTooLarge(StarletteHTTPException):
    # A Starlette HTTPException passes through FastAPI's body parsing unchanged, so the client
    # gets this 413 instead of a generic "error parsing the body".
    error_type = "payload_too_large"

    def __init__(self, limit: int) -> None:
        super().__init__(status_code=413, detail=f"request body is larger than the {limit}-byte limit")


class BodySizeLimit:
    """Refuses oversized bodies while they stream in: by Content-Length up front, else by counting."""

    def __init__(self, app: ASGIApp, *, max_body_bytes: int, per_path: dict[str, int] | None = None) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.per_path = per_path or {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.per_path.get(scope.get("path", ""), self.max_body_bytes)
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = 0
                if declared > limit:
                    response = error_response(
                        status_code=413, message=BodyTooLarge(limit).detail, error_type="payload_too_large"
                    )
                    await response(scope, receive, send)
                    return
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise BodyTooLarge(limit)
            return message

        await self.app(scope, limited_receive, send)
