"""Ingest throughput, latency and memory, each against a reference measured in the same run.

What runs, in order (every server is a subprocess bound to 127.0.0.1 and is stopped at the end):

1. ``bare``: a FastAPI app with one POST endpoint that only reads the body (``await request.body()``),
   served by uvicorn as ``p2p serve ingest`` serves the product (one process, same defaults, log
   level WARNING for both). The same app also has ``/form``, which parses the multipart body and
   nothing else (``bare_form``): it shows how much of the gap is multipart parsing alone.
2. ``embedded``: ``p2p serve ingest`` on the embedded profile (embedded PostgreSQL, local folder
   object store, in-process queue serving only the ingest queue) with a fresh data folder.
3. ``stages`` (embedded): one figure at a time in-process through the product's own
   ``ingest_figure``, each stage timed (multipart parse, sha256, Pillow decode, object store, DB),
   then the same work from 16 threads without HTTP.
4. ``bare_mid``: the reference again (it is measured at the start, middle and end; the ratios use
   the median, since other work on the machine moves the short bare runs the most).
5. ``servers``: ``p2p serve ingest`` on the production profile against PostgreSQL, Redis and an S3
   server (SeaweedFS) started by ``tests/servers.py``, with an API key made by ``p2p keys create``;
   then ``stages`` (servers), which adds the API key check.
6. ``bare_end``: the reference a third time.
7. ``batch_memory``: a manifest folder of ``--batch-mb`` distinct ~1 MB images ingested through
   ``POST /v1/batches`` on a fresh embedded server, sampling the server's RSS against progress.

Each load scenario posts N new (never duplicate) ~1 MB JPEG figures from 16 concurrent clients and
reports figures/s, p50/p99 latency, errors, and the server's RSS (sampled every 50 ms) and CPU time.
Absolute numbers depend on the machine; the ratios to ``bare`` are the result.

    .venv/bin/python bench/ingest_bench.py [--figures N] [--clients 16] [--batch-mb 500]
        [--out bench/results/ingest.json] [--quick] [--client httpx|raw|both]

Every load scenario runs once per load generator: ``httpx`` (httpx.AsyncClient) and ``raw`` (a
minimal asyncio HTTP/1.1 client that costs the load generator far less CPU per request; on a
small machine the httpx client, not the server, is what limits the bare endpoint).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import io
import json
import os
import platform
import pstats
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import psutil
from abba import interleave, machine_record, summary_line
from fastapi import Request  # module level: the bare app's annotations resolve against these globals

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
MB = 1_000_000
MiB = 1024 * 1024
TARGET_COST_RATIO = 3.0  # ingest may cost at most 3x the bare endpoint
BARE_RUNS = ("bare", "bare_mid", "bare_end")  # the reference, measured three times in each run
# "Flat": peak RSS growth under 10% of the batch size (or under a 16 MiB allowance for the few
# items in flight, which matters only for small batches), and RSS(100%) - RSS(50%) under 5% of it.
FLAT_PEAK_FRACTION = 0.10
FLAT_ALLOWANCE_MIB = 16.0
FLAT_TAIL_FRACTION = 0.05


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# --- figures ---------------------------------------------------------------------------------


class FigureFactory:
    """Distinct ~1 MB JPEGs, cheaply.

    A few noisy base images are encoded once, at the JPEG quality that brings them closest to the
    target size. Each figure is a base image with a JPEG comment segment (FF FE) carrying a unique
    tag inserted right after the start-of-image marker: still a valid JPEG that Pillow decodes in
    full, but every figure has its own sha256, so the server never sees a duplicate.
    """

    def __init__(self, target_bytes: int = MB, size: tuple[int, int] = (1000, 800), bases: int = 6) -> None:
        from PIL import Image, ImageFilter

        rng = random.Random(20261122)
        self.bases: list[bytes] = []
        width, height = size
        for _ in range(bases):
            noise = Image.frombytes("RGB", size, rng.randbytes(width * height * 3))
            # A soft gradient under the noise, so the images are not pure static.
            gradient = Image.linear_gradient("L").resize(size).convert("RGB")
            image = Image.blend(noise.filter(ImageFilter.GaussianBlur(0.5)), gradient, 0.3)
            self.bases.append(self._closest_quality(image, target_bytes))
        self.size = size
        self.mean_bytes = int(statistics.fmean(len(b) for b in self.bases))

    @staticmethod
    def _closest_quality(image: Any, target: int) -> bytes:
        best: bytes | None = None
        for quality in range(70, 100):
            buffer = io.BytesIO()
            image.save(buffer, format="JPEG", quality=quality)
            data = buffer.getvalue()
            if best is None or abs(len(data) - target) < abs(len(best) - target):
                best = data
            if len(data) > target:
                break
        assert best is not None
        return best

    def figure(self, tag: str, index: int) -> bytes:
        base = self.bases[index % len(self.bases)]
        payload = f"panel2patch bench {tag} #{index} {uuid.uuid4().hex}".encode()
        segment = b"\xff\xfe" + (len(payload) + 2).to_bytes(2, "big") + payload
        return base[:2] + segment + base[2:]


def caption_for(tag: str, index: int) -> str:
    return (
        f"Figure {index + 1} ({tag}). (A) H&E staining of liver tissue; arrows mark portal tracts. "
        "(B) Quantification of positive cells per field (mean +/- s.d., n = 6). Scale bars, 50 um."
    )


BOUNDARY = "p2pbench" + uuid.uuid4().hex


def multipart_body(image: bytes, caption: str, filename: str) -> tuple[bytes, str]:
    """The multipart/form-data body a browser or httpx would send: a caption field and the image."""
    head = (
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="caption"\r\n\r\n{caption}\r\n'
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="image"; filename="{filename}"\r\n'
        "Content-Type: image/jpeg\r\n\r\n"
    ).encode()
    tail = f"\r\n--{BOUNDARY}--\r\n".encode()
    return head + image + tail, f"multipart/form-data; boundary={BOUNDARY}"


# --- process groups: RSS and CPU ---------------------------------------------------------------


class ProcessGroup:
    """A process and its descendants; the descendant list is refreshed at most once a second."""

    def __init__(self, name: str, root_pid: int) -> None:
        self.name = name
        self.root = psutil.Process(root_pid)
        self._members: list[psutil.Process] = [self.root]
        self._refreshed = 0.0
        self._gone_cpu = 0.0
        self._last_cpu: dict[int, float] = {}

    def members(self) -> list[psutil.Process]:
        now = time.monotonic()
        if now - self._refreshed > 1.0:
            self._refreshed = now
            with contextlib.suppress(psutil.Error):
                self._members = [self.root, *self.root.children(recursive=True)]
        return self._members

    def rss(self) -> tuple[int, int]:
        """(RSS of the root process, RSS of the whole group) in bytes."""
        root = total = 0
        for proc in self.members():
            try:
                value = proc.memory_info().rss
            except psutil.Error:
                continue
            total += value
            if proc.pid == self.root.pid:
                root = value
        return root, total

    def cpu_seconds(self) -> float:
        """User + system CPU of the group so far, counting members that have since exited."""
        seen: dict[int, float] = {}
        for proc in self.members():
            try:
                t = proc.cpu_times()
            except psutil.Error:
                continue
            seen[proc.pid] = t.user + t.system
        for pid, value in self._last_cpu.items():
            if pid not in seen:
                self._gone_cpu += value
        self._last_cpu = seen
        return self._gone_cpu + sum(seen.values())


class RssSampler(threading.Thread):
    """Samples RSS of several process groups every ``interval`` seconds."""

    def __init__(self, groups: list[ProcessGroup], interval: float = 0.05) -> None:
        super().__init__(daemon=True, name="rss-sampler")
        self.groups = groups
        self.interval = interval
        self.samples: list[tuple[float, dict[str, tuple[int, int]]]] = []
        self._halt = threading.Event()

    def sample(self) -> dict[str, tuple[int, int]]:
        return {g.name: g.rss() for g in self.groups}

    def run(self) -> None:
        while not self._halt.is_set():
            self.samples.append((time.monotonic(), self.sample()))
            self._halt.wait(self.interval)

    def stop(self) -> None:
        self._halt.set()
        self.join(5)

    def peak(self, group: str, whole: bool = False) -> int:
        idx = 1 if whole else 0
        values = [s[group][idx] for _, s in self.samples if group in s]
        return max(values) if values else 0

    def at(self, when: float, group: str) -> int:
        """RSS of the group's root at the last sample taken at or before ``when``."""
        best = self.samples[0][1][group][0] if self.samples else 0
        for t, s in self.samples:
            if t > when:
                break
            best = s[group][0]
        return best


