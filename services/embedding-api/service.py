"""Search orchestration and the checks behind the embedding API's routes.

Inference goes through the process's micro-batcher (off the event loop); database and object store
work runs in the thread pool. Every hit is enriched with its context in three queries at most
(regions, panels, figures with their articles), whatever ``k`` is.
"""

from __future__ import annotations

import io
import json
import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np
from fastapi.concurrency import run_in_threadpool
from PIL import Image
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session, selectinload

from p2p.embedding_api import vectors
from p2p.embedding_api.deps import ModelState
from p2p.embedding_api.schemas import (
    ArticleBrief,
    CorpusPublic,
    FigureBrief,
    HitPublic,
    ModelRef,
    PanelBrief,
    PanelItemPublic,
    RegionItemPublic,
    SearchCreate,
    SearchPublic,
)
from p2p.embedding_api.search_plan import PathCosts
from p2p.shared.db.models import Article, Figure, Panel, Region
from p2p.shared.errors import InvalidInput, NotFound, PayloadTooLarge, ServiceUnavailable
from p2p.shared.images import inspect_image
from p2p.shared.runtime import Runtime
from p2p.shared.schemas import MAX_OFFSET, FigurePublic, PanelPublic, RegionPublic, crop_url
from p2p.shared.settings import Settings
from p2p.shared.storage import ObjectNotFound


def model_ref(state: ModelState) -> ModelRef:
    return ModelRef(
        version_id=state.version_id, name=state.name, version=state.version, dim=state.dim, space=state.space
    )


# --- input checks ----------------------------------------------------------------------------------


def check_texts(texts: Sequence[str], *, settings: Settings, what: str = "texts") -> list[str]:
    limits = settings.embedding
    if not texts:
        raise InvalidInput(f"send at least one of {what}", error_type="empty_input")
    if len(texts) > limits.max_texts:
        raise InvalidInput(
            f"{len(texts)} {what} is more than the {limits.max_texts} allowed per request",
            error_type="too_many_texts",
        )
    cleaned = []
    for index, text in enumerate(texts):
        if not text.strip():
            raise InvalidInput(f"{what}[{index}] is empty", error_type="empty_text")
        if len(text) > limits.max_text_chars:
            raise InvalidInput(
                f"{what}[{index}] has {len(text)} characters, over the {limits.max_text_chars} limit",
                error_type="text_too_long",
            )
        cleaned.append(text.strip())
    return cleaned


def check_k(k: int, offset: int, *, settings: Settings) -> None:
    max_k = settings.embedding.max_k
    if not 1 <= k <= max_k:
        raise InvalidInput(f"k must be between 1 and {max_k}, got {k}", error_type="k_out_of_range")
    if not 0 <= offset <= MAX_OFFSET:
        raise InvalidInput(
            f"offset must be between 0 and {MAX_OFFSET}, got {offset}", error_type="offset_out_of_range"
        )


def decode_image(data: bytes, *, settings: Settings, name: str = "image") -> Image.Image:
    """An RGB image from uploaded bytes: format, pixel count and integrity checked as on ingest."""
    cap = settings.ingest.max_upload_bytes
    if len(data) > cap:
        raise PayloadTooLarge(f"{name} is larger than the {cap}-byte limit")
    if not data:
        raise InvalidInput(f"{name} is empty", error_type="not_an_image")
    stream = io.BytesIO(data)
    try:
        inspect_image(
            stream, allowed_formats=settings.ingest.allowed_formats, max_pixels=settings.ingest.max_pixels
        )
    except InvalidInput as exc:
        exc.message = f"{name}: {exc.message}"
        raise
    try:
        with Image.open(stream) as img:
            return img.convert("RGB")
    except (OSError, SyntaxError, ValueError, EOFError, Image.DecompressionBombError) as exc:
        # The structure checks passed but the pixel data does not decode (a corrupt zlib stream...).
        raise InvalidInput(
            f"{name}: image data is truncated or corrupt: {exc}", error_type="corrupt_image"
        ) from exc


def parse_box(raw: str | Sequence[float] | None) -> list[float] | None:
    """``x0,y0,x1,y1`` or a JSON list of four numbers, in image pixels."""
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return None
    try:
        if isinstance(raw, str):
            text = raw.strip()
            values = json.loads(text) if text.startswith("[") else [float(v) for v in text.split(",")]
        else:
            values = list(raw)
        box = [float(v) for v in values]
    except (ValueError, TypeError) as exc:
        raise InvalidInput(
            f"box must be four numbers x0,y0,x1,y1, got {raw!r}", error_type="invalid_box"
        ) from exc
    if len(box) != 4 or not all(np.isfinite(box)):
        raise InvalidInput(
            f"box must be four finite numbers x0,y0,x1,y1, got {raw!r}", error_type="invalid_box"
        )
    return box


