"""Prometheus metrics: the APIs' /metrics, a real Celery worker's metrics server, the queue and job
gauges read from Redis and PostgreSQL, the off switch, and the dashboards' queries checked against
what the scrapes really hold (a renamed metric or label fails here)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine, func, select, update
from typer.testing import CliRunner

from p2p.apps.embedding import embedding_app
from p2p.apps.ingest import ingest_app
from p2p.cli.queues_cmd import consumers_by_queue
from p2p.ingest.samples import make_figure
from p2p.mining.jobs import mine_job
from p2p.mining.lvlm.miner import LvlmMiner
from p2p.mining.pipeline import CpuMiner
from p2p.shared import jobs as durable
from p2p.shared.db.base import utcnow
from p2p.shared.db.models import JobStatus, MiningJob
from p2p.shared.metrics import broker
from p2p.shared.metrics.backlog import backlog_collector
from p2p.shared.metrics.worker import remove_dead_files
from p2p.shared.queue import CeleryDispatcher, configure_celery
from p2p.shared.runtime import Runtime, build_runtime, set_process_runtime
from p2p.shared.settings import Settings
from p2p.training.jobs import _progress_values
from tests.conftest import RuntimeFactory, SettingsFactory
from tests.helpers import upload, wait_for
from tests.lvlm_fixtures import lvlm_settings
from tests.lvlm_sim import SimServer
from tests.servers import S3Handle, free_port
from tests.test_embedding_api import index_corpus
from tests.test_faults import OwnRedis, Worker

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server")

ROOT = Path(__file__).resolve().parents[1]
DASHBOARDS = ROOT / "ops" / "grafana" / "dashboards"
TIMEOUT_S = 600.0  # waits are for conditions; the machine is shared


# --- scraping ---------------------------------------------------------------------------------


Samples = list[tuple[str, dict[str, str], float]]


def parse(text: str) -> Samples:
    return [
        (sample.name, dict(sample.labels), sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    ]


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` whose labels include ``labels`` (0 when none)."""
    return sum(v for n, lab, v in samples if n == name and labels.items() <= lab.items())


def registry_value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


# --- the APIs ---------------------------------------------------------------------------------


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[OwnRedis]:
    """A redis-server of this test: queue names are fixed, so no other run may share them."""
    server = OwnRedis(tmp_path / "redis", persistent=False).start()
    yield server
    server.stop()


@pytest.mark.parametrize("store_kind", ["s3"], indirect=True)
def test_the_ingest_api_counts_requests_by_route_template_with_sizes_and_job_gauges(
    make_runtime: RuntimeFactory,
) -> None:
    runtime = make_runtime()
    route = "/v1/figures/{figure_id}"
    before = registry_value(
        "p2p_http_requests_total", service="ingest", method="GET", route=route, status="200"
    )
    bytes_before = registry_value("p2p_http_request_body_bytes_count", service="ingest", route="/v1/figures")
    with TestClient(ingest_app(runtime=runtime)) as client:
        ids = []
        for seed in (1, 2):
            sample = make_figure(seed)
            accepted = upload(client, sample.image, caption=sample.caption, filename=sample.name)
            assert accepted.status_code == 202, accepted.text
            ids.append(accepted.json()["figure_id"])
        for figure_id in ids:
            assert client.get(f"/v1/figures/{figure_id}").status_code == 200
        assert client.get(f"/v1/figures/{uuid.uuid4()}").status_code == 404
        assert client.get("/no/such/path").status_code == 404
        scrape = client.get("/metrics")
    assert scrape.status_code == 200 and scrape.headers["content-type"].startswith("text/plain")
    samples = parse(scrape.text)
    assert (
        value(samples, "p2p_http_requests_total", service="ingest", route=route, status="200") - before == 2
    )
    assert value(samples, "p2p_http_requests_total", service="ingest", route=route, status="404") >= 1
    assert value(samples, "p2p_http_requests_total", service="ingest", route="unmatched", status="404") >= 1
    assert not any(figure_id in scrape.text for figure_id in ids)  # templates, never raw paths
    uploaded = value(samples, "p2p_http_request_body_bytes_count", service="ingest", route="/v1/figures")
    assert uploaded - bytes_before == 2
    assert value(samples, "p2p_http_requests_in_flight", service="ingest") == 1  # the scrape itself
    assert value(samples, "p2p_jobs", kind="mining", status="queued") == 2
    assert value(samples, "p2p_jobs", kind="mining", status="succeeded") == 0
    assert value(samples, "p2p_figures", status="queued") == 2
    assert value(samples, "p2p_backlog_up", source="database") == 1
    assert "/metrics" not in client.app.openapi()["paths"]


