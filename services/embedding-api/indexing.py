"""The background (re-)embedding of the corpus for a model version (registration and activation
live in ``p2p.models.registry``).

A space serves search from its active version. Activating another version embeds every figure,
panel and region crop into that version's own vector table in the background (progress on the
version row) while the active one keeps answering; the space switches only when the new table is
complete. Newly mined figures are embedded into the active and the pending version automatically.
"""

from __future__ import annotations

import io
import logging
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image
from sqlalchemy import select
from sqlalchemy.orm import Session

from p2p.embedding_api import vectors
from p2p.models import registry
from p2p.models.modeling import EmbeddingModel, ModelLoadError, ModelSpec, load_model
from p2p.models.registry import get_space, spec_of
from p2p.shared import jobs as durable
from p2p.shared.db.base import utcnow
from p2p.shared.db.models import (
    Article,
    EmbeddingSpace,
    Figure,
    FigureStatus,
    ModelStatus,
    ModelVersion,
    Panel,
    Region,
)
from p2p.shared.errors import NotFound
from p2p.shared.runtime import Runtime
from p2p.shared.storage import ObjectStore

log = logging.getLogger(__name__)


def register(
    session: Session, spec: ModelSpec, version: str, *, store: ObjectStore | None, dim: int | None = None
) -> ModelVersion:
    """``registry.register``, keeping the loaded model for this process's re-index."""
    return registry.register(session, spec, version, store=store, dim=dim, on_loaded=_models.put)


# -- the work ----------------------------------------------------------------------------------------


class _ModelCache:
    """A few loaded models per process, by version id (loading costs seconds)."""

    def __init__(self, size: int = 2) -> None:
        self._items: OrderedDict[uuid.UUID, EmbeddingModel] = OrderedDict()
        self._lock = threading.Lock()
        self.size = size

    def put(self, key: uuid.UUID, model: EmbeddingModel) -> None:
        with self._lock:
            self._items[key] = model
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)

    def get(self, version: ModelVersion, store: ObjectStore, threads: int | None) -> EmbeddingModel:
        with self._lock:
            model = self._items.get(version.id)
            if model is not None:
                self._items.move_to_end(version.id)
                return model
        model = load_model(spec_of(version), store=store, threads=threads)
        self.put(version.id, model)
        return model


_models = _ModelCache()


def clear_model_cache() -> None:
    """Forget loaded models (a worker that must re-read weights, and tests)."""
    global _models
    _models = _ModelCache(_models.size)


@dataclass(frozen=True)
class _Item:
    level: str
    item_id: uuid.UUID
    figure_id: uuid.UUID
    panel_id: uuid.UUID | None
    region_id: uuid.UUID | None
    object_key: str
    figure_type: str | None
    article_id: uuid.UUID | None


def _items(session: Session, figure_ids: Sequence[uuid.UUID] | None = None) -> Iterator[_Item]:
    figures = select(Figure.id, Figure.object_key, Figure.article_id).where(
        Figure.status == FigureStatus.MINED
    )
    panels = (
        select(Panel.id, Panel.figure_id, Panel.crop_key, Panel.figure_type, Figure.article_id)
        .join(Figure, Figure.id == Panel.figure_id)
        .where(Panel.crop_key.is_not(None))
    )
    regions = (
        select(
            Region.id, Region.panel_id, Panel.figure_id, Region.crop_key, Panel.figure_type, Figure.article_id
        )
        .join(Panel, Panel.id == Region.panel_id)
        .join(Figure, Figure.id == Panel.figure_id)
        .where(Region.crop_key.is_not(None))
    )
    if figure_ids is not None:
        figures = figures.where(Figure.id.in_(figure_ids))
        panels = panels.where(Panel.figure_id.in_(figure_ids))
        regions = regions.where(Panel.figure_id.in_(figure_ids))
    for fid, figure_key, article in session.execute(figures.order_by(Figure.id)):
        yield _Item("figure", fid, fid, None, None, figure_key, None, article)
    for pid, fid, panel_key, kind, article in session.execute(panels.order_by(Panel.id)):
        yield _Item("panel", pid, fid, pid, None, str(panel_key), kind, article)
    for rid, pid, fid, region_key, kind, article in session.execute(regions.order_by(Region.id)):
        yield _Item("region", rid, fid, pid, rid, str(region_key), kind, article)


