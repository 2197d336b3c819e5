"""Request and response shapes of training runs (API, CLI and the worker share them)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from p2p.shared.db.models import TrainingRunStatus
from p2p.shared.schemas import StrictModel as _Strict
from p2p.shared.storage import StorageError, validate_key


class RunData(_Strict):
    """What a run trains on: an existing export snapshot, or a fresh export with these filters."""

    snapshot: str | None = Field(
        default=None, description="Object-store prefix of an export (manifest.json)."
    )
    license_groups: list[str] | None = Field(default=None, description="e.g. ['commercial']; None: all.")
    figure_types: list[str] | None = Field(default=None, description="Panel types kept; None: all.")
    min_panels: int = Field(default=1, ge=1)
    mix_plain_pairs: float = Field(default=0.0, ge=0.0, lt=1.0, description="Share of plain figure pairs.")
    shard_size: int = Field(default=1000, ge=1, le=100_000)

    @field_validator("snapshot")
    @classmethod
    def _snapshot_key(cls, value: str | None) -> str | None:
        if value is None:
            return None
        prefix = value.strip("/")
        try:
            validate_key(f"{prefix}/manifest.json" if prefix else "")
        except StorageError as exc:
            raise ValueError(f"not an object-store prefix: {value!r}") from exc
        return value

    @model_validator(mode="after")
    def _snapshot_or_filters(self) -> RunData:
        filtered = self.license_groups is not None or self.figure_types is not None or self.min_panels != 1
        if self.snapshot is not None and (filtered or self.mix_plain_pairs):
            raise ValueError(
                "give either a snapshot or export filters, not both (a snapshot is already filtered)"
            )
        return self


class RunOptions(_Strict):
    checkpoint_every: int = Field(default=50, ge=1, description="Steps between checkpoints.")
    keep_checkpoints: int = Field(default=3, ge=1, le=100)
    progress_every: int = Field(default=5, ge=1, description="Steps between progress updates.")
    shuffle_buffer: int = Field(default=1000, ge=0)
    register_model: bool = Field(default=True, description="Register the trained model as a model version.")
    activate: bool = Field(default=False, description="Also activate it (re-embeds the corpus).")
    space: str | None = Field(default=None, description="Space to activate in; default: the configured one.")
    model_version: str | None = Field(default=None, max_length=64, description="Default: run-<id prefix>.")
    # val+test: both held-out splits, for corpora whose test split alone is too small to compare on
    eval_split: Literal["test", "val", "val+test"] = "test"
    eval_max_items: int | None = Field(default=2000, ge=1, description="Figures scored after training.")
    max_restarts: int = Field(default=2, ge=0, le=20, description="Resumes after the trainer is killed.")
    threads: int | None = Field(default=None, ge=1, le=256, description="Torch threads of the trainer.")


class TrainingRunCreate(_Strict):
    name: str | None = Field(default=None, max_length=128)
    preset: str | None = Field(default=None, description="Config preset (small, paper); default small.")
    config: dict[str, Any] = Field(default_factory=dict, description="TrainConfig keys over the preset.")
    data: RunData = RunData()
    options: RunOptions = RunOptions()


class TrainingRunPublic(BaseModel):
    id: uuid.UUID
    name: str | None
    status: TrainingRunStatus
    config: dict[str, Any]
    data: dict[str, Any]
    options: dict[str, Any]
    snapshot_prefix: str | None
    snapshot: dict[str, Any]
    out_prefix: str
    progress: dict[str, Any]
    metrics: dict[str, Any]
    checkpoint: str | None
    final_model: str | None
    model_version_id: uuid.UUID | None
    error: str | None
    cancel_requested: bool
    attempts: int
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    heartbeat_at: datetime | None

    model_config = ConfigDict(from_attributes=True)
