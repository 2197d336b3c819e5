"""Measure what each search path costs on the running database (see search_plan.PathCosts).

Probe queries, each in its own transaction as a request runs it: the fixed cost of a query (an
exact search under a filter matching no row), unfiltered graph walks at two ``ef_search`` values,
and an exact search and the bits path's two stages under a probe filter taken from the table's own
statistics (a common value of an indexed metadata column, the one whose row count is nearest
:data:`PROBE_ROWS`). One round runs every probe query back to back on one stored vector (timed
in CPU ms of this thread and the PostgreSQL backend where the backend runs on this machine, see
``_Clock``); each per-unit cost is a difference of times within a round (so a slow spell of a
shared machine falls on both sides of it), and the median over a few rounds is kept. Rounds stop
once ``budget_s`` has passed (at least :data:`MIN_PROBES` run).
"""

from __future__ import annotations

import logging
import math
import statistics
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy import Connection, Engine

from p2p.embedding_api import vectors
from p2p.embedding_api.search_plan import DEFAULT_COSTS, PathCosts, Plan, rerank_candidates

log = logging.getLogger(__name__)

PROBE_QUERIES = 5
MIN_PROBES = 3
PROBE_ROWS = 4000
BUDGET_S = 5.0
GRAPH_EFS = (40, 400)
PROBE_K = 10
# The smallest cost a measurement may give: a difference of medians can come out at or below zero
# when a path's per-unit cost is lost in the noise.
MIN_MS = 1e-6
# Metadata columns (text) whose btree covers the sign bits.
_PROBE_COLUMNS = ("figure_type", "license_group", "journal")
_NO_FIGURE = uuid.UUID(int=0)


@dataclass(frozen=True)
class ProbeFilter:
    filters: vectors.SearchFilters
    rows: int
    described: str


Runner = Callable[[Connection, np.ndarray], object]


class _Clock:
    """Milliseconds of work. Where the connection's PostgreSQL backend runs on this machine, the CPU
    time of this thread plus the backend's (``/proc/<pid>/schedstat``, in ns): on a shared machine a
    query's wall time is mostly waiting for a core (5-28x its CPU time at load 10-25 on 2 cores),
    which no number of rounds averages out. Elsewhere (a remote server), wall time."""

    def __init__(self, conn: Connection) -> None:
        pid = int(conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one())
        conn.rollback()
        stat = Path(f"/proc/{pid}/schedstat")
        self.backend: Path | None = stat if _is_postgres(pid) and _readable(stat) else None
        self.kind = "cpu" if self.backend is not None else "wall"

    def now_ms(self) -> float:
        if self.backend is None:
            return time.perf_counter_ns() / 1e6
        return (time.thread_time_ns() + int(self.backend.read_text().split()[0])) / 1e6


def _is_postgres(pid: int) -> bool:
    try:
        return b"postgres" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _readable(path: Path) -> bool:
    try:
        int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return False
    return True


def _rounds(
    engine: Engine, runners: dict[str, Runner], probes: np.ndarray, budget_s: float
) -> tuple[list[dict[str, float]], str]:
    """Per probe vector, the ms of every runner back to back (order reversed every other round, so
    a slow spell of the machine falls on all of them alike), after one untimed warm-up round; stops
    after :data:`MIN_PROBES` rounds once ``budget_s`` has passed. Also which clock measured them."""
    deadline = time.perf_counter() + budget_s
    rounds: list[dict[str, float]] = []
    names = list(runners)
    with engine.connect() as conn:
        clock = _Clock(conn)
        for name in names:
            runners[name](conn, probes[0])
            conn.rollback()
        for i, q in enumerate(probes):
            times: dict[str, float] = {}
            for name in names if i % 2 == 0 else reversed(names):
                t0 = clock.now_ms()
                runners[name](conn, q)
                conn.rollback()
                times[name] = clock.now_ms() - t0
            rounds.append(times)
            if len(rounds) >= MIN_PROBES and time.perf_counter() > deadline:
                break
    return rounds, clock.kind