def postmaster_pid(pgdata: Path) -> int | None:
    pidfile = pgdata / "postmaster.pid"
    try:
        return int(pidfile.read_text().splitlines()[0])
    except (OSError, ValueError, IndexError):
        return None


# --- servers ---------------------------------------------------------------------------------


def free_port() -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def scratch_dir(prefix: str) -> Path:
    # Not under a 0700 folder: the embedded PostgreSQL runs as its own system user under root.
    path = Path(tempfile.mkdtemp(prefix=prefix))
    path.chmod(0o755)
    return path


class ServerProcess:
    """An HTTP server in a subprocess of its own session, logging to a file."""

    def __init__(self, name: str, cmd: list[str], env: dict[str, str], port: int, log_path: Path) -> None:
        self.name, self.cmd, self.env, self.port, self.log_path = name, cmd, env, port, log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.pgdata: Path | None = None  # the embedded PostgreSQL it starts, if any

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, ready_path: str, timeout: float = 180.0) -> None:
        with self.log_path.open("wb") as out:
            self.proc = subprocess.Popen(
                self.cmd, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(self.base_url + ready_path, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{self.name} not ready after {timeout:.0f} s:\n{self.log_tail()}")

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # uvicorn shuts down gracefully: lifespan closes
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.pgdata is not None:
            # The server stops its embedded PostgreSQL on shutdown; make sure, if it was killed.
            pid = postmaster_pid(self.pgdata)
            if pid is not None and psutil.pid_exists(pid):
                with contextlib.suppress(psutil.Error):
                    postmaster = psutil.Process(pid)
                    if "postgres" in postmaster.name():
                        postmaster.send_signal(signal.SIGINT)  # fast shutdown
                        postmaster.wait(30)


def bare_server(port: int, workdir: Path) -> ServerProcess:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--serve-bare", str(port)]
    return ServerProcess("bare", cmd, clean_env(), port, workdir / "bare.log")


def ingest_server(name: str, port: int, workdir: Path, p2p_env: dict[str, str]) -> ServerProcess:
    env = {**clean_env(), "P2P_LOG_LEVEL": "WARNING", **p2p_env}
    cmd = [str(BIN / "p2p"), "serve", "ingest", "--host", "127.0.0.1", "--port", str(port)]
    return ServerProcess(name, cmd, env, port, workdir / f"{name}.log")


def embedded_queue_env() -> dict[str, str]:
    """Serve only the ingest queue in-process, so the embedded server does not also mine the
    figures it receives (mining would compete for the same CPUs; this benchmark measures ingest).
    Empty on a release without the setting, which mined nothing in-process."""
    from p2p.shared.settings import QueueSettings

    if "embedded_queues" not in QueueSettings.model_fields:
        return {}
    return {"P2P_QUEUE__EMBEDDED_QUEUES": json.dumps(["ingest"])}


def clean_env() -> dict[str, str]:
    """This environment without any P2P_ setting, so each server gets only what it is given."""
    return {k: v for k, v in os.environ.items() if not k.startswith("P2P_")}


def run_bare_app(port: int) -> None:
    """The reference: uvicorn with the same settings ``p2p serve ingest`` uses, one process."""
    import uvicorn
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse

    app = FastAPI(title="bare reference")

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/body")
    async def body(request: Request) -> JSONResponse:
        data = await request.body()
        return JSONResponse({"bytes": len(data)})

    @app.post("/form")
    async def form(request: Request) -> JSONResponse:
        parsed = await request.form()
        try:
            image = parsed["image"]
            size = len(await image.read()) if hasattr(image, "read") else len(image)
        finally:
            await parsed.close()
        return JSONResponse({"bytes": size})

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


# --- load ------------------------------------------------------------------------------------


@dataclass
class LoadResult:
    name: str
    figures: int
    clients: int
    wall_s: float
    latencies_s: list[float]
    errors: int
    error_samples: list[str]
    statuses: dict[int, int]
    bytes_sent: int
    server: dict[str, Any] = field(default_factory=dict)

    @property
    def fps(self) -> float:
        return self.figures / self.wall_s if self.wall_s else 0.0

    def percentile(self, q: float) -> float:
        data = sorted(self.latencies_s)
        if not data:
            return float("nan")
        rank = q / 100 * (len(data) - 1)
        lo = int(rank)
        hi = min(lo + 1, len(data) - 1)
        return data[lo] + (data[hi] - data[lo]) * (rank - lo)

    def summary(self) -> dict[str, Any]:
        return {
            "figures": self.figures,
            "clients": self.clients,
            "wall_s": round(self.wall_s, 3),
            "figures_per_s": round(self.fps, 2),
            "mb_per_s": round(self.bytes_sent / MB / self.wall_s, 2) if self.wall_s else 0.0,
            "latency_ms": {
                "p50": round(self.percentile(50) * 1000, 1),
                "p90": round(self.percentile(90) * 1000, 1),
                "p99": round(self.percentile(99) * 1000, 1),
                "max": round(max(self.latencies_s) * 1000, 1) if self.latencies_s else None,
                "mean": round(statistics.fmean(self.latencies_s) * 1000, 1) if self.latencies_s else None,
            },
            "errors": self.errors,
            "error_samples": self.error_samples,
            "statuses": {str(k): v for k, v in sorted(self.statuses.items())},
            **self.server,
        }


class RawHttpClient:
    """A minimal HTTP/1.1 keep-alive client on asyncio streams: one connection, one request at a time.

    It costs the load generator almost nothing per request (a header and a write of prebuilt bytes),
    so on a small machine the reference endpoint is limited by the server, not by the client.
    """

    def __init__(self, url: str) -> None:
        parsed = httpx.URL(url)
        self.host, self.port = parsed.host, parsed.port or 80
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, content: bytes, headers: dict[str, str]) -> tuple[int, str]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        lines = [f"POST {path} HTTP/1.1", f"host: {self.host}:{self.port}", f"content-length: {len(content)}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        self.writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
        self.writer.write(content)
        await self.writer.drain()
        status_line = await self.reader.readline()
        if not status_line:
            await self.close()
            raise ConnectionError("server closed the connection")
        status = int(status_line.split()[1])
        length, close = 0, False
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            name, value = name.strip().lower(), value.strip()
            if name == "content-length":
                length = int(value)
            elif name == "connection" and value.lower() == "close":
                close = True
        body = await self.reader.readexactly(length) if length else b""
        if close:
            await self.close()
        return status, body.decode(errors="replace")

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(Exception):
                await self.writer.wait_closed()
        self.reader = self.writer = None


async def _post_all(
    url: str,
    bodies: Callable[[int], tuple[bytes, str]],
    indices: list[int],
    clients: int,
    headers: dict[str, str],
    expect: int,
    client_kind: str,
) -> tuple[float, list[float], int, list[str], dict[int, int], int]:
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    samples: list[str] = []
    errors = 0
    sent = 0
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in indices:
        queue.put_nowait(i)
    path = httpx.URL(url).raw_path.decode()
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(300.0)) as shared:

        async def worker() -> None:
            nonlocal errors, sent
            raw = RawHttpClient(url) if client_kind == "raw" else None
            try:
                while True:
                    try:
                        i = queue.get_nowait()
                    except asyncio.QueueEmpty:
                        return
                    content, content_type = bodies(i)
                    request_headers = {**headers, "content-type": content_type}
                    start = time.perf_counter()
                    try:
                        if raw is not None:
                            status, text = await raw.post(path, content, request_headers)
                        else:
                            response = await shared.post(url, content=content, headers=request_headers)
                            status, text = response.status_code, response.text
                    except (httpx.HTTPError, OSError, asyncio.IncompleteReadError, ValueError) as exc:
                        status, text = -1, f"{type(exc).__name__}: {exc}"
                        if raw is not None:
                            await raw.close()
                    latencies.append(time.perf_counter() - start)
                    sent += len(content)
                    statuses[status] = statuses.get(status, 0) + 1
                    if status != expect:
                        errors += 1
                        if len(samples) < 5:
                            samples.append(f"{status}: {text[:300]}")
            finally:
                if raw is not None:
                    await raw.close()

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(clients)))
        wall = time.perf_counter() - start
    return wall, latencies, errors, samples, statuses, sent


