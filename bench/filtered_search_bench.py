"""Filtered vector search: the cost-based planner (``vectors.search``) against exact ranking.

One process, its own embedded PostgreSQL (as the embedded profile starts it) in ``--data-dir``
(kept with ``--keep``, so a second run reuses the loaded, indexed table; otherwise a temp folder
removed at the end):

1. Data: ``search_bench.make_data`` (``--n`` clustered 512-d unit vectors, a ``rare`` figure type on
   1 % of rows uncorrelated with the clusters), years drawn from 2000-2019 so that ``year 2018-2019``
   is a 10 % filter; exact top-10 per query by numpy within each filter's rows.
2. PostgreSQL: the product's table (COPY, HNSW m=16 / ef_construction=64, ANALYZE, prewarm).
3. Calibration: ``calibration.calibrate`` on the table, its wall time and the costs it measured.
4. For no filter, the 1 % filter and the 10 % filter: the plan the planner picks, then every query
   through four arms, interleaved query by query with the order rotated and reversed on every other
   query (ABBA): **product** (``vectors.search`` with the calibrated costs), **exact** (every
   matching row ranked exactly: the reference) and, for insight, each other path forced (bits,
   graph). Per arm: p50 / p99 / mean wall ms, recall@10 against numpy, CPU ms per query (this
   process + its PostgreSQL backend), and the product / exact p50 ratio in each quarter of the
   queries (the spread).

    .venv/bin/python bench/filtered_search_bench.py [--n 200000] [--queries 400]
        [--data-dir /tmp/p2p-fsb-200k --keep] [--out bench/results/filtered-search.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import psutil
from sqlalchemy import Connection, Engine

from p2p.embedding_api import calibration, search_plan, vectors
from p2p.embedding_api.search_plan import PathCosts, PathName
from p2p.shared.db.engine import make_engine
from p2p.shared.embedded import EmbeddedPostgres
from p2p.shared.settings import DatabaseSettings

sys.path.insert(0, str(Path(__file__).parent))
import search_bench as sb

K = sb.K
EF_SEARCH = 200  # the service's default (P2P_EMBEDDING__HNSW_EF_SEARCH)
VERSION = uuid.UUID("00000000-0000-4000-8000-00000000f5b0")
ARMS: tuple[str, ...] = ("product", "exact", "bits", "graph")
MASK = (1 << 64) - 1


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def machine() -> dict[str, Any]:
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    fields = dict(line.split(":", 1) for line in lscpu.splitlines() if ":" in line)
    flags = fields.get("Flags", "").split()
    return {
        "cpu_model": fields.get("Model name", "").strip(),
        "cpus": os.cpu_count(),
        "simd_flags": [f for f in flags if f.startswith(("avx", "sse4", "fma", "f16c"))],
        "python": sys.version.split()[0],
        "platform": platform.platform(),
    }


def filters_of(d: dict[str, Any]) -> dict[str, tuple[vectors.SearchFilters, np.ndarray | None]]:
    years = d["year"]
    return {
        "none": (vectors.SearchFilters(), None),
        "rare_1pct": (vectors.SearchFilters(figure_type=sb.RARE), np.flatnonzero(d["rare"])),
        "years_10pct": (
            vectors.SearchFilters(year_min=2018, year_max=2019),
            np.flatnonzero((years >= 2018) & (years <= 2019)),
        ),
    }


def build(engine: Engine, d: dict[str, Any], n: int, dim: int, timings: dict[str, float]) -> None:
    vectors.ensure_table(engine, VERSION, dim, indexes=False)
    t0 = time.perf_counter()
    for start in range(0, n, 50_000):
        with engine.begin() as conn:
            vectors.copy_rows(conn, VERSION, sb.rows_of(d, start, min(n, start + 50_000)))
    timings["pg_copy"] = round(time.perf_counter() - t0, 1)
    table = vectors.table_name(VERSION)
    with engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql(f"VACUUM ANALYZE {table}")
    t0 = time.perf_counter()
    vectors.build_indexes(engine, VERSION)
    timings["pg_hnsw_build"] = round(time.perf_counter() - t0, 1)
    log(f"COPY {timings['pg_copy']} s, HNSW {timings['pg_hnsw_build']} s")


def prewarm(engine: Engine) -> None:
    table = vectors.table_name(VERSION)
    with engine.connect() as conn:
        conn = conn.execution_options(isolation_level="AUTOCOMMIT")
        conn.exec_driver_sql(f"ANALYZE {table}")
        try:
            conn.exec_driver_sql("CREATE EXTENSION IF NOT EXISTS pg_prewarm")
            for rel in (table, f"{table}_hnsw_region", f"{table}_figure_type", f"{table}_year"):
                conn.exec_driver_sql("SELECT pg_prewarm(%s)", (rel,))
        except Exception as exc:  # the extension may be missing from the embedded build
            log(f"no prewarm: {type(exc).__name__}")


def backend_cpu_s(conn: Connection) -> psutil.Process:
    pid = int(conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one())
    conn.rollback()
    return psutil.Process(pid)


def one(
    conn: Connection, q: np.ndarray, arm: str, flt: vectors.SearchFilters, costs: PathCosts
) -> tuple[float, list[int]]:
    force: PathName | None = None if arm == "product" else arm  # type: ignore[assignment]
    t0 = time.perf_counter()
    hits = vectors.search(
        conn, VERSION, q, level="region", k=K, filters=flt, ef_search=EF_SEARCH, costs=costs, force=force
    )
    conn.rollback()
    return time.perf_counter() - t0, [h.item_id.int & MASK for h in hits]


def interleaved(
    conn: Connection, queries: np.ndarray, flt: vectors.SearchFilters, costs: PathCosts
) -> dict[str, dict[str, list[Any]]]:
    backend = backend_cpu_s(conn)
    runs: dict[str, dict[str, list[Any]]] = {a: {"wall": [], "cpu": [], "found": []} for a in ARMS}
    for i, q in enumerate(queries):
        order = ARMS[i % len(ARMS) :] + ARMS[: i % len(ARMS)]
        for arm in order if i % 2 == 0 else tuple(reversed(order)):
            c0 = time.process_time() + sum(backend.cpu_times()[:2])
            wall, found = one(conn, q, arm, flt, costs)
            runs[arm]["cpu"].append(time.process_time() + sum(backend.cpu_times()[:2]) - c0)
            runs[arm]["wall"].append(wall)
            runs[arm]["found"].append(found)
    return runs


def summary(run: dict[str, list[Any]], truth: np.ndarray) -> dict[str, Any]:
    out = sb.summarise(run["wall"], run["found"], truth)
    out["cpu_ms_mean"] = round(1000 * float(np.mean(run["cpu"])), 3)
    out["wall_ms_mean_over_cpu_ms_mean"] = round(out["mean_ms"] / max(out["cpu_ms_mean"], 1e-9), 2)
    return out


def quarter_ratios(a: list[float], b: list[float]) -> list[float]:
    n = len(a) // 4
    return [
        round(float(np.median(a[i * n : (i + 1) * n]) / np.median(b[i * n : (i + 1) * n])), 3)
        for i in range(4)
    ]


def open_pg(folder: Path, pg_settings: dict[str, str]) -> tuple[EmbeddedPostgres, Engine]:
    """A new server with the settings, or the one a ``--keep`` run left in ``folder``."""
    if not folder.exists():
        return sb.start_pg(folder, pg_settings)
    pg = EmbeddedPostgres(folder)
    return pg, make_engine(pg.start(), DatabaseSettings())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=200_000)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--queries", type=int, default=400)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--keep", action="store_true", help="keep the data folder for another run")
    parser.add_argument("--out", type=Path, default=Path("bench/results/filtered-search.json"))
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    result: dict[str, Any] = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join(sys.argv),
        "machine": machine(),
        "load_avg_at_start": [round(x, 2) for x in os.getloadavg()],
        "params": {"n": args.n, "dim": args.dim, "queries": args.queries, "k": K, "ef_search": EF_SEARCH},
        "timings_s": {},
    }
    clusters = min(5000, max(100, args.n // 250))
    d = sb.make_data(args.n, args.dim, clusters, args.queries, args.seed, "lowrank")
    d["year"] = np.random.default_rng(args.seed + 1).integers(2000, 2020, size=args.n).astype(np.int16)
    flts = filters_of(d)
    truths = {name: sb.ground_truth(d["data"], d["queries"], rows) for name, (_, rows) in flts.items()}
    log(f"data and ground truth for {args.n} x {args.dim}")
    vector_bytes = args.n * (args.dim * 4 + 200)
    pg_settings = {
        "shared_buffers": f"{int(min(8192, max(256, 2.6 * vector_bytes / 2**20)))}MB",
        "maintenance_work_mem": f"{int(min(4096, max(256, 1.6 * vector_bytes / 2**20)))}MB",
        "max_parallel_maintenance_workers": "2",
        "jit": "off",
    }
    result["pg_settings"] = pg_settings
    data_dir = args.data_dir or Path(tempfile.mkdtemp(prefix="p2p-fsb-"))
    data_dir.mkdir(parents=True, exist_ok=True)
    data_dir.chmod(0o755)
    pg: EmbeddedPostgres | None = None
    try:
        pg, engine = open_pg(data_dir / "pg", pg_settings)
        result.update(sb.pg_versions(engine))
        with engine.connect() as conn:
            loaded = vectors.count(conn, VERSION, "region")
        if loaded != args.n:
            if loaded:
                vectors.drop_table(engine, VERSION)
            build(engine, d, args.n, args.dim, result["timings_s"])
        prewarm(engine)
        measure(engine, d, flts, truths, result)
        engine.dispose()
    finally:
        if pg is not None:
            pg.stop()
        if not args.keep:
            shutil.rmtree(data_dir, ignore_errors=True)
    result["load_avg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    log(f"wrote {args.out}")


def calibrated(engine: Engine) -> dict[str, Any]:
    t0 = time.perf_counter()
    costs = calibration.calibrate(engine, VERSION)
    out = {"wall_s": round(time.perf_counter() - t0, 3), **costs.as_dict()}
    log(f"calibration {out}")
    return out


def measure(
    engine: Engine,
    d: dict[str, Any],
    flts: dict[str, tuple[vectors.SearchFilters, np.ndarray | None]],
    truths: dict[str, np.ndarray],
    result: dict[str, Any],
) -> None:
    # Calibrated twice: as the service does right after start-up (caches cold), and after a
    # warm-up of every path (what the service's later calibration sees); the runs use the second.
    queries = d["queries"]
    result["calibration_cold"] = calibrated(engine)
    with engine.connect() as conn:
        for q in queries[:30]:
            for name, (flt, _) in flts.items():
                for arm in ("product", "graph") if name == "none" else ARMS:
                    one(conn, q, arm, flt, search_plan.DEFAULT_COSTS)
    result["calibration"] = calibrated(engine)
    costs = PathCosts(**{k: v for k, v in result["calibration"].items() if k != "wall_s"})
    with engine.connect() as conn:
        result["filters"] = {}
        for name, (flt, rows) in flts.items():
            plan = vectors.plan_for(
                conn, VERSION, level="region", k=K, filters=flt, ef_search=EF_SEARCH, costs=costs
            )
            conn.rollback()
            # Unfiltered, the exact and bits arms read every row (~0.3 s each at 200k): fewer queries.
            qs = queries if rows is not None else queries[:40]
            truth = truths[name][: len(qs)]
            runs = interleaved(conn, qs, flt, costs)
            entry: dict[str, Any] = {
                "matching_rows": len(rows) if rows is not None else len(d["data"]),
                "plan": {
                    "path": plan.path,
                    "ef_search": plan.ef_search,
                    "candidates": plan.candidates,
                    "estimate": plan.estimate,
                    "predicted_ms": round(plan.predicted_ms, 3),
                },
                "load_avg_1m": round(os.getloadavg()[0], 2),
                "queries": len(qs),
                "arms": {arm: summary(runs[arm], truth) for arm in ARMS},
                "product_over_exact_p50_by_quarter": quarter_ratios(
                    runs["product"]["wall"], runs["exact"]["wall"]
                ),
            }
            entry["product_over_exact_p50"] = round(
                entry["arms"]["product"]["p50_ms"] / entry["arms"]["exact"]["p50_ms"], 3
            )
            result["filters"][name] = entry
            log(f"{name}: {json.dumps(entry)}")


if __name__ == "__main__":
    main()
