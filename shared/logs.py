"""Logging of every process (APIs, Celery workers, CLI): one line per event, JSON or plain text, with
the context the line was written in.

The context (request id, job kind and id, task name and id, queue, figure id) lives in one
:class:`~contextvars.ContextVar`, so it follows a request through the API's threads and coroutines,
and a task through its run. A request's id is taken from its ``X-Request-ID`` header (or made),
stored on the rows the request creates and sent in the headers of the tasks it queues, so that one
upload can be followed from ingest through mining to embedding by that id.

Nothing here holds a connection: a forked child (Celery prefork, DataLoader workers) inherits the
context of the thread that forked it, which is the job it works for.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import random
import re
import sys
import time
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import IO, TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from p2p.shared.settings import Settings

REQUEST_ID_HEADER = "X-Request-ID"
# The Celery message header carrying the request id to the tasks a request (or a task) queues.
TASK_HEADER = "p2p_request_id"
REQUEST_ID_MAX = 64  # the width of the request_id columns
_REQUEST_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@+=-]{0,63}")

LogFormat = Literal["json", "text"]

_EMPTY: Mapping[str, Any] = MappingProxyType({})
_context: contextvars.ContextVar[Mapping[str, Any]] = contextvars.ContextVar(
    "p2p_log_context", default=_EMPTY
)


def context() -> Mapping[str, Any]:
    """The fields every log line written here and now carries."""
    return _context.get()


def current_request_id() -> str | None:
    value = _context.get().get("request_id")
    return value if isinstance(value, str) else None


@contextlib.contextmanager
def bound(**fields: Any) -> Iterator[None]:
    """Add fields to the log context for the block (None values leave a field unchanged)."""
    token = bind(**fields)
    try:
        yield
    finally:
        _context.reset(token)


def bind(**fields: Any) -> contextvars.Token[Mapping[str, Any]]:
    """Add fields to the log context until :func:`unbind` of the returned token."""
    current = _context.get()
    return _context.set({**current, **{k: v for k, v in fields.items() if v is not None}})


def unbind(token: contextvars.Token[Mapping[str, Any]]) -> None:
    _context.reset(token)


def clear() -> None:
    _context.set(_EMPTY)


def valid_request_id(value: str | None) -> str | None:
    """``value`` when it is a usable request id (bounded, a safe charset), else None."""
    if value and len(value) <= REQUEST_ID_MAX and _REQUEST_ID.fullmatch(value):
        return value
    return None


def new_request_id() -> str:
    """32 random hex digits, like ``uuid4().hex``, from the ``random`` module's generator: an id to
    follow a request by, not a secret. ``uuid4`` reads ``os.urandom``, which lets go of the GIL, and
    on a busy API server (model and decode threads beside the event loop) the loop then waits up to
    a switch interval to get it back, once per request (bench/README.md, embedding). The module's
    generator is seeded from the OS at import and again in every forked child."""
    return f"{random.getrandbits(128):032x}"


# --- formatters -------------------------------------------------------------------------------

# Attributes every LogRecord has; anything else on a record came from ``extra=`` and is a field.
_RECORD_ATTRS = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message",
    "asctime",
}


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in record.__dict__.items() if k not in _RECORD_ATTRS and not k.startswith("_")}


def _access_fields(record: logging.LogRecord) -> dict[str, Any]:
    # uvicorn's access lines: (client, method, path, http version, status).
    args = record.args
    if record.name == "uvicorn.access" and isinstance(args, tuple) and len(args) == 5:
        return {"client": args[0], "method": args[1], "path": args[2], "status": args[4]}
    return {}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: timestamp, level, logger, message, then the context and extras."""

    def __init__(self, *, service: str | None = None) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "timestamp": _iso_utc(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if self.service:
            entry["service"] = self.service
        entry.update(_context.get())
        entry.update(_access_fields(record))
        entry.update(_extras(record))
        if record.exc_info:
            entry["exc_type"] = record.exc_info[0].__name__ if record.exc_info[0] else None
            entry["exc_info"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exc_info"] = record.exc_text
        return json.dumps(entry, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """The development format: the classic line, then the context as key=value."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = {**_context.get(), **_extras(record)}
        if not fields:
            return line
        suffix = " ".join(f"{k}={v}" for k, v in fields.items())
        head, sep, rest = line.partition("\n")  # a traceback stays below its line
        return f"{head} [{suffix}]{sep}{rest}"


def _iso_utc(created: float) -> str:
    seconds = int(created)
    return (
        time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{int((created - seconds) * 1000):03d}Z"
    )


# --- configuration ----------------------------------------------------------------------------

# uvicorn's own loggers hand their lines to the root handler (its access and error logs then share
# the format); run uvicorn with log_config=None so it does not install handlers of its own.
UVICORN_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access", "uvicorn.asgi")


class _P2PHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The handler this module installs (told apart from pytest's and others' on the root)."""


def resolve_format(settings: Settings | None) -> LogFormat:
    """The configured format; by default JSON in the production profile (containers), else text."""
    if settings is None:  # the configuration itself is broken: its error is told in plain text
        return "text"
    if settings.logging.format is not None:
        return settings.logging.format
    return "json" if settings.profile == "production" else "text"


def configure_logging(
    settings: Settings | None,
    *,
    service: str,
    level: str | int | None = None,
    stream: IO[str] | None = None,
    force: bool = False,
) -> logging.Handler | None:
    """Install the process's log handler on the root logger (again: replaces the previous one).

    Like ``logging.basicConfig`` it leaves alone a process whose root logger someone else set up
    (a test runner capturing logs) unless ``force``; returns None then."""
    root = logging.getLogger()
    if not force and any(not isinstance(h, _P2PHandler) for h in root.handlers):
        return None
    fmt = resolve_format(settings)
    handler = _P2PHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter(service=service) if fmt == "json" else TextFormatter())
    for old in [h for h in root.handlers if isinstance(h, _P2PHandler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level if level is not None else settings.log_level if settings is not None else "INFO")
    for name in UVICORN_LOGGERS:
        logger = logging.getLogger(name)
        # whatever an earlier uvicorn.Config or dictConfig left (its own handler, a level such as
        # log_level="critical", disabled) goes: the root's handler and level decide
        logger.handlers.clear()
        logger.setLevel(logging.NOTSET)
        logger.disabled = False
        logger.propagate = True
    return handler