def crop_box(image: Image.Image, box: list[float]) -> Image.Image:
    x0, y0, x1, y1 = box
    width, height = image.size
    if x1 <= x0 or y1 <= y0:
        raise InvalidInput(f"box {box} has zero area (x1 <= x0 or y1 <= y0)", error_type="invalid_box")
    if x0 < 0 or y0 < 0 or x1 > width or y1 > height:
        raise InvalidInput(f"box {box} lies outside the {width}x{height} image", error_type="invalid_box")
    left, top = int(np.floor(x0)), int(np.floor(y0))
    right, bottom = max(int(np.ceil(x1)), left + 1), max(int(np.ceil(y1)), top + 1)
    return image.crop((left, top, min(right, width), min(bottom, height)))


def check_labels(labels: Sequence[str] | None, *, settings: Settings, default: Sequence[str]) -> list[str]:
    if labels is None or len(labels) == 0:
        return list(default)
    cleaned = check_texts(labels, settings=settings, what="labels")
    if len(set(cleaned)) != len(cleaned):
        raise InvalidInput("labels must be distinct", error_type="duplicate_labels")
    return cleaned


# --- stored items ----------------------------------------------------------------------------------


def resolve_level(session: Session, item_id: uuid.UUID) -> str:
    for level, model in (("panel", Panel), ("region", Region), ("figure", Figure)):
        if session.get(model, item_id) is not None:
            return level
    raise NotFound(f"no figure, panel or region {item_id}")


def item_image_key(session: Session, item_id: uuid.UUID, level: str | None = None) -> tuple[str, str]:
    """(level, object key) of a stored figure, panel or region image."""
    level = level or resolve_level(session, item_id)
    if level == "figure":
        figure = session.get(Figure, item_id)
        key = figure.object_key if figure is not None else None
    elif level == "panel":
        panel = session.get(Panel, item_id)
        key = panel.crop_key if panel is not None else None
    else:
        region = session.get(Region, item_id)
        key = region.crop_key if region is not None else None
    if key is None:
        raise NotFound(f"no {level} {item_id} with a stored image")
    return level, key


def load_item_image(
    runtime: Runtime, session: Session, item_id: uuid.UUID, level: str | None = None
) -> Image.Image:
    level, key = item_image_key(session, item_id, level)
    try:
        data = runtime.store.get_bytes(key)
    except ObjectNotFound as exc:
        raise NotFound(f"the image of {level} {item_id} is missing from the store") from exc
    try:
        with Image.open(io.BytesIO(data)) as img:
            return img.convert("RGB")
    except (OSError, SyntaxError, ValueError, EOFError, Image.DecompressionBombError) as exc:
        raise InvalidInput(
            f"the stored image of {level} {item_id} does not decode: {exc}", error_type="corrupt_image"
        ) from exc


def stored_vector(engine: Engine, *, version_id: uuid.UUID, level: str, item_id: uuid.UUID) -> np.ndarray:
    with engine.connect() as conn:
        vector = vectors.get_vector(conn, version_id, level, item_id)
    if vector is None:
        raise NotFound(
            f"{level} {item_id} has no vector in the active model version", error_type="not_embedded"
        )
    return vector


# --- search ----------------------------------------------------------------------------------------


async def text_vector(state: ModelState, text: str) -> np.ndarray:
    """The query text's embedding: from the state's cache when this model embedded it recently."""
    vector = state.text_cache.get(state.cache_key, text)
    if vector is None:
        vector = (await state.batcher.embed_texts([text]))[0]
        state.text_cache.put(state.cache_key, text, vector)
    return vector


async def query_vector(
    *,
    runtime: Runtime,
    state: ModelState,
    body: SearchCreate,
    image: Image.Image | None,
    box: list[float] | None,
) -> tuple[np.ndarray, dict[str, Any], tuple[str, uuid.UUID] | None]:
    """The query vector, a description of the query, and the (level, id) of a query item."""
    given = sum(x is not None for x in (body.text, body.item, image))
    if given != 1:
        raise InvalidInput(
            "send exactly one query: text, item, or an image upload", error_type="invalid_query"
        )
    if box is not None and image is None:
        raise InvalidInput("box crops an uploaded image; send an image with it", error_type="invalid_box")
    if body.text is not None:
        (text,) = check_texts([body.text], settings=runtime.settings, what="text")
        return await text_vector(state, text), {"text": text}, None
    if image is not None:
        described: dict[str, Any] = {"image": f"{image.width}x{image.height}"}
        if box is not None:
            image = crop_box(image, box)
            described["box"] = box
        return (await state.batcher.embed_images([image]))[0], described, None
    assert body.item is not None
    version_id = state.require_space()
    item_id = body.item.id

    def lookup() -> tuple[str, np.ndarray]:
        with runtime.session() as session:
            level = body.item.level if body.item and body.item.level else resolve_level(session, item_id)
        return level, stored_vector(runtime.engine, version_id=version_id, level=level, item_id=item_id)

    level, vector = await run_in_threadpool(lookup)
    return vector, {"item": {"level": level, "id": str(item_id)}}, (level, item_id)


