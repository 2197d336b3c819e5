"""Training runs as records: create (validated, then queued), read, list, cancel.

Everything that can be checked before a worker spends time is checked here: the config (strict,
unknown keys named), the export filters, and for a given snapshot that it exists and can fill one
batch of every level the config trains. What only the export can tell fails the run with its reason.
"""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from p2p.shared.db.base import utcnow
from p2p.shared.db.models import Figure, FigureStatus, TrainingRun, TrainingRunStatus
from p2p.shared.errors import InvalidInput, NotFound
from p2p.shared.queue import TRAIN_RUN_TASK, TRAINING_QUEUE, TaskDispatcher
from p2p.shared.storage import ObjectStore
from p2p.training.checkpoints import config_dict
from p2p.training.config import TrainConfig, TrainConfigError
from p2p.training.dataset import DatasetError, read_manifest
from p2p.training.export import ExportError, ExportFilters
from p2p.training.presets import resolve
from p2p.training.runner import check_data
from p2p.training.schemas import TrainingRunCreate

RUNS_PREFIX = "training-runs"


class RunConflict(InvalidInput):
    status_code = 409
    error_type = "conflict"


def run_prefix(run_id: uuid.UUID) -> str:
    return f"{RUNS_PREFIX}/{run_id}"


def _config(body: TrainingRunCreate) -> TrainConfig:
    try:
        return resolve(body.preset, body.config)
    except TrainConfigError as exc:
        raise InvalidInput(str(exc), error_type="invalid_config") from exc


def _check_export_filters(body: TrainingRunCreate) -> None:
    try:
        ExportFilters(
            license_groups=tuple(body.data.license_groups) if body.data.license_groups is not None else None,
            figure_types=tuple(body.data.figure_types) if body.data.figure_types is not None else None,
            min_panels=body.data.min_panels,
        )
    except ExportError as exc:
        raise InvalidInput(str(exc), error_type="invalid_data") from exc


def _check_snapshot(store: ObjectStore, prefix: str, config: TrainConfig) -> dict[str, Any]:
    try:
        manifest = read_manifest(store, prefix)
        check_data(manifest, "train", config)
    except DatasetError as exc:
        raise InvalidInput(str(exc), error_type="invalid_data") from exc
    return {"name": manifest.get("snapshot_name"), "counts": manifest.get("counts", {})}


def create_run(
    session: Session, dispatcher: TaskDispatcher, store: ObjectStore, *, body: TrainingRunCreate
) -> TrainingRun:
    """Validate ``body`` and queue the run; a bad config or data raises :class:`InvalidInput` (422)."""
    config = _config(body)
    snapshot: dict[str, Any] = {}
    if body.data.snapshot is not None:
        snapshot = _check_snapshot(store, body.data.snapshot.strip("/"), config)
    else:
        _check_export_filters(body)
        mined = session.scalar(
            select(func.count()).select_from(Figure).where(Figure.status == FigureStatus.MINED)
        )
        if not mined:
            raise InvalidInput(
                "nothing to train on: no mined figure in the database (ingest and mine figures first, "
                "or give data.snapshot)",
                error_type="invalid_data",
            )
    run_id = uuid.uuid4()
    run = TrainingRun(
        id=run_id,
        name=body.name,
        status=TrainingRunStatus.QUEUED,
        config=config_dict(config),
        data=body.data.model_dump(mode="json"),
        options={**body.options.model_dump(mode="json"), "preset": body.preset},
        snapshot_prefix=body.data.snapshot.strip("/") if body.data.snapshot else None,
        snapshot=snapshot,
        out_prefix=run_prefix(run_id),
        progress={},
        metrics={},
    )
    session.add(run)
    session.commit()
    if dispatcher.send(TRAIN_RUN_TASK, args=[str(run.id)], queue=TRAINING_QUEUE):
        run.enqueued_at = utcnow()  # a message the broker lost is sent again by the sweep
        session.commit()
    return run


def get_run(session: Session, run_id: uuid.UUID) -> TrainingRun:
    run = session.get(TrainingRun, run_id)
    if run is None:
        raise NotFound(f"no training run {run_id}")
    return run


def list_runs(
    session: Session, *, status: TrainingRunStatus | None = None, limit: int = 50, offset: int = 0
) -> list[TrainingRun]:
    stmt = select(TrainingRun).order_by(TrainingRun.created_at.desc(), TrainingRun.id)
    if status is not None:
        stmt = stmt.where(TrainingRun.status == status)
    return list(session.scalars(stmt.limit(limit).offset(offset)))


def cancel_run(session: Session, run_id: uuid.UUID) -> TrainingRun:
    """A queued run is cancelled at once; a running one stops after its current step (its worker
    sees the request, stops the trainer, which writes a checkpoint first)."""
    run = session.get(TrainingRun, run_id, with_for_update=True)
    if run is None:
        raise NotFound(f"no training run {run_id}")
    if run.status.finished:
        raise RunConflict(f"training run {run_id} has already {run.status.value}", error_type="run_finished")
    run.cancel_requested = True
    if run.status is TrainingRunStatus.QUEUED:
        run.status = TrainingRunStatus.CANCELLED
        run.finished_at = utcnow()
        run.error = "cancelled before it started"
    session.commit()
    return run
