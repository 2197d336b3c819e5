"""Pydantic schemas shared by services: what clients send and what the API returns."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any
from urllib.parse import quote

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, computed_field, model_validator

from p2p.shared.db.models import (
    BatchItemStatus,
    BatchKind,
    BatchStatus,
    FigureStatus,
    JobStatus,
    LicenseGroup,
    RegionKind,
)

ShortText = Annotated[str, StringConstraints(strip_whitespace=True, max_length=512)]
LongText = Annotated[str, StringConstraints(max_length=100_000)]


# Offsets beyond this are refused (422) rather than handed to PostgreSQL, whose bigint they overflow.
MAX_OFFSET = 2**31 - 1


def _find_nul(value: Any, path: str) -> str | None:
    if isinstance(value, str):
        return path if "\x00" in value else None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        if isinstance(key, str) and "\x00" in key:
            return f"{path}.{key!r}".lstrip(".")
        found = _find_nul(item, f"{path}.{key}".lstrip("."))
        if found is not None:
            return found
    return None


class StrictModel(BaseModel):
    """What clients send: unknown fields refused, and no NUL character in any string (PostgreSQL
    text cannot hold one, and no path or name needs one)."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _no_nul(cls, data: Any) -> Any:
        where = _find_nul(data, "")
        if where is not None:
            raise ValueError(f"{where or 'a string'} contains a NUL character")
        return data


class ArticleIn(StrictModel):
    pmcid: Annotated[str, StringConstraints(strip_whitespace=True, pattern=r"^PMC\d{1,12}$")] | None = None
    pmid: Annotated[str, StringConstraints(strip_whitespace=True, pattern=r"^\d{1,12}$")] | None = None
    doi: (
        Annotated[str, StringConstraints(strip_whitespace=True, pattern=r"^10\.\S+$", max_length=256)] | None
    ) = None
    title: LongText | None = None
    abstract: LongText | None = None
    journal: ShortText | None = None
    year: Annotated[int, Field(ge=1600, le=2200)] | None = None
    license: Annotated[str, StringConstraints(strip_whitespace=True, max_length=256)] | None = None

    def has_identity(self) -> bool:
        return bool(self.pmcid or self.pmid or self.doi)


class FigureMetadata(StrictModel):
    """The optional JSON metadata sent with a figure (and one line of a manifest, less image/caption)."""

    article: ArticleIn | None = None
    figure_label: Annotated[str, StringConstraints(strip_whitespace=True, max_length=128)] | None = None
    inline_references: list[LongText] = Field(default_factory=list, max_length=200)
    source_ref: Annotated[str, StringConstraints(max_length=2048)] | None = None


class ArticlePublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: uuid.UUID
    pmcid: str | None
    pmid: str | None
    doi: str | None
    title: str | None
    journal: str | None
    year: int | None
    license: str | None
    license_group: LicenseGroup


CROPS_PREFIX = "/v1/crops/"


def crop_url(key: str | None) -> str | None:
    """Where both APIs serve a stored figure image or crop (``GET /v1/crops/{key}``)."""
    return CROPS_PREFIX + quote(key, safe="/") if key else None


class RegionPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: uuid.UUID
    panel_id: uuid.UUID
    ordinal: int
    box_in_panel: list[float] = Field(description="[x0, y0, x1, y1] in the panel's crop pixels.")
    box_in_figure: list[float] = Field(description="[x0, y0, x1, y1] in figure pixels.")
    kind: RegionKind
    marker_type: str | None
    crop_key: str | None = Field(description="Object key; its crop_url works on either API.")
    caption_text: str | None = Field(description="The caption pathway's text for the region.")
    description: str | None = Field(description="The described text (LVLM backend), else null.")
    confidence: float | None
    provenance: dict[str, Any]

    @computed_field  # type: ignore[prop-decorator]
    @property
    def crop_url(self) -> str | None:
        return crop_url(self.crop_key)


class PanelPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: uuid.UUID
    figure_id: uuid.UUID
    ordinal: int
    label: str | None
    box: list[float] = Field(description="[x0, y0, x1, y1] in figure pixels.")
    crop_key: str | None = Field(description="Object key; its crop_url works on either API.")
    subcaption: str | None
    description: str | None
    figure_type: str | None
    modality: str | None
    confidence: float | None
    provenance: dict[str, Any]
    regions: list[RegionPublic]

    @computed_field  # type: ignore[prop-decorator]
    @property
    def crop_url(self) -> str | None:
        return crop_url(self.crop_key)


class JobPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: uuid.UUID
    figure_id: uuid.UUID
    backend: str
    miner_version: str | None
    superseded_by_id: uuid.UUID | None
    prompt_version: str | None
    status: JobStatus
    attempts: int
    stage_timings: dict[str, float]
    cost: dict[str, float]
    error: str | None
    notes: list[str]
    created_at: datetime
    enqueued_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None


class FigurePublic(BaseModel):
    """A figure with its article, panels and regions: the one shape of GET /v1/figures/{id} on the
    ingest and the embedding API alike."""

    model_config = ConfigDict(from_attributes=True)

    id: uuid.UUID
    status: FigureStatus
    mining_error: str | None = Field(default=None, description="Why mining failed, when it did.")
    image_sha256: str
    object_key: str
    byte_size: int
    width: int
    height: int
    format: str
    caption: str
    figure_label: str | None
    inline_references: list[str]
    source: str
    source_ref: str | None
    created_at: datetime
    article: ArticlePublic | None
    miner_version: str | None
    panels: list[PanelPublic]

    @computed_field  # type: ignore[prop-decorator]
    @property
    def image_url(self) -> str:
        return crop_url(self.object_key) or ""


class FigureAccepted(BaseModel):
    figure_id: uuid.UUID
    job_id: uuid.UUID
    status: FigureStatus
    duplicate: bool


class BatchCreate(StrictModel):
    kind: BatchKind
    source: Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=4096)]


class BatchItemPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    item_key: str
    status: BatchItemStatus
    figure_id: uuid.UUID | None
    error_type: str | None
    error_message: str | None


class BatchPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: uuid.UUID
    kind: BatchKind
    source: str
    status: BatchStatus
    total: int | None
    ingested: int
    duplicates: int
    failed: int
    processed: int
    error: str | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    failures: list[BatchItemPublic] = Field(default_factory=list)