def test_metrics_switched_off_serve_nothing_and_count_nothing(
    make_settings: SettingsFactory, db: Engine
) -> None:
    settings = make_settings(metrics={"enabled": False})
    runtime = build_runtime(settings)
    set_process_runtime(runtime)
    try:
        assert runtime.job_observers == []
        before = registry_value(
            "p2p_http_requests_total", service="ingest", method="GET", route="/healthz", status="200"
        )
        with TestClient(ingest_app(runtime=runtime)) as client:
            assert client.get("/healthz").status_code == 200
            assert client.get("/metrics").status_code == 404
        after = registry_value(
            "p2p_http_requests_total", service="ingest", method="GET", route="/healthz", status="200"
        )
        assert after == before
    finally:
        set_process_runtime(None)
        runtime.close()


# --- broker and database gauges ---------------------------------------------------------------


def test_queue_depth_counts_priority_lists_and_ages_come_from_the_publish_header(own_redis: OwnRedis) -> None:
    settings = Settings(profile="embedded", redis={"url": own_redis.url})
    dispatcher = CeleryDispatcher(configure_celery(settings), own_redis.url, settings=settings)
    client = broker.open_client(own_redis.url)
    try:
        sent_from = time.time()
        for _ in range(2):
            dispatcher.send("p2p.mining.mine_figure", args=[str(uuid.uuid4())], queue="mining")
        with dispatcher._pool.acquire(block=True) as conn:  # a message with a priority: kombu's sub-list
            dispatcher.app.send_task(
                "p2p.mining.mine_figure", args=["x"], queue="mining", priority=9, connection=conn
            )
        read_at = time.time()
        states = {state.name: state for state in broker.read_queues(client, now=read_at)}
        keys = {key.decode() for key in client.keys("mining*")}
        assert keys == {"mining", f"mining{broker.PRIORITY_SEP}9"}, keys  # how kombu named them
        mining = states["mining"]
        assert mining.depth == 3 and mining.oldest_task == "p2p.mining.mine_figure"
        assert mining.oldest_age_s is not None and 0 <= mining.oldest_age_s <= read_at - sent_from
        assert states["ingest"].depth == 0 and states["ingest"].oldest_age_s is None
        assert set(states) == set(broker.QUEUES)
        client.lpush("embedding", json.dumps({"headers": {"task": "old"}}))  # sent before the header
        assert broker.read_queues(client, ["embedding"])[0].oldest_age_s is None
    finally:
        client.close()
        dispatcher.close()