def _busy_seconds(times: Any) -> float:
    """Machine-wide CPU seconds spent running anything (not idle, not waiting on I/O, not stolen)."""
    return sum(getattr(times, f, 0.0) for f in ("user", "nice", "system", "irq", "softirq"))


def run_load(
    name: str,
    url: str,
    factory: FigureFactory,
    *,
    figures: int,
    clients: int,
    warmup: int,
    expect: int,
    headers: dict[str, str] | None = None,
    groups: list[ProcessGroup],
    client_kind: str,
) -> LoadResult:
    tag = f"{name}-{client_kind}-{uuid.uuid4().hex[:8]}"

    def bodies(i: int) -> tuple[bytes, str]:
        return multipart_body(factory.figure(tag, i), caption_for(tag, i), f"{tag}-{i}.jpg")

    headers = headers or {}
    # Warm up: connections, thread pools, DB pool, imports on first use. Figures stay distinct.
    warm = list(range(figures, figures + warmup))
    w = asyncio.run(_post_all(url, bodies, warm, clients, headers, expect, client_kind))
    if w[2]:
        log(f"  warm-up of {name}: {w[2]} unexpected responses, e.g. {w[3][:2]}")
    sampler = RssSampler(groups)
    before = sampler.sample()
    cpu_before = {g.name: g.cpu_seconds() for g in groups}
    own = psutil.Process()
    client_cpu_before = sum(own.cpu_times()[:2])
    machine_before = psutil.cpu_times()
    sampler.start()
    try:
        wall, latencies, errors, samples, statuses, sent = asyncio.run(
            _post_all(url, bodies, list(range(figures)), clients, headers, expect, client_kind)
        )
    finally:
        sampler.stop()
    after = sampler.sample()
    cpu = {g.name: g.cpu_seconds() - cpu_before[g.name] for g in groups}
    client_cpu = sum(own.cpu_times()[:2]) - client_cpu_before
    machine_after = psutil.cpu_times()
    result = LoadResult(name, figures, clients, wall, latencies, errors, samples, statuses, sent)
    server: dict[str, Any] = {}
    for g in groups:
        server[f"{g.name}_rss_mb"] = {
            "before": round(before[g.name][0] / MiB, 1),
            "peak": round(sampler.peak(g.name) / MiB, 1),
            "after": round(after[g.name][0] / MiB, 1),
        }
        if len(g.members()) > 1 or g.name != "server":
            server[f"{g.name}_tree_rss_mb"] = {
                "before": round(before[g.name][1] / MiB, 1),
                "peak": round(sampler.peak(g.name, whole=True) / MiB, 1),
                "after": round(after[g.name][1] / MiB, 1),
            }
        server[f"{g.name}_cpu_ms_per_figure"] = round(cpu[g.name] * 1000 / figures, 2)
    server["client_cpu_ms_per_figure"] = round(client_cpu * 1000 / figures, 2)
    # Other work on the machine while this run lasted, in cores: what makes absolute numbers move.
    busy = _busy_seconds(machine_after) - _busy_seconds(machine_before)
    ours = client_cpu + sum(cpu.values())
    server["machine"] = {
        "other_processes_cores": round(max(0.0, busy - ours) / wall, 2) if wall else None,
        "steal_cores": round(
            (getattr(machine_after, "steal", 0.0) - getattr(machine_before, "steal", 0.0)) / wall, 2
        )
        if wall
        else None,
        "load_average_1m_after": round(os.getloadavg()[0], 2),
    }
    server["rss_samples"] = len(sampler.samples)
    result.server = server
    s = result.summary()
    log(
        f"  {name} ({client_kind} client): {s['figures_per_s']} figures/s, p50 {s['latency_ms']['p50']} ms, "
        f"p99 {s['latency_ms']['p99']} ms, errors {errors}, server peak RSS "
        f"{server['server_rss_mb']['peak']} MiB, server CPU {server['server_cpu_ms_per_figure']} ms/figure"
    )
    for sample in samples[:3]:
        log(f"    error: {sample}")
    return result


# --- scenarios -------------------------------------------------------------------------------


Results = dict[str, dict[str, dict[str, Any]]]  # client kind -> scenario -> summary


def load_each_client(
    name: str,
    url: str,
    factory: FigureFactory,
    args: argparse.Namespace,
    *,
    expect: int,
    groups: list[ProcessGroup],
    headers: dict[str, str] | None = None,
) -> dict[str, dict[str, Any]]:
    """One load run per client kind against the same server; every run posts its own new figures.

    The bare endpoint gets ``--bare-factor`` times more figures: it is so fast that a run of N
    figures lasts a second or two, short enough for other work on the machine to skew it."""
    out = {}
    figures = args.figures * (args.bare_factor if name.startswith("bare") else 1)
    for kind in args.client_kinds:
        log(f"{name}: {figures} figures to {httpx.URL(url).path} with the {kind} client")
        out[kind] = run_load(
            name,
            url,
            factory,
            figures=figures,
            clients=args.clients,
            warmup=args.warmup,
            expect=expect,
            headers=headers,
            groups=groups,
            client_kind=kind,
        ).summary()
    return out


def merge(results: Results, name: str, by_kind: dict[str, dict[str, Any]]) -> None:
    for kind, summary in by_kind.items():
        results.setdefault(kind, {})[name] = summary


def scenario_bare(
    results: Results, workdir: Path, factory: FigureFactory, args: argparse.Namespace, name: str
) -> None:
    server = bare_server(free_port(), workdir)
    try:
        server.start("/healthz")
        assert server.proc is not None
        groups = [ProcessGroup("server", server.proc.pid)]
        merge(
            results,
            name,
            load_each_client(name, server.base_url + "/body", factory, args, expect=200, groups=groups),
        )
        if name == "bare":  # the multipart-only endpoint, once
            form = load_each_client(
                f"{name}_form", server.base_url + "/form", factory, args, expect=200, groups=groups
            )
            merge(results, f"{name}_form", form)
    finally:
        server.stop()


def scenario_embedded(
    results: Results, workdir: Path, factory: FigureFactory, args: argparse.Namespace
) -> None:
    data = scratch_dir("p2p-bench-embedded-")
    env = {"P2P_DATA_DIR": str(data), **embedded_queue_env()}
    server = ingest_server("embedded", free_port(), workdir, env)
    server.pgdata = data / "pg"
    try:
        log("embedded: starting p2p serve ingest (embedded PostgreSQL, local objects, in-process queue)")
        server.start("/readyz")
        assert server.proc is not None
        groups = [ProcessGroup("server", server.proc.pid)]
        pid = postmaster_pid(server.pgdata)
        if pid is not None:
            groups.append(ProcessGroup("postgres", pid))
        url = server.base_url + "/v1/figures"
        merge(
            results, "embedded", load_each_client("embedded", url, factory, args, expect=202, groups=groups)
        )
    finally:
        server.stop()
        shutil.rmtree(data, ignore_errors=True)


@dataclass
class Backends:
    workdir: Path
    pg: Any = None
    redis: Any = None
    s3: Any = None
    bucket: str = field(default_factory=lambda: f"p2p-bench-{uuid.uuid4().hex[:10]}")
    redis_keys_before: set[bytes] = field(default_factory=set)

    def env(self) -> dict[str, str]:
        return {
            "P2P_PROFILE": "production",
            "P2P_DATA_DIR": str(self.workdir / "data"),
            "P2P_DB__URL": self.pg.url,
            "P2P_REDIS__URL": self.redis.url,
            "P2P_S3__ENDPOINT": self.s3.endpoint,
            "P2P_S3__ACCESS_KEY": self.s3.access_key,
            "P2P_S3__SECRET_KEY": self.s3.secret_key,
            "P2P_S3__BUCKET": self.bucket,
        }

    def stop(self) -> None:
        if self.redis is not None:
            self._drop_new_redis_keys()
            self.redis.stop()
        if self.s3 is not None:
            self.s3.stop()
        if self.pg is not None:
            self.pg.stop()

    def _redis_keys(self) -> set[bytes]:
        import redis

        client = redis.Redis.from_url(self.redis.url)
        try:
            return set(client.scan_iter(count=1000))
        finally:
            client.close()

    def _drop_new_redis_keys(self) -> None:
        # The machine's Redis may be shared: remove only the keys this run created (queued tasks).
        import redis

        with contextlib.suppress(Exception):
            new = self._redis_keys() - self.redis_keys_before
            if new:
                client = redis.Redis.from_url(self.redis.url)
                client.delete(*new)
                client.close()


