"""The figure -> panel -> region hierarchy, its articles, mining jobs, batches and API keys.

Every entity has a UUID primary key. Vectors (added by the embedding service) live in their own
table keyed by (model version, level, entity id), so one panel or region can carry embeddings of
several model versions side by side.
"""

from __future__ import annotations

import enum
import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    DateTime,
    Enum,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.orm import Mapped, mapped_column, relationship

from p2p.shared.db.base import Base, TimestampMixin, new_id
from p2p.shared.logs import current_request_id


def _enum(cls: type[enum.Enum], name: str) -> Enum:
    return Enum(
        cls,
        name=name,
        native_enum=False,
        create_constraint=True,
        length=32,
        values_callable=lambda members: [m.value for m in members],
        validate_strings=True,
    )


class LicenseGroup(enum.StrEnum):
    COMMERCIAL = "commercial"
    NONCOMMERCIAL = "noncommercial"
    OTHER = "other"


class FigureStatus(enum.StrEnum):
    QUEUED = "queued"
    MINING = "mining"
    MINED = "mined"
    FAILED = "failed"


class JobStatus(enum.StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class BatchStatus(enum.StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    COMPLETED_WITH_ERRORS = "completed_with_errors"
    FAILED = "failed"


class BatchKind(enum.StrEnum):
    MANIFEST = "manifest"
    WEBDATASET = "webdataset"
    PMC = "pmc"


class BatchItemStatus(enum.StrEnum):
    INGESTED = "ingested"
    DUPLICATE = "duplicate"
    FAILED = "failed"


class RegionKind(enum.StrEnum):
    MARKER = "marker"
    CAPTION = "caption"
    INFERRED = "inferred"


class LeaseMixin:
    """The durable-job lease (``p2p.shared.jobs``): who runs the job and until when that claim
    holds without a heartbeat. A running job whose lease ran out has no live owner."""

    enqueued_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))  # last sent to a queue
    lease_owner: Mapped[str | None] = mapped_column(String(128))
    lease_expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    heartbeat_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # The request (or CLI call) that created the job, from the log context: its logs carry it too.
    request_id: Mapped[str | None] = mapped_column(String(64), default=current_request_id)


class Article(TimestampMixin, Base):
    __tablename__ = "article"

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=new_id)
    pmcid: Mapped[str | None] = mapped_column(String(32), unique=True)
    pmid: Mapped[str | None] = mapped_column(String(32), unique=True)
    doi: Mapped[str | None] = mapped_column(String(256), unique=True)
    title: Mapped[str | None] = mapped_column(Text)
    abstract: Mapped[str | None] = mapped_column(Text)
    journal: Mapped[str | None] = mapped_column(String(512))
    year: Mapped[int | None] = mapped_column(Integer)
    license: Mapped[str | None] = mapped_column(String(256))
    license_group: Mapped[LicenseGroup] = mapped_column(
        _enum(LicenseGroup, "license_group"), default=LicenseGroup.OTHER, nullable=False
    )

    figures: Mapped[list[Figure]] = relationship(back_populates="article")


