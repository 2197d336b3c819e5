"""Metrics under load: a production-like run that the scraped metrics must account for, and the
overhead of metrics on ingest and mining, measured against the same commit with metrics off.

Stack (all on 127.0.0.1, stopped at the end): PostgreSQL (``tests/servers.start_postgres``), a
redis-server of the benchmark's own, SeaweedFS S3 (``start_s3``), ``p2p serve ingest`` and two
Celery mining workers (``-Q mining --concurrency=1``, one torch thread each). Each run gets empty
tables, an empty Redis and a fresh bucket, and the same synthetic figures (``make_figure``).

A run: (1) ``--figures`` figures are posted to ``POST /v1/figures`` by 8 concurrent clients with no
worker up (ingest alone: figures/s and the API's CPU seconds per figure); (2) the two workers start,
and once both say "ready" their CPU is read; they mine every figure (mining: wall and worker CPU
per figure, and the mean job run time from the database). A scraper reads every ``/metrics`` every
5 s throughout, as Prometheus would (in a metrics-off run it meets 404s and closed ports).

``load``: one run with metrics on; the scrapes at the end must account for every figure: figures
ingested (the API's 202 count) = mining jobs succeeded + failed (the workers' job events) = the
workers' successful mining tasks = figures in the database, with nothing queued, running or stuck.
Exit status 1 otherwise.

``overhead``: arms interleaved ABBA (``--rounds`` times); each arm is a set of environment variables
given to every server. The default arms are metrics on and off (``P2P_METRICS__ENABLED``); another
factor (JSON logs, say) is measured by passing ``--arms`` with more environment, e.g.
``--arms '{"on": {"P2P_METRICS__ENABLED": "true", "P2P_LOGGING__FORMAT": "json"}, ...}'``.

    .venv/bin/python bench/metrics_bench.py load --figures 5000
    .venv/bin/python bench/metrics_bench.py overhead --figures 400 --rounds 1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import psutil
import redis
from sqlalchemy import Engine, func, select, text

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.ingest_bench import ProcessGroup, ServerProcess, clean_env, multipart_body  # noqa: E402
from p2p.ingest.samples import make_figure  # noqa: E402
from p2p.shared.db import migrate  # noqa: E402
from p2p.shared.db.base import Base  # noqa: E402
from p2p.shared.db.engine import make_engine  # noqa: E402
from p2p.shared.db.models import JobStatus, MiningJob  # noqa: E402
from tests.servers import free_port, start_postgres, start_s3  # noqa: E402

BIN = Path(sys.executable).parent
RESULTS = ROOT / "bench" / "results"
CLIENTS = 8
SCRAPE_EVERY_S = 5.0
PANEL_SIZE = (160, 120)
BASE_FIGURES = 50
DEFAULT_ARMS = {"on": {"P2P_METRICS__ENABLED": "true"}, "off": {"P2P_METRICS__ENABLED": "false"}}


def log(message: str) -> None:
    print(f"[{datetime.now(UTC):%H:%M:%S}] {message}", flush=True)


@dataclass
class Servers:
    workdir: Path
    db_url: str
    redis_url: str
    s3: dict[str, str]
    engine: Engine
    stoppers: list[Any] = field(default_factory=list)

    def env(self, bucket: str, extra: dict[str, str]) -> dict[str, str]:
        return {
            **clean_env(),
            "P2P_PROFILE": "embedded",  # every URL below is set: nothing is embedded, keys are off
            "P2P_DATA_DIR": str(self.workdir / "data"),
            "P2P_LOG_LEVEL": "WARNING",
            "P2P_DB__URL": self.db_url,
            "P2P_REDIS__URL": self.redis_url,
            "P2P_S3__ENDPOINT": self.s3["endpoint"],
            "P2P_S3__ACCESS_KEY": self.s3["access_key"],
            "P2P_S3__SECRET_KEY": self.s3["secret_key"],
            "P2P_S3__BUCKET": bucket,
            "P2P_MINING__TORCH_THREADS": "1",
            "P2P_RATE_LIMIT__WRITES_PER_WINDOW": "0",
            **extra,
        }

    def reset(self) -> None:
        tables = ", ".join(f'"{t.name}"' for t in Base.metadata.sorted_tables)
        with self.engine.begin() as conn:
            conn.execute(text(f"TRUNCATE {tables} CASCADE"))
        client = redis.Redis.from_url(self.redis_url)
        client.flushdb()  # the benchmark's own redis-server
        client.close()

    def stop(self) -> None:
        self.engine.dispose()
        for stop in reversed(self.stoppers):
            stop()


def start_servers(workdir: Path) -> Servers:
    pg = start_postgres(workdir, database="p2p_metrics_bench")
    migrate.upgrade(pg.url)
    port = free_port()
    redis_proc = subprocess.Popen(
        ["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    s3 = start_s3(workdir / "s3")
    servers = Servers(
        workdir,
        pg.url,
        f"redis://127.0.0.1:{port}/0",
        {"endpoint": s3.endpoint, "access_key": s3.access_key, "secret_key": s3.secret_key},
        make_engine(pg.url),
        [pg.stop, lambda: (redis_proc.terminate(), redis_proc.wait(10)), s3.stop],
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            redis.Redis.from_url(servers.redis_url).ping()
            break
        except redis.exceptions.ConnectionError:
            time.sleep(0.1)
    return servers


# --- one run ----------------------------------------------------------------------------------


class Worker:
    """A Celery mining worker in a session of its own; "ready" read from its log."""

    def __init__(self, name: str, env: dict[str, str], log_path: Path) -> None:
        self.log_path = log_path
        with log_path.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "p2p.apps.worker:celery_app", "worker", "-Q", "mining",
                 "--concurrency=1", "--loglevel=INFO", "-n", f"{name}@%h",
                 "--without-gossip", "--without-mingle"],
                # the project's logging sets the level (not --loglevel), and "ready" is an INFO line
                env={**env, "P2P_LOG_LEVEL": "INFO"},
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        self.group = ProcessGroup(name, self.proc.pid)

    def ready(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"worker exited:\n{self.log_path.read_text(errors='replace')[-3000:]}")
        return " ready." in self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait(10)


class Scraper(threading.Thread):
    """Reads every /metrics endpoint every few seconds, as Prometheus would."""

    def __init__(self, urls: list[str]) -> None:
        super().__init__(daemon=True)
        self.urls, self.stop_event, self.scrapes, self.failures = urls, threading.Event(), 0, 0

    def run(self) -> None:
        with httpx.Client(timeout=10) as client:
            while not self.stop_event.wait(SCRAPE_EVERY_S):
                for url in self.urls:
                    try:
                        self.scrapes += client.get(url).status_code == 200
                    except httpx.HTTPError:
                        self.failures += 1

    def stop(self) -> None:
        self.stop_event.set()
        self.join(15)


async def post_all(url: str, bodies: list[tuple[bytes, str]]) -> list[int]:
    queue: asyncio.Queue[tuple[bytes, str]] = asyncio.Queue()
    for body in bodies:
        queue.put_nowait(body)
    statuses: list[int] = []

    async def client_loop(client: httpx.AsyncClient) -> None:
        while not queue.empty():
            content, content_type = queue.get_nowait()
            response = await client.post(url, content=content, headers={"content-type": content_type})
            statuses.append(response.status_code)

    async with httpx.AsyncClient(timeout=120) as client:
        await asyncio.gather(*(client_loop(client) for _ in range(CLIENTS)))
    return statuses


def figure_bodies(count: int) -> list[tuple[bytes, str]]:
    """``count`` distinct JPEGs: ``BASE_FIGURES`` synthetic figures (making one takes most of a second
    on a busy machine), each copy with a comment segment of its own, so no two share a sha256."""
    bases = []
    for seed in range(10 * BASE_FIGURES):  # the JPEGs only: a comment segment is a JPEG's
        sample = make_figure(seed, panel_size=PANEL_SIZE)
        if sample.image[:2] == b"\xff\xd8":
            bases.append(sample)
        if len(bases) == min(count, BASE_FIGURES):
            break
    bodies = []
    for index in range(count):
        sample = bases[index % len(bases)]
        payload = f"panel2patch metrics bench #{index}".encode()
        image = (
            sample.image[:2]
            + b"\xff\xfe"
            + (len(payload) + 2).to_bytes(2, "big")
            + payload
            + sample.image[2:]
        )
        bodies.append(multipart_body(image, sample.caption, f"figure_{index:05d}.jpg"))
    return bodies


def finished_jobs(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(
            conn.scalar(
                select(func.count())
                .select_from(MiningJob)
                .where(MiningJob.status.in_((JobStatus.SUCCEEDED, JobStatus.FAILED)))
            )
            or 0
        )


def mean_job_seconds(engine: Engine) -> float:
    with engine.connect() as conn:
        value = conn.scalar(
            select(func.avg(func.extract("epoch", MiningJob.finished_at - MiningJob.started_at))).where(
                MiningJob.status == JobStatus.SUCCEEDED
            )
        )
    return float(value or 0.0)


def run_once(
    servers: Servers, arm: str, env_extra: dict[str, str], bodies: list[tuple[bytes, str]]
) -> dict[str, Any]:
    servers.reset()
    bucket = f"bench-{uuid.uuid4().hex[:10]}"
    env = servers.env(bucket, env_extra)
    api_port, ports = free_port(), [free_port(), free_port()]
    run_dir = Path(tempfile.mkdtemp(prefix=f"run-{arm}-", dir=servers.workdir))
    api = ServerProcess(
        "ingest", [str(BIN / "p2p"), "serve", "ingest", "--host", "127.0.0.1", "--port", str(api_port)],
        env, api_port, run_dir / "api.log",
    )  # fmt: skip
    api.start("/healthz")
    urls = [f"{api.base_url}/metrics", *(f"http://127.0.0.1:{p}/metrics" for p in ports)]
    scraper = Scraper(urls)
    scraper.start()
    workers: list[Worker] = []
    try:
        assert api.proc is not None
        api_group = ProcessGroup("api", api.proc.pid)
        cpu0, started = api_group.cpu_seconds(), time.perf_counter()
        statuses = asyncio.run(post_all(f"{api.base_url}/v1/figures", bodies))
        ingest_wall, ingest_cpu = time.perf_counter() - started, api_group.cpu_seconds() - cpu0
        accepted = sum(status == 202 for status in statuses)
        for index, port in enumerate(ports):
            worker_env = {**env, "P2P_METRICS__WORKER_PORT": str(port)}
            workers.append(Worker(f"bench{index}", worker_env, run_dir / f"worker{index}.log"))
        while not all(w.ready() for w in workers):
            time.sleep(0.05)
        wcpu0, mine_started = sum(w.group.cpu_seconds() for w in workers), time.perf_counter()
        while finished_jobs(servers.engine) < accepted:
            time.sleep(0.5)
            for w in workers:
                w.group.cpu_seconds()  # keep track of pool children that come and go
        mine_wall = time.perf_counter() - mine_started
        mine_cpu = sum(w.group.cpu_seconds() for w in workers) - wcpu0
        time.sleep(SCRAPE_EVERY_S)  # the workers' last events reach their files; the cache expires
        accounting = account(urls) if env_extra.get("P2P_METRICS__ENABLED", "true") == "true" else None
        return {
            "arm": arm,
            "figures": len(bodies),
            "accepted": accepted,
            "errors": len(statuses) - accepted,
            "ingest_wall_s": round(ingest_wall, 3),
            "ingest_fps": round(accepted / ingest_wall, 2),
            "ingest_cpu_ms_per_figure": round(1000 * ingest_cpu / max(accepted, 1), 3),
            "mining_wall_s": round(mine_wall, 3),
            "mining_fps": round(accepted / mine_wall, 3),
            "mining_cpu_s_per_figure": round(mine_cpu / max(accepted, 1), 4),
            "mining_job_mean_s": round(mean_job_seconds(servers.engine), 4),
            "scrapes": scraper.scrapes,
            "accounting": accounting,
        }
    finally:
        scraper.stop()
        for w in workers:
            w.stop()
        api.stop()
        shutil.rmtree(run_dir, ignore_errors=True)


# --- accounting from the scrapes --------------------------------------------------------------


def scrape(url: str) -> list[tuple[str, dict[str, str], float]]:
    from prometheus_client.parser import text_string_to_metric_families

    body = httpx.get(url, timeout=30).text
    return [
        (s.name, dict(s.labels), s.value) for f in text_string_to_metric_families(body) for s in f.samples
    ]


def total(samples: list[tuple[str, dict[str, str], float]], name: str, **labels: str) -> float:
    return sum(v for n, lab, v in samples if n == name and labels.items() <= lab.items())


def account(urls: list[str]) -> dict[str, Any]:
    """What the scrapes say happened to the figures; ``ok`` when every figure is accounted for."""
    api = scrape(urls[0])
    workers = [sample for url in urls[1:] for sample in scrape(url)]
    ingested = total(api, "p2p_http_requests_total", route="/v1/figures", method="POST", status="202")
    succeeded = total(workers, "p2p_job_events_total", kind="mining", event="succeeded")
    failed = total(workers, "p2p_job_events_total", kind="mining", event="failed")
    tasks_ok = total(
        workers, "p2p_tasks_total", queue="mining", task="p2p.mining.mine_figure", outcome="success"
    )
    task_runs = total(workers, "p2p_tasks_total", queue="mining", task="p2p.mining.mine_figure")
    found = {
        "figures_ingested": ingested,
        "jobs_succeeded": succeeded,
        "jobs_failed": failed,
        "mining_tasks_succeeded": tasks_ok,
        "mining_task_runs": task_runs,  # every outcome: a duplicate delivery is a run too
        "jobs_requeued": total(workers, "p2p_job_events_total", kind="mining", event="requeued")
        + total(api, "p2p_job_events_total", kind="mining", event="requeued"),
        "figures_in_database": total(api, "p2p_figures"),
        "jobs_queued_or_running": total(api, "p2p_jobs", kind="mining", status="queued")
        + total(api, "p2p_jobs", kind="mining", status="running"),
        "jobs_stuck": total(api, "p2p_jobs_stuck"),
        "mining_queue_messages": total(api, "p2p_queue_messages", queue="mining"),
        "stage_observations_crops": total(workers, "p2p_mining_stage_seconds_count", stage="crops"),
    }
    found["ok"] = (
        ingested > 0
        and ingested == succeeded + failed == tasks_ok + failed == found["figures_in_database"]
        and found["jobs_queued_or_running"] == found["jobs_stuck"] == found["mining_queue_messages"] == 0
    )
    return found


# --- the cost of each metric call, in this process -------------------------------------------


def micro(calls: int = 20000) -> dict[str, float]:
    """CPU microseconds per request (middleware bookkeeping), per finished mining job (the observer,
    with a job's real stage timings) and per task (the two Celery signal handlers)."""
    from p2p.shared.jobs import JobEvent
    from p2p.shared.metrics import worker
    from p2p.shared.metrics.http import RequestMetrics
    from p2p.shared.metrics.jobs import JobMetrics

    class Route:
        path = "/v1/figures"

    class Task:
        name = "p2p.mining.mine_figure"

        class request:  # the shape of a Celery task's request
            delivery_info = {"routing_key": "mining"}

    middleware = RequestMetrics("ingest")
    scope = {"type": "http", "method": "POST", "route": Route()}
    stages = {s: 0.01 for s in ("segment", "labels", "markers", "regions", "captions", "crops")}
    event = JobEvent("mining", uuid.uuid4(), "succeeded", 1, running_s=0.5,
                     details={"backend": "cpu", "stage_seconds": stages, "cost": {}})  # fmt: skip
    observer, task = JobMetrics(), Task()

    def per_call(step: Any) -> float:
        started = time.process_time()
        for _ in range(calls):
            step()
        return round(1e6 * (time.process_time() - started) / calls, 2)

    def request() -> None:
        middleware.started()
        middleware.finished(scope, 202, 21000, 0.01)

    def task_run() -> None:
        worker.task_started(task_id="t", task=task)
        worker.task_ended(task_id="t", task=task, state="SUCCESS")

    return {
        "request_us": per_call(request),
        "mining_job_event_us": per_call(lambda: observer(event)),
        "task_us": per_call(task_run),
    }


# --- the two benchmarks -----------------------------------------------------------------------


def ratios(runs: list[dict[str, Any]], arm: str, reference: str) -> dict[str, float]:
    keys = (
        "ingest_fps",
        "ingest_cpu_ms_per_figure",
        "mining_fps",
        "mining_cpu_s_per_figure",
        "mining_job_mean_s",
    )
    out = {}
    for key in keys:
        a = statistics.mean(r[key] for r in runs if r["arm"] == arm)
        b = statistics.mean(r[key] for r in runs if r["arm"] == reference)
        out[key] = round(a / b, 4) if b else float("nan")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("mode", choices=["load", "overhead", "micro"])
    parser.add_argument("--figures", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=1, help="overhead: ABBA blocks")
    parser.add_argument(
        "--arms", type=json.loads, default=DEFAULT_ARMS, help="overhead: {name: env}, A first"
    )
    args = parser.parse_args()
    if args.mode == "micro":
        log(json.dumps(micro()))
        return 0
    figures = args.figures or (5000 if args.mode == "load" else 400)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stop still stops the servers
    workdir = Path(tempfile.mkdtemp(prefix="p2p-metrics-bench-"))
    workdir.chmod(0o755)
    log(f"{args.mode}: {figures} figures; servers in {workdir}")
    servers = start_servers(workdir)
    try:
        bodies = figure_bodies(figures)
        log(f"{len(bodies)} figures made ({sum(len(b) for b, _ in bodies) / len(bodies) / 1000:.1f} kB each)")
        if args.mode == "load":
            plan = [("on", DEFAULT_ARMS["on"])]
        else:
            (a, env_a), (b, env_b) = list(args.arms.items())[:2]
            plan = [(a, env_a), (b, env_b), (b, env_b), (a, env_a)] * args.rounds
        runs = []
        for arm, env_extra in plan:
            log(f"run {len(runs) + 1}/{len(plan)}: {arm}")
            runs.append(run_once(servers, arm, env_extra, bodies))
            log(json.dumps(runs[-1]))
    finally:
        servers.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    result: dict[str, Any] = {
        "mode": args.mode,
        "figures": figures,
        "cores": psutil.cpu_count(),
        "runs": runs,
    }
    if args.mode == "overhead":
        names = list(args.arms)
        result["ratio_a_over_b"] = ratios(runs, names[0], names[1])
        log(f"{names[0]} / {names[1]}: {json.dumps(result['ratio_a_over_b'])}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"metrics-{args.mode}-{datetime.now(UTC):%Y%m%dT%H%M%S}.json"
    out.write_text(json.dumps(result, indent=2))
    log(f"written {out}")
    accounted = [r["accounting"] for r in runs if r["accounting"] is not None]
    for found in accounted:
        log(f"accounting: {json.dumps(found)}")
    return 0 if all(found["ok"] for found in accounted) else 1


if __name__ == "__main__":
    sys.exit(main())