def _articles(session: Session, ids: set[uuid.UUID]) -> dict[uuid.UUID, tuple[Any, Any, Any]]:
    if not ids:
        return {}
    rows = session.execute(
        select(Article.id, Article.license_group, Article.year, Article.journal).where(Article.id.in_(ids))
    )
    return {
        aid: (str(group) if group is not None else None, year, journal) for aid, group, year, journal in rows
    }


def _embed_batch(
    runtime: Runtime, model: EmbeddingModel, version_id: uuid.UUID, batch: list[_Item]
) -> tuple[int, int]:

    images: list[Image.Image] = []
    kept: list[_Item] = []
    skipped = 0
    for item in batch:
        try:
            with Image.open(io.BytesIO(runtime.store.get_bytes(item.object_key))) as img:
                images.append(img.convert("RGB"))
            kept.append(item)
        except Exception as exc:  # a missing or unreadable crop loses that item only
            log.warning("cannot embed %s %s: %s", item.level, item.item_id, exc)
            skipped += 1
    if not kept:
        return 0, skipped
    embeddings = model.encode_images(images)
    with runtime.session() as session:
        meta = _articles(session, {i.article_id for i in kept if i.article_id})
    rows = []
    for item, vector in zip(kept, embeddings, strict=True):
        group, year, journal = (
            meta.get(item.article_id, (None, None, None)) if item.article_id else (None,) * 3
        )
        rows.append(
            vectors.VectorRow(
                level=item.level,
                item_id=item.item_id,
                figure_id=item.figure_id,
                panel_id=item.panel_id,
                region_id=item.region_id,
                figure_type=item.figure_type,
                license_group=group,
                year=year,
                journal=journal,
                article_id=item.article_id,
                embedding=np.asarray(vector, dtype=np.float32),
            )
        )
    with runtime.engine.begin() as conn:
        vectors.upsert(conn, version_id, rows)
    return len(rows), skipped


def reindex(runtime: Runtime, version_id: uuid.UUID, space: str) -> dict[str, Any]:
    """Embed the whole corpus with ``version_id``; switch ``space`` to it when complete. A failure
    marks the version failed with its reason and leaves the space's active version as it was.
    Runs under the version's durable-job claim: a second delivery leaves the first one at work."""
    with durable.claim(runtime, durable.REINDEX, version_id) as lease:
        if lease is None:
            with runtime.session() as session:
                held = session.get(ModelVersion, version_id)
                return dict(held.progress or {}) if held is not None else {}
        return _reindex_claimed(runtime, lease, space)


