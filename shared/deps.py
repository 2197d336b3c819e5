"""FastAPI dependencies every service API shares: runtime, settings, session, API-key scopes.

The runtime lives on ``app.state`` (set by each app's lifespan), never in a module global.
Dependencies that only read attributes are ``async def``: FastAPI runs a plain ``def`` dependency
on its thread pool, a thread hop per dependency per request. The key check opens a database session
only when keys are required.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from typing import Annotated

from fastapi import Depends, Header, Request
from fastapi.concurrency import run_in_threadpool
from sqlalchemy.orm import Session

from p2p.shared import ratelimit
from p2p.shared.auth import ANONYMOUS, Principal, Scope, authenticate, require
from p2p.shared.runtime import Runtime
from p2p.shared.settings import Settings


async def get_runtime(request: Request) -> Runtime:
    runtime: Runtime = request.app.state.runtime
    return runtime


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]


async def get_app_settings(runtime: RuntimeDep) -> Settings:
    return runtime.settings


SettingsDep = Annotated[Settings, Depends(get_app_settings)]


def get_session(runtime: RuntimeDep) -> Iterator[Session]:
    with runtime.session() as session:
        yield session


SessionDep = Annotated[Session, Depends(get_session)]


def _check_key(runtime: Runtime, authorization: str | None, scope: Scope) -> Principal:
    with runtime.session() as session:
        return require(authenticate(session, authorization), scope)


def scope_required(scope: Scope) -> Callable[..., Awaitable[Principal]]:
    async def dependency(
        request: Request, runtime: RuntimeDep, authorization: Annotated[str | None, Header()] = None
    ) -> Principal:
        if not runtime.settings.auth_required:
            principal = ANONYMOUS
        else:
            principal = await run_in_threadpool(_check_key, runtime, authorization, scope)
        if scope is not Scope.READ and runtime.rate_limiter is not None:
            # Writes are limited per key; without keys, per client address.
            client = request.client.host if request.client else "unknown"
            key = f"key:{principal.key_id}" if principal.key_id else f"addr:{client}"
            await run_in_threadpool(ratelimit.check, runtime.rate_limiter, key)
        return principal

    return dependency


IngestPrincipal = Annotated[Principal, Depends(scope_required(Scope.INGEST))]
ReadPrincipal = Annotated[Principal, Depends(scope_required(Scope.READ))]
AdminPrincipal = Annotated[Principal, Depends(scope_required(Scope.ADMIN))]