class Figure(TimestampMixin, Base):
    __tablename__ = "figure"
    __table_args__ = (
        # The same image under the same caption is one figure; under another caption it is another.
        UniqueConstraint("image_sha256", "caption_sha256", name="uq_figure_image_caption"),
        CheckConstraint("width > 0 AND height > 0", name="positive_size"),
    )

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=new_id)
    image_sha256: Mapped[str] = mapped_column(String(64), nullable=False, index=True)
    caption_sha256: Mapped[str] = mapped_column(String(64), nullable=False)
    object_key: Mapped[str] = mapped_column(String(512), nullable=False)
    byte_size: Mapped[int] = mapped_column(BigInteger, nullable=False)
    width: Mapped[int] = mapped_column(Integer, nullable=False)
    height: Mapped[int] = mapped_column(Integer, nullable=False)
    format: Mapped[str] = mapped_column(String(16), nullable=False)
    caption: Mapped[str] = mapped_column(Text, nullable=False, default="")
    figure_label: Mapped[str | None] = mapped_column(String(128))
    inline_references: Mapped[list[str]] = mapped_column(JSONB, nullable=False, default=list)
    article_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("article.id", ondelete="SET NULL"), index=True
    )
    source: Mapped[str] = mapped_column(String(32), nullable=False)
    source_ref: Mapped[str | None] = mapped_column(Text)
    status: Mapped[FigureStatus] = mapped_column(
        _enum(FigureStatus, "figure_status"), default=FigureStatus.QUEUED, nullable=False, index=True
    )
    request_id: Mapped[str | None] = mapped_column(String(64), default=current_request_id)  # who stored it

    @property
    def mining_error(self) -> str | None:
        """Why the figure failed (an image that does not decode...), from its failed mining job."""
        if self.status is not FigureStatus.FAILED:
            return None  # no job is loaded for the figures that did not fail
        reasons = [job.error for job in self.jobs if job.status is JobStatus.FAILED and job.error]
        return reasons[-1] if reasons else None

    article: Mapped[Article | None] = relationship(back_populates="figures")
    panels: Mapped[list[Panel]] = relationship(
        back_populates="figure", cascade="all, delete-orphan", order_by="Panel.ordinal"
    )
    jobs: Mapped[list[MiningJob]] = relationship(back_populates="figure", cascade="all, delete-orphan")

    @property
    def miner_version(self) -> str | None:
        """The version of the miner whose panels the figure shows; None until it is mined."""
        current = [j for j in self.jobs if j.status is JobStatus.SUCCEEDED and j.superseded_by_id is None]
        latest = max(current, key=lambda j: (j.finished_at is not None, j.finished_at), default=None)
        return latest.miner_version if latest is not None else None


class MiningJob(LeaseMixin, TimestampMixin, Base):
    __tablename__ = "mining_job"
    __table_args__ = (
        # One job per figure, backend and miner version (NULL, a job no miner took yet, counts as
        # one value): a re-run replaces its rows, never duplicates them; a newer miner gets a new job.
        UniqueConstraint(
            "figure_id",
            "backend",
            "miner_version",
            name="uq_mining_job_figure_backend_version",
            postgresql_nulls_not_distinct=True,
        ),
        CheckConstraint("attempts >= 0", name="attempts_nonnegative"),
        Index("ix_mining_job_status_lease", "status", "lease_expires_at"),
    )

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=new_id)
    figure_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("figure.id", ondelete="CASCADE"), nullable=False)
    backend: Mapped[str] = mapped_column(String(32), nullable=False)
    # The version of the miner that produced the job's rows (``Miner.version``); a re-mine asks for one.
    miner_version: Mapped[str | None] = mapped_column(String(128))
    # Set when a newer miner's job replaced this one's panels and regions (the row stays: costs, history).
    superseded_by_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("mining_job.id", ondelete="SET NULL")
    )
    prompt_version: Mapped[str | None] = mapped_column(String(64))
    params: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False, default=dict)
    status: Mapped[JobStatus] = mapped_column(
        _enum(JobStatus, "job_status"), default=JobStatus.QUEUED, nullable=False, index=True
    )
    attempts: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    stage_timings: Mapped[dict[str, float]] = mapped_column(JSONB, nullable=False, default=dict)
    cost: Mapped[dict[str, float]] = mapped_column(JSONB, nullable=False, default=dict)
    error: Mapped[str | None] = mapped_column(Text)
    # What the miner could not do for this figure, in words ("no labels read: reading order used").
    notes: Mapped[list[str]] = mapped_column(JSONB, nullable=False, default=list, server_default="[]")
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))

    figure: Mapped[Figure] = relationship(back_populates="jobs")


class Panel(TimestampMixin, Base):
    __tablename__ = "panel"
    __table_args__ = (CheckConstraint("cardinality(box) = 4", name="box_has_four_numbers"),)

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=new_id)
    figure_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("figure.id", ondelete="CASCADE"), nullable=False, index=True
    )
    mining_job_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("mining_job.id", ondelete="CASCADE"), nullable=False, index=True
    )
    ordinal: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    label: Mapped[str | None] = mapped_column(String(16))
    box: Mapped[list[float]] = mapped_column(ARRAY(Float), nullable=False)
    crop_key: Mapped[str | None] = mapped_column(String(512))
    subcaption: Mapped[str | None] = mapped_column(Text)
    description: Mapped[str | None] = mapped_column(Text)
    figure_type: Mapped[str | None] = mapped_column(String(64))
    modality: Mapped[str | None] = mapped_column(String(64))
    confidence: Mapped[float | None] = mapped_column(Float)
    provenance: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False)

    figure: Mapped[Figure] = relationship(back_populates="panels")
    regions: Mapped[list[Region]] = relationship(
        back_populates="panel", cascade="all, delete-orphan", order_by="Region.ordinal"
    )


