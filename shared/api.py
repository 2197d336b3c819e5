"""What every FastAPI service of the project shares: the error envelope and the body size cap."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy import exc as sa_exc
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from p2p.shared.errors import P2PError, error_body
from p2p.shared.logs import REQUEST_ID_HEADER, bind, new_request_id, unbind, valid_request_id
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
    429: "rate_limited",
}

# A database that cannot be reached (down, restarting, pool exhausted) is the server's state, not
# the request's fault: 503 with the reason, and the client retries.
DATABASE_DOWN_ERRORS: tuple[type[Exception], ...] = (
    sa_exc.OperationalError,
    sa_exc.InterfaceError,
    sa_exc.TimeoutError,
)


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
        if exc.headers:
            headers = {**(headers or {}), **exc.headers}
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
        headers = None
        if exc.status_code == 405:
            # RFC 9110: a 405 names the methods the resource has.
            headers = dict(exc.headers or {}) or None
        return error_response(
            status_code=exc.status_code, message=str(exc.detail), error_type=error_type, headers=headers
        )

    async def _database_down(request: Request, exc: Exception) -> JSONResponse:
        log.warning("database unavailable on %s %s: %s", request.method, request.url.path, exc)
        notify = getattr(getattr(request.app.state, "runtime", None), "database_unavailable", None)
        if notify is not None:
            notify()  # the embedded profile restarts its own server
        return error_response(
            status_code=503,
            message=f"the database is unavailable ({type(exc).__name__}); retry shortly",
            error_type="database_unavailable",
            headers={"Retry-After": "5"},
        )

    for cls in DATABASE_DOWN_ERRORS:
        app.add_exception_handler(cls, _database_down)

    @app.exception_handler(sa_exc.DataError)
    async def _data_error(_: Request, exc: sa_exc.DataError) -> JSONResponse:
        # Values the schema let through but PostgreSQL refuses (numbers out of range...).
        reason = str(getattr(exc, "orig", exc)).splitlines()[0]
        return error_response(status_code=422, message=f"value refused: {reason}", error_type="invalid_value")

    app.add_middleware(StrictFormText)
    app.add_middleware(CatchAll)
    install_openapi(app)


class CatchAll:
    """Answers an unexpected error with the 500 envelope and keeps the connection open.

    Starlette's own last-resort handler re-raises after answering, and the server then drops the
    connection, failing the client's next, unrelated request on it.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception:
            log.exception("unhandled error on %s %s", scope.get("method"), scope.get("path"))
            if started:
                raise  # half a response is out: only closing the connection tells the client
            response = error_response(
                status_code=500, message="internal server error", error_type="internal_error"
            )
            await response(scope, receive, send)


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


class InvalidFormText(StarletteHTTPException):
    error_type = "invalid_utf8"

    def __init__(self, field: str) -> None:
        super().__init__(status_code=422, detail=f"form field {field!r} is not valid UTF-8 text")


class _TextPartWatcher:
    """Follows a multipart body as it streams in and checks every text part decodes as UTF-8.

    Starlette decodes an undecodable text part as Latin-1, which would store mojibake silently.
    File parts pass through untouched; a body the watcher cannot parse is left to Starlette.
    """

    def __init__(self, boundary: bytes) -> None:
        from python_multipart.multipart import MultipartParser

        self._header_name = self._header_value = b""
        self._disposition = b""
        self._text: bytearray | None = None
        self.bad_field: str | None = None
        self._parser = MultipartParser(
            boundary,
            {
                "on_part_begin": self._begin,
                "on_header_field": self._field,
                "on_header_value": self._value,
                "on_header_end": self._header_end,
                "on_headers_finished": self._headers_done,
                "on_part_data": self._data,
                "on_part_end": self._end,
            },
        )
        self.broken = False

    def feed(self, chunk: bytes) -> None:
        if self.broken or self.bad_field is not None:
            return
        try:
            self._parser.write(chunk)
        except Exception:
            self.broken = True

    def _begin(self) -> None:
        self._disposition, self._text = b"", None

    def _field(self, data: bytes, start: int, end: int) -> None:
        self._header_name += data[start:end]

    def _value(self, data: bytes, start: int, end: int) -> None:
        self._header_value += data[start:end]

    def _header_end(self) -> None:
        if self._header_name.lower() == b"content-disposition":
            self._disposition = self._header_value
        self._header_name = self._header_value = b""

    def _headers_done(self) -> None:
        from python_multipart.multipart import parse_options_header

        _, options = parse_options_header(self._disposition)
        self._name = options.get(b"name", b"").decode("latin-1")
        self._text = None if b"filename" in options else bytearray()

    def _data(self, data: bytes, start: int, end: int) -> None:
        if self._text is not None:
            self._text.extend(data[start:end])

    def _end(self) -> None:
        if self._text is None:
            return
        try:
            bytes(self._text).decode("utf-8")
        except UnicodeDecodeError:
            self.bad_field = self._name


