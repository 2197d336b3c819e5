"""What clients send to the embedding API (``...Create``) and what it returns (``...Public``)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from p2p.shared.db.models import LicenseGroup, ModelStatus, RegionKind
from p2p.shared.schemas import StrictModel

Level = Literal["figure", "panel", "region"]
Name = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=128)]


# --- embeds ----------------------------------------------------------------------------------------


class TextEmbedCreate(StrictModel):
    texts: list[str] = Field(description="Texts to embed; limits: embedding.max_texts, max_text_chars.")


class ModelRef(BaseModel):
    version_id: uuid.UUID | None = Field(description="None: the default model (no active version).")
    name: str
    version: str | None
    dim: int
    space: str


class EmbeddingPublic(BaseModel):
    source: str = Field(description="'text:<index>', 'file:<name>' or '<level>:<id>'.")
    embedding: list[float]


class EmbedPublic(BaseModel):
    model: ModelRef
    dim: int
    items: list[EmbeddingPublic]


# --- search ----------------------------------------------------------------------------------------


class SearchFiltersCreate(StrictModel):
    figure_type: str | None = None
    license_group: LicenseGroup | None = None
    year_min: int | None = None
    year_max: int | None = None
    journal: str | None = None
    article_id: uuid.UUID | None = None
    figure_id: uuid.UUID | None = None


class ItemRef(StrictModel):
    id: uuid.UUID
    level: Level | None = Field(default=None, description="Found from the id when left out.")


class SearchCreate(StrictModel):
    """One query: ``text``, or ``item`` (an embedded figure/panel/region: its stored vector). Image
    queries are multipart uploads (``image``, optional ``box``) with the other fields as form fields."""

    text: str | None = None
    item: ItemRef | None = None
    level: Level = "panel"
    k: int = 10
    offset: int = 0
    filters: SearchFiltersCreate = Field(default_factory=SearchFiltersCreate)
    exact: bool = False


class ArticleBrief(BaseModel):
    id: uuid.UUID
    title: str | None
    journal: str | None
    year: int | None
    license: str | None
    license_group: LicenseGroup | None
    pmcid: str | None
    doi: str | None


class FigureBrief(BaseModel):
    id: uuid.UUID
    caption: str
    figure_label: str | None
    width: int
    height: int
    image_url: str


class PanelBrief(BaseModel):
    id: uuid.UUID
    label: str | None
    box: list[float]
    subcaption: str | None
    description: str | None
    figure_type: str | None
    crop_url: str | None


class HitPublic(BaseModel):
    level: Level
    id: uuid.UUID
    score: float
    figure_id: uuid.UUID
    panel_id: uuid.UUID | None
    region_id: uuid.UUID | None
    box: list[float] = Field(description="In figure pixels: the whole figure, the panel or the region.")
    crop_url: str | None
    text: str | None = Field(description="The caption, subcaption or region text of the hit.")
    caption_text: str | None = Field(default=None, description="Regions: the caption pathway's text.")
    description: str | None = Field(default=None, description="Panels and regions: the described text.")
    figure: FigureBrief
    panel: PanelBrief | None
    article: ArticleBrief | None


class SearchPublic(BaseModel):
    model: ModelRef
    level: Level
    k: int
    offset: int
    exact: bool
    query: dict[str, Any]
    hits: list[HitPublic]


# --- items -----------------------------------------------------------------------------------------


class RegionDetailPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: uuid.UUID
    panel_id: uuid.UUID
    ordinal: int
    box_in_panel: list[float]
    box_in_figure: list[float]
    kind: RegionKind
    marker_type: str | None
    crop_url: str | None
    caption_text: str | None
    description: str | None
    confidence: float | None
    provenance: dict[str, Any]


class PanelDetailPublic(BaseModel):
    id: uuid.UUID
    figure_id: uuid.UUID
    ordinal: int
    label: str | None
    box: list[float]
    crop_url: str | None
    subcaption: str | None
    description: str | None
    figure_type: str | None
    modality: str | None
    confidence: float | None
    provenance: dict[str, Any]
    regions: list[RegionDetailPublic]


class FigureDetailPublic(BaseModel):
    id: uuid.UUID
    status: str
    caption: str
    figure_label: str | None
    width: int
    height: int
    format: str
    image_url: str
    source: str
    created_at: datetime
    article: ArticleBrief | None
    miner_version: str | None  # of the miner whose panels these are; None until mined
    panels: list[PanelDetailPublic]


class PanelItemPublic(PanelDetailPublic):
    figure: FigureBrief
    article: ArticleBrief | None


class RegionItemPublic(RegionDetailPublic):
    figure_id: uuid.UUID
    panel: PanelBrief
    figure: FigureBrief
    article: ArticleBrief | None


# --- classify --------------------------------------------------------------------------------------


class ClassifyCreate(StrictModel):
    panel_id: uuid.UUID
    labels: list[str] | None = Field(default=None, description="Default: the figure-type taxonomy.")


class LabelScore(BaseModel):
    label: str
    probability: float


class ClassifyPublic(BaseModel):
    model: ModelRef
    source: str
    labels: list[LabelScore] = Field(description="Sorted, most probable first.")


# --- models ----------------------------------------------------------------------------------------


class ModelCreate(StrictModel):
    name: Name | None = Field(default=None, description="Default: the offline default model.")
    version: Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=64)]
    architecture: Name | None = Field(default=None, description="open_clip model name, or 'custom'.")
    config: dict[str, Any] | None = Field(default=None, description="open_clip model config (custom).")
    source: Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=1024)] = "random"
    dim: int | None = Field(default=None, ge=1, description="When given, must be the model's dimension.")


class ActivateCreate(StrictModel):
    space: Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=64)] | None = None


class ModelPublic(BaseModel):
    id: uuid.UUID
    name: str
    version: str
    architecture: str
    source: str
    dim: int
    status: ModelStatus
    error: str | None
    progress: dict[str, Any]
    metrics: dict[str, Any]
    active_in: list[str] = Field(description="Spaces this version serves.")
    pending_in: list[str] = Field(description="Spaces switching to this version.")
    active: bool = Field(description="Serves this service's space.")
    serving: bool = Field(description="Loaded by this process right now.")
    created_at: datetime