class Region(TimestampMixin, Base):
    __tablename__ = "region"
    __table_args__ = (
        CheckConstraint("cardinality(box_in_panel) = 4", name="panel_box_has_four_numbers"),
        CheckConstraint("cardinality(box_in_figure) = 4", name="figure_box_has_four_numbers"),
    )

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=new_id)
    panel_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("panel.id", ondelete="CASCADE"), nullable=False, index=True
    )
    ordinal: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    box_in_panel: Mapped[list[float]] = mapped_column(ARRAY(Float), nullable=False)
    box_in_figure: Mapped[list[float]] = mapped_column(ARRAY(Float), nullable=False)
    kind: Mapped[RegionKind] = mapped_column(_enum(RegionKind, "region_kind"), nullable=False)
    marker_type: Mapped[str | None] = mapped_column(String(32))
    crop_key: Mapped[str | None] = mapped_column(String(512))
    caption_text: Mapped[str | None] = mapped_column(Text)
    description: Mapped[str | None] = mapped_column(Text)
    confidence: Mapped[float | None] = mapped_column(Float)
    provenance: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False)

    panel: Mapped[Panel] = relationship(back_populates="regions")


class Batch(LeaseMixin, TimestampMixin, Base):
    __tablename__ = "batch"
    __table_args__ = (Index("ix_batch_status", "status"),)

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=new_id)
    kind: Mapped[BatchKind] = mapped_column(_enum(BatchKind, "batch_kind"), nullable=False)
    source: Mapped[str] = mapped_column(Text, nullable=False)
    status: Mapped[BatchStatus] = mapped_column(
        _enum(BatchStatus, "batch_status"), default=BatchStatus.QUEUED, nullable=False
    )
    total: Mapped[int | None] = mapped_column(Integer)
    ingested: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    duplicates: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    failed: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    error: Mapped[str | None] = mapped_column(Text)
    attempts: Mapped[int] = mapped_column(Integer, nullable=False, default=0, server_default="0")
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))

    items: Mapped[list[BatchItem]] = relationship(back_populates="batch", cascade="all, delete-orphan")


class BatchItem(TimestampMixin, Base):
    __tablename__ = "batch_item"
    __table_args__ = (
        # A re-delivered batch task skips the items it already recorded.
        UniqueConstraint("batch_id", "item_key", name="uq_batch_item_key"),
        Index("ix_batch_item_batch_status", "batch_id", "status"),
    )

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=new_id)
    batch_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("batch.id", ondelete="CASCADE"), nullable=False)
    item_key: Mapped[str] = mapped_column(Text, nullable=False)
    status: Mapped[BatchItemStatus] = mapped_column(
        _enum(BatchItemStatus, "batch_item_status"), nullable=False
    )
    figure_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("figure.id", ondelete="SET NULL"))
    error_type: Mapped[str | None] = mapped_column(String(64))
    error_message: Mapped[str | None] = mapped_column(Text)

    batch: Mapped[Batch] = relationship(back_populates="items")


class ApiKey(TimestampMixin, Base):
    __tablename__ = "api_key"

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=new_id)
    name: Mapped[str] = mapped_column(String(128), nullable=False)
    prefix: Mapped[str] = mapped_column(String(16), nullable=False, unique=True)
    secret_hash: Mapped[str] = mapped_column(String(128), nullable=False)
    scopes: Mapped[list[str]] = mapped_column(ARRAY(String(16)), nullable=False)
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    last_used_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class ModelStatus(enum.StrEnum):
    REGISTERED = "registered"  # known, no vectors yet
    INDEXING = "indexing"  # (re)embedding every figure, panel and region
    READY = "ready"  # every item embedded: can serve a space
    FAILED = "failed"  # loading or indexing failed; ``error`` says why