class StrictFormText:
    """Refuses (422) a multipart form whose text fields are not UTF-8, before the route runs."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        boundary = _multipart_boundary(scope) if scope["type"] == "http" else None
        if boundary is None:
            await self.app(scope, receive, send)
            return
        watcher = _TextPartWatcher(boundary)

        async def checked_receive() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                watcher.feed(message.get("body", b""))
                if watcher.bad_field is not None:
                    raise InvalidFormText(watcher.bad_field)
            return message

        await self.app(scope, checked_receive, send)


def _multipart_boundary(scope: Scope) -> bytes | None:
    for name, value in scope.get("headers", []):
        if name == b"content-type":
            from python_multipart.multipart import parse_options_header

            kind, options = parse_options_header(value)
            if kind == b"multipart/form-data" and options.get(b"boundary"):
                return bytes(options[b"boundary"])
    return None


ERROR_SCHEMA: dict[str, Any] = {
    "title": "ErrorBody",
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string", "description": "Stable machine-readable reason."},
                "code": {"type": "integer", "description": "The HTTP status."},
                "request_id": {
                    "type": "string",
                    "description": "The request's id (its X-Request-ID header): its log lines carry it.",
                },
            },
        }
    },
}
_ERROR_DESCRIPTIONS = {
    400: "Malformed request body.",
    401: "Missing or unknown API key.",
    403: "The key lacks the scope, the source is not allowed, or a client off loopback without keys.",
    404: "The resource (or one the request names) does not exist.",
    409: "The request conflicts with the resource's state.",
    413: "The body or a part of it is over its limit.",
    415: "Unsupported content or image format.",
    422: "Invalid input.",
    429: "Too many requests for this key; see Retry-After.",
    503: "A dependency (the database, the broker, the model) is unavailable; retry.",
}
_WRITE_METHODS = {"post", "put", "patch", "delete"}


def _error_statuses(method: str, operation: dict[str, Any]) -> set[int]:
    """The errors the shared machinery can give an operation, whatever its route does."""
    statuses = {404, 503}
    params = operation.get("parameters", [])
    if params or "requestBody" in operation:
        statuses.add(422)
    if any(p.get("in") == "header" and p.get("name") == "authorization" for p in params):
        statuses |= {401, 403}
    if "requestBody" in operation or method in _WRITE_METHODS:
        # Routes that read their body themselves (several content types) declare none.
        statuses |= {400, 413, 415, 422}
    if method in _WRITE_METHODS:
        statuses |= {409, 429}
    return statuses


def _hoist_defs(node: Any, schemas: dict[str, Any]) -> Any:
    """Moves inline ``$defs`` (from a model's own JSON schema) into components, so refs resolve."""
    if isinstance(node, dict):
        for name, schema in node.pop("$defs", {}).items():
            schemas.setdefault(name, _hoist_defs(schema, schemas))
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            node["$ref"] = "#/components/schemas/" + ref[len("#/$defs/") :]
        for value in node.values():
            _hoist_defs(value, schemas)
    elif isinstance(node, list):
        for value in node:
            _hoist_defs(value, schemas)
    return node


def install_openapi(app: FastAPI, *, skip: frozenset[str] = frozenset({"/healthz"})) -> None:
    """Every operation declares the errors it can answer, all in the one envelope."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        from fastapi.openapi.utils import get_openapi

        spec = get_openapi(
            title=app.title, version=app.version, description=app.description, routes=app.routes
        )
        schemas = spec.setdefault("components", {}).setdefault("schemas", {})
        _hoist_defs(spec["paths"], schemas)
        schemas["ErrorBody"] = ERROR_SCHEMA
        for schema_name in ("HTTPValidationError", "ValidationError"):
            schemas.pop(schema_name, None)
        error_ref = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
        for path, operations in spec["paths"].items():
            for method, operation in operations.items():
                responses = operation.setdefault("responses", {})
                # Off loopback without keys every route answers 403 (LoopbackOnlyWithoutKeys).
                statuses = {403} if path in skip else _error_statuses(method, operation) | {403}
                statuses |= {int(code) for code in responses if code.isdigit() and int(code) >= 400}
                for status in sorted(statuses):
                    description = responses.get(str(status), {}).get("description")
                    responses[str(status)] = {
                        "description": description or _ERROR_DESCRIPTIONS.get(status, "Error."),
                        "content": error_ref,
                    }
        app.openapi_schema = spec
        return spec

    app.openapi = openapi  # type: ignore[method-assign]


class SecurityHeaders:
    """Standard headers on every answer, and a content security policy on the viewer's pages
    (``csp_paths`` prefixes; the API docs load Swagger UI from a CDN and keep FastAPI's page)."""

    def __init__(self, app: ASGIApp, *, csp: str, csp_paths: tuple[str, ...]) -> None:
        self.app, self.csp, self.csp_paths = app, csp.encode(), csp_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        viewer = path == "/" or path.startswith(self.csp_paths)

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {name.lower() for name, _ in headers}
                for name, value in (
                    (b"x-content-type-options", b"nosniff"),
                    (b"x-frame-options", b"DENY"),
                    (b"referrer-policy", b"no-referrer"),
                    *([(b"content-security-policy", self.csp)] if viewer else []),
                ):
                    if name not in present:
                        headers.append((name, value))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, with_headers)


_REQUEST_ID_HEADER = REQUEST_ID_HEADER.lower().encode()


class RequestIds:
    """Gives every request an id: the client's ``X-Request-ID`` when it is a safe one (bounded, a
    plain charset), else a new one. The id is in the log context for the whole request (every log
    line, the rows it creates, the tasks it queues), in the error envelope, and sent back in the
    response's ``X-Request-ID``. Installed last (:func:`install_request_ids`), so it is outermost
    and every answer, a guard's refusal included, carries it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self._with_id(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    async def _with_id(self, scope: Scope, receive: Receive, send: Send) -> None:
        given = next((v for k, v in scope.get("headers", []) if k == _REQUEST_ID_HEADER), b"")
        request_id = valid_request_id(given.decode("latin-1")) or new_request_id()
        header = (_REQUEST_ID_HEADER, request_id.encode())

        async def with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), header]}
            await send(message)

        token = bind(request_id=request_id)
        try:
            await self.app(scope, receive, with_id)
        finally:
            unbind(token)


def install_request_ids(app: FastAPI) -> None:
    """Call after every other middleware: the request id must wrap them all."""
    app.add_middleware(RequestIds)


# "testclient" is the peer Starlette's in-process test client reports; no socket peer can be named so.
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1", "localhost", "testclient"})
VIEWER_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data: blob:{extra}; connect-src 'self'; frame-ancestors 'none'; "
    "base-uri 'self'; form-action 'self'; object-src 'none'"
)


def install_guards(
    app: FastAPI, *, auth_required: bool, csp_paths: tuple[str, ...] = (), img_hosts: str = ""
) -> None:
    """Loopback-only without keys, and the security headers (a CSP on ``csp_paths``)."""
    app.add_middleware(LoopbackOnlyWithoutKeys, enforce=not auth_required)
    extra = f" {img_hosts}" if img_hosts else ""
    app.add_middleware(SecurityHeaders, csp=VIEWER_CSP.format(extra=extra), csp_paths=csp_paths)


class LoopbackOnlyWithoutKeys:
    """Without API keys the APIs answer loopback clients only, however they were started (the
    ``p2p serve`` command also refuses such a bind; ``uvicorn`` run by hand does not check)."""

    def __init__(self, app: ASGIApp, *, enforce: bool) -> None:
        self.app, self.enforce = app, enforce

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.enforce and scope["type"] == "http":
            client = scope.get("client")
            host = client[0] if client else ""
            if host not in LOOPBACK_HOSTS and not host.startswith("127."):
                response = error_response(
                    status_code=403,
                    message="this server runs without API keys and answers loopback clients only; "
                    "set P2P_AUTH__REQUIRED=true to serve other hosts",
                    error_type="keys_required_off_loopback",
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
