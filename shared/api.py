"""What every FastAPI service of the project shares: the error envelope, and the edge middleware
(request ids, guards, body size cap, strict form text, catch-all, request metrics)."""

from __future__ import annotations

import logging
import time
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any, Protocol

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from python_multipart.multipart import parse_options_header
from sqlalchemy import exc as sa_exc
from starlette.datastructures import FormData
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.formparsers import MultiPartException, MultiPartParser
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

    edge_options(app)  # the edge middleware: request ids, guards, limits, errors, strict form text
    install_openapi(app)


class BodyTooLarge(StarletteHTTPException):
    # A Starlette HTTPException passes through FastAPI's body parsing unchanged, so the client
    # gets this 413 instead of a generic "error parsing the body".
    error_type = "payload_too_large"

    def __init__(self, limit: int) -> None:
        super().__init__(status_code=413, detail=f"request body is larger than the {limit}-byte limit")


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


class _StrictMultiPartParser(MultiPartParser):
    """Starlette's multipart parser, refusing (422) a text part that is not UTF-8 where Starlette
    would decode it as Latin-1: the check the edge's watcher makes, in the one parse."""

    def on_part_end(self) -> None:
        part = self._current_part
        if part.file is None:
            try:
                bytes(part.data).decode("utf-8")
            except UnicodeDecodeError:
                raise InvalidFormText(part.field_name) from None
        super().on_part_end()


async def read_form(request: Request) -> FormData:
    """The request's form, as ``request.form()`` reads it (same limits, a broken body 400), with
    text parts that must be UTF-8 (422). A multipart body is parsed once: the edge's watcher,
    which would follow the same bytes for the same check, stands down for this request."""
    content_type, _ = parse_options_header(request.headers.get("content-type", ""))
    if content_type != b"multipart/form-data":
        return await request.form()
    exchange = request.scope.get(_EXCHANGE_KEY)
    if isinstance(exchange, _Exchange):
        exchange.watcher = None
    try:
        async with aclosing(request.stream()) as stream:
            return await _StrictMultiPartParser(request.headers, stream).parse()
    except MultiPartException as exc:
        raise StarletteHTTPException(status_code=400, detail=exc.message) from exc


def _multipart_boundary(content_type: bytes) -> bytes | None:
    if content_type[:19].lower() != b"multipart/form-data":
        return None
    kind, options = parse_options_header(content_type)
    if kind == b"multipart/form-data" and options.get(b"boundary"):
        return bytes(options[b"boundary"])
    return None


class RequestRecorder(Protocol):
    """What the edge tells the request metrics (``p2p.shared.metrics.http.RequestMetrics``)."""

    def started(self) -> None: ...

    def finished(self, scope: Scope, status: int, received: int, seconds: float) -> None: ...


@dataclass
class EdgeOptions:
    """What :class:`ApiEdge` does for one app. Each ``install_*`` call fills its part before the app
    serves its first request (the middleware reads them when Starlette builds its stack)."""

    loopback_only: bool = False
    csp: bytes = b""
    csp_paths: tuple[str, ...] = ()
    max_body_bytes: int | None = None
    per_path: dict[str, int] = field(default_factory=dict)
    metrics: RequestRecorder | None = None


def edge_options(app: FastAPI) -> EdgeOptions:
    """The app's :class:`EdgeOptions`; the first call installs :class:`ApiEdge`."""
    options = getattr(app.state, "edge_options", None)
    if options is None:
        options = app.state.edge_options = EdgeOptions()
        app.add_middleware(ApiEdge, options=options)
    assert isinstance(options, EdgeOptions)
    return options


def limit_body_size(app: FastAPI, *, max_body_bytes: int, per_path: dict[str, int] | None = None) -> None:
    """Refuse bodies over ``max_body_bytes`` (``per_path``: other limits for some paths) with 413."""
    options = edge_options(app)
    options.max_body_bytes, options.per_path = max_body_bytes, dict(per_path or {})


_REQUEST_ID_HEADER = REQUEST_ID_HEADER.lower().encode()
_EXCHANGE_KEY = "p2p.edge"  # the request's _Exchange, on its ASGI scope (read_form finds it there)
_SECURITY_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
)