def _median(rounds: list[dict[str, float]], value: Callable[[dict[str, float]], float]) -> float:
    """The median over rounds of a cost computed within each round (differences of paired times)."""
    return max(MIN_MS, statistics.median(value(r) for r in rounds))


def _largest_level(conn: Connection, table: str) -> tuple[str, float]:
    sizes = {lv: vectors._estimated_rows(conn, table, f"level = '{lv}'", []) for lv in vectors.LEVELS}
    level = max(sizes, key=lambda lv: sizes[lv])
    return level, sizes[level]


def _probe_vectors(conn: Connection, table: str, level: str, rows: float, n: int) -> np.ndarray:
    vectors._adapt(conn)
    percent = min(100.0, 100.0 * 40 * n / max(rows, 1.0))
    found = conn.exec_driver_sql(
        f"SELECT embedding FROM {table} TABLESAMPLE SYSTEM (%s) WHERE level = '{level}' LIMIT %s",
        (percent, n),
    ).fetchall()
    if len(found) < n:
        found = conn.exec_driver_sql(
            f"SELECT embedding FROM {table} WHERE level = '{level}' LIMIT %s", (n,)
        ).fetchall()
    return np.stack([np.asarray(r[0], dtype=np.float32) for r in found]) if found else np.zeros((0, 0))


def _common_values(conn: Connection, table: str) -> list[tuple[str, str, float]]:
    """(column, value, fraction of the table's rows) from the planner's statistics."""
    found = conn.exec_driver_sql(
        "SELECT attname, most_common_vals::text::text[], most_common_freqs FROM pg_stats "
        "WHERE schemaname = current_schema() AND tablename = %s AND attname = ANY(%s)",
        (table, list(_PROBE_COLUMNS)),
    ).fetchall()
    out = []
    for column, values, freqs in found:
        for value, freq in zip(values or [], freqs or [], strict=False):
            out.append((str(column), str(value), float(freq)))
    return out


def _filter_on(column: str, value: str) -> vectors.SearchFilters:
    if column == "figure_type":
        return vectors.SearchFilters(figure_type=value)
    if column == "license_group":
        return vectors.SearchFilters(license_group=value)
    return vectors.SearchFilters(journal=value)


def probe_filter(conn: Connection, table: str, level: str, *, target: int = PROBE_ROWS) -> ProbeFilter | None:
    """The common metadata value whose rows at ``level`` are nearest ``target`` (log scale)."""
    total = vectors._estimated_rows(conn, table, "true", [])
    choices = _common_values(conn, table)
    if not choices:
        return None
    column, value, freq = min(choices, key=lambda c: abs(math.log(max(c[2] * total, 1.0) / target)))
    filters = _filter_on(column, value)
    where, params = vectors._where(level, filters)
    rows = int(
        conn.exec_driver_sql(f"SELECT count(*) FROM {table} WHERE {where}", tuple(params)).scalar_one()
    )
    if rows == 0:
        return None
    return ProbeFilter(filters, rows, f"{column} = {value!r} ({rows} rows, {freq:.3%} of the table)")


def _runner(
    version_id: uuid.UUID, level: str, filters: vectors.SearchFilters, plan: Plan, *, stage_one: bool = False
) -> Callable[[Connection, np.ndarray], object]:
    def run(conn: Connection, q: np.ndarray) -> object:
        prepared = vectors.prepare(conn, version_id, q, level, filters, PROBE_K)
        if stage_one:
            return vectors.rank_bits(conn, prepared, plan.candidates)
        return vectors.run_plan(conn, prepared, plan, max_scan_tuples=vectors.DEFAULT_MAX_SCAN_TUPLES)

    return run


def _plan(path: Any, *, ef: int = 0, candidates: int = 0) -> Plan:
    return Plan(path, ef, candidates, 0.0, 0.0)


