"""``/v1/training-runs``: start (admin), watch and cancel (admin) hierarchical CLIP training runs.

Mounted by the embedding API beside ``/v1/models``: a completed run registers a model version there.
"""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Query, status

from p2p.shared.db.models import TrainingRunStatus
from p2p.shared.deps import AdminPrincipal, ReadPrincipal, RuntimeDep, SessionDep
from p2p.shared.schemas import MAX_OFFSET
from p2p.training import runs
from p2p.training.schemas import TrainingRunCreate, TrainingRunPublic

router = APIRouter(prefix="/v1/training-runs", tags=["training"])


@router.post("", status_code=status.HTTP_202_ACCEPTED, response_model=TrainingRunPublic)
def create_training_run(
    body: TrainingRunCreate, runtime: RuntimeDep, session: SessionDep, _: AdminPrincipal
) -> TrainingRunPublic:
    """Queue a run on the training queue. The config (preset + keys) and, for a given snapshot, the
    data are checked first: an unknown key, a bad value or data that cannot fill a batch is a 422."""
    run = runs.create_run(session, runtime.dispatcher, runtime.store, body=body)
    return TrainingRunPublic.model_validate(run)


@router.get("", response_model=list[TrainingRunPublic])
def list_training_runs(
    session: SessionDep,
    _: ReadPrincipal,
    status_filter: Annotated[TrainingRunStatus | None, Query(alias="status")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
) -> list[TrainingRunPublic]:
    found = runs.list_runs(session, status=status_filter, limit=limit, offset=offset)
    return [TrainingRunPublic.model_validate(r) for r in found]


@router.get("/{run_id}", response_model=TrainingRunPublic)
def get_training_run(run_id: uuid.UUID, session: SessionDep, _: ReadPrincipal) -> TrainingRunPublic:
    """Status, progress (step, epoch, per-level losses, samples/s, ETA), metrics and the model version."""
    return TrainingRunPublic.model_validate(runs.get_run(session, run_id))


@router.post("/{run_id}/cancel", status_code=status.HTTP_202_ACCEPTED, response_model=TrainingRunPublic)
def cancel_training_run(run_id: uuid.UUID, session: SessionDep, _: AdminPrincipal) -> TrainingRunPublic:
    """Cancel: a queued run at once, a running one after its current step (a checkpoint is kept)."""
    return TrainingRunPublic.model_validate(runs.cancel_run(session, run_id))
