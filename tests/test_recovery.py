"""The durable-job framework and the recovery sweep on a real database: leases, one lifecycle,
observers, the sweep and its operator command (with a dry run), re-sending a stalled figure, and
the queue settings derived from the task limits."""

from __future__ import annotations

import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from typer.testing import CliRunner

from p2p.cli.main import app as cli_app
from p2p.ingest.app import create_app
from p2p.ingest.samples import make_figure
from p2p.mining.jobs import mine_job
from p2p.mining.tasks import get_miner
from p2p.shared import jobs
from p2p.shared.db.base import utcnow
from p2p.shared.db.models import Figure, FigureStatus, JobStatus, MiningJob, Panel
from p2p.shared.queue import celery_config, time_limits, visibility_timeout_s
from p2p.shared.recovery import recover
from p2p.shared.runtime import Runtime
from p2p.shared.settings import Settings, get_settings
from tests.conftest import RuntimeFactory
from tests.helpers import upload, wait_for


@pytest.fixture
def store_kind() -> str:
    return "local"


@pytest.fixture
def events(runtime: Runtime) -> list[jobs.JobEvent]:
    seen: list[jobs.JobEvent] = []
    runtime.job_observers.append(seen.append)
    return seen


def _ingest(runtime: Runtime, seed: int = 5) -> tuple[uuid.UUID, uuid.UUID]:
    sample = make_figure(seed, panel_size=(120, 96))
    with TestClient(create_app(runtime=runtime)) as client:
        body = upload(client, sample.image, caption=sample.caption, filename=sample.name).json()
    return uuid.UUID(body["figure_id"]), uuid.UUID(body["job_id"])


def _strand(runtime: Runtime, job_id: uuid.UUID, *, attempts: int = 1) -> None:
    """What a worker killed mid-job leaves: running, its lease run out, nobody holding the lock."""
    with runtime.session() as session:
        job = session.get(MiningJob, job_id)
        assert job is not None
        job.status, job.attempts = JobStatus.RUNNING, attempts
        job.lease_owner = "gone:1:1"
        job.lease_expires_at = utcnow() - timedelta(seconds=30)
        figure = session.get(Figure, job.figure_id)
        assert figure is not None
        figure.status = FigureStatus.MINING
        session.commit()


def _job(runtime: Runtime, job_id: uuid.UUID) -> MiningJob:
    with runtime.session() as session:
        job = session.get(MiningJob, job_id)
        assert job is not None
        session.expunge(job)
        return job


def test_a_mining_run_goes_through_the_one_lifecycle_and_tells_observers(
    runtime: Runtime, events: list[jobs.JobEvent]
) -> None:
    _, job_id = _ingest(runtime)
    outcome = mine_job(runtime, job_id, get_miner())
    assert outcome.status is JobStatus.SUCCEEDED
    job = _job(runtime, job_id)
    assert job.lease_owner is None and job.lease_expires_at is None and job.heartbeat_at is not None
    assert jobs.MINING.phase(job) is jobs.Phase.SUCCEEDED
    started, succeeded = [e for e in events if e.job_id == job_id]
    assert (started.event, succeeded.event) == ("started", "succeeded")
    assert started.kind == succeeded.kind == "mining" and started.attempt == 1
    assert started.queued_s is not None and started.queued_s >= 0
    assert succeeded.running_s is not None and succeeded.running_s > 0


def test_a_held_job_is_skipped_and_its_lease_is_renewed(
    runtime: Runtime, events: list[jobs.JobEvent]
) -> None:
    runtime.settings.queue.lease_s = 0.6  # heartbeats every 0.2 s
    _, job_id = _ingest(runtime)
    with jobs.claim(runtime, jobs.MINING, job_id) as lease:
        assert lease is not None
        first = _job(runtime, job_id).lease_expires_at
        assert mine_job(runtime, job_id, get_miner()).skipped == "locked"

        def renewed() -> bool:
            later = _job(runtime, job_id).lease_expires_at
            return later is not None and first is not None and later > first

        wait_for(renewed, 30, "a heartbeat")
    assert [e.event for e in events if e.job_id == job_id] == ["skipped"]
    assert _job(runtime, job_id).lease_owner is None


