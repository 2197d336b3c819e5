"""Miner versions: recorded on jobs and in provenance, shown by the APIs and `p2p status`, and the
re-mining of what an older version produced (`p2p mine --stale`), on the real database and queue."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, select, update
from typer.testing import CliRunner

from p2p.cli import app
from p2p.embedding_api import service as embedding_service
from p2p.ingest.app import create_app
from p2p.ingest.samples import make_figure
from p2p.mining import remine
from p2p.mining.jobs import mine_job
from p2p.mining.tasks import get_miner
from p2p.shared.db.models import Figure, FigureStatus, JobStatus, MiningJob, Panel, Region
from p2p.shared.queue import CeleryDispatcher, InProcessDispatcher, celery_app
from p2p.shared.runtime import Runtime
from p2p.shared.settings import get_settings
from p2p.shared.storage import put_bytes
from tests.conftest import RuntimeFactory
from tests.helpers import upload

INGEST_AND_MINING = {"queue": {"embedded_queues": ["ingest", "mining"]}}
OLD = "cpu-0-older"


@pytest.fixture
def mining_runtime(make_runtime: RuntimeFactory) -> Runtime:
    return make_runtime(**INGEST_AND_MINING)


@pytest.fixture
def mining_client(mining_runtime: Runtime) -> Iterator[TestClient]:
    with TestClient(create_app(runtime=mining_runtime)) as client:
        yield client


def _idle(runtime: Runtime) -> None:
    assert isinstance(runtime.dispatcher, InProcessDispatcher)
    assert runtime.dispatcher.wait_idle(120)


def _mine(client: TestClient, runtime: Runtime, seeds: list[int]) -> list[dict[str, str]]:
    accepted = []
    for seed in seeds:
        sample = make_figure(seed)
        accepted.append(upload(client, sample.image, caption=sample.caption, filename=sample.name).json())
    _idle(runtime)
    return accepted


def _as_if_mined_by(runtime: Runtime, version: str) -> None:
    """Every standing job's rows become those of miner ``version`` (an older release, say)."""
    with runtime.session() as session:
        session.execute(update(MiningJob).values(miner_version=version))
        session.commit()


def _panel_ids(runtime: Runtime, figure_id: str) -> set[uuid.UUID]:
    with runtime.session() as session:
        return set(session.scalars(select(Panel.id).where(Panel.figure_id == uuid.UUID(figure_id))))


@pytest.mark.parametrize("store_kind", ["local"], indirect=True)
def test_the_miner_version_is_on_the_job_the_provenance_and_both_figure_views(
    mining_client: TestClient, mining_runtime: Runtime
) -> None:
    version = get_miner().version
    (accepted,) = _mine(mining_client, mining_runtime, [3])
    job = mining_client.get(f"/v1/jobs/{accepted['job_id']}").json()
    assert job["status"] == "succeeded" and job["miner_version"] == version
    assert job["superseded_by_id"] is None
    figure = mining_client.get(f"/v1/figures/{accepted['figure_id']}").json()
    assert figure["miner_version"] == version
    assert figure["panels"] and all(p["provenance"]["miner_version"] == version for p in figure["panels"])
    regions = [r for p in figure["panels"] for r in p["regions"]]
    assert regions and all(r["provenance"]["miner_version"] == version for r in regions)
    listed = mining_client.get("/v1/figures").json()
    assert [f["miner_version"] for f in listed] == [version]
    with mining_runtime.session() as session:
        detail = embedding_service.figure_detail(session, uuid.UUID(accepted["figure_id"]))
    assert detail.miner_version == version

    # Before a miner takes it, a job has no version and the figure shows none.
    with mining_runtime.session() as session:
        fresh = Figure(
            image_sha256="f" * 64, caption_sha256="c" * 64, object_key="figures/none", byte_size=1,
            width=4, height=4, format="PNG", source="test",
        )  # fmt: skip
        session.add(fresh)
        session.flush()
        session.add(MiningJob(figure_id=fresh.id, backend="cpu", status=JobStatus.QUEUED))
        session.commit()
        fresh_id = fresh.id
    assert mining_client.get(f"/v1/figures/{fresh_id}").json()["miner_version"] is None


