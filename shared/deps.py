"""FastAPI dependencies every service API shares: runtime, settings, session, API-key scopes.

The runtime lives on ``app.state`` (set by each app's lifespan), never in a module global.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Annotated

from fastapi import Depends, Header, Request
from sqlalchemy.orm import Session

from p2p.shared.auth import ANONYMOUS, Principal, Scope, authenticate, require
from p2p.shared.runtime import Runtime
from p2p.shared.settings import Settings


def get_runtime(request: Request) -> Runtime:
    runtime: Runtime = request.app.state.runtime
    return runtime


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]


def get_app_settings(runtime: RuntimeDep) -> Settings:
    return runtime.settings


SettingsDep = Annotated[Settings, Depends(get_app_settings)]


def get_session(runtime: RuntimeDep) -> Iterator[Session]:
    with runtime.session() as session:
        yield session


SessionDep = Annotated[Session, Depends(get_session)]


def scope_required(scope: Scope) -> Callable[..., Principal]:
    def dependency(
        runtime: RuntimeDep, session: SessionDep, authorization: Annotated[str | None, Header()] = None
    ) -> Principal:
        if not runtime.settings.auth_required:
            return ANONYMOUS
        return require(authenticate(session, authorization), scope)

    return dependency


IngestPrincipal = Annotated[Principal, Depends(scope_required(Scope.INGEST))]
ReadPrincipal = Annotated[Principal, Depends(scope_required(Scope.READ))]
AdminPrincipal = Annotated[Principal, Depends(scope_required(Scope.ADMIN))]