def test_the_sweep_requeues_a_stranded_job_once_and_a_dry_run_changes_nothing(
    runtime: Runtime, events: list[jobs.JobEvent]
) -> None:
    figure_id, job_id = _ingest(runtime)
    _strand(runtime, job_id)
    found = recover(runtime, dry_run=True)
    assert [(s.kind, s.job_id, s.action) for s in found] == [("mining", job_id, "requeue")]
    assert "lease expired" in found[0].reason
    assert _job(runtime, job_id).status is JobStatus.RUNNING  # the dry run changed nothing

    done = recover(runtime)
    assert [(s.job_id, s.action) for s in done] == [(job_id, "requeue")]
    job = _job(runtime, job_id)
    assert job.status is JobStatus.QUEUED and job.lease_owner is None
    with runtime.session() as session:
        assert session.get(Figure, figure_id).status is FigureStatus.QUEUED  # type: ignore[union-attr]
    assert recover(runtime) == []  # idempotent: nothing left to do
    assert "requeued" in [e.event for e in events]

    # the re-queued job mines once; a re-delivery afterwards adds nothing
    mine_job(runtime, job_id, get_miner())
    with runtime.session() as session:
        panels = session.scalar(select(func.count()).select_from(Panel))
    assert mine_job(runtime, job_id, get_miner()).skipped == "already mined"
    with runtime.session() as session:
        assert session.scalar(select(func.count()).select_from(Panel)) == panels
        assert session.scalar(select(func.count()).select_from(MiningJob)) == 1


def test_a_job_whose_worker_died_too_often_is_failed_with_the_reason(runtime: Runtime) -> None:
    figure_id, job_id = _ingest(runtime)
    _strand(runtime, job_id, attempts=runtime.settings.queue.max_attempts)
    (stuck,) = recover(runtime)
    assert stuck.action == "fail" and stuck.done
    job = _job(runtime, job_id)
    assert job.status is JobStatus.FAILED and "worker was lost" in (job.error or "")
    with runtime.session() as session:
        assert session.get(Figure, figure_id).status is FigureStatus.FAILED  # type: ignore[union-attr]


def test_sending_a_figure_again_requeues_its_stalled_job(runtime: Runtime) -> None:
    sample = make_figure(6, panel_size=(120, 96))
    with TestClient(create_app(runtime=runtime)) as client:
        first = upload(client, sample.image, caption=sample.caption, filename=sample.name).json()
        job_id = uuid.UUID(first["job_id"])
        _strand(runtime, job_id)
        again = upload(client, sample.image, caption=sample.caption, filename=sample.name)
    assert again.status_code == 200 and again.json()["duplicate"], again.text
    job = _job(runtime, job_id)
    assert job.status is JobStatus.QUEUED and job.lease_owner is None


def test_p2p_recover_lists_with_a_dry_run_then_recovers(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch, pg_url: str, tmp_path: Path
) -> None:
    _, job_id = _ingest(runtime)
    _strand(runtime, job_id)
    monkeypatch.setenv("P2P_DB__URL", pg_url)
    monkeypatch.setenv("P2P_DATA_DIR", str(tmp_path / "cli-data"))
    monkeypatch.setenv("P2P_QUEUE__EMBEDDED_QUEUES", "[]")
    get_settings.cache_clear()
    try:
        runner = CliRunner()
        listed = runner.invoke(cli_app, ["recover", "--dry-run"])
        assert listed.exit_code == 0, listed.output
        assert "mining" in listed.output and str(job_id)[:8] in listed.output
        assert _job(runtime, job_id).status is JobStatus.RUNNING
        recovered = runner.invoke(cli_app, ["recover", "--kind", "mining"])
        assert recovered.exit_code == 0, recovered.output
        assert _job(runtime, job_id).status is JobStatus.QUEUED
        assert "nothing stuck" in runner.invoke(cli_app, ["recover"]).output
        assert runner.invoke(cli_app, ["recover", "--kind", "nope"]).exit_code != 0
    finally:
        get_settings.cache_clear()


def test_embedded_start_up_sends_again_what_a_killed_process_left(make_runtime: RuntimeFactory) -> None:
    """The embedded queue is process memory: jobs queued or running there when the process died
    are sent again when the next one starts."""
    quiet = make_runtime(queue={"embedded_queues": [], "recover_on_start": False})
    _, job_id = _ingest(quiet)
    _strand(quiet, job_id)
    mining = make_runtime(queue={"embedded_queues": ["ingest", "mining"]})
    with TestClient(create_app(runtime=mining)):
        wait_for(lambda: _job(mining, job_id).status is JobStatus.SUCCEEDED, 300, "the job to be mined")
    assert _job(mining, job_id).attempts == 2