def start_backends(workdir: Path) -> Backends:
    sys.path.insert(0, str(ROOT))
    from tests import servers

    backends = Backends(workdir)
    try:
        log("servers: starting PostgreSQL (tests/servers.start_postgres)")
        backends.pg = servers.start_postgres(workdir / "pg", database="p2p_bench")
        log("servers: Redis (tests/servers.start_redis, database 14)")
        backends.redis = servers.start_redis(workdir / "redis", db=14)
        backends.redis_keys_before = backends._redis_keys()
        log("servers: starting SeaweedFS S3 (tests/servers.start_s3)")
        backends.s3 = servers.start_s3(workdir / "s3")
    except BaseException:
        backends.stop()
        raise
    return backends


def p2p_cli(args: list[str], env: dict[str, str]) -> str:
    done = subprocess.run(
        [str(BIN / "p2p"), *args], env={**clean_env(), **env}, capture_output=True, text=True, timeout=300
    )
    if done.returncode != 0:
        raise RuntimeError(f"p2p {' '.join(args)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return done.stdout.strip()


def new_ingest_key(backends: Backends) -> str:
    """A new API key with the ingest scope on ``backends``' (migrated) database."""
    args = ["keys", "create", "--name", "bench", "--scope", "ingest"]
    return p2p_cli(args, backends.env()).splitlines()[-1].strip()


def _production_ingest(workdir: Path, backends: Backends) -> tuple[ServerProcess, str]:
    """The production-profile ingest API on ``backends`` (migrated, with an API key), not started."""
    env = backends.env()
    log("servers: p2p db upgrade")
    p2p_cli(["db", "upgrade"], env)
    return ingest_server("servers", free_port(), workdir, env), new_ingest_key(backends)


def _start_production_ingest(server: ServerProcess, backends: Backends) -> list[ProcessGroup]:
    """Start ``server``; the process groups whose CPU the load is charged: the API, PostgreSQL, S3."""
    server.start("/readyz")
    assert server.proc is not None
    groups = [ProcessGroup("server", server.proc.pid)]
    pid = postmaster_pid(Path(backends.pg.embedded.data_dir)) if backends.pg.embedded else None
    if pid is not None:
        groups.append(ProcessGroup("postgres", pid))
    if backends.s3.process is not None:
        groups.append(ProcessGroup("s3", backends.s3.process.pid))
    return groups


def scenario_servers(
    results: Results, workdir: Path, factory: FigureFactory, args: argparse.Namespace, backends: Backends
) -> str:
    """Returns the API key it made (the stage timing reuses it)."""
    server, token = _production_ingest(workdir, backends)
    try:
        log("servers: starting p2p serve ingest (production profile: PostgreSQL, Redis, S3, API key)")
        groups = _start_production_ingest(server, backends)
        url = server.base_url + "/v1/figures"
        auth = {"Authorization": f"Bearer {token}"}
        merge(
            results,
            "servers",
            load_each_client("servers", url, factory, args, expect=202, groups=groups, headers=auth),
        )
        return token
    finally:
        server.stop()


# --- A B B A: every server up at once, product and bare endpoint interleaved ---------------------


def _abba_side(
    name: str,
    url: str,
    factory: FigureFactory,
    args: argparse.Namespace,
    groups: list[ProcessGroup],
    **kw: Any,
) -> Callable[[], tuple[int, dict[str, Any]]]:
    """One load run as an ``abba`` side: its figures, its own wall time (after its warm-up) and the
    CPU of the processes it loaded (server, PostgreSQL, SeaweedFS) plus the client's."""

    def side() -> tuple[int, dict[str, Any]]:
        figures = args.figures * (args.bare_factor if name == "bare" else 1)
        summary = run_load(
            name,
            url,
            factory,
            figures=figures,
            clients=args.clients,
            warmup=args.warmup,
            groups=groups,
            client_kind=args.client_kinds[0],
            **kw,
        ).summary()
        cpu_ms = sum(v for k, v in summary.items() if k.endswith("_cpu_ms_per_figure"))
        return figures, {
            "wall_s": summary["wall_s"],
            "cpu_s": cpu_ms * figures / 1000,
            "server_cpu_ms_per_figure": summary["server_cpu_ms_per_figure"],
            "p50_ms": summary["latency_ms"]["p50"],
            "errors": summary["errors"],
            "other_cores": summary["machine"]["other_processes_cores"],
        }

    return side


def _abba_embedded(
    workdir: Path, factory: FigureFactory, args: argparse.Namespace, servers: list[ServerProcess]
) -> Callable[[], tuple[int, dict[str, Any]]]:
    data = scratch_dir("p2p-bench-embedded-")
    server = ingest_server(
        "embedded", free_port(), workdir, {"P2P_DATA_DIR": str(data), **embedded_queue_env()}
    )
    server.pgdata = data / "pg"
    servers.append(server)
    server.start("/readyz")
    assert server.proc is not None
    groups = [ProcessGroup("server", server.proc.pid)]
    pid = postmaster_pid(server.pgdata)
    if pid is not None:
        groups.append(ProcessGroup("postgres", pid))
    return _abba_side("embedded", server.base_url + "/v1/figures", factory, args, groups, expect=202)


def _abba_production(
    workdir: Path,
    factory: FigureFactory,
    args: argparse.Namespace,
    servers: list[ServerProcess],
    backends: Backends,
) -> Callable[[], tuple[int, dict[str, Any]]]:
    server, token = _production_ingest(workdir, backends)
    servers.append(server)
    groups = _start_production_ingest(server, backends)
    auth = {"Authorization": f"Bearer {token}"}
    return _abba_side(
        "servers", server.base_url + "/v1/figures", factory, args, groups, expect=202, headers=auth
    )


def scenario_abba(workdir: Path, factory: FigureFactory, args: argparse.Namespace) -> dict[str, Any]:
    """The bare endpoint, the embedded server and the production one run side by side; each ingest
    server is interleaved with the bare endpoint A B B A over ``--abba`` rounds. The cost is the
    median over rounds of bare figures/s ÷ ingest figures/s."""

    out: dict[str, Any] = {"machine": machine_record(), "client": args.client_kinds[0], "rounds": args.abba}
    bare = bare_server(free_port(), workdir)
    backends: Backends | None = None
    servers: list[ServerProcess] = [bare]
    try:
        bare.start("/healthz")
        assert bare.proc is not None
        bare_groups = [ProcessGroup("server", bare.proc.pid)]
        reference = _abba_side("bare", bare.base_url + "/body", factory, args, bare_groups, expect=200)
        products = {"embedded": _abba_embedded(workdir, factory, args, servers)}
        if not args.skip_servers:
            backends = start_backends(workdir / "backends")
            products["servers"] = _abba_production(workdir, factory, args, servers, backends)
        for name, product in products.items():
            log(f"abba: {name} against the bare endpoint, {args.abba} rounds")
            result = interleave(product, reference, rounds=args.abba)
            record = result.as_dict()
            record["target"] = f"cost <= {TARGET_COST_RATIO}"
            record["met"] = result.median_cost <= TARGET_COST_RATIO
            out[name] = record
            log(summary_line(name, result, cost=True))
        return out
    finally:
        for server in servers:
            server.stop()
        if backends is not None:
            backends.stop()


def abba_only(report: dict[str, Any], workdir: Path, factory: FigureFactory, args: argparse.Namespace) -> int:
    report["abba"] = scenario_abba(workdir, factory, args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {args.out}")
    return 0


# --- stages ----------------------------------------------------------------------------------


class StageClock:
    """Wall time and CPU time (of the calling thread, so waits do not count) per named stage."""

    def __init__(self) -> None:
        self.wall: dict[str, float] = {}
        self.cpu: dict[str, float] = {}

    @staticmethod
    def now() -> tuple[float, float]:
        return time.perf_counter(), time.thread_time()

    def add(self, name: str, start: tuple[float, float], end: tuple[float, float]) -> None:
        self.wall[name] = self.wall.get(name, 0.0) + end[0] - start[0]
        self.cpu[name] = self.cpu.get(name, 0.0) + end[1] - start[1]

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*a: Any, **kw: Any) -> Any:
            start = self.now()
            try:
                return fn(*a, **kw)
            finally:
                self.add(name, start, self.now())

        return timed

    def table(self, names: list[str], count: int, rest: str, total: str) -> dict[str, dict[str, float]]:
        """ms per figure, wall and CPU, for ``names``; ``rest`` is ``total`` less the stages in it."""
        out = {}
        for name in names:
            if name in self.wall:
                out[name] = {
                    "wall": round(self.wall[name] * 1000 / count, 2),
                    "cpu": round(self.cpu[name] * 1000 / count, 2),
                }
        inside = [n for n in INGEST_STAGES if n in self.wall]
        out[rest] = {
            "wall": round((self.wall[total] - sum(self.wall[n] for n in inside)) * 1000 / count, 2),
            "cpu": round((self.cpu[total] - sum(self.cpu[n] for n in inside)) * 1000 / count, 2),
        }
        return out


MULTIPART = "multipart parse (Starlette/python-multipart)"
AUTH = "API key check + last_used_at commit"
INGEST_TOTAL = "ingest_figure total"
REQUEST_TOTAL = "request total (in-process)"
DB_REST = "database (lookups, inserts, commits) + rest of ingest_figure"
INGEST_STAGES = [
    "sha256 + size (digest_upload)",
    "Pillow identify + decode (inspect_image)",
    "object store exists()",
    "object store put()",
    "queue dispatch (dispatcher.send)",
]


async def _parse_multipart(body: bytes, content_type: str) -> Any:
    from starlette.datastructures import Headers
    from starlette.formparsers import MultiPartParser

    async def stream() -> Any:
        # uvicorn (h11) hands the body to the app in chunks of this size.
        for i in range(0, len(body), 65536):
            yield body[i : i + 65536]

    return await MultiPartParser(Headers({"content-type": content_type}), stream()).parse()


@contextlib.contextmanager
def instrumented(runtime: Any, clock: StageClock) -> Iterator[None]:
    """Time the stages of the product's ``ingest_figure`` by wrapping what it calls."""
    from p2p.ingest import service

    saved = (service.digest_upload, service.inspect_image)
    service.digest_upload = clock.wrap("sha256 + size (digest_upload)", service.digest_upload)
    service.inspect_image = clock.wrap("Pillow identify + decode (inspect_image)", service.inspect_image)
    store, dispatcher = runtime.store, runtime.dispatcher
    store.exists = clock.wrap("object store exists()", store.exists)
    store.put = clock.wrap("object store put()", store.put)
    dispatcher.send = clock.wrap("queue dispatch (dispatcher.send)", dispatcher.send)
    try:
        yield
    finally:
        service.digest_upload, service.inspect_image = saved
        for obj, names in ((store, ("exists", "put")), (dispatcher, ("send",))):
            for name in names:
                with contextlib.suppress(AttributeError):
                    delattr(obj, name)


COMPONENTS = (
    # (what the profile entry's file or built-in name contains, component)
    ("ImagingDecoder", "Pillow decode (C, GIL released)"),
    ("/PIL/", "Pillow (Python side)"),
    ("_hashlib", "hashing (sha256/md5, C)"),
    ("posix.fsync", "fsync"),
    ("/sqlalchemy/", "SQLAlchemy"),
    ("psycopg", "psycopg"),
    ("/python_multipart/", "multipart parsing"),
    ("/starlette/", "multipart parsing"),
    ("/minio/", "S3 client (minio, urllib3)"),
    ("/urllib3/", "S3 client (minio, urllib3)"),
    ("/kombu/", "Celery/kombu/redis"),
    ("/celery/", "Celery/kombu/redis"),
    ("/redis/", "Celery/kombu/redis"),
    ("/amqp/", "Celery/kombu/redis"),
    ("_socket.socket", "socket calls"),
    ("select", "socket calls"),
    ("/bench/", "benchmark (making figures)"),
    ("/services/", "p2p code"),
    ("/shared/", "p2p code"),
    ("/pydantic", "pydantic"),
)


def cpu_by_component(stats: pstats.Stats, figures: int) -> dict[str, float]:
    """CPU ms per figure, own time (tottime) of every function summed by the library it belongs to."""
    totals: dict[str, float] = {}
    for (filename, _, function), row in stats.stats.items():  # type: ignore[attr-defined]
        where = f"{filename}:{function}"
        name = next((component for needle, component in COMPONENTS if needle in where), "other")
        totals[name] = totals.get(name, 0.0) + row[2]
    return {k: round(v * 1000 / figures, 2) for k, v in sorted(totals.items(), key=lambda kv: -kv[1])}


def _concurrent_in_process(
    runtime: Any, factory: FigureFactory, tag: str, token: str | None, threads: int, count: int
) -> dict:
    """``ingest_figure`` (and the key check) from ``threads`` threads, no HTTP and no multipart:
    the throughput the ingest work itself allows in one process, to set beside the HTTP numbers."""
    from concurrent.futures import ThreadPoolExecutor

    from p2p.ingest.service import ingest_figure
    from p2p.shared.auth import authenticate
    from p2p.shared.schemas import FigureMetadata

    def one(i: int) -> None:
        with runtime.session() as session:
            if token:
                authenticate(session, f"Bearer {token}")
            outcome = ingest_figure(
                session=session,
                store=runtime.store,
                dispatcher=runtime.dispatcher,
                settings=runtime.settings,
                image=io.BytesIO(images[i]),
                caption=caption_for(f"{tag}-concurrent", i),
                metadata=FigureMetadata(),
                source="api",
            )
        assert not outcome.duplicate

    def run(first: int) -> dict[str, float]:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(one, range(first + count, first + count + threads)))  # warm-up
            start, cpu_start = time.perf_counter(), time.process_time()
            list(pool.map(one, range(first, first + count)))
            wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
        return {"figures_per_s": round(count / wall, 2), "cpu_ms_per_figure": round(cpu * 1000 / count, 2)}

    images = [factory.figure(f"{tag}-concurrent", i) for i in range(2 * (count + threads))]
    as_is = run(0)
    # What if the request only identified the image (header, format, size) and left the full
    # decode to the mining worker? Same work otherwise.
    from p2p.ingest import service

    saved = service.inspect_image
    service.inspect_image = _header_only_inspect
    try:
        header_only = run(count + threads)
    finally:
        service.inspect_image = saved
    return {"threads": threads, "figures": count, "as_is": as_is, "what_if_header_only_check": header_only}


