"""Faults against real servers: Celery workers killed with kill -9 (the whole process group) in
the middle of their work, Redis killed and restarted (persistence on and off), PostgreSQL killed
and restarted. Each test waits for recovery and then counts: every figure mined exactly once, every
batch ended, no job left queued or running.

Leases, sweeps and re-send delays are set short by the tests; nothing asserts on wall-clock time
(waits are for conditions, with generous timeouts); the measured recovery times are printed.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis as redis_lib
from fastapi.testclient import TestClient
from sqlalchemy import Engine, func, select

from p2p.ingest.app import create_app
from p2p.ingest.samples import make_figure, write_manifest_folder
from p2p.shared.db import migrate
from p2p.shared.db.engine import make_engine
from p2p.shared.db.models import Batch, BatchStatus, Figure, JobStatus, MiningJob, Panel
from p2p.shared.embedded import EmbeddedPostgres
from p2p.shared.runtime import Runtime, build_runtime, set_process_runtime
from p2p.shared.settings import Settings
from tests.helpers import upload, wait_for
from tests.servers import free_port

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server")

RECOVERY_TIMEOUT_S = 600.0  # generous: the machine is shared; the measured times are printed
FAST_RECOVERY = {
    "P2P_QUEUE__LEASE_S": "3",
    "P2P_QUEUE__SWEEP_INTERVAL_S": "1",
    "P2P_QUEUE__REQUEUE_AFTER_S": "8",
    # Far beyond the test: recovery must come from leases and the sweep, not from Redis.
    "P2P_QUEUE__VISIBILITY_TIMEOUT_S": "3600",
}


class OwnRedis:
    """A redis-server this test starts, kills and restarts on the same port and folder."""

    def __init__(self, folder: Path, *, persistent: bool) -> None:
        self.folder, self.persistent, self.port = folder, persistent, free_port()
        folder.mkdir(parents=True, exist_ok=True)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> OwnRedis:
        persistence = ["--appendonly", "yes", "--appendfsync", "always"] if self.persistent else []
        self.proc = subprocess.Popen(
            ["redis-server", "--bind", "127.0.0.1", "--port", str(self.port), "--save", "",
             "--dir", str(self.folder), *persistence],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        wait_for(lambda: _redis_answers(self.port), 30, "redis-server to start")
        return self

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.kill()


def _redis_answers(port: int) -> bool:
    try:
        return bool(redis_lib.Redis(host="127.0.0.1", port=port, socket_connect_timeout=1).ping())
    except redis_lib.exceptions.ConnectionError:
        return False


@dataclass
class Worker:
    """A real `celery worker` in a process group of its own (its pool children included)."""

    queues: str
    env: dict[str, str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    _out: Any = field(default=None, repr=False)

    def start(self) -> Worker:
        self._out = self.log.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "p2p.apps.worker:celery_app", "worker",
             "-Q", self.queues, "--concurrency=1", "--loglevel=INFO", "-n", f"w{uuid.uuid4().hex[:6]}@%h",
             "--without-gossip", "--without-mingle", "--without-heartbeat"],
            env=self.env, stdout=self._out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        return self

    def kill_group(self) -> None:
        """kill -9 of the main process and its pool children, as an OOM or container kill does."""
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        if self._out is not None:
            self._out.close()


@dataclass
class Stack:
    settings: Settings
    runtime: Runtime
    env: dict[str, str]
    folder: Path
    workers: list[Worker] = field(default_factory=list)

    def worker(self, queues: str) -> Worker:
        worker = Worker(queues, self.env, self.folder / "workers.log").start()
        self.workers.append(worker)
        return worker

    def client(self) -> TestClient:
        return TestClient(create_app(runtime=self.runtime))


@pytest.fixture
def make_stack(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Callable[..., Stack]]:
    built: list[Stack] = []

    def factory(
        *, db_url: str, redis_url: str, time_limits: dict[str, tuple[int, int]] | None = None
    ) -> Stack:
        env = {
            **os.environ,
            "P2P_PROFILE": "embedded",
            "P2P_DATA_DIR": str(tmp_path / "data"),
            "P2P_DB__URL": db_url,
            "P2P_REDIS__URL": redis_url,
            "P2P_INGEST__BATCH_ROOTS": json.dumps([str(tmp_path / "sources")]),
            "P2P_MINING__TORCH_THREADS": "1",
            **FAST_RECOVERY,
            **({"P2P_QUEUE__TIME_LIMITS_S": json.dumps(time_limits)} if time_limits else {}),
        }
        env.pop("P2P_S3__ENDPOINT", None)
        settings = Settings(
            profile="embedded",
            data_dir=tmp_path / "data",
            db={"url": db_url},
            redis={"url": redis_url},
            ingest={"batch_roots": [tmp_path / "sources"]},
            queue={
                "lease_s": 3,
                "sweep_interval_s": 1,
                "requeue_after_s": 8,
                "visibility_timeout_s": 3600,
                **({"time_limits_s": time_limits} if time_limits else {}),
            },
        )
        runtime = build_runtime(settings)
        set_process_runtime(runtime)
        stack = Stack(settings, runtime, env, tmp_path)
        built.append(stack)
        return stack

    yield factory
    set_process_runtime(None)
    for stack in built:
        for worker in stack.workers:
            worker.stop()
        stack.runtime.close()


def _figures_mined_exactly_once(engine: Engine, expected: int) -> dict[str, Any]:
    """Every figure has one mining job, succeeded, whose panels are one run's (no duplicates)."""
    with engine.connect() as conn:
        figures = conn.scalar(select(func.count()).select_from(Figure))
        jobs = conn.execute(select(MiningJob.figure_id, MiningJob.status, MiningJob.attempts)).all()
        duplicated_panels = conn.execute(
            select(Panel.mining_job_id, Panel.ordinal)
            .group_by(Panel.mining_job_id, Panel.ordinal)
            .having(func.count() > 1)
        ).all()
        panels_by_job = dict(
            conn.execute(select(Panel.mining_job_id, func.count()).group_by(Panel.mining_job_id)).all()
        )
        job_ids = list(conn.scalars(select(MiningJob.id)))
    assert figures == expected, figures
    assert len(jobs) == expected and len({figure for figure, _, _ in jobs}) == expected, jobs
    assert all(status is JobStatus.SUCCEEDED for _, status, _ in jobs), jobs
    assert not duplicated_panels, duplicated_panels
    assert all(panels_by_job.get(job_id, 0) >= 1 for job_id in job_ids), panels_by_job
    return {"attempts": sorted(attempts for _, _, attempts in jobs)}