def find_hits(
    engine: Engine,
    *,
    version_id: uuid.UUID,
    query: np.ndarray,
    body: SearchCreate,
    ef_search: int,
    exclude: tuple[str, uuid.UUID] | None,
    costs: PathCosts | None = None,
) -> list[vectors.Hit]:
    """Nearest items; a query item is left out of its own results (pages stay contiguous)."""
    filters = vectors.SearchFilters(
        **{
            **body.filters.model_dump(),
            "license_group": body.filters.license_group.value if body.filters.license_group else None,
        }
    )
    skip_self = exclude is not None and exclude[0] == body.level
    k, offset = body.k, body.offset
    if skip_self:
        k, offset = (k + 1, 0) if offset == 0 else (k, offset + 1)
    try:
        with engine.connect() as conn:
            hits = vectors.search(
                conn,
                version_id,
                query,
                level=body.level,
                k=k,
                offset=offset,
                filters=filters,
                exact=body.exact,
                ef_search=max(ef_search, min(body.k + body.offset, 1000)),
                costs=costs,
            )
    except LookupError as exc:
        raise ServiceUnavailable(str(exc), error_type="space_not_ready") from exc
    except ValueError as exc:
        raise InvalidInput(str(exc), error_type="invalid_query") from exc
    if skip_self and exclude is not None:
        hits = [h for h in hits if h.item_id != exclude[1]]
    return hits[: body.k]


def _article(article: Article | None) -> ArticleBrief | None:
    if article is None:
        return None
    return ArticleBrief(
        id=article.id,
        title=article.title,
        journal=article.journal,
        year=article.year,
        license=article.license,
        license_group=article.license_group,
        pmcid=article.pmcid,
        doi=article.doi,
    )


def figure_brief(figure: Figure) -> FigureBrief:
    return FigureBrief(
        id=figure.id,
        caption=figure.caption,
        figure_label=figure.figure_label,
        width=figure.width,
        height=figure.height,
        image_url=crop_url(figure.object_key) or "",
    )


def panel_brief(panel: Panel) -> PanelBrief:
    return PanelBrief(
        id=panel.id,
        label=panel.label,
        box=list(panel.box),
        subcaption=panel.subcaption,
        description=panel.description,
        figure_type=panel.figure_type,
        crop_url=crop_url(panel.crop_key),
    )


def enrich(session: Session, hits: Sequence[vectors.Hit]) -> list[HitPublic]:
    region_ids = {h.region_id for h in hits if h.region_id is not None}
    regions = (
        {r.id: r for r in session.scalars(select(Region).where(Region.id.in_(region_ids)))}
        if region_ids
        else {}
    )
    panel_ids = {h.panel_id for h in hits if h.panel_id is not None} | {r.panel_id for r in regions.values()}
    panels = (
        {p.id: p for p in session.scalars(select(Panel).where(Panel.id.in_(panel_ids)))} if panel_ids else {}
    )
    figure_ids = {h.figure_id for h in hits}
    rows = session.execute(
        select(Figure, Article)
        .outerjoin(Article, Article.id == Figure.article_id)
        .where(Figure.id.in_(figure_ids))
    ).all()
    figures = {figure.id: (figure, article) for figure, article in rows}
    out = []
    for hit in hits:
        if hit.figure_id not in figures:
            continue  # deleted since it was embedded
        figure, article = figures[hit.figure_id]
        panel = panels.get(hit.panel_id) if hit.panel_id else None
        region = regions.get(hit.region_id) if hit.region_id else None
        common: dict[str, Any] = {
            "level": hit.level,
            "id": hit.item_id,
            "score": round(float(hit.score), 6),
            "figure_id": figure.id,
            "panel_id": hit.panel_id,
            "region_id": hit.region_id,
            "figure": figure_brief(figure),
            "panel": panel_brief(panel) if panel is not None else None,
            "article": _article(article),
        }
        if hit.level == "region":
            if region is None:
                continue
            extra: dict[str, Any] = {
                "box": list(region.box_in_figure),
                "crop_url": crop_url(region.crop_key),
                "text": region.caption_text or region.description,
                "caption_text": region.caption_text,
                "description": region.description,
            }
        elif hit.level == "panel":
            if panel is None:
                continue
            extra = {
                "box": list(panel.box),
                "crop_url": crop_url(panel.crop_key),
                "text": panel.subcaption or panel.description,
                "description": panel.description,
            }
        else:
            extra = {
                "box": [0.0, 0.0, float(figure.width), float(figure.height)],
                "crop_url": crop_url(figure.object_key),
                "text": figure.caption,
            }
        out.append(HitPublic(**common, **extra))
    return out