def _header_only_inspect(stream: Any, *, allowed_formats: tuple[str, ...], max_pixels: int) -> Any:
    """Format and size from the header alone (what-if only; the product decodes every image)."""
    from PIL import Image

    from p2p.shared.images import ImageInfo

    stream.seek(0)
    with Image.open(stream) as image:
        info = ImageInfo(format=(image.format or "").upper(), width=image.size[0], height=image.size[1])
    stream.seek(0)
    return info


def measure_stages(
    label: str,
    settings: Any,
    factory: FigureFactory,
    count: int,
    token: str | None,
    profile: bool,
    threads: int,
) -> dict:
    """Ingest ``count`` figures one at a time in-process; time each stage of the request."""
    from sqlalchemy import event

    from p2p.ingest.service import ingest_figure
    from p2p.shared.auth import authenticate
    from p2p.shared.runtime import build_runtime
    from p2p.shared.schemas import FigureMetadata

    runtime = build_runtime(settings)
    clock = StageClock()
    tag = f"stages-{label}-{uuid.uuid4().hex[:8]}"
    # Database round trips per figure: statements (SAVEPOINTs included), commits, and pool checkouts
    # (each one is preceded by a pre-ping ``SELECT 1`` since the engine has pool_pre_ping=True).
    db_counts = {"statements": 0, "commits": 0, "savepoints": 0, "pool_checkouts": 0}

    def counter(name: str) -> Callable[..., None]:
        def count(*_: Any) -> None:
            db_counts[name] += 1

        return count

    event.listen(runtime.engine, "before_cursor_execute", counter("statements"))
    event.listen(runtime.engine, "commit", counter("commits"))
    event.listen(runtime.engine, "savepoint", counter("savepoints"))
    event.listen(runtime.engine.pool, "checkout", counter("pool_checkouts"))
    loop = asyncio.new_event_loop()
    # Profiled on CPU time, not wall time: waits on the database, disk or S3 do not count.
    profiler = cProfile.Profile(time.process_time) if profile else None

    def one(i: int, timed: bool) -> None:
        body, ctype = multipart_body(factory.figure(tag, i), caption_for(tag, i), f"{i}.jpg")
        start = clock.now()
        form = loop.run_until_complete(_parse_multipart(body, ctype))
        parsed = clock.now()
        try:
            with runtime.session() as session:
                if token:
                    authenticate(session, f"Bearer {token}")
                authed = clock.now()
                outcome = ingest_figure(
                    session=session,
                    store=runtime.store,
                    dispatcher=runtime.dispatcher,
                    settings=runtime.settings,
                    image=form["image"].file,
                    caption=str(form["caption"]),
                    metadata=FigureMetadata(),
                    source="api",
                )
                done = clock.now()
            assert not outcome.duplicate
        finally:
            loop.run_until_complete(form.close())
        if timed:
            clock.add(MULTIPART, start, parsed)
            if token:
                clock.add(AUTH, parsed, authed)
            clock.add(INGEST_TOTAL, authed, done)
            clock.add(REQUEST_TOTAL, start, done)

    try:
        for i in range(3):  # warm-up: first-use imports, pool connections
            one(count + i, timed=False)
        db_counts.update(dict.fromkeys(db_counts, 0))
        cpu_start = time.process_time()
        with instrumented(runtime, clock):
            for i in range(count):
                one(i, timed=True)
        cpu_ms = (time.process_time() - cpu_start) * 1000 / count
        db_per_figure = {k: round(v / count, 2) for k, v in db_counts.items()}
        top: list[str] = []
        by_component: dict[str, float] = {}
        if profiler is not None:
            profiled = min(count, 20)
            profiler.enable()
            for i in range(count + 3, count + 3 + profiled):
                one(i, timed=False)
            profiler.disable()
            stats = pstats.Stats(profiler, stream=io.StringIO())
            by_component = cpu_by_component(stats, profiled)
            text = io.StringIO()
            stats.stream = text  # type: ignore[attr-defined]
            stats.sort_stats("tottime").print_stats(14)
            top = [line.rstrip() for line in text.getvalue().splitlines() if line.strip()][-15:]
        concurrent = _concurrent_in_process(runtime, factory, tag, token, threads, count * 4)
    finally:
        loop.close()
        runtime.close()

    names = [MULTIPART, AUTH, *INGEST_STAGES]
    stages = clock.table(names, count, rest=DB_REST, total=INGEST_TOTAL)
    for name in (INGEST_TOTAL, REQUEST_TOTAL):
        stages[name] = {
            "wall": round(clock.wall[name] * 1000 / count, 2),
            "cpu": round(clock.cpu[name] * 1000 / count, 2),
        }
    result = {
        "figures": count,
        "ms_per_figure": stages,
        # CPU of this process over the timed loop; the rest of the wall time is waiting on I/O.
        "cpu_ms_per_figure": round(cpu_ms, 2),
        "database_per_figure": db_per_figure,
        "concurrent_in_process": concurrent,
    }
    if by_component:
        result["cpu_ms_per_figure_by_component"] = by_component
        log(f"  stages {label}: CPU by component (ms/figure) {by_component}")
    if top:
        result["cprofile_top_tottime_cpu"] = top
    shown = ", ".join(f"{k} {v['wall']}/{v['cpu']}" for k, v in stages.items())
    log(f"  stages {label} (ms per figure, wall/CPU): {shown}")
    log(f"  stages {label}: CPU {cpu_ms:.1f} ms/figure; database per figure {db_per_figure}")
    log(f"  stages {label}: {threads} threads in-process, no HTTP: {concurrent}")
    return result


