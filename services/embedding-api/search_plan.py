"""Which way a vector search runs, chosen by predicted cost (no database access here).

Three ways answer the ``k`` nearest rows of a level under a filter (see ``vectors.search``):

- ``exact``: read every matching row and rank it (recall 1);
- ``bits``: rank the matching rows by the Hamming distance of their stored sign bits (an index-only
  scan of the covering metadata btree), then rerank the best candidates exactly;
- ``graph``: walk the level's HNSW index with pgvector's iterative scan, with ``ef_search`` large
  enough that the first batch of candidates holds :data:`GRAPH_OVERFETCH` times the rows wanted.

Each way's cost is linear in what it touches, with coefficients measured on the running database
(:mod:`p2p.embedding_api.calibration`): matching rows for ``exact``, matching rows and reranked
candidates for ``bits``, graph candidates plus the heap rows checked against the filter for
``graph``. The planner's row estimate for the filter says how many rows that is, and the cheapest
way wins, ``exact`` on ties. ``exact`` is always a candidate, so a plan is never predicted to be
slower than exact ranking. ``graph`` is a candidate only while its first batch can hold enough
matching rows (``ef_search`` at most :data:`MAX_EF_SEARCH`): past that pgvector's relaxed-order
iterative scan hands back rows of later, farther batches, and recall fell to 0.61 at a 1 % filter
(bench/results/2026-11-22-search-runs-1-2.md).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

PathName = Literal["exact", "bits", "graph"]
PATHS: tuple[PathName, ...] = ("exact", "bits", "graph")

# pgvector's upper bound for hnsw.ef_search.
MAX_EF_SEARCH = 1000
# Matching rows the graph path's first batch should hold per row returned: the nearest matching
# rows are then among the best of that batch, so recall is that of an unfiltered walk.
GRAPH_OVERFETCH = 3
# Candidates the bits path reranks: max(RERANK_CANDIDATES, RERANK_PER_RESULT x rows wanted,
# RERANK_FRACTION x matching rows). How many hold the exact top 10 depends on the data: on
# bench/search_bench.py's 1M 512-d clustered vectors and a 1% filter, 400 held 90.6% of it and 800
# held 96%.
RERANK_CANDIDATES = 800
RERANK_PER_RESULT = 20
RERANK_FRACTION = 0.08


@dataclass(frozen=True)
class PathCosts:
    """Milliseconds per unit of work of each path, measured on one table (see calibration).

    Predicted times: exact ``fixed_ms + exact_row_ms x rows``; bits ``fixed_ms + bits_row_ms x rows
    + rerank_ms x candidates``; graph ``graph_fixed_ms + graph_tuple_ms x ef_search + exact_row_ms x
    heap rows checked against the filter``."""

    fixed_ms: float
    exact_row_ms: float
    bits_row_ms: float
    rerank_ms: float
    graph_fixed_ms: float
    graph_tuple_ms: float
    source: str = "default"  # "default", or what was measured: table, level, probe filter, rows
    index_oid: int = 0  # the HNSW index the graph costs were measured on (0: not measured)

    def __post_init__(self) -> None:
        for name in (
            "fixed_ms",
            "exact_row_ms",
            "bits_row_ms",
            "rerank_ms",
            "graph_fixed_ms",
            "graph_tuple_ms",
        ):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number of milliseconds, got {value!r}")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# Used until a calibration has run (or for what it cannot measure): the costs a calibration in CPU
# time measured on bench/filtered_search_bench.py's 200k x 512 table on the 2-core development
# machine, after a warm-up (run 4 in bench/results/2026-11-27-filtered-search-runs-1-4.md).
DEFAULT_COSTS = PathCosts(
    fixed_ms=1.35,
    exact_row_ms=0.0014,
    bits_row_ms=0.00035,
    rerank_ms=0.0065,
    graph_fixed_ms=2.7,
    graph_tuple_ms=0.02,
)


@dataclass(frozen=True)
class Plan:
    path: PathName
    ef_search: int  # graph: the walk's ef_search
    candidates: int  # bits: rows reranked exactly
    estimate: float  # the planner's matching rows
    predicted_ms: float


@dataclass
class CostSlot:
    """The costs a process plans with for its served model version; replaced by a calibration."""

    costs: PathCosts | None = None


def rerank_candidates(rows: float, limit: int) -> int:
    return max(RERANK_CANDIDATES, RERANK_PER_RESULT * limit, int(RERANK_FRACTION * rows))


def graph_ef(rows: float, level_rows: float, limit: int, ef_search: int) -> int:
    """The ef_search whose first batch should hold GRAPH_OVERFETCH x ``limit`` matching rows."""
    selectivity = min(1.0, max(rows, 1.0) / max(level_rows, 1.0))
    wanted = limit if selectivity >= 1.0 else math.ceil(GRAPH_OVERFETCH * limit / selectivity)
    return max(ef_search, limit, wanted)


def predicted(
    costs: PathCosts, path: PathName, *, rows: float, level_rows: float, limit: int, ef_search: int
) -> tuple[float, int, int]:
    """(predicted ms, ef_search, candidates) of one path."""
    if path == "exact":
        return costs.fixed_ms + costs.exact_row_ms * rows, 0, 0
    if path == "bits":
        candidates = rerank_candidates(rows, limit)
        return costs.fixed_ms + costs.bits_row_ms * rows + costs.rerank_ms * candidates, 0, candidates
    ef = graph_ef(rows, level_rows, limit, ef_search)
    # The executor fetches heap rows (for the filter) until it has ``limit`` matching ones.
    checked = limit * max(level_rows, 1.0) / max(rows, 1.0) if rows < level_rows else limit
    return costs.graph_fixed_ms + costs.graph_tuple_ms * ef + costs.exact_row_ms * checked, ef, 0


def choose(
    costs: PathCosts,
    *,
    rows: float,
    level_rows: float,
    limit: int,
    ef_search: int,
    has_bits: bool,
    force: PathName | None = None,
) -> Plan:
    """The cheapest eligible path for a query whose filter matches ``rows`` of ``level_rows``."""
    eligible: list[PathName] = ["exact"]
    if has_bits and rows > 2 * rerank_candidates(rows, limit):
        eligible.append("bits")
    if graph_ef(rows, level_rows, limit, ef_search) <= MAX_EF_SEARCH:
        eligible.append("graph")
    if force is not None:
        # A table made before the bits column existed has no bits to rank: exact instead.
        eligible = ["exact"] if force == "bits" and not has_bits else [force]
    best: Plan | None = None
    for path in eligible:
        ms, ef, candidates = predicted(
            costs, path, rows=rows, level_rows=level_rows, limit=limit, ef_search=ef_search
        )
        if best is None or ms < best.predicted_ms:
            best = Plan(path, min(ef, MAX_EF_SEARCH), candidates, rows, ms)
    assert best is not None
    return best