def calibrate(
    engine: Engine, version_id: uuid.UUID, *, probes: int = PROBE_QUERIES, budget_s: float = BUDGET_S
) -> PathCosts:
    """The costs of every search path on ``version_id``'s table, measured now (bounded by
    ``budget_s``, give or take one probe per phase). Raises LookupError without a table."""
    table = vectors.table_name(version_id)
    with engine.connect() as conn:
        if vectors._table_dim(conn, table) is None:
            raise LookupError(f"no vector table for model version {version_id}")
        level, level_rows = _largest_level(conn, table)
        sample = _probe_vectors(conn, table, level, level_rows, max(probes, MIN_PROBES))
        probe = probe_filter(conn, table, level)
        has_bits = vectors._has_bits(conn, table)
        index_oid = conn.exec_driver_sql(
            "SELECT coalesce(to_regclass(%s)::oid, 0)", (vectors._index_name(table, level),)
        ).scalar_one()
    if len(sample) == 0:
        return DEFAULT_COSTS
    runners = _runners(version_id, level, probe, has_bits=has_bits)
    rounds, clock = _rounds(engine, runners, sample, budget_s)
    low, high = GRAPH_EFS
    graph_tuple = _median(rounds, lambda r: (r["graph_high"] - r["graph_low"]) / (high - low))
    costs: dict[str, Any] = {
        "fixed_ms": _median(rounds, lambda r: r["fixed"]),
        "graph_tuple_ms": graph_tuple,
        "graph_fixed_ms": _median(rounds, lambda r: r["graph_low"] - graph_tuple * low),
        "exact_row_ms": DEFAULT_COSTS.exact_row_ms,
        "bits_row_ms": DEFAULT_COSTS.bits_row_ms,
        "rerank_ms": DEFAULT_COSTS.rerank_ms,
        "index_oid": int(index_oid),
        "source": f"{table} {level} ({level_rows:.0f} rows), {clock} time, no probe: default row costs",
    }
    if probe is not None:
        costs.update(_row_costs(rounds, probe))
        costs["source"] = (
            f"{table} {level} ({level_rows:.0f} rows), probe {probe.described}, "
            f"{len(rounds)} rounds of {clock} time"
        )
    return PathCosts(**costs)


def _runners(
    version_id: uuid.UUID, level: str, probe: ProbeFilter | None, *, has_bits: bool
) -> dict[str, Runner]:
    nothing = vectors.SearchFilters(figure_id=_NO_FIGURE)
    everything = vectors.SearchFilters()
    runners = {
        "fixed": _runner(version_id, level, nothing, _plan("exact")),
        "graph_low": _runner(version_id, level, everything, _plan("graph", ef=GRAPH_EFS[0])),
        "graph_high": _runner(version_id, level, everything, _plan("graph", ef=GRAPH_EFS[1])),
    }
    if probe is not None:
        runners["exact"] = _runner(version_id, level, probe.filters, _plan("exact"))
        if has_bits:
            bits = _plan("bits", candidates=_candidates(probe))
            runners["bits_ranking"] = _runner(version_id, level, probe.filters, bits, stage_one=True)
            runners["bits"] = _runner(version_id, level, probe.filters, bits)
    return runners


def _candidates(probe: ProbeFilter) -> int:
    return min(probe.rows, rerank_candidates(probe.rows, PROBE_K))


def _row_costs(rounds: list[dict[str, float]], probe: ProbeFilter) -> dict[str, float]:
    out = {"exact_row_ms": _median(rounds, lambda r: (r["exact"] - r["fixed"]) / probe.rows)}
    if "bits" in rounds[0]:
        out["bits_row_ms"] = _median(rounds, lambda r: (r["bits_ranking"] - r["fixed"]) / probe.rows)
        out["rerank_ms"] = _median(rounds, lambda r: (r["bits"] - r["bits_ranking"]) / _candidates(probe))
    return out