class _Exchange:
    """One request as :class:`ApiEdge` sees it: its headers read once, and the ``receive`` and
    ``send`` the app gets (bound methods: no closures built per request)."""

    __slots__ = (
        "_receive", "_send", "added", "declared", "id_header", "limit", "received", "request_id",
        "started", "status", "watcher",
    )  # fmt: skip

    def __init__(self, scope: Scope, receive: Receive, send: Send, options: EdgeOptions) -> None:
        self._receive, self._send = receive, send
        given = declared = content_type = b""
        for name, value in scope["headers"]:
            if name == _REQUEST_ID_HEADER:
                given = value
            elif name == b"content-length":
                declared = value
            elif name == b"content-type":
                content_type = value
        self.request_id = valid_request_id(given.decode("latin-1")) or new_request_id()
        self.id_header = (_REQUEST_ID_HEADER, self.request_id.encode())
        self.declared = declared
        path: str = scope.get("path", "")
        self.added = _SECURITY_HEADERS
        if options.csp_paths and (path == "/" or path.startswith(options.csp_paths)):
            self.added = (*self.added, (b"content-security-policy", options.csp))
        self.limit = options.per_path.get(path, options.max_body_bytes) if options.max_body_bytes else None
        boundary = _multipart_boundary(content_type) if content_type else None
        self.watcher = _TextPartWatcher(boundary) if boundary is not None else None
        self.status, self.received, self.started = 500, 0, False  # an escaped error ends as a 500

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status, self.started = int(message["status"]), True
            headers = list(message.get("headers", []))
            present = {name.lower() for name, _ in headers}
            headers.extend(header for header in self.added if header[0] not in present)
            headers.append(self.id_header)
            message = {**message, "headers": headers}
        await self._send(message)

    async def receive(self) -> Message:
        message = await self._receive()
        if message["type"] == "http.request":
            body = message.get("body", b"")
            self.received += len(body)
            if self.limit is not None and self.received > self.limit:
                raise BodyTooLarge(self.limit)
            watcher = self.watcher
            if watcher is not None:
                watcher.feed(body)
                if watcher.bad_field is not None:
                    raise InvalidFormText(watcher.bad_field)
        return message


class ApiEdge:
    """Everything the APIs do around a route, in one ASGI layer (seven middlewares once, each with
    its own wrapped ``send`` or ``receive`` and a pass over the headers; bench/README.md, ingest).

    In the order a request meets them:

    * metrics (when ``options.metrics`` is set): counted, timed and sized by route template;
    * a request id: the client's ``X-Request-ID`` when it is a safe one (bounded, a plain
      charset), else a new one; in the log context for the whole request (every log line, the
      rows it creates, the tasks it queues), in the error envelope, and sent back in the
      response's ``X-Request-ID``, on every answer, a refusal here included;
    * the body size limit: by Content-Length up front (413), else by counting as the body streams
      in (``BodyTooLarge`` raised into the reader, answered 413 by the error handlers);
    * security headers on every answer, and a content security policy on the viewer's pages
      (``csp_paths`` prefixes and ``/``; the API docs load Swagger UI from a CDN);
    * without API keys (``loopback_only``), loopback clients only (403 for others), however the
      server was started (``p2p serve`` also refuses such a bind; ``uvicorn`` by hand does not);
    * strict form text: a multipart form whose text fields are not UTF-8 is refused (422) before
      the route sees it;
    * the catch-all: an unexpected error is answered with the 500 envelope and the connection
      kept open (Starlette's own last-resort handler re-raises after answering, and the server
      then drops the connection, failing the client's next, unrelated request on it).
    """

    def __init__(self, app: ASGIApp, *, options: EdgeOptions) -> None:
        self.app, self.options = app, options

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        began = time.perf_counter()
        exchange = scope[_EXCHANGE_KEY] = _Exchange(scope, receive, send, self.options)
        token = bind(request_id=exchange.request_id)
        metrics = self.options.metrics
        if metrics is not None:
            metrics.started()
        try:
            refusal = self._refusal(scope, exchange.limit, exchange.declared)
            if refusal is not None:
                await refusal(scope, receive, exchange.send)
                return
            try:
                await self.app(scope, exchange.receive, exchange.send)
            except Exception:
                log.exception("unhandled error on %s %s", scope.get("method"), scope.get("path"))
                if exchange.started:
                    raise  # half a response is out: only closing the connection tells the client
                response = error_response(
                    status_code=500, message="internal server error", error_type="internal_error"
                )
                await response(scope, receive, exchange.send)
        finally:
            unbind(token)
            if metrics is not None:
                metrics.finished(scope, exchange.status, exchange.received, time.perf_counter() - began)

    def _refusal(self, scope: Scope, limit: int | None, declared: bytes) -> JSONResponse | None:
        """The answer to a request refused before its route runs, or None."""
        if limit is not None and declared:
            try:
                size = int(declared)
            except ValueError:
                size = 0
            if size > limit:
                return error_response(
                    status_code=413, message=BodyTooLarge(limit).detail, error_type="payload_too_large"
                )
        if self.options.loopback_only:
            client = scope.get("client")
            host = client[0] if client else ""
            if host not in LOOPBACK_HOSTS and not host.startswith("127."):
                return error_response(
                    status_code=403,
                    message="this server runs without API keys and answers loopback clients only; "
                    "set P2P_AUTH__REQUIRED=true to serve other hosts",
                    error_type="keys_required_off_loopback",
                )
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
    options = edge_options(app)
    options.loopback_only = not auth_required
    extra = f" {img_hosts}" if img_hosts else ""
    options.csp, options.csp_paths = VIEWER_CSP.format(extra=extra).encode(), csp_paths