def stage_settings_embedded(data: Path) -> Any:
    from p2p.shared.settings import Settings

    queues = json.loads(embedded_queue_env().get("P2P_QUEUE__EMBEDDED_QUEUES", "null"))
    return Settings(
        profile="embedded",
        data_dir=data,
        log_level="WARNING",
        **({"queue": {"embedded_queues": queues}} if queues is not None else {}),
    )


def stage_settings_servers(backends: Backends) -> Any:
    from p2p.shared.settings import DatabaseSettings, RedisSettings, S3Settings, Settings

    return Settings(
        profile="production",
        data_dir=backends.workdir / "data",
        log_level="WARNING",
        db=DatabaseSettings(url=backends.pg.url),
        redis=RedisSettings(url=backends.redis.url),
        s3=S3Settings(
            endpoint=backends.s3.endpoint,
            access_key=backends.s3.access_key,
            secret_key=backends.s3.secret_key,
            bucket=backends.bucket,
        ),
    )


# --- batch memory ----------------------------------------------------------------------------


def write_batch(folder: Path, factory: FigureFactory, total_mb: int) -> tuple[int, int]:
    """A manifest folder of distinct ~1 MB figures adding up to ``total_mb`` MB."""
    folder.mkdir(parents=True, exist_ok=True)
    tag = f"batch-{uuid.uuid4().hex[:8]}"
    written = count = 0
    lines = []
    while written < total_mb * MB:
        data = factory.figure(tag, count)
        name = f"fig_{count:05d}.jpg"
        (folder / name).write_bytes(data)
        lines.append(json.dumps({"image": name, "caption": caption_for(tag, count)}))
        written += len(data)
        count += 1
    (folder / "manifest.jsonl").write_text("\n".join(lines) + "\n")
    return count, written


def scenario_batch_memory(workdir: Path, factory: FigureFactory, args: argparse.Namespace) -> dict:
    root = scratch_dir("p2p-bench-batchroot-")
    data = scratch_dir("p2p-bench-batchdata-")
    folder = root / "figures"
    server: ServerProcess | None = None
    try:
        log(f"batch_memory: writing a {args.batch_mb} MB manifest folder")
        count, written = write_batch(folder, factory, args.batch_mb)
        env = {
            "P2P_DATA_DIR": str(data),
            "P2P_INGEST__BATCH_ROOTS": json.dumps([str(root)]),
            **embedded_queue_env(),
        }
        server = ingest_server("batch", free_port(), workdir, env)
        server.pgdata = data / "pg"
        log(f"batch_memory: {count} figures, {written / MB:.0f} MB; starting an embedded server")
        server.start("/readyz")
        assert server.proc is not None
        group = ProcessGroup("server", server.proc.pid)
        sampler = RssSampler([group])
        sampler.start()
        time.sleep(1.0)
        cpu_before = group.cpu_seconds()
        start_rss = sampler.sample()["server"][0]
        progress: list[tuple[float, int]] = []
        with httpx.Client(base_url=server.base_url, timeout=60) as client:
            started = time.monotonic()
            response = client.post("/v1/batches", json={"kind": "manifest", "source": str(folder)})
            if response.status_code != 202:
                raise RuntimeError(f"POST /v1/batches: {response.status_code} {response.text[:500]}")
            batch_id = response.json()["id"]
            status: dict[str, Any] = {}
            deadline = started + max(1800.0, count * 2.0)
            while time.monotonic() < deadline:
                status = client.get(f"/v1/batches/{batch_id}").json()
                progress.append((time.monotonic(), int(status.get("processed", 0))))
                if status.get("status") in ("succeeded", "completed_with_errors", "failed"):
                    break
                time.sleep(0.25)
            finished = time.monotonic()
        time.sleep(1.0)
        sampler.stop()
        cpu = group.cpu_seconds() - cpu_before
        end_rss = sampler.sample()["server"][0]
        peak = sampler.peak("server")
        at_progress = {}
        for pct in (25, 50, 75, 100):
            needed = count * pct / 100
            when = next((t for t, done in progress if done >= needed), finished)
            at_progress[f"{pct}%"] = round(sampler.at(when, "server") / MiB, 1)
        growth = (peak - start_rss) / MiB
        tail = at_progress["100%"] - at_progress["50%"]
        batch_mib = written / MiB
        elapsed = finished - started
        result = {
            "figures": count,
            "batch_mb": round(written / MB, 1),
            "status": status.get("status"),
            "ingested": status.get("ingested"),
            "duplicates": status.get("duplicates"),
            "failed": status.get("failed"),
            "error": status.get("error"),
            "wall_s": round(elapsed, 2),
            "figures_per_s": round(count / elapsed, 2) if elapsed else None,
            "server_cpu_ms_per_figure": round(cpu * 1000 / count, 2),
            "server_rss_mb": {
                "start": round(start_rss / MiB, 1),
                **at_progress,
                "peak": round(peak / MiB, 1),
                "after_idle_1s": round(end_rss / MiB, 1),
            },
            "peak_growth_mb": round(growth, 1),
            "peak_growth_fraction_of_batch": round(growth / batch_mib, 4),
            "growth_50_to_100_percent_mb": round(tail, 1),
            "flat": growth <= max(FLAT_ALLOWANCE_MIB, FLAT_PEAK_FRACTION * batch_mib)
            and tail <= max(FLAT_ALLOWANCE_MIB / 2, FLAT_TAIL_FRACTION * batch_mib),
            "rss_samples": len(sampler.samples),
            "rss_trace_mb": _downsample(sampler, started, "server", points=40),
        }
        log(
            f"  batch: {status.get('status')} {status.get('ingested')} ingested in {elapsed:.1f} s; "
            "RSS start "
            f"{result['server_rss_mb']['start']} peak {result['server_rss_mb']['peak']} MiB "
            f"(growth {growth:.1f} MiB = {growth / batch_mib:.1%} of the batch)"
        )
        return result
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(data, ignore_errors=True)


