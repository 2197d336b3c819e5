"""What clients send to the embedding API (``...Create``) and what it returns (``...Public``)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, StringConstraints

from p2p.shared.db.models import LicenseGroup, ModelStatus
from p2p.shared.schemas import PanelPublic, RegionPublic, StrictModel

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
    """Metadata filters; every given key must match (AND)."""

    figure_type: str | None = Field(
        default=None, description="The panel's mined type: image, plot, schematic or table."
    )
    license_group: LicenseGroup | None = Field(default=None, description="The article's license group.")
    year_min: int | None = Field(default=None, description="Publication year, inclusive.")
    year_max: int | None = Field(default=None, description="Publication year, inclusive.")
    journal: str | None = Field(default=None, description="Journal name, exact.")
    article_id: uuid.UUID | None = Field(
        default=None, description="Only this article (GET /v1/figures: article.id)."
    )
    figure_id: uuid.UUID | None = Field(default=None, description="Only this figure's panels or regions.")


class ItemRef(StrictModel):
    id: uuid.UUID
    level: Level | None = Field(default=None, description="Found from the id when left out.")


class SearchCreate(StrictModel):
    """One query: ``text``, or ``item`` (an embedded figure/panel/region: its stored vector). Image
    queries are multipart uploads (``image``, optional ``box``) with the other fields as form fields."""

    text: str | None = Field(default=None, description="A text query.")
    item: ItemRef | None = Field(default=None, description="A stored figure, panel or region as the query.")
    level: Level = Field(default="panel", description="What to return: figures, panels or regions.")
    k: int = Field(default=10, description="Hits per page (at most embedding.max_k).")
    offset: int = Field(default=0, description="Hits to skip: the next page is offset + k.")
    filters: SearchFiltersCreate = Field(default_factory=SearchFiltersCreate)
    exact: bool = Field(default=False, description="Exact scan instead of the HNSW index (evaluation).")


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


class CorpusPublic(BaseModel):
    """What the viewer's landing page shows: corpus counts and a page of the newest figures."""

    figures: int
    panels: int
    regions: int
    articles: int
    offset: int
    limit: int
    recent: list[FigureBrief] = Field(description="Newest figures first.")


class PanelItemPublic(PanelPublic):
    figure: FigureBrief
    article: ArticleBrief | None


class RegionItemPublic(RegionPublic):
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