def _all_mined(engine: Engine, expected: int) -> bool:
    with engine.connect() as conn:
        done = conn.scalar(
            select(func.count()).select_from(MiningJob).where(MiningJob.status == JobStatus.SUCCEEDED)
        )
    return done == expected


def _nothing_stuck(engine: Engine) -> None:
    with engine.connect() as conn:
        stuck_jobs = conn.scalar(
            select(func.count())
            .select_from(MiningJob)
            .where(MiningJob.status.in_((JobStatus.QUEUED, JobStatus.RUNNING)))
        )
        stuck_batches = conn.scalar(
            select(func.count())
            .select_from(Batch)
            .where(Batch.status.in_((BatchStatus.QUEUED, BatchStatus.RUNNING)))
        )
    assert (stuck_jobs, stuck_batches) == (0, 0)


def _upload_figures(client: TestClient, seeds: range) -> list[str]:
    ids = []
    for seed in seeds:
        sample = make_figure(seed)
        response = upload(client, sample.image, caption=sample.caption, filename=sample.name)
        assert response.status_code == 202, response.text
        ids.append(response.json()["figure_id"])
    return ids


def _running_jobs(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(
            conn.scalar(
                select(func.count()).select_from(MiningJob).where(MiningJob.status == JobStatus.RUNNING)
            )
            or 0
        )


def test_a_mining_worker_killed_mid_batch_loses_and_duplicates_nothing(
    db: Engine, pg_url: str, make_stack: Callable[..., Stack], tmp_path: Path
) -> None:
    redis = OwnRedis(tmp_path / "redis", persistent=False).start()
    try:
        stack = make_stack(db_url=pg_url, redis_url=redis.url)
        victim = stack.worker("mining")
        with stack.client() as client:
            _upload_figures(client, range(1, 7))
        wait_for(lambda: _running_jobs(db) > 0, RECOVERY_TIMEOUT_S, "a job to start")
        victim.kill_group()
        killed_at = time.monotonic()
        assert _running_jobs(db) > 0  # the killed worker's job is left "running"
        stack.worker("mining")
        wait_for(lambda: _all_mined(db, 6), RECOVERY_TIMEOUT_S, "every figure to be mined")
        recovered_s = time.monotonic() - killed_at
        counts = _figures_mined_exactly_once(db, 6)
        _nothing_stuck(db)
        assert max(counts["attempts"]) >= 2  # the killed job ran again
        print(f"\nmining worker kill -9: all 6 figures mined {recovered_s:.1f} s after the kill; {counts}")
    finally:
        redis.stop()


def test_an_ingest_worker_killed_mid_batch_finishes_its_batch_once(
    db: Engine, pg_url: str, make_stack: Callable[..., Stack], tmp_path: Path
) -> None:
    redis = OwnRedis(tmp_path / "redis", persistent=False).start()
    try:
        stack = make_stack(db_url=pg_url, redis_url=redis.url)
        count = 120
        write_manifest_folder(tmp_path / "sources" / "big", count=count)
        victim = stack.worker("ingest")
        with stack.client() as client:
            response = client.post(
                "/v1/batches", json={"kind": "manifest", "source": str(tmp_path / "sources/big")}
            )
            assert response.status_code == 202, response.text
            batch_id = uuid.UUID(response.json()["id"])

            def progressed() -> bool:
                with stack.runtime.session() as session:
                    batch = session.get(Batch, batch_id)
                    return batch is not None and batch.ingested >= 5

            wait_for(progressed, RECOVERY_TIMEOUT_S, "the batch to get going")
            victim.kill_group()
            killed_at = time.monotonic()
            stack.worker("ingest")

            def ended() -> Batch | None:
                with stack.runtime.session() as session:
                    batch = session.get(Batch, batch_id)
                    assert batch is not None
                    return batch if batch.status not in (BatchStatus.QUEUED, BatchStatus.RUNNING) else None

            batch = wait_for(ended, RECOVERY_TIMEOUT_S, "the batch to end")
        recovered_s = time.monotonic() - killed_at
        assert batch.status is BatchStatus.SUCCEEDED, batch.error
        assert (batch.ingested, batch.duplicates, batch.failed, batch.total) == (count, 0, 0, count)
        assert batch.attempts >= 2
        with db.connect() as conn:
            assert conn.scalar(select(func.count()).select_from(Figure)) == count
        print(f"\ningest worker kill -9: batch of {count} ended {recovered_s:.1f} s after the kill")
    finally:
        redis.stop()


@pytest.mark.parametrize("persistent", [True, False], ids=["persistence-on", "persistence-off"])
def test_redis_killed_and_restarted_loses_no_job(
    persistent: bool, db: Engine, pg_url: str, make_stack: Callable[..., Stack], tmp_path: Path
) -> None:
    redis = OwnRedis(tmp_path / "redis", persistent=persistent).start()
    try:
        stack = make_stack(db_url=pg_url, redis_url=redis.url)
        with stack.client() as client:
            _upload_figures(client, range(11, 14))  # queued in Redis, no worker yet
            redis.kill()
            killed_at = time.monotonic()
            # While the broker is down: the figure is stored, its job is not, and the client is told.
            late = make_figure(14, panel_size=(120, 96))
            down = upload(client, late.image, caption=late.caption, filename=late.name)
            assert down.status_code == 503 and down.json()["error"]["type"] == "broker_unavailable"
            write_manifest_folder(tmp_path / "sources" / "during", count=2, first_seed=21)
            source = {"kind": "manifest", "source": str(tmp_path / "sources/during")}
            refused = client.post("/v1/batches", json=source)
            assert refused.status_code == 503, refused.text
            batch_location = refused.headers["location"]
            redis.start()
            # The same requests again complete what the first ones left unsent.
            again = upload(client, late.image, caption=late.caption, filename=late.name)
            assert again.status_code == 200 and again.json()["duplicate"], again.text
            resent = client.post("/v1/batches", json=source)
            assert resent.status_code == 202 and resent.headers["location"] == batch_location
            stack.worker("mining,ingest")
            wait_for(lambda: _all_mined(db, 6), RECOVERY_TIMEOUT_S, "every figure to be mined")
            recovered_s = time.monotonic() - killed_at
            batch = client.get(batch_location).json()
        assert batch["status"] == "succeeded" and batch["ingested"] == 2, batch
        with db.connect() as conn:
            assert conn.scalar(select(func.count()).select_from(Batch)) == 1
        counts = _figures_mined_exactly_once(db, 6)
        wait_for(lambda: _stuck_free(db), 60, "nothing queued or running")
        mode = "on" if persistent else "off"
        print(f"\nredis kill -9, persistence {mode}: 6 figures mined {recovered_s:.1f} s after; {counts}")
    finally:
        redis.stop()


def _stuck_free(engine: Engine) -> bool:
    try:
        _nothing_stuck(engine)
        return True
    except AssertionError:
        return False


def test_postgres_killed_and_restarted_mid_batch_loses_no_job(
    make_stack: Callable[..., Stack], tmp_path: Path
) -> None:
    pg = EmbeddedPostgres(tmp_path / "own-pg")
    url = pg.start()
    migrate.upgrade(url)
    engine = make_engine(url)
    redis = OwnRedis(tmp_path / "redis", persistent=False).start()
    try:
        stack = make_stack(db_url=url, redis_url=redis.url)
        stack.worker("mining")
        with stack.client() as client:
            _upload_figures(client, range(31, 37))
        wait_for(lambda: _running_jobs(engine) > 0, RECOVERY_TIMEOUT_S, "a job to start")
        pid = pg._server.get_pid() if pg._server is not None else None
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        killed_at = time.monotonic()
        wait_for(lambda: not pg.is_running(), 30, "PostgreSQL to die")
        time.sleep(1.0)  # workers meet the dead database
        assert pg.ensure_running()
        engine.dispose()
        wait_for(lambda: _all_mined(engine, 6), RECOVERY_TIMEOUT_S, "every figure to be mined")
        recovered_s = time.monotonic() - killed_at
        counts = _figures_mined_exactly_once(engine, 6)
        wait_for(lambda: _stuck_free(engine), 60, "nothing queued or running")
        print(f"\npostgres kill -9: 6 figures mined {recovered_s:.1f} s after the kill; {counts}")
    finally:
        for worker in stack.workers if "stack" in locals() else []:
            worker.stop()
        redis.stop()
        engine.dispose()
        pg.stop()


def test_a_task_over_its_soft_time_limit_fails_with_the_reason(
    db: Engine, pg_url: str, make_stack: Callable[..., Stack], tmp_path: Path
) -> None:
    redis = OwnRedis(tmp_path / "redis", persistent=False).start()
    try:
        stack = make_stack(db_url=pg_url, redis_url=redis.url, time_limits={"mining": (1, 30)})
        stack.worker("mining")
        big = make_figure(3, panel_size=(1400, 1100))  # seconds of mining, over the 1 s soft limit
        with stack.client() as client:
            job_id = upload(client, big.image, caption=big.caption, filename=big.name).json()["job_id"]

            def failed() -> MiningJob | None:
                with stack.runtime.session() as session:
                    job = session.get(MiningJob, uuid.UUID(job_id))
                    return job if job is not None and job.status is JobStatus.FAILED else None

            job = wait_for(failed, RECOVERY_TIMEOUT_S, "the job to fail")
            figure = client.get(f"/v1/figures/{job.figure_id}").json()
        assert "TimeLimitExceeded" in (job.error or ""), job.error
        assert figure["status"] == "failed" and "TimeLimitExceeded" in figure["mining_error"]
        assert job.lease_owner is None
    finally:
        redis.stop()
