"""Errors that reach clients, and the one function that shapes them.

Every API error body is ``{"error": {"message": str, "type": str, "code": int, "request_id": str}}``:
``type`` is a stable machine-readable reason (``corrupt_image``, ``payload_too_large``...), ``code``
the HTTP status, ``request_id`` the id to find the request's log lines by (also in ``X-Request-ID``).
"""

from __future__ import annotations

from typing import Any

from p2p.shared.logs import current_request_id


def error_body(*, message: str, error_type: str, status_code: int) -> dict[str, Any]:
    error: dict[str, Any] = {"message": message, "type": error_type, "code": status_code}
    request_id = current_request_id()
    if request_id is not None:
        error["request_id"] = request_id
    return {"error": error}


class P2PError(Exception):
    status_code = 400
    error_type = "bad_request"

    def __init__(
        self,
        message: str,
        *,
        error_type: str | None = None,
        status_code: int | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.headers = headers
        if error_type is not None:
            self.error_type = error_type
        if status_code is not None:
            self.status_code = status_code

    def body(self) -> dict[str, Any]:
        return error_body(message=self.message, error_type=self.error_type, status_code=self.status_code)


class InvalidInput(P2PError):
    status_code = 422
    error_type = "invalid_request"


class PayloadTooLarge(P2PError):
    status_code = 413
    error_type = "payload_too_large"


class UnsupportedMediaType(P2PError):
    status_code = 415
    error_type = "unsupported_format"


class NotFound(P2PError):
    status_code = 404
    error_type = "not_found"


class Unauthorized(P2PError):
    status_code = 401
    error_type = "unauthorized"


class Forbidden(P2PError):
    status_code = 403
    error_type = "forbidden"


class ServiceUnavailable(P2PError):
    status_code = 503
    error_type = "service_unavailable"


def broker_unavailable(what: str, exc: BaseException, *, location: str | None = None) -> ServiceUnavailable:
    """``what`` is recorded but not queued: the same request again completes it."""
    return ServiceUnavailable(
        f"{what} could not be queued ({type(exc).__name__}: {exc}); send the same request again to run it",
        error_type="broker_unavailable",
        headers={"Retry-After": "10", **({"Location": location} if location else {})},
    )
