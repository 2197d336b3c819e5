"""Model versions: register, activate (background re-index with progress), switch only when
complete, failures leave the active space intact, newly mined figures are embedded."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from p2p.embedding_api import vectors
from p2p.embedding_api.indexing import clear_model_cache, embed_figures, register, reindex
from p2p.ingest.app import create_app
from p2p.ingest.samples import make_figure
from p2p.mining.jobs import mine_job
from p2p.mining.tasks import get_miner
from p2p.models.modeling import ModelSpec, default_spec, load_model, save_checkpoint
from p2p.models.registry import activate
from p2p.shared.db.models import EmbeddingSpace, ModelStatus, ModelVersion, Panel, Region
from p2p.shared.errors import InvalidInput
from p2p.shared.queue import InProcessDispatcher
from p2p.shared.runtime import Runtime
from tests.conftest import RuntimeFactory
from tests.helpers import upload

pytestmark = pytest.mark.parametrize("store_kind", ["local"], indirect=True)

TINY = {
    "embed_dim": 32,
    "vision_cfg": {"image_size": 64, "layers": 2, "width": 64, "patch_size": 16, "head_width": 32},
    "text_cfg": {"context_length": 32, "vocab_size": 49408, "width": 64, "heads": 2, "layers": 1},
}


def _mined_corpus(runtime: Runtime, seeds: tuple[int, ...]) -> list[str]:
    figure_ids = []
    with TestClient(create_app(runtime=runtime)) as client:
        for seed in seeds:
            sample = make_figure(seed)
            accepted = upload(client, sample.image, caption=sample.caption, filename=sample.name).json()
            mine_job(runtime, uuid.UUID(accepted["job_id"]), get_miner())
            figure_ids.append(accepted["figure_id"])
    return figure_ids


def _items(runtime: Runtime) -> dict[str, int]:
    with runtime.session() as session:
        panels = len(list(session.scalars(select(Panel.id).where(Panel.crop_key.is_not(None)))))
        regions = len(list(session.scalars(select(Region.id).where(Region.crop_key.is_not(None)))))
    return {"panel": panels, "region": regions}


def _space(runtime: Runtime, name: str = "default") -> EmbeddingSpace:
    with runtime.session() as session:
        row = session.get(EmbeddingSpace, name)
        assert row is not None
        session.expunge(row)
        return row


def _version(runtime: Runtime, version_id: uuid.UUID) -> ModelVersion:
    with runtime.session() as session:
        row = session.get(ModelVersion, version_id)
        assert row is not None
        session.expunge(row)
        return row


def test_activation_embeds_every_item_in_the_background_and_then_serves(
    make_runtime: RuntimeFactory,
) -> None:
    runtime = make_runtime(queue={"embedded_queues": ["ingest", "embedding"]})
    figure_ids = _mined_corpus(runtime, (4, 7))
    with runtime.session() as session:
        version = register(session, default_spec(), "1", store=runtime.store)
        assert version.dim == 384 and version.status is ModelStatus.REGISTERED
        activate(session, runtime.dispatcher, version_id=version.id, space="default")
    assert isinstance(runtime.dispatcher, InProcessDispatcher) and runtime.dispatcher.wait_idle(300)
    row = _version(runtime, version.id)
    assert row.status is ModelStatus.READY, row.error
    counts = _items(runtime)
    with runtime.engine.connect() as conn:
        assert vectors.count(conn, version.id, "figure") == len(figure_ids)
        assert vectors.count(conn, version.id, "panel") == counts["panel"]
        assert vectors.count(conn, version.id, "region") == counts["region"]
    assert row.progress["state"] == "complete" and row.progress["items_per_s"] > 0
    assert _space(runtime).active_version_id == version.id and _space(runtime).pending_version_id is None


def test_the_active_space_serves_until_the_new_version_is_complete_and_survives_a_failure(
    make_runtime: RuntimeFactory, tmp_path: Path
) -> None:
    runtime = make_runtime()  # the embedding queue is not served: each re-index runs by hand
    _mined_corpus(runtime, (5,))
    with runtime.session() as session:
        first = register(session, default_spec(), "1", store=runtime.store)
        activate(session, runtime.dispatcher, version_id=first.id, space="default")
    reindex(runtime, first.id, "default")
    assert _space(runtime).active_version_id == first.id

    checkpoint = tmp_path / "tiny.pt"
    tiny = ModelSpec(name="tiny", architecture="custom", config=TINY, source="random")
    save_checkpoint(load_model(tiny), checkpoint, spec=tiny)
    with runtime.session() as session:
        second = register(
            session, ModelSpec("tiny", "custom", TINY, f"local:{checkpoint}"), "1", store=runtime.store
        )
        assert second.dim == 32  # another dimension lives in its own table beside the first
        activate(session, runtime.dispatcher, version_id=second.id, space="default")
    space = _space(runtime)
    assert (space.active_version_id, space.pending_version_id) == (first.id, second.id)
    assert _version(runtime, second.id).status is ModelStatus.INDEXING

    checkpoint.unlink()  # the weights vanish before a worker re-indexes: activation fails
    clear_model_cache()  # a worker process other than the one that registered the version
    with pytest.raises(Exception, match=r"tiny\.pt|checkpoint"):
        reindex(runtime, second.id, "default")
    failed = _version(runtime, second.id)
    assert failed.status is ModelStatus.FAILED and failed.error
    space = _space(runtime)
    assert (space.active_version_id, space.pending_version_id) == (first.id, None)

    save_checkpoint(load_model(tiny), checkpoint, spec=tiny)
    with runtime.session() as session:
        activate(session, runtime.dispatcher, version_id=second.id, space="default")
    reindex(runtime, second.id, "default")
    assert _space(runtime).active_version_id == second.id
    with runtime.engine.connect() as conn:
        assert vectors.count(conn, second.id) == vectors.count(conn, first.id) > 0


def test_register_refuses_what_cannot_serve(make_runtime: RuntimeFactory, tmp_path: Path) -> None:
    runtime = make_runtime()
    tiny = ModelSpec(name="tiny", architecture="custom", config=TINY, source="random")
    other = dict(TINY, embed_dim=48)
    checkpoint = tmp_path / "other.pt"
    other_spec = ModelSpec("other", "custom", other, "random")
    save_checkpoint(load_model(other_spec), checkpoint, spec=other_spec)
    with runtime.session() as session:
        with pytest.raises(InvalidInput, match="cannot be loaded") as mismatch:
            register(
                session, ModelSpec("tiny", "custom", TINY, f"local:{checkpoint}"), "1", store=runtime.store
            )
        assert mismatch.value.error_type == "model_load_failed"
        with pytest.raises(InvalidInput, match="cannot be loaded"):
            register(
                session, ModelSpec("tiny", "custom", TINY, "local:/nowhere.pt"), "1", store=runtime.store
            )
        with pytest.raises(InvalidInput, match="dimension"):
            register(session, tiny, "1", store=runtime.store, dim=64)
        register(session, tiny, "1", store=runtime.store)
        with pytest.raises(Exception, match="already registered"):
            register(session, tiny, "1", store=runtime.store)


def test_newly_mined_figures_join_the_active_space(make_runtime: RuntimeFactory) -> None:
    runtime = make_runtime(queue={"embedded_queues": ["ingest", "mining", "embedding"]})
    tiny = ModelSpec(name="tiny", architecture="custom", config=TINY, source="random")
    with runtime.session() as session:
        version = register(session, tiny, "1", store=runtime.store)
        activate(session, runtime.dispatcher, version_id=version.id, space="default")
    assert isinstance(runtime.dispatcher, InProcessDispatcher) and runtime.dispatcher.wait_idle(120)
    assert _space(runtime).active_version_id == version.id
    with TestClient(create_app(runtime=runtime)) as client:
        sample = make_figure(9)
        accepted = upload(client, sample.image, caption=sample.caption).json()
    assert runtime.dispatcher.wait_idle(300)  # mined, then embedded by the task the miner sent
    with runtime.engine.connect() as conn:
        assert vectors.count(conn, version.id, "figure") == 1
        assert vectors.count(conn, version.id, "panel") == _items(runtime)["panel"] > 0
    assert embed_figures(runtime, [uuid.UUID(accepted["figure_id"])]) >= 1  # idempotent upsert
    with runtime.engine.connect() as conn:
        assert vectors.count(conn, version.id, "figure") == 1
