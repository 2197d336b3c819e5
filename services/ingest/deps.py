"""Dependencies of the ingest API: the ones every service API shares (``p2p.shared.deps``)."""

from __future__ import annotations

from p2p.shared.deps import (
    AdminPrincipal,
    IngestPrincipal,
    ReadPrincipal,
    RuntimeDep,
    SessionDep,
    SettingsDep,
    get_runtime,
    get_session,
    scope_required,
)

__all__ = [
    "AdminPrincipal",
    "IngestPrincipal",
    "ReadPrincipal",
    "RuntimeDep",
    "SessionDep",
    "SettingsDep",
    "get_runtime",
    "get_session",
    "scope_required",
]
