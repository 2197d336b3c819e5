"""The registry of model versions and embedding spaces, which training and the embedding API share.

A model version is a loadable ``ModelSpec`` recorded once its weights have loaded; activating it
for a space queues the re-embedding of the corpus on the embedding queue (the embedding API's
``indexing`` does that work and switches the space when it is complete).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from p2p.models.modeling import EmbeddingModel, ModelLoadError, ModelSpec, load_model
from p2p.shared.db.base import utcnow
from p2p.shared.db.models import EmbeddingSpace, ModelStatus, ModelVersion
from p2p.shared.errors import InvalidInput, NotFound, P2PError
from p2p.shared.queue import EMBEDDING_QUEUE, REINDEX_TASK, TaskDispatcher
from p2p.shared.storage import ObjectStore


class Conflict(P2PError):
    status_code = 409
    error_type = "conflict"


def spec_of(version: ModelVersion) -> ModelSpec:
    return ModelSpec(
        name=version.name,
        architecture=version.architecture,
        config=version.config or None,
        source=version.source,
    )


def register(
    session: Session,
    spec: ModelSpec,
    version: str,
    *,
    store: ObjectStore | None,
    dim: int | None = None,
    on_loaded: Callable[[uuid.UUID, EmbeddingModel], None] | None = None,
) -> ModelVersion:
    """Load the model once (so a checkpoint that does not fit its config is refused now, not at
    activation), then record it. ``dim``, when given, must be the model's. ``on_loaded`` receives
    the loaded model with the new row's id (the embedding API keeps it for the re-index)."""
    if not spec.name.strip() or not version.strip():
        raise InvalidInput("a model version needs a name and a version")
    existing = session.scalar(
        select(ModelVersion).where(ModelVersion.name == spec.name, ModelVersion.version == version)
    )
    if existing is not None:
        raise Conflict(
            f"model {spec.name} version {version} is already registered", error_type="model_exists"
        )
    try:
        model = load_model(spec, store=store)
    except ModelLoadError as exc:
        raise InvalidInput(f"model cannot be loaded: {exc}", error_type="model_load_failed") from exc
    if dim is not None and dim != model.dim:
        raise InvalidInput(
            f"declared dimension {dim} differs from the model's {model.dim}", error_type="dimension_mismatch"
        )
    row = ModelVersion(
        name=spec.name,
        version=version,
        architecture=spec.architecture,
        config=dict(spec.config or {}),
        source=spec.source,
        dim=model.dim,
        status=ModelStatus.REGISTERED,
        progress={},
        metrics={},
    )
    session.add(row)
    try:
        session.commit()
    except IntegrityError as exc:
        session.rollback()
        raise Conflict(f"model {spec.name} version {version} is already registered") from exc
    if on_loaded is not None:
        on_loaded(row.id, model)
    return row


def get_space(session: Session, name: str, *, create: bool = False) -> EmbeddingSpace | None:
    space = session.get(EmbeddingSpace, name)
    if space is None and create:
        space = EmbeddingSpace(name=name)
        session.add(space)
        session.flush()
    return space


def activate(
    session: Session, dispatcher: TaskDispatcher, *, version_id: uuid.UUID, space: str
) -> ModelVersion:
    """Start (re-)embedding the corpus with ``version_id`` for ``space``; the space keeps serving
    its active version until the new one is complete."""
    version = session.get(ModelVersion, version_id)
    if version is None:
        raise NotFound(f"no model version {version_id}")
    row = get_space(session, space, create=True)
    assert row is not None
    if row.active_version_id == version.id and version.status is ModelStatus.READY:
        return version
    if row.pending_version_id is not None and row.pending_version_id != version.id:
        pending = session.get(ModelVersion, row.pending_version_id)
        if pending is not None and pending.status is ModelStatus.INDEXING:
            raise Conflict(
                f"space {space} is already switching to {pending.name} {pending.version}; retry later",
                error_type="activation_in_progress",
            )
    row.pending_version_id = version.id
    version.status = ModelStatus.INDEXING
    version.error = None
    version.progress = {"state": "queued", "space": space, "queued_at": utcnow().isoformat()}
    session.commit()
    if dispatcher.send(REINDEX_TASK, args=[str(version.id), space], queue=EMBEDDING_QUEUE):
        version.enqueued_at = utcnow()  # a message the broker lost is sent again by the sweep
        session.commit()
    return version
