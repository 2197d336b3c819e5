"""FastAPI dependencies every service API shares: runtime, settings, session, API-key scopes.

The runtime lives on ``app.state`` (set by each app's lifespan), never in a module global.
Dependencies that only read attributes are ``async def``: FastAPI runs a plain ``def`` dependency
on its thread pool, a thread hop per dependency per request. The key check opens a database session
only when keys are required.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import Annotated

from fastapi import Depends, Header, Request
from fastapi.concurrency import run_in_threadpool
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from p2p.shared import ratelimit
from p2p.shared.auth import ANONYMOUS, Principal, Scope, authenticate, require
from p2p.shared.runtime import Runtime
from p2p.shared.settings import Settings

log = logging.getLogger(__name__)


async def get_runtime(request: Request) -> Runtime:
    runtime: Runtime = request.app.state.runtime
    return runtime


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]


async def get_app_settings(runtime: RuntimeDep) -> Settings:
    return runtime.settings


SettingsDep = Annotated[Settings, Depends(get_app_settings)]


def get_session(runtime: RuntimeDep) -> Iterator[Session]:
    session = runtime.session_factory()
    try:
        yield session
    finally:
        try:
            session.close()
        except DBAPIError as exc:
            # Closing runs after the answer is sent. A database that went away since the request
            # read from it leaves nothing to roll back: its connection is dropped from the pool,
            # and the next request meets the outage (and answers 503) instead of this one failing
            # half sent.
            if not exc.connection_invalidated:
                raise
            log.warning("database connection lost while closing a request's session: %s", exc.orig)


SessionDep = Annotated[Session, Depends(get_session)]


def _check_key(runtime: Runtime, authorization: str | None, scope: Scope) -> Principal:
    # The lookup is one SELECT and the occasional last_used_at one UPDATE: autocommit saves the
    # BEGIN and the ROLLBACK on return, two of the request's database round trips.
    with runtime.autocommit_session() as session:
        return require(authenticate(session, authorization), scope)


def _admit(runtime: Runtime, authorization: str | None, scope: Scope, client: str) -> Principal:
    """The key check, then the rate limit of a write (per key; without keys, per client address)."""
    principal = _check_key(runtime, authorization, scope) if runtime.settings.auth_required else ANONYMOUS
    if scope is not Scope.READ and runtime.rate_limiter is not None:
        key = f"key:{principal.key_id}" if principal.key_id else f"addr:{client}"
        ratelimit.check(runtime.rate_limiter, key)
    return principal


def scope_required(scope: Scope) -> Callable[..., Awaitable[Principal]]:
    # The runtime is read from the app, not declared as a dependency: every dependency FastAPI
    # resolves costs the event loop ~10 us per request (bench/README.md, embedding).
    async def dependency(
        request: Request, authorization: Annotated[str | None, Header()] = None
    ) -> Principal:
        runtime: Runtime = request.app.state.runtime
        if not runtime.settings.auth_required and (scope is Scope.READ or runtime.rate_limiter is None):
            return ANONYMOUS
        # Both checks on one thread-pool hop: each hop costs the event loop and a thread wake-up.
        client = request.client.host if request.client else "unknown"
        return await run_in_threadpool(_admit, runtime, authorization, scope, client)

    return dependency


IngestPrincipal = Annotated[Principal, Depends(scope_required(Scope.INGEST))]
ReadPrincipal = Annotated[Principal, Depends(scope_required(Scope.READ))]
AdminPrincipal = Annotated[Principal, Depends(scope_required(Scope.ADMIN))]