class ModelVersion(LeaseMixin, TimestampMixin, Base):
    """An embedding model: open_clip architecture (by name or config) plus its weights."""

    __tablename__ = "model_version"
    __table_args__ = (
        UniqueConstraint("name", "version", name="uq_model_version_name_version"),
        CheckConstraint("dim > 0", name="dim_positive"),
    )

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=new_id)
    name: Mapped[str] = mapped_column(String(128), nullable=False)
    version: Mapped[str] = mapped_column(String(64), nullable=False)
    architecture: Mapped[str] = mapped_column(String(128), nullable=False)  # open_clip name or "custom"
    config: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False, default=dict)  # custom config
    # Where the weights come from: "random", "local:/path/ckpt.pt", "s3:key", "pretrained:tag",
    # "hf-hub:org/name".
    source: Mapped[str] = mapped_column(String(1024), nullable=False)
    dim: Mapped[int] = mapped_column(Integer, nullable=False)
    status: Mapped[ModelStatus] = mapped_column(
        _enum(ModelStatus, "model_status"), default=ModelStatus.REGISTERED, nullable=False
    )
    error: Mapped[str | None] = mapped_column(Text)
    # Re-index progress: {"total": n, "done": m, "by_level": {...}, "started_at": ..., "finished_at": ...}
    progress: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False, default=dict)
    metrics: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False, default=dict)  # evaluation
    training_run_id: Mapped[uuid.UUID | None] = mapped_column()
    attempts: Mapped[int] = mapped_column(Integer, nullable=False, default=0, server_default="0")


class EmbeddingSpace(TimestampMixin, Base):
    """A named space that serves search from one model version at a time; a newly activated
    version indexes in the background while the active one keeps answering."""

    __tablename__ = "embedding_space"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    active_version_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("model_version.id", ondelete="SET NULL")
    )
    pending_version_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("model_version.id", ondelete="SET NULL")
    )


class TrainingRunStatus(enum.StrEnum):
    QUEUED = "queued"  # waiting for a training worker (also after an interruption: it resumes)
    EXPORTING = "exporting"  # writing the data snapshot the run trains on
    TRAINING = "training"  # the trainer subprocess is running
    EVALUATING = "evaluating"  # scoring the trained model against the untrained one
    COMPLETED = "completed"  # trained, evaluated and registered as a model version
    FAILED = "failed"  # ``error`` says why; the last good checkpoint is kept
    CANCELLED = "cancelled"  # stopped on request; its checkpoint is kept

    @property
    def finished(self) -> bool:
        return self in (TrainingRunStatus.COMPLETED, TrainingRunStatus.FAILED, TrainingRunStatus.CANCELLED)


class TrainingRun(LeaseMixin, TimestampMixin, Base):
    """One hierarchical CLIP training run: its config, data snapshot, progress, checkpoints and result."""

    __tablename__ = "training_run"
    __table_args__ = (Index("ix_training_run_status_created", "status", "created_at"),)

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=new_id)
    name: Mapped[str | None] = mapped_column(String(128))
    status: Mapped[TrainingRunStatus] = mapped_column(
        _enum(TrainingRunStatus, "training_run_status"), default=TrainingRunStatus.QUEUED, nullable=False
    )
    config: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False)  # the validated TrainConfig
    # What to train on: {"snapshot": prefix} or export options {"filters": {...}, "mix_plain_pairs": x}.
    data: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False, default=dict)
    # Runner and registration options: checkpoint_every, progress_every, register, activate, ...
    options: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False, default=dict)
    snapshot_prefix: Mapped[str | None] = mapped_column(String(1024))
    snapshot: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False, default=dict)  # name, counts
    out_prefix: Mapped[str] = mapped_column(String(1024), nullable=False)
    # {"step", "epoch", "total_steps", "losses", "samples_per_s", "eta_s", "updated_at", ...}
    progress: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False, default=dict)
    metrics: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False, default=dict)  # evaluation
    checkpoint: Mapped[str | None] = mapped_column(String(1024))  # latest committed checkpoint key
    final_model: Mapped[str | None] = mapped_column(String(1024))
    model_version_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("model_version.id", ondelete="SET NULL")
    )
    error: Mapped[str | None] = mapped_column(Text)
    cancel_requested: Mapped[bool] = mapped_column(default=False, nullable=False)
    attempts: Mapped[int] = mapped_column(Integer, default=0, nullable=False)
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