def _reindex_claimed(runtime: Runtime, lease: durable.Lease, space: str) -> dict[str, Any]:
    settings = runtime.settings.embedding
    version_id = lease.job_id
    with runtime.session() as session:
        version = session.get(ModelVersion, version_id)
        if version is None:
            raise NotFound(f"no model version {version_id}")
        if version.status is not ModelStatus.INDEXING:
            return dict(version.progress or {})  # finished (or failed) before this delivery
        durable.start(session, lease, version, status=ModelStatus.INDEXING)
        session.commit()
        durable.flush_events(runtime, session)
        session.expunge(version)
    started = time.perf_counter()
    try:
        model = _models.get(version, runtime.store, settings.torch_threads)
        if model.dim != version.dim:
            raise ModelLoadError(f"model gives {model.dim}-d vectors, the version says {version.dim}")
        vectors.ensure_table(
            runtime.engine,
            version_id,
            version.dim,
            m=settings.hnsw_m,
            ef_construction=settings.hnsw_ef_construction,
        )
        with runtime.session() as session:
            items = list(_items(session))
        totals = {
            level: sum(item.level == level for item in items) for level in ("figure", "panel", "region")
        }
        done = dict.fromkeys(totals, 0)
        skipped = 0
        _progress(runtime, version_id, state="running", space=space, total=totals, done=done, started=started)
        for start in range(0, len(items), settings.reindex_batch):
            batch = items[start : start + settings.reindex_batch]
            _, missed = _embed_batch(runtime, model, version_id, batch)
            skipped += missed
            for item in batch:
                done[item.level] += 1
            _progress(
                runtime, version_id, state="running", space=space, total=totals, done=done, started=started,
                skipped=skipped,
            )  # fmt: skip
    except Exception as exc:
        _fail(runtime, version_id, space, f"{type(exc).__name__}: {exc}")
        raise
    with runtime.session() as session:
        version_row = session.get(ModelVersion, version_id)
        row = get_space(session, space, create=True)
        assert version_row is not None and row is not None
        version_row.error = None
        durable.finish(session, lease, version_row, status=ModelStatus.READY)
        elapsed = time.perf_counter() - started
        version_row.progress = {
            **(version_row.progress or {}),
            "state": "complete",
            "finished_at": utcnow().isoformat(),
            "seconds": round(elapsed, 3),
            "items_per_s": round(sum(done.values()) / elapsed, 2) if elapsed else None,
        }
        if row.pending_version_id in (None, version_id):
            row.active_version_id = version_id
            row.pending_version_id = None
        session.commit()
        durable.flush_events(runtime, session)
        return dict(version_row.progress)


def _progress(
    runtime: Runtime,
    version_id: uuid.UUID,
    *,
    state: str,
    space: str,
    total: dict[str, int],
    done: dict[str, int],
    started: float,
    skipped: int = 0,
) -> None:
    with runtime.session() as session:
        version = session.get(ModelVersion, version_id)
        if version is None:
            return
        all_total, all_done = sum(total.values()), sum(done.values())
        version.progress = {
            "state": state,
            "space": space,
            "total": all_total,
            "done": all_done,
            "fraction": round(all_done / all_total, 4) if all_total else 1.0,
            "by_level": {level: {"done": done[level], "total": total[level]} for level in total},
            "skipped": skipped,
            "elapsed_s": round(time.perf_counter() - started, 3),
        }
        session.commit()


def _fail(runtime: Runtime, version_id: uuid.UUID, space: str, reason: str) -> None:
    durable.mark_failed(runtime, durable.REINDEX, version_id, reason)


def embed_figures(runtime: Runtime, figure_ids: Sequence[uuid.UUID]) -> int:
    """Embed newly mined figures into every space's active and pending version."""
    with runtime.session() as session:
        targets: set[uuid.UUID] = set()
        for space in session.scalars(select(EmbeddingSpace)):
            targets.update(v for v in (space.active_version_id, space.pending_version_id) if v is not None)
        versions = [session.get(ModelVersion, v) for v in targets]
        for version in versions:
            if version is not None:
                session.expunge(version)
        items = list(_items(session, figure_ids))
    written = 0
    for version in versions:
        if version is None or version.status not in (ModelStatus.READY, ModelStatus.INDEXING):
            continue
        settings = runtime.settings.embedding
        model = _models.get(version, runtime.store, settings.torch_threads)
        # A version activated a moment ago may not have its table yet: same index parameters as
        # the re-index that would have made it.
        vectors.ensure_table(
            runtime.engine,
            version.id,
            version.dim,
            m=settings.hnsw_m,
            ef_construction=settings.hnsw_ef_construction,
        )
        size = settings.reindex_batch
        for start in range(0, len(items), size):
            embedded, _ = _embed_batch(runtime, model, version.id, items[start : start + size])
            written += embedded
    return written