def test_p2p_queues_reports_every_queue_from_the_broker(
    own_redis: OwnRedis, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from p2p.cli.main import app
    from p2p.shared.settings import get_settings

    settings = Settings(profile="embedded", redis={"url": own_redis.url})
    dispatcher = CeleryDispatcher(configure_celery(settings), own_redis.url, settings=settings)
    for _ in range(3):
        dispatcher.send("p2p.ingest.run_batch", args=[str(uuid.uuid4())], queue="ingest")
    dispatcher.close()
    monkeypatch.setenv("P2P_REDIS__URL", own_redis.url)
    monkeypatch.setenv("P2P_DATA_DIR", str(tmp_path))
    get_settings.cache_clear()
    try:
        result = CliRunner().invoke(app, ["queues", "--json", "--no-inspect", "--interval", "0"])
    finally:
        get_settings.cache_clear()
    assert result.exit_code == 0, result.output
    rows = {row["queue"]: row for row in json.loads(result.output)}
    assert set(rows) == set(broker.QUEUES)
    assert rows["ingest"]["messages"] == 3 and rows["ingest"]["oldest_task"] == "p2p.ingest.run_batch"
    assert rows["ingest"]["oldest_age_s"] >= 0 and rows["mining"]["messages"] == 0
    assert rows["ingest"]["consumers"] is None


def test_stuck_jobs_are_counted_and_scrapes_within_the_cache_reuse_the_reading(
    make_runtime: RuntimeFactory,
) -> None:
    runtime = make_runtime()
    with TestClient(ingest_app(runtime=runtime)) as client:
        sample = make_figure(3)
        job_id = upload(client, sample.image, caption=sample.caption, filename=sample.name).json()["job_id"]
    long_ago = utcnow().replace(year=2000)
    with runtime.session() as session:  # a worker died mid-job long ago: its lease ran out
        session.execute(
            update(MiningJob)
            .where(MiningJob.id == uuid.UUID(job_id))
            .values(
                status=JobStatus.RUNNING,
                lease_owner="gone:1:1",
                lease_expires_at=long_ago,
                started_at=long_ago,
            )
        )
        session.commit()
    cached = backlog_collector(
        runtime.settings.model_copy(
            update={"metrics": runtime.settings.metrics.model_copy(update={"cache_s": 3600.0})}
        ),
        lambda: runtime.engine,
    )
    first = collected(cached)
    assert value(first, "p2p_jobs_stuck", kind="mining", reason="lease_expired") == 1
    assert value(first, "p2p_jobs_stuck", kind="mining", reason="running_too_long") == 1
    assert value(first, "p2p_jobs", kind="mining", status="running") == 1
    with runtime.session() as session:
        session.execute(
            update(MiningJob)
            .where(MiningJob.id == uuid.UUID(job_id))
            .values(status=JobStatus.QUEUED, lease_owner=None)
        )
        session.commit()
    assert collected(cached) == first  # within cache_s: no new reading
    fresh = collected(backlog_collector(runtime.settings, lambda: runtime.engine))
    assert value(fresh, "p2p_jobs_stuck", kind="mining") == 0
    assert value(fresh, "p2p_jobs", kind="mining", status="queued") == 1


def collected(collector: Any) -> Samples:
    return [(s.name, dict(s.labels), s.value) for family in collector.collect() for s in family.samples]


def test_a_broker_that_is_down_is_reported_and_the_scrape_still_answers(
    make_settings: SettingsFactory,
) -> None:
    settings = make_settings(redis={"url": f"redis://127.0.0.1:{free_port()}/0"})
    samples = collected(backlog_collector(settings, None))
    assert value(samples, "p2p_backlog_up", source="broker") == 0
    assert not any(name == "p2p_queue_messages" for name, _, _ in samples)


def test_metric_files_of_dead_processes_are_removed(tmp_path: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    for pid in (gone.pid, 1):
        (tmp_path / f"counter_{pid}.db").write_bytes(b"")
        (tmp_path / f"gauge_livesum_{pid}.db").write_bytes(b"")
    assert remove_dead_files(tmp_path) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["counter_1.db", "gauge_livesum_1.db"]


# --- every scrape, and the dashboards against them --------------------------------------------


@dataclass
class Stack:
    settings: Settings
    runtime: Runtime
    env: dict[str, str]
    worker: Worker
    metrics_port: int


@pytest.fixture
def stack(
    db: Engine, pg_url: str, own_redis: OwnRedis, s3_server: S3Handle, s3_bucket: str, tmp_path: Path
) -> Iterator[Stack]:
    s3 = {"endpoint": s3_server.endpoint, "access_key": s3_server.access_key,
          "secret_key": s3_server.secret_key, "bucket": s3_bucket}  # fmt: skip
    settings = Settings(
        profile="embedded",
        data_dir=tmp_path / "data",
        db={"url": pg_url},
        redis={"url": own_redis.url},
        s3=s3,
    )
    runtime = build_runtime(settings)
    set_process_runtime(runtime)
    port = free_port()
    env = {
        **{k: v for k, v in __import__("os").environ.items() if not k.startswith(("P2P_", "PROMETHEUS_"))},
        "P2P_PROFILE": "embedded",
        "P2P_DATA_DIR": str(tmp_path / "data"),
        "P2P_DB__URL": pg_url,
        "P2P_REDIS__URL": own_redis.url,
        "P2P_S3__ENDPOINT": s3_server.endpoint,
        "P2P_S3__ACCESS_KEY": s3_server.access_key,
        "P2P_S3__SECRET_KEY": s3_server.secret_key,
        "P2P_S3__BUCKET": s3_bucket,
        "P2P_MINING__TORCH_THREADS": "1",
        "P2P_METRICS__WORKER_PORT": str(port),
        "P2P_METRICS__CACHE_S": "0",
        "P2P_METRICS__WORKER_BACKLOG": "true",
    }
    worker = Worker("mining,ingest", env, tmp_path / "worker.log").start()
    try:
        yield Stack(settings, runtime, env, worker, port)
    finally:
        worker.stop()
        set_process_runtime(None)
        runtime.close()


def scrape_worker(port: int) -> str:
    return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text


def worker_answers(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def mined(engine: Engine, count: int) -> bool:
    with engine.connect() as conn:
        done = conn.scalar(
            select(func.count()).select_from(MiningJob).where(MiningJob.status == JobStatus.SUCCEEDED)
        )
    return done == count


def test_every_dashboard_query_names_metrics_and_labels_that_the_scrapes_hold(
    stack: Stack, sim: SimServer, cpu_miner: CpuMiner, lvlm_dataset: Path, lvlm_entries: dict[str, Any]
) -> None:
    # 1. Figures through the ingest API, mined by a real Celery worker (Redis, PostgreSQL, S3).
    figures = 3
    with TestClient(ingest_app(runtime=stack.runtime)) as client:
        for seed in range(figures):
            sample = make_figure(seed)
            assert (
                upload(client, sample.image, caption=sample.caption, filename=sample.name).status_code == 202
            )
        wait_for(lambda: mined(stack.runtime.engine, figures), TIMEOUT_S, "the worker to mine every figure")
        wait_for(lambda: worker_answers(stack.metrics_port), TIMEOUT_S, "the worker's metrics server")
        worker = parse(scrape_worker(stack.metrics_port))
        consumers = consumers_by_queue(configure_celery(stack.settings), 10.0)  # as `p2p queues` asks
        assert consumers == {"mining": 1, "ingest": 1}, consumers
        # 2. In this process: an LVLM job (simulated model server), a re-index, a training progress
        # report; each reaches the metrics through the durable-job observer of the runtime.
        # counters of this process and the model server's tally both carry earlier tests' requests
        lvlm_before = value(parse(client.get("/metrics").text), "p2p_lvlm_requests_total")
        sim_before = sim.stats.total_requests
        lvlm_job(stack, sim, cpu_miner, lvlm_dataset, lvlm_entries, client)
        index_corpus(stack.runtime)
        durable.emit(
            stack.runtime, durable.JobEvent("training", uuid.uuid4(), "progress", details=training_progress())
        )
        ingest = parse(client.get("/metrics").text)
    with TestClient(embedding_app(runtime=stack.runtime, refresh_interval_s=3600)) as client:
        assert (
            client.post("/v1/embed/texts", json={"texts": ["a liver section", "a western blot"]}).status_code
            == 200
        )
        embedding = parse(client.get("/metrics").text)

    tasks = {"queue": "mining", "task": "p2p.mining.mine_figure", "outcome": "success"}
    assert value(worker, "p2p_tasks_total", **tasks) == figures
    assert value(worker, "p2p_task_duration_seconds_count", **tasks) == figures
    assert value(worker, "p2p_job_events_total", kind="mining", event="succeeded") == figures
    assert value(worker, "p2p_mining_stage_seconds_count", backend="cpu", stage="crops") == figures
    assert value(worker, "p2p_queue_messages", queue="embedding") == figures  # sent on, no consumer here
    assert value(worker, "p2p_queue_oldest_message_age_seconds", queue="embedding") > 0
    assert {lab["queue"] for n, lab, _ in worker if n == "p2p_queue_messages"} == set(broker.QUEUES)
    assert value(worker, "p2p_jobs", kind="mining", status="succeeded") == figures
    lvlm_requests = value(ingest, "p2p_lvlm_requests_total") - lvlm_before
    assert lvlm_requests == sim.stats.total_requests - sim_before > 0
    assert value(embedding, "p2p_embedding_batch_size_sum", kind="texts") >= 2

    missing = dashboard_problems(worker + ingest + embedding)
    assert not missing, "\n".join(missing)


def lvlm_job(
    stack: Stack,
    sim: SimServer,
    cpu_miner: CpuMiner,
    folder: Path,
    entries: dict[str, Any],
    client: TestClient,
) -> None:
    name = "synth_00000.jpg"
    lvlm_settings_ = stack.settings.model_copy(
        update={"mining": stack.settings.mining.model_copy(update={"backend": "lvlm"})}
    )
    runtime = build_runtime(lvlm_settings_)  # its jobs go to mining-lvlm, which no worker here takes
    try:
        with TestClient(ingest_app(runtime=runtime)) as lvlm_client:
            data = (folder / name).read_bytes()
            job_id = upload(lvlm_client, data, caption=entries[name]["caption"], filename=name).json()[
                "job_id"
            ]
        miner = LvlmMiner(lvlm_settings(sim, mode="paper", views=3, max_retries=1), cpu=cpu_miner)
        try:
            assert mine_job(runtime, uuid.UUID(job_id), miner).status is JobStatus.SUCCEEDED
        finally:
            miner.close()
    finally:
        runtime.close()
        set_process_runtime(stack.runtime)


def training_progress() -> dict[str, Any]:
    """A progress report as the trainer's runner writes it, turned into the run's progress."""
    report = {"event": "progress", "step": 40, "epoch": 1, "level": "panel", "loss": 2.5,
              "losses": {"figure": 2.7, "panel": 2.4}, "samples_per_s": 96.0, "steps_per_s": 1.5}  # fmt: skip
    return _progress_values(report, restarts=0, pid=None)


# --- dashboard queries ------------------------------------------------------------------------

METRIC = re.compile(r"\b(p2p_[a-z0-9_]+)(\{[^}]*\})?")
MATCHER = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"([^"]*)"')
BY = re.compile(r"\bby \(([^)]*)\)")


def dashboard_queries() -> list[tuple[str, str]]:
    found = []
    for path in sorted(DASHBOARDS.glob("*.json")):
        for panel in json.loads(path.read_text())["panels"]:
            found += [(f"{path.name}: {panel['title']}", target["expr"]) for target in panel["targets"]]
    return found


def dashboard_problems(samples: Samples) -> list[str]:
    """Every metric a query names must be scraped with every label it filters or groups by, and an
    equality matcher's value must be one a scrape holds."""
    labels: dict[str, set[str]] = {}
    values: dict[tuple[str, str], set[str]] = {}
    for name, lab, _ in samples:
        labels.setdefault(name, set()).update(lab)
        for key, val in lab.items():
            values.setdefault((name, key), set()).add(val)
    queries = dashboard_queries()
    assert len(queries) >= 30 and {q.split(":")[0] for q, _ in queries} == {
        "mining.json", "pipeline.json", "search-embedding.json", "training.json"
    }  # fmt: skip
    problems = []
    for where, expr in queries:
        grouped = {
            label.strip() for clause in BY.findall(expr) for label in clause.split(",") if label.strip()
        }
        for name, matchers in METRIC.findall(expr):
            if name not in labels:
                problems.append(f"{where}: {name} is in no scrape")
                continue
            problems += [f"{where}: {p}" for p in metric_problems(name, matchers, grouped, labels, values)]
    return problems


def metric_problems(
    name: str,
    matchers: str,
    grouped: set[str],
    labels: dict[str, set[str]],
    values: dict[tuple[str, str], set[str]],
) -> list[str]:
    problems = []
    for label in grouped - {"le"} | {m[0] for m in MATCHER.findall(matchers)}:
        if label not in labels[name]:
            problems.append(f"{name} has no label {label}")
    if "le" in grouped and not name.endswith("_bucket"):
        problems.append(f"{name} is grouped by le but is no histogram bucket")
    for label, op, wanted in MATCHER.findall(matchers):
        # A regex filter (5xx statuses...) may rightly match nothing in a healthy run; an equality
        # names one route, queue or kind that must exist.
        seen = values.get((name, label), set())
        if op == "=" and wanted not in seen:
            problems.append(f"no {name} sample with {label}{op}{wanted!r} (seen {sorted(seen)})")
    return problems


def test_a_renamed_metric_or_label_is_caught() -> None:
    samples: Samples = [("p2p_queue_messages", {"queue": "mining"}, 1.0)]
    problems = dashboard_problems(samples)
    assert any("p2p_tasks_total is in no scrape" in p for p in problems)
    assert not any(
        p.startswith("pipeline.json: Queue depth:") and "p2p_queue_messages" in p for p in problems
    )
    renamed: Samples = [("p2p_queue_messages", {"name": "mining"}, 1.0)]
    assert any("p2p_queue_messages has no label queue" in p for p in dashboard_problems(renamed))
