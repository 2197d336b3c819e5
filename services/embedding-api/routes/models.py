from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Body, Response, status
from fastapi.concurrency import run_in_threadpool
from sqlalchemy import select
from sqlalchemy.orm import Session

from p2p.embedding_api.deps import (
    AdminPrincipal,
    ModelState,
    ModelStateDep,
    ReadPrincipal,
    RuntimeDep,
    SessionDep,
)
from p2p.embedding_api.indexing import register
from p2p.embedding_api.schemas import ActivateCreate, ModelCreate, ModelPublic
from p2p.models.modeling import ModelSpec, default_spec
from p2p.models.registry import activate
from p2p.shared.db.models import EmbeddingSpace, ModelVersion
from p2p.shared.errors import InvalidInput, NotFound

router = APIRouter(prefix="/v1/models", tags=["models"])


def to_public(version: ModelVersion, spaces: list[EmbeddingSpace], state: ModelState) -> ModelPublic:
    active_in = sorted(s.name for s in spaces if s.active_version_id == version.id)
    return ModelPublic(
        id=version.id,
        name=version.name,
        version=version.version,
        architecture=version.architecture,
        source=version.source,
        dim=version.dim,
        status=version.status,
        error=version.error,
        progress=version.progress or {},
        metrics=version.metrics or {},
        active_in=active_in,
        pending_in=sorted(s.name for s in spaces if s.pending_version_id == version.id),
        active=state.space in active_in,
        serving=state.version_id == version.id,
        created_at=version.created_at,
    )


def _spaces(session: Session) -> list[EmbeddingSpace]:
    return list(session.scalars(select(EmbeddingSpace)))


@router.get("", response_model=list[ModelPublic])
def list_models(session: SessionDep, state: ModelStateDep, _: ReadPrincipal) -> list[ModelPublic]:
    """Every registered version with its status, re-index progress and the spaces it serves."""
    spaces = _spaces(session)
    versions = session.scalars(select(ModelVersion).order_by(ModelVersion.created_at.desc(), ModelVersion.id))
    return [to_public(v, spaces, state) for v in versions]


@router.get("/{version_id}", response_model=ModelPublic)
def get_model(
    version_id: uuid.UUID, session: SessionDep, state: ModelStateDep, _: ReadPrincipal
) -> ModelPublic:
    version = session.get(ModelVersion, version_id)
    if version is None:
        raise NotFound(f"no model version {version_id}")
    return to_public(version, _spaces(session), state)


@router.post("", status_code=status.HTTP_201_CREATED, response_model=ModelPublic)
async def register_model(
    body: ModelCreate,
    response: Response,
    runtime: RuntimeDep,
    session: SessionDep,
    state: ModelStateDep,
    _: AdminPrincipal,
) -> ModelPublic:
    """Register a model version; its weights are loaded once, so a checkpoint that does not match its
    config (or a declared ``dim`` that differs) is refused now with the reason."""

    if body.name is None and body.architecture is None:
        base = default_spec()
        spec = ModelSpec(
            name=base.name, architecture=base.architecture, config=base.config, source=body.source
        )
    elif body.name is None or body.architecture is None:
        raise InvalidInput("name and architecture go together", error_type="invalid_request")
    else:
        spec = ModelSpec(
            name=body.name, architecture=body.architecture, config=body.config, source=body.source
        )
    version = await run_in_threadpool(
        lambda: register(session, spec, body.version, store=runtime.store, dim=body.dim)
    )
    response.headers["Location"] = f"/v1/models/{version.id}"
    return to_public(version, _spaces(session), state)


@router.post("/{version_id}/activate", status_code=status.HTTP_202_ACCEPTED, response_model=ModelPublic)
async def activate_model(
    version_id: uuid.UUID,
    runtime: RuntimeDep,
    session: SessionDep,
    state: ModelStateDep,
    _: AdminPrincipal,
    body: Annotated[ActivateCreate | None, Body()] = None,
) -> ModelPublic:
    """Start re-embedding the corpus with this version in the background (progress on the version);
    the space keeps serving its active version until the new one is complete."""

    space = (body.space if body is not None else None) or runtime.settings.embedding.space
    version = await run_in_threadpool(
        lambda: activate(session, runtime.dispatcher, version_id=version_id, space=space)
    )
    return to_public(version, _spaces(session), state)
