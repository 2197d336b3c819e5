"""LVLM mining jobs end to end: Postgres rows, cost and prompt versions on the job, the
mining-lvlm queue, and a model server that is down or dies mid-figure (the job is never left
"running" and the figure is never lost)."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient
from sqlalchemy import select

from p2p.ingest.app import create_app
from p2p.mining.costs import aggregate_costs
from p2p.mining.jobs import mine_job
from p2p.mining.lvlm.client import LvlmUnavailable
from p2p.mining.lvlm.miner import LvlmMiner
from p2p.mining.pipeline import CpuMiner
from p2p.shared.db.models import Figure, FigureStatus, JobStatus, MiningJob, Panel, Region
from p2p.shared.queue import MINE_FIGURE_TASK, MINING_LVLM_QUEUE, MINING_QUEUE
from p2p.shared.runtime import Runtime
from tests.conftest import RuntimeFactory
from tests.helpers import job_row_counts, upload
from tests.lvlm_fixtures import lvlm_settings
from tests.lvlm_sim import SimServer

FIGURE = "synth_00000.jpg"  # labelled a-j, micrographs with markers

pytestmark = pytest.mark.parametrize("store_kind", ["local"], indirect=True)


@pytest.fixture
def lvlm_runtime(make_runtime: RuntimeFactory, sim: SimServer) -> Runtime:
    # The mining-lvlm queue is not served in-process: each test runs the job by hand.
    return make_runtime(mining={"backend": "lvlm", "lvlm": {"base_url": sim.url}})


@pytest.fixture
def paper_miner(sim: SimServer, cpu_miner: CpuMiner) -> Iterator[LvlmMiner]:
    miner = LvlmMiner(lvlm_settings(sim, mode="paper", views=3, max_retries=1), cpu=cpu_miner)
    yield miner
    miner.close()


def _ingest(runtime: Runtime, folder: Path, entries: dict[str, Any], name: str = FIGURE) -> tuple[str, str]:
    with TestClient(create_app(runtime=runtime)) as client:
        data = (folder / name).read_bytes()
        accepted = upload(client, data, caption=entries[name]["caption"], filename=name).json()
    return accepted["figure_id"], accepted["job_id"]


def _job(runtime: Runtime, job_id: str) -> MiningJob:
    with runtime.session() as session:
        job = session.get(MiningJob, uuid.UUID(job_id))
        assert job is not None
        session.expunge(job)
        return job


def test_an_lvlm_job_stores_the_hierarchy_with_its_cost_and_prompt_versions(
    lvlm_runtime: Runtime,
    paper_miner: LvlmMiner,
    sim: SimServer,
    lvlm_dataset: Path,
    lvlm_entries: dict[str, Any],
) -> None:
    figure_id, job_id = _ingest(lvlm_runtime, lvlm_dataset, lvlm_entries)
    queued = _job(lvlm_runtime, job_id)
    assert (queued.backend, queued.status) == ("lvlm", JobStatus.QUEUED)

    outcome = mine_job(lvlm_runtime, uuid.UUID(job_id), paper_miner)
    assert outcome.status is JobStatus.SUCCEEDED
    job = _job(lvlm_runtime, job_id)
    assert job.prompt_version == paper_miner.prompt_version and job.prompt_version.startswith("prompts-")
    assert job.params["mode"] == "paper" and job.params["prompts"]["panels"].startswith("panels@1+")
    assert job.cost["requests"] == sim.stats.total_requests > 0
    assert job.cost["prompt_tokens"] == sim.stats.prompt_tokens
    assert set(job.cost["stages"]) >= {"panels", "markers", "objects", "describe"}
    assert job.cost["outcomes"]["panels"] == "lvlm"
    with lvlm_runtime.session() as session:
        panels = list(session.scalars(select(Panel).where(Panel.mining_job_id == uuid.UUID(job_id))))
        regions = list(
            session.scalars(select(Region).join(Panel).where(Panel.mining_job_id == uuid.UUID(job_id)))
        )
        figure = session.get(Figure, uuid.UUID(figure_id))
        assert figure is not None and figure.status is FigureStatus.MINED
    assert len(panels) == len(lvlm_entries[FIGURE]["panels"])
    assert all(p.description and p.subcaption for p in panels)
    assert all(p.provenance["backend"] == "lvlm" and p.provenance["mode"] == "paper" for p in panels)
    assert regions and all(r.description for r in regions) and any(r.caption_text for r in regions)
    with lvlm_runtime.session() as session:
        (row,) = aggregate_costs(session, backend="lvlm")
    assert row["figures"] == 1 and row["per_figure"]["requests"] == job.cost["requests"]
    assert row["stages"]["panels"]["requests"] == 3


def test_a_server_down_sends_the_job_back_to_the_queue_and_the_last_attempt_uses_the_cpu(
    lvlm_runtime: Runtime,
    paper_miner: LvlmMiner,
    cpu_miner: CpuMiner,
    sim: SimServer,
    lvlm_dataset: Path,
    lvlm_entries: dict[str, Any],
) -> None:
    figure_id, job_id = _ingest(lvlm_runtime, lvlm_dataset, lvlm_entries)
    sim.faults.down = True
    with pytest.raises(LvlmUnavailable):
        mine_job(lvlm_runtime, uuid.UUID(job_id), paper_miner)
    job = _job(lvlm_runtime, job_id)
    assert job.status is JobStatus.QUEUED and "model server unavailable" in (job.error or "")
    assert job_row_counts(lvlm_runtime, job_id) == (0, 0)
    with lvlm_runtime.session() as session:
        figure = session.get(Figure, uuid.UUID(figure_id))
        assert figure is not None and figure.status is FigureStatus.QUEUED

    outcome = mine_job(lvlm_runtime, uuid.UUID(job_id), paper_miner, fallback=cpu_miner)
    assert outcome.status is JobStatus.SUCCEEDED
    job = _job(lvlm_runtime, job_id)
    assert any("mined with the CPU backend" in note for note in job.notes)
    assert job.params["miner_version"] == cpu_miner.version
    assert job_row_counts(lvlm_runtime, job_id)[0] >= 1


def test_a_server_dying_mid_figure_leaves_no_rows_and_a_rerun_completes_once(
    lvlm_runtime: Runtime,
    paper_miner: LvlmMiner,
    sim: SimServer,
    lvlm_dataset: Path,
    lvlm_entries: dict[str, Any],
) -> None:
    _, job_id = _ingest(lvlm_runtime, lvlm_dataset, lvlm_entries)
    sim.faults.die_after = 5
    with pytest.raises(LvlmUnavailable):
        mine_job(lvlm_runtime, uuid.UUID(job_id), paper_miner)
    assert _job(lvlm_runtime, job_id).status is JobStatus.QUEUED
    assert job_row_counts(lvlm_runtime, job_id) == (0, 0)

    sim.revive()
    paper_miner.client._healthy_until = 0.0
    assert mine_job(lvlm_runtime, uuid.UUID(job_id), paper_miner).status is JobStatus.SUCCEEDED
    first = job_row_counts(lvlm_runtime, job_id)
    assert first[0] == len(lvlm_entries[FIGURE]["panels"])
    with lvlm_runtime.session() as session:  # a forced re-run replaces, never adds
        job = session.get(MiningJob, uuid.UUID(job_id))
        assert job is not None
        job.status = JobStatus.QUEUED
        session.commit()
    mine_job(lvlm_runtime, uuid.UUID(job_id), paper_miner)
    assert job_row_counts(lvlm_runtime, job_id) == first
    assert _job(lvlm_runtime, job_id).attempts == 3


def test_the_task_retries_while_the_server_is_down_and_falls_back_on_its_last_retry(
    lvlm_runtime: Runtime,
    paper_miner: LvlmMiner,
    cpu_miner: CpuMiner,
    sim: SimServer,
    lvlm_dataset: Path,
    lvlm_entries: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from p2p.mining import tasks
    from p2p.shared.queue import celery_app

    monkeypatch.setattr(tasks, "_miners", {"cpu": cpu_miner, "lvlm": paper_miner})
    _, job_id = _ingest(lvlm_runtime, lvlm_dataset, lvlm_entries)
    sim.faults.down = True
    task = celery_app.tasks[MINE_FIGURE_TASK]
    # Run eagerly, each retry runs at once: every attempt but the last is refused by the health
    # check before any work; the last mines the figure with the CPU backend.
    result = task.apply(args=[job_id])
    assert result.successful()
    assert sim.stats.total_requests == 0  # no completion was ever attempted
    job = _job(lvlm_runtime, job_id)
    assert job.status is JobStatus.SUCCEEDED and job.attempts == 1
    assert any("mined with the CPU backend" in note for note in job.notes)


def test_ingest_puts_lvlm_jobs_on_their_own_queue(
    make_runtime: RuntimeFactory,
    redis_url: str,
    sim: SimServer,
    lvlm_dataset: Path,
    lvlm_entries: dict[str, Any],
) -> None:
    client = redis.Redis.from_url(redis_url)
    client.delete(MINING_QUEUE, MINING_LVLM_QUEUE)
    runtime = make_runtime(
        redis={"url": redis_url}, mining={"backend": "lvlm", "lvlm": {"base_url": sim.url}}
    )
    try:
        _, job_id = _ingest(runtime, lvlm_dataset, lvlm_entries)
        assert client.llen(MINING_QUEUE) == 0
        (message,) = client.lrange(MINING_LVLM_QUEUE, 0, -1)
        body = json.loads(message)
        assert body["headers"]["task"] == MINE_FIGURE_TASK
        assert json.loads(base64.b64decode(body["body"]))[0] == [job_id]
    finally:
        client.delete(MINING_QUEUE, MINING_LVLM_QUEUE)
