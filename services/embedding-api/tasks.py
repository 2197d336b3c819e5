"""Celery tasks of the embedding queue: re-index a model version, embed newly mined figures."""

from __future__ import annotations

import logging
import uuid

from p2p.shared.jobs import REINDEX
from p2p.shared.queue import EMBED_FIGURES_TASK, REINDEX_TASK, celery_app
from p2p.shared.tasks import P2PTask

log = logging.getLogger(__name__)


# Every worker imports every task module (p2p.apps.tasks); the work itself (indexing: torch, the
# models) is imported inside the tasks so that ingest and mining workers never load it.


class EmbeddingTask(P2PTask):
    abstract = True


class ReindexTask(EmbeddingTask):
    abstract = True
    job_kind = REINDEX


@celery_app.task(name=REINDEX_TASK, base=ReindexTask, bind=True)
def reindex_task(self: ReindexTask, version_id: str, space: str) -> None:
    from p2p.embedding_api.indexing import reindex

    progress = reindex(self.runtime, uuid.UUID(version_id), space)
    log.info("model version %s indexed for space %s: %s", version_id, space, progress)


@celery_app.task(name=EMBED_FIGURES_TASK, base=EmbeddingTask, bind=True)
def embed_figures_task(self: EmbeddingTask, figure_ids: list[str]) -> None:
    from p2p.embedding_api.indexing import embed_figures

    written = embed_figures(self.runtime, [uuid.UUID(f) for f in figure_ids])
    log.info("embedded %d items of %d figures", written, len(figure_ids), extra={"figure_ids": figure_ids})