async def search(
    *,
    runtime: Runtime,
    state: ModelState,
    body: SearchCreate,
    image: Image.Image | None = None,
    box: list[float] | None = None,
) -> SearchPublic:
    check_k(body.k, body.offset, settings=runtime.settings)
    year_min, year_max = body.filters.year_min, body.filters.year_max
    if year_min is not None and year_max is not None and year_min > year_max:
        raise InvalidInput("filters.year_min is after filters.year_max", error_type="invalid_filter")
    version_id = state.require_space()
    query, described, exclude = await query_vector(
        runtime=runtime, state=state, body=body, image=image, box=box
    )

    def lookup() -> list[HitPublic]:
        hits = find_hits(
            runtime.engine,
            version_id=version_id,
            query=query,
            body=body,
            ef_search=runtime.settings.embedding.hnsw_ef_search,
            exclude=exclude,
            costs=state.search_costs.costs,
        )
        with runtime.session() as session:
            return enrich(session, hits)

    hits = await run_in_threadpool(lookup)
    return SearchPublic(
        model=model_ref(state),
        level=body.level,
        k=body.k,
        offset=body.offset,
        exact=body.exact,
        query={**described, "filters": body.filters.model_dump(mode="json", exclude_none=True)},
        hits=hits,
    )


def filters_from_form(raw: str | None) -> dict[str, Any]:
    if raw is None or not raw.strip():
        return {}
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise InvalidInput(f"filters must be a JSON object: {exc}", error_type="invalid_filter") from exc
    if not isinstance(value, dict):
        raise InvalidInput("filters must be a JSON object", error_type="invalid_filter")
    return value


# --- items -----------------------------------------------------------------------------------------


def figure_detail(session: Session, figure_id: uuid.UUID) -> FigurePublic:
    figure = session.scalars(
        select(Figure)
        .where(Figure.id == figure_id)
        .options(
            selectinload(Figure.article),
            selectinload(Figure.jobs),
            selectinload(Figure.panels).selectinload(Panel.regions),
        )
    ).first()
    if figure is None:
        raise NotFound(f"no figure {figure_id}")
    return FigurePublic.model_validate(figure)


def corpus_overview(session: Session, *, limit: int, offset: int) -> CorpusPublic:
    def count(model: Any) -> int:
        return int(session.scalar(select(func.count()).select_from(model)) or 0)

    newest = session.scalars(
        select(Figure).order_by(Figure.created_at.desc(), Figure.id).limit(limit).offset(offset)
    )
    return CorpusPublic(
        figures=count(Figure),
        panels=count(Panel),
        regions=count(Region),
        articles=count(Article),
        offset=offset,
        limit=limit,
        recent=[figure_brief(f) for f in newest],
    )


def panel_item(session: Session, panel_id: uuid.UUID) -> PanelItemPublic:
    panel = session.scalars(
        select(Panel)
        .where(Panel.id == panel_id)
        .options(selectinload(Panel.regions), selectinload(Panel.figure).selectinload(Figure.article))
    ).first()
    if panel is None:
        raise NotFound(f"no panel {panel_id}")
    return PanelItemPublic(
        **PanelPublic.model_validate(panel).model_dump(exclude={"crop_url"}),
        figure=figure_brief(panel.figure),
        article=_article(panel.figure.article),
    )


def region_item(session: Session, region_id: uuid.UUID) -> RegionItemPublic:
    region = session.scalars(
        select(Region)
        .where(Region.id == region_id)
        .options(selectinload(Region.panel).selectinload(Panel.figure).selectinload(Figure.article))
    ).first()
    if region is None:
        raise NotFound(f"no region {region_id}")
    figure = region.panel.figure
    return RegionItemPublic(
        **RegionPublic.model_validate(region).model_dump(exclude={"crop_url"}),
        figure_id=figure.id,
        panel=panel_brief(region.panel),
        figure=figure_brief(figure),
        article=_article(figure.article),
    )