@pytest.mark.parametrize("store_kind", ["local"], indirect=True)
def test_stale_figures_are_remined_through_the_queue_and_replace_the_old_rows(
    mining_client: TestClient, mining_runtime: Runtime
) -> None:
    version = get_miner().version
    accepted = _mine(mining_client, mining_runtime, [4, 5])
    _as_if_mined_by(mining_runtime, OLD)
    old_panels = {a["figure_id"]: _panel_ids(mining_runtime, a["figure_id"]) for a in accepted}
    with mining_runtime.session() as session:
        assert remine.count_stale(session, backend="cpu", version=version) == {OLD: 2}
        assert remine.figures_per_version(session) == [("cpu", OLD, 2)]

    queued = remine.queue_remine(mining_runtime, backend="cpu", version=version)
    assert len(queued.job_ids) == 2 and queued.not_sent == 0
    _idle(mining_runtime)

    with mining_runtime.session() as session:
        assert remine.progress(session, queued.job_ids) == {JobStatus.SUCCEEDED: 2}
        assert remine.figures_per_version(session) == [("cpu", version, 2)]
        assert remine.count_stale(session, backend="cpu", version=version) == {}
        for a in accepted:
            old_job = session.get(MiningJob, uuid.UUID(a["job_id"]))
            assert old_job is not None and old_job.superseded_by_id in queued.job_ids
            assert old_job.status is JobStatus.SUCCEEDED  # its costs and timings stay on record
    for a in accepted:
        new_panels = _panel_ids(mining_runtime, a["figure_id"])
        assert new_panels and not (new_panels & old_panels[a["figure_id"]])
        figure = mining_client.get(f"/v1/figures/{a['figure_id']}").json()
        assert figure["status"] == "mined" and figure["miner_version"] == version
        assert {p["provenance"]["job_id"] for p in figure["panels"]} <= {str(j) for j in queued.job_ids}
    # The same upload again is a duplicate of the standing (new) job, not a third one.
    sample = make_figure(4)
    again = upload(mining_client, sample.image, caption=sample.caption, filename=sample.name).json()
    assert again["duplicate"] and uuid.UUID(again["job_id"]) in queued.job_ids


@pytest.mark.parametrize("store_kind", ["local"], indirect=True)
def test_queueing_twice_before_the_workers_run_makes_one_job_per_figure(
    mining_client: TestClient, mining_runtime: Runtime, make_runtime: RuntimeFactory
) -> None:
    version = get_miner().version
    (accepted,) = _mine(mining_client, mining_runtime, [6])
    _as_if_mined_by(mining_runtime, OLD)
    no_workers = make_runtime(queue={"embedded_queues": ["ingest"]})
    first = remine.queue_remine(no_workers, backend="cpu", version=version)
    second = remine.queue_remine(no_workers, backend="cpu", version=version)
    assert first.job_ids == second.job_ids and first.not_sent == 1
    with no_workers.session() as session:
        jobs = list(
            session.scalars(select(MiningJob).where(MiningJob.figure_id == uuid.UUID(accepted["figure_id"])))
        )
    assert sorted((j.miner_version, j.status) for j in jobs) == [
        (OLD, JobStatus.SUCCEEDED),
        (version, JobStatus.QUEUED),
    ]
    # Until it runs, the figure shows the old results.
    figure = mining_client.get(f"/v1/figures/{accepted['figure_id']}").json()
    assert figure["status"] == "mined" and figure["miner_version"] == OLD and figure["panels"]


@pytest.mark.parametrize("store_kind", ["local"], indirect=True)
def test_a_failed_remine_keeps_the_old_results(mining_client: TestClient, mining_runtime: Runtime) -> None:
    version = get_miner().version
    (accepted,) = _mine(mining_client, mining_runtime, [7])
    _as_if_mined_by(mining_runtime, OLD)
    before = _panel_ids(mining_runtime, accepted["figure_id"])
    with mining_runtime.session() as session:
        figure = session.get(Figure, uuid.UUID(accepted["figure_id"]))
        assert figure is not None
        put_bytes(mining_runtime.store, figure.object_key, b"no longer an image", "image/png")
    queued = remine.queue_remine(mining_runtime, backend="cpu", version=version)
    _idle(mining_runtime)
    with mining_runtime.session() as session:
        (job_id,) = queued.job_ids
        job = session.get(MiningJob, job_id)
        assert job is not None and job.status is JobStatus.FAILED and "cannot be decoded" in (job.error or "")
        old = session.get(MiningJob, uuid.UUID(accepted["job_id"]))
        assert old is not None and old.superseded_by_id is None
        assert remine.figures_per_version(session) == [("cpu", OLD, 1)]
    assert _panel_ids(mining_runtime, accepted["figure_id"]) == before
    figure_view = mining_client.get(f"/v1/figures/{accepted['figure_id']}").json()
    assert figure_view["status"] == "mined" and figure_view["miner_version"] == OLD