def _downsample(sampler: RssSampler, t0: float, group: str, points: int) -> list[tuple[float, float]]:
    samples = sampler.samples
    if not samples:
        return []
    step = max(1, len(samples) // points)
    return [(round(t - t0, 2), round(s[group][0] / MiB, 1)) for t, s in samples[::step]]


# --- report ----------------------------------------------------------------------------------


def machine_info() -> dict:
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    versions = {}
    from importlib.metadata import PackageNotFoundError, version

    for package in ("fastapi", "starlette", "uvicorn", "python-multipart", "pillow", "httpx", "h11"):
        with contextlib.suppress(PackageNotFoundError):
            versions[package] = version(package)
    for package in ("httptools", "uvloop"):
        try:
            versions[package] = version(package)
        except PackageNotFoundError:
            versions[package] = "not installed"
    return {
        "nproc": os.cpu_count(),
        "cpu_model": model or platform.processor(),
        "memory_gb": round(psutil.virtual_memory().total / 1024**3, 1),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "packages": versions,
    }


def ratios(results: dict[str, dict[str, Any]]) -> dict:
    """Each scenario against the bare endpoint measured with the same client in the same run."""
    bare_runs = [results[k] for k in BARE_RUNS if k in results]
    # The median of the bare runs taken at the start, middle and end of the benchmark.
    bare_fps = statistics.median(r["figures_per_s"] for r in bare_runs)
    bare_p50 = statistics.median(r["latency_ms"]["p50"] for r in bare_runs)
    bare_p99 = statistics.median(r["latency_ms"]["p99"] for r in bare_runs)
    bare_cpu = statistics.median(r["server_cpu_ms_per_figure"] for r in bare_runs)
    out: dict[str, Any] = {
        "reference": {
            "bare_figures_per_s": round(bare_fps, 2),
            "bare_p50_ms": round(bare_p50, 1),
            "bare_p99_ms": round(bare_p99, 1),
            "bare_server_cpu_ms_per_figure": round(bare_cpu, 2),
            "runs": len(bare_runs),
            "figures_per_s_of_each_run": [r["figures_per_s"] for r in bare_runs],
            "spread_max_over_min": round(
                max(r["figures_per_s"] for r in bare_runs) / min(r["figures_per_s"] for r in bare_runs), 2
            ),
        }
    }
    for name in ("bare_form", "embedded", "servers"):
        if name not in results:
            continue
        r = results[name]
        cost = bare_fps / r["figures_per_s"] if r["figures_per_s"] else float("inf")
        out[name] = {
            "cost_x_bare_throughput": round(cost, 2),
            "p50_x_bare": round(r["latency_ms"]["p50"] / bare_p50, 2),
            "p99_x_bare": round(r["latency_ms"]["p99"] / bare_p99, 2),
            "server_cpu_x_bare": round(r["server_cpu_ms_per_figure"] / bare_cpu, 2) if bare_cpu else None,
        }
        if name != "bare_form":
            out[name]["meets_3x_target"] = cost <= TARGET_COST_RATIO
    return out


def print_table(kind: str, results: dict[str, dict[str, Any]], report_ratios: dict) -> None:
    header = (
        "scenario",
        "fig/s",
        "p50 ms",
        "p99 ms",
        "err",
        "peak RSS MiB",
        "srv CPU ms/fig",
        "cli CPU ms/fig",
    )
    rows = [(*header, "cost x bare")]
    for name in ("bare", "bare_form", "embedded", "bare_mid", "servers", "bare_end"):
        if name not in results:
            continue
        r = results[name]
        cost = report_ratios.get(name, {}).get("cost_x_bare_throughput")
        rows.append(
            (
                name,
                f"{r['figures_per_s']:.1f}",
                f"{r['latency_ms']['p50']:.0f}",
                f"{r['latency_ms']['p99']:.0f}",
                str(r["errors"]),
                f"{r['server_rss_mb']['peak']:.0f}",
                f"{r['server_cpu_ms_per_figure']:.1f}",
                f"{r['client_cpu_ms_per_figure']:.1f}",
                "(reference)" if cost is None else f"{cost:.2f}",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    print(f"\n{kind} client, {results['bare']['clients']} concurrent:")
    for row in rows:
        cells = zip(row, widths, strict=True)
        print("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(cells)))


def markdown_report(report: dict) -> str:
    """The results of one run as Markdown tables (for bench/README.md)."""
    lines: list[str] = []
    machine = report["machine"]
    lines.append(
        f"Run of {report['date']}: {machine['nproc']} cores ({machine['cpu_model']}), "
        f"Python {machine['python']}, {report['config']['figures_per_scenario']} figures per ingest "
        f"scenario, {report['config']['figures_per_bare_run']} per bare run, "
        f"{report['config']['clients']} clients, figures of {report['config']['figure_bytes_mean']} bytes."
    )
    for kind, by_name in report["scenarios"].items():
        ratios = report["ratios"][kind]
        lines += [
            "",
            f"**{kind} client**",
            "",
            "| scenario | figures/s | p50 ms | p99 ms | errors | server RSS before / peak / after MiB "
            "| server CPU ms/figure | client CPU ms/figure | other processes, cores | cost x bare |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for name in ("bare", "bare_form", "embedded", "bare_mid", "servers", "bare_end"):
            if name not in by_name:
                continue
            r = by_name[name]
            rss = r["server_rss_mb"]
            cost = ratios.get(name, {}).get("cost_x_bare_throughput")
            other = r.get("machine", {}).get("other_processes_cores")
            lines.append(
                f"| {name} | {r['figures_per_s']:.1f} | {r['latency_ms']['p50']:.0f} | "
                f"{r['latency_ms']['p99']:.0f} | {r['errors']} | {rss['before']:.0f} / {rss['peak']:.0f} / "
                f"{rss['after']:.0f} | {r['server_cpu_ms_per_figure']:.1f} | "
                f"{r['client_cpu_ms_per_figure']:.1f} | {'' if other is None else other} | "
                f"{'reference' if cost is None else f'{cost:.2f}'} |"
            )
        ref = ratios["reference"]
        lines.append("")
        lines.append(
            f"Reference (median of the bare runs {ref['figures_per_s_of_each_run']}): "
            f"{ref['bare_figures_per_s']} figures/s, p50 {ref['bare_p50_ms']} ms, server CPU "
            f"{ref['bare_server_cpu_ms_per_figure']} ms/figure."
        )
        for name in ("embedded", "servers"):
            if name in ratios:
                x = ratios[name]
                lines.append(
                    f"- {name}: throughput cost **{x['cost_x_bare_throughput']}x** bare, p50 "
                    f"{x['p50_x_bare']}x, p99 {x['p99_x_bare']}x, server CPU {x['server_cpu_x_bare']}x: "
                    f"{'meets' if x['meets_3x_target'] else 'misses'} the 3x target."
                )
    if "batch_memory" in report:
        b = report["batch_memory"]
        rss = b["server_rss_mb"]
        lines += [
            "",
            "**Batch memory** (embedded server, `POST /v1/batches`, manifest folder)",
            "",
            "| batch | figures | status | wall s | figures/s | RSS start | 25% | 50% | 75% | 100% | peak "
            "| peak growth | flat |",
            "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
            f"| {b['batch_mb']} MB | {b['figures']} | {b['status']} ({b['ingested']} ingested, "
            f"{b['failed']} failed) | {b['wall_s']} | {b['figures_per_s']} | {rss['start']} | {rss['25%']} | "
            f"{rss['50%']} | {rss['75%']} | {rss['100%']} | {rss['peak']} | {b['peak_growth_mb']} MiB "
            f"({b['peak_growth_fraction_of_batch']:.1%}) | {'yes' if b['flat'] else 'no'} |",
        ]
    for label, stage in report.get("stages", {}).items():
        lines += [
            "",
            f"**Stages, {label}** (one figure at a time, in-process, ms per figure; CPU is the thread's "
            "own CPU time, the rest of the wall time is waiting)",
            "",
            "| stage | wall | CPU |",
            "|---|---:|---:|",
        ]
        for name, value in stage["ms_per_figure"].items():
            lines.append(f"| {name} | {value['wall']} | {value['cpu']} |")
        db = stage["database_per_figure"]
        conc = stage["concurrent_in_process"]
        lines += [
            "",
            f"Database per figure: {db['statements']:.0f} statements (with {db['savepoints']:.0f} "
            f"SAVEPOINT/RELEASE pairs), {db['commits']:.0f} commit(s), {db['pool_checkouts']:.0f} "
            "pool checkouts (each with a pre-ping).",
            f"{conc['threads']} threads in-process, no HTTP: {conc['as_is']['figures_per_s']} figures/s "
            f"({conc['as_is']['cpu_ms_per_figure']} ms CPU/figure); what-if header-only image check: "
            f"{conc['what_if_header_only_check']['figures_per_s']} figures/s "
            f"({conc['what_if_header_only_check']['cpu_ms_per_figure']} ms CPU/figure).",
        ]
    return "\n".join(lines) + "\n"


def print_verdicts(results: Results, report: dict[str, Any]) -> None:
    for kind, by_name in results.items():
        print_table(kind, by_name, report["ratios"][kind])
        for name in ("embedded", "servers"):
            if name in report["ratios"][kind]:
                r = report["ratios"][kind][name]
                verdict = "meets" if r["meets_3x_target"] else "MISSES"
                print(
                    f"  {name}: costs {r['cost_x_bare_throughput']}x the bare endpoint in figures/s "
                    f"(p50 {r['p50_x_bare']}x, server CPU {r['server_cpu_x_bare']}x): "
                    f"{verdict} the 3x target"
                )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--figures", type=int, default=None, help="figures per load scenario (default 400)")
    parser.add_argument("--clients", type=int, default=16, help="concurrent clients (default 16)")
    parser.add_argument("--batch-mb", type=int, default=None, help="batch size in MB (default 500)")
    parser.add_argument("--stage-figures", type=int, default=None, help="figures timed per stage run")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "ingest.json")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 48 figures, 48 MB batch")
    parser.add_argument(
        "--client",
        choices=("httpx", "raw", "both"),
        default="both",
        help="load generator: httpx.AsyncClient, a minimal asyncio HTTP/1.1 client, or both (default)",
    )
    parser.add_argument(
        "--bare-factor", type=int, default=2, help="the bare endpoint gets this many times more figures"
    )
    parser.add_argument("--skip-servers", action="store_true", help="no PostgreSQL/Redis/S3 scenario")
    parser.add_argument("--skip-batch", action="store_true", help="no batch memory scenario")
    parser.add_argument(
        "--markdown", type=Path, default=None, metavar="JSON", help="print a results file as Markdown"
    )
    parser.add_argument(
        "--abba",
        type=int,
        default=0,
        metavar="ROUNDS",
        help="only the A B B A comparison: every server up at once, each ingest server interleaved "
        "with the bare endpoint over ROUNDS rounds (bench/abba.py); use with --client httpx",
    )
    parser.add_argument("--serve-bare", type=int, default=None, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_bare is not None:
        run_bare_app(args.serve_bare)
        return 0
    if args.markdown is not None:
        print(markdown_report(json.loads(args.markdown.read_text())), end="")
        return 0
    args.figures = args.figures or (48 if args.quick else 400)
    args.batch_mb = args.batch_mb or (48 if args.quick else 500)
    args.stage_figures = args.stage_figures or (10 if args.quick else 40)
    args.warmup = args.clients
    args.client_kinds = ["httpx", "raw"] if args.client == "both" else [args.client]

    def interrupted(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)
    workdir = scratch_dir("p2p-bench-")
    backends: Backends | None = None
    results: Results = {}
    report: dict[str, Any] = {
        "benchmark": "ingest",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine_info(),
        "config": {
            "figures_per_scenario": args.figures,
            "figures_per_bare_run": args.figures * args.bare_factor,
            "clients": args.clients,
            "warmup_requests": args.warmup,
            "batch_mb": args.batch_mb,
            "quick": args.quick,
            "client_kinds": args.client_kinds,
            "embedded_server_env": embedded_queue_env(),
        },
    }
    started = time.monotonic()
    try:
        log("generating figures")
        factory = FigureFactory()
        report["config"]["figure_bytes_mean"] = factory.mean_bytes
        report["config"]["figure_pixels"] = list(factory.size)
        log(
            f"  {len(factory.bases)} base JPEGs of {factory.size[0]}x{factory.size[1]}, "
            f"~{factory.mean_bytes} bytes each"
        )
        if args.abba:
            return abba_only(report, workdir, factory, args)
        scenario_bare(results, workdir, factory, args, "bare")
        scenario_embedded(results, workdir, factory, args)
        stage_report: dict[str, Any] = {}
        stage_data = scratch_dir("p2p-bench-stages-")
        try:
            log("stages: embedded profile, in-process")
            stage_report["embedded"] = measure_stages(
                "embedded",
                stage_settings_embedded(stage_data),
                factory,
                args.stage_figures,
                None,
                True,
                args.clients,
            )
        finally:
            shutil.rmtree(stage_data, ignore_errors=True)
        scenario_bare(results, workdir, factory, args, "bare_mid")
        if not args.skip_servers:
            backends = start_backends(workdir / "backends")
            token = scenario_servers(results, workdir, factory, args, backends)
            log("stages: PostgreSQL + Redis + S3, in-process")
            stage_report["servers"] = measure_stages(
                "servers",
                stage_settings_servers(backends),
                factory,
                args.stage_figures,
                token,
                True,
                args.clients,
            )
            backends.stop()
            backends = None
        scenario_bare(results, workdir, factory, args, "bare_end")
        report["scenarios"] = results
        report["stages"] = stage_report
        report["ratios"] = {kind: ratios(by_name) for kind, by_name in results.items()}
        report["targets"] = {
            "ingest_cost_x_bare_max": TARGET_COST_RATIO,
            "batch_flat": f"peak RSS growth <= max({FLAT_ALLOWANCE_MIB:.0f} MiB, {FLAT_PEAK_FRACTION:.0%} of "
            f"the batch) and RSS(100%) - RSS(50%) <= max({FLAT_ALLOWANCE_MIB / 2:.0f} MiB, "
            f"{FLAT_TAIL_FRACTION:.0%} of it)",
        }
        if not args.skip_batch:
            report["batch_memory"] = scenario_batch_memory(workdir, factory, args)
        report["wall_s"] = round(time.monotonic() - started, 1)
        print_verdicts(results, report)
        print()
        if "batch_memory" in report:
            b = report["batch_memory"]
            print(
                f"batch {b['batch_mb']} MB: RSS {b['server_rss_mb']} MiB; "
                f"peak growth {b['peak_growth_mb']} MiB ({b['peak_growth_fraction_of_batch']:.1%} "
                f"of the batch): {'flat' if b['flat'] else 'NOT flat'}"
            )
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
        print(f"\nwrote {args.out} ({report['wall_s']} s)")
        return 0
    except KeyboardInterrupt:
        log("interrupted; stopping servers")
        return 130
    finally:
        if backends is not None:
            backends.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