def test_queue_settings_follow_the_task_limits() -> None:
    settings = Settings(queue={"time_limits_s": {"mining": (50, 60), "ingest": (100, 120)}})
    assert visibility_timeout_s(settings) == 120 + 300
    assert time_limits(settings, "mining") == {"soft_time_limit": 50, "time_limit": 60}
    assert time_limits(settings, "other") == {}
    config: dict[str, Any] = celery_config(settings)
    assert config["broker_transport_options"]["visibility_timeout"] == 420
    assert config["worker_max_memory_per_child"] == settings.queue.worker_max_memory_mb * 1024
    assert celery_config(Settings(queue={"visibility_timeout_s": 900}))["broker_transport_options"] == {
        "visibility_timeout": 900
    }


def test_every_kind_maps_its_statuses_onto_one_vocabulary() -> None:
    from p2p.shared.db.models import Batch, BatchStatus, ModelStatus, ModelVersion, TrainingRun
    from p2p.shared.db.models import TrainingRunStatus as T

    assert set(jobs.KINDS) == {"ingest_batch", "mining", "reindex", "training"}
    phase = jobs.Phase
    assert jobs.INGEST_BATCH.phase(Batch(status=BatchStatus.COMPLETED_WITH_ERRORS)) is phase.SUCCEEDED
    assert jobs.INGEST_BATCH.phase(Batch(status=BatchStatus.RUNNING)) is phase.RUNNING
    assert [jobs.TRAINING.phase(TrainingRun(status=s)) for s in (T.QUEUED, T.TRAINING, T.CANCELLED)] == [
        phase.QUEUED,
        phase.RUNNING,
        phase.CANCELLED,
    ]
    assert jobs.REINDEX.phase(ModelVersion(status=ModelStatus.INDEXING)) is phase.QUEUED
    assert jobs.REINDEX.phase(ModelVersion(status=ModelStatus.INDEXING, lease_owner="w:1:1")) is phase.RUNNING
    assert jobs.REINDEX.phase(ModelVersion(status=ModelStatus.READY)) is phase.SUCCEEDED
    keys = {kind.lock_key(uuid.UUID(int=7)) for kind in jobs.KINDS.values()}
    assert len(keys) == 4  # one id under two kinds never shares a lock


def test_an_upload_the_broker_refused_is_completed_by_sending_it_again(make_runtime: RuntimeFactory) -> None:
    import io
    import tarfile

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in (
            ("0001.png", make_figure(7, panel_size=(80, 64)).image),
            ("0001.txt", b"Figure 1."),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    shard = buffer.getvalue()
    files = {"file": ("s.tar", shard)}
    down = make_runtime(redis={"url": "redis://127.0.0.1:1/0"})  # a broker that is not there
    with TestClient(create_app(runtime=down)) as client:
        refused = client.post("/v1/batches/upload", data={"kind": "webdataset"}, files=files)
    assert refused.status_code == 503 and refused.json()["error"]["type"] == "broker_unavailable"
    location = refused.headers["location"]
    assert location.split("/")[-1] in refused.json()["error"]["message"]
    up = make_runtime()
    with TestClient(create_app(runtime=up)) as client:
        again = client.post("/v1/batches/upload", data={"kind": "webdataset"}, files=files)
        assert again.status_code == 202 and again.headers["location"] == location
        wait_for(lambda: client.get(location).json()["status"] == "succeeded", 60, "the batch to end")
        assert client.get(location).json()["ingested"] == 1


def test_a_job_that_finished_while_the_sweep_looked_counts_as_nothing_sent(runtime: Runtime) -> None:
    """The sweep reads a running job's row, then its lock: a job that finished in between looks
    ownerless, is found, and then nothing is sent; the sweep's log counts only what it did."""
    from p2p.shared.recovery import _done, _recover_one, find_stuck

    _, job_id = _ingest(runtime)
    with runtime.session() as session:  # running under a live lease, its lock free: "worker gone"
        job = session.get(MiningJob, job_id)
        assert job is not None
        job.status, job.lease_owner = JobStatus.RUNNING, "w:1:1"
        job.lease_expires_at = utcnow() + timedelta(seconds=60)
        session.commit()
    (found,) = find_stuck(runtime)
    assert found.action == "requeue" and "lock free" in found.reason
    with runtime.session() as session:  # ...and it finishes before the sweep acts
        job = session.get(MiningJob, job_id)
        assert job is not None
        job.status, job.lease_owner, job.lease_expires_at = JobStatus.SUCCEEDED, None, None
        session.commit()
    acted = _recover_one(runtime, found)
    assert not acted.done and _done([acted]) == 0
    assert _job(runtime, job_id).status is JobStatus.SUCCEEDED