@pytest.mark.parametrize("store_kind", ["local"], indirect=True)
def test_a_job_for_another_miner_version_fails_with_the_reason(
    mining_client: TestClient, mining_runtime: Runtime
) -> None:
    (accepted,) = _mine(mining_client, mining_runtime, [8])
    before = _panel_ids(mining_runtime, accepted["figure_id"])
    with mining_runtime.session() as session:
        job = MiningJob(
            figure_id=uuid.UUID(accepted["figure_id"]),
            backend="cpu",
            miner_version="cpu-999",
            status=JobStatus.QUEUED,
        )
        session.add(job)
        session.commit()
        job_id = job.id
    outcome = mine_job(mining_runtime, job_id, get_miner())
    assert outcome.status is JobStatus.FAILED
    with mining_runtime.session() as session:
        job = session.get(MiningJob, job_id)
        assert job is not None and "cpu-999" in (job.error or "") and get_miner().version in (job.error or "")
        assert session.get(Figure, uuid.UUID(accepted["figure_id"])).status is FigureStatus.MINED  # type: ignore[union-attr]
    assert _panel_ids(mining_runtime, accepted["figure_id"]) == before


runner = CliRunner()


def said(result) -> str:  # type: ignore[no-untyped-def]
    return " ".join(result.output.split())


@pytest.mark.parametrize("store_kind", ["local"], indirect=True)
def test_p2p_status_and_mine_stale(
    mining_client: TestClient,
    mining_runtime: Runtime,
    monkeypatch: pytest.MonkeyPatch,
    pg_url: str,
    tmp_path: Path,
    db: Engine,
) -> None:
    version = get_miner().version
    accepted = _mine(mining_client, mining_runtime, [9, 10])
    _as_if_mined_by(mining_runtime, OLD)
    monkeypatch.setenv("P2P_DB__URL", pg_url)
    monkeypatch.setenv("P2P_DATA_DIR", str(mining_runtime.settings.data_dir))
    monkeypatch.setenv("P2P_QUEUE__EMBEDDED_QUEUES", '["ingest", "mining"]')
    get_settings.cache_clear()
    try:
        status = runner.invoke(app, ["status"])
        assert status.exit_code == 0, status.output
        assert f"figures mined by cpu {OLD} │ 2 │" in said(status)

        unsaid = runner.invoke(app, ["mine"])
        assert unsaid.exit_code == 2 and "--stale" in said(unsaid)

        dry = runner.invoke(app, ["mine", "--stale", "--dry-run"])
        assert dry.exit_code == 0, dry.output
        assert OLD in said(dry) and version in said(dry)
        with mining_runtime.session() as session:
            assert remine.figures_per_version(session) == [("cpu", OLD, 2)]  # a dry run queues nothing

        declined = runner.invoke(app, ["mine", "--stale"], input="n\n")
        assert declined.exit_code == 1
        with mining_runtime.session() as session:
            assert session.scalar(select(MiningJob).where(MiningJob.miner_version == version)) is None

        done = runner.invoke(app, ["mine", "--stale", "--yes"])
        assert done.exit_code == 0, done.output
        assert "queued 2 mining jobs" in said(done)
        after = runner.invoke(app, ["status"])
        assert f"figures mined by cpu {version} │ 2 │" in said(after) and OLD not in said(after)
        nothing = runner.invoke(app, ["mine", "--stale", "--yes"])
        assert nothing.exit_code == 0 and "nothing to re-mine" in said(nothing)
    finally:
        get_settings.cache_clear()
    with mining_runtime.session() as session:
        regions = session.scalars(
            select(Region).join(Panel).where(Panel.figure_id == uuid.UUID(accepted[0]["figure_id"]))
        )
        assert all(r.provenance["miner_version"] == version for r in regions)


@pytest.mark.parametrize("store_kind", ["local"], indirect=True)
def test_a_dead_broker_leaves_the_jobs_to_the_next_run(
    mining_client: TestClient, mining_runtime: Runtime
) -> None:
    version = get_miner().version
    _mine(mining_client, mining_runtime, [11])
    _as_if_mined_by(mining_runtime, OLD)
    live = mining_runtime.dispatcher
    mining_runtime.dispatcher = CeleryDispatcher(celery_app, "redis://127.0.0.1:1/0")
    try:
        failed = remine.queue_remine(mining_runtime, backend="cpu", version=version)
    finally:
        mining_runtime.dispatcher.close()
        mining_runtime.dispatcher = live
    assert failed.error is not None and failed.not_sent == 1
    (job_id,) = failed.job_ids
    with mining_runtime.session() as session:
        job = session.get(MiningJob, job_id)
        assert job is not None and job.status is JobStatus.QUEUED and job.enqueued_at is None
    again = remine.queue_remine(mining_runtime, backend="cpu", version=version)
    assert again.job_ids == [job_id] and again.error is None
    _idle(mining_runtime)
    with mining_runtime.session() as session:
        assert remine.figures_per_version(session) == [("cpu", version, 1)]
