"""The search planner (p2p.embedding_api.search_plan) and its calibration on the real PostgreSQL."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, event

from p2p.embedding_api import calibration, search_plan, vectors
from p2p.embedding_api.search_plan import PathCosts, choose
from p2p.embedding_api.vectors import SearchFilters
from tests.test_vectors import Corpus, ids, loaded, queries

COSTS = PathCosts(
    fixed_ms=1.0,
    exact_row_ms=0.003,
    bits_row_ms=0.001,
    rerank_ms=0.006,
    graph_fixed_ms=1.5,
    graph_tuple_ms=0.01,
)


@pytest.fixture(scope="module")
def corpus(engine: Engine) -> Iterator[Corpus]:
    yield from loaded(engine, 5, 32, {"figure": 100, "panel": 200, "region": 2400})


@pytest.fixture(scope="module")
def calibrated(engine: Engine, corpus: Corpus) -> PathCosts:
    return calibration.calibrate(engine, corpus.version_id, probes=3, budget_s=5.0)


# --- the rule ------------------------------------------------------------------------------------


def test_a_very_selective_filter_is_ranked_exactly_and_no_filter_walks_the_graph() -> None:
    rows = 1_000_000.0
    selective = choose(COSTS, rows=50, level_rows=rows, limit=10, ef_search=200, has_bits=True)
    assert selective.path == "exact"
    unfiltered = choose(COSTS, rows=rows, level_rows=rows, limit=10, ef_search=200, has_bits=True)
    assert unfiltered.path == "graph" and unfiltered.ef_search == 200


def test_the_choice_follows_the_measured_costs_not_a_row_count() -> None:
    """The same 10,000 matching rows of 1M go to the sign bits when their scan is cheap, and to exact
    ranking when this database's measurements say reading the rows is cheaper than reranking."""
    rows, level_rows = 10_000.0, 1_000_000.0
    cheap_bits = choose(COSTS, rows=rows, level_rows=level_rows, limit=10, ef_search=200, has_bits=True)
    assert cheap_bits.path == "bits" and cheap_bits.candidates == 800
    dear_rerank = dataclasses.replace(COSTS, rerank_ms=0.05)
    assert (
        choose(dear_rerank, rows=rows, level_rows=level_rows, limit=10, ef_search=200, has_bits=True).path
        == "exact"
    )
    assert (
        choose(COSTS, rows=rows, level_rows=level_rows, limit=10, ef_search=200, has_bits=False).path
        == "exact"
    )


def test_medium_selectivity_walks_the_graph_with_a_batch_that_holds_enough_matches() -> None:
    plan = choose(COSTS, rows=100_000, level_rows=1_000_000, limit=10, ef_search=200, has_bits=True)
    assert plan.path == "graph"
    assert plan.ef_search == search_plan.GRAPH_OVERFETCH * 10 * 10  # 30 matches at 10 %
    # At 1 % the batch would need ef_search 3,000: past pgvector's limit, the graph is no candidate.
    rare = choose(COSTS, rows=10_000, level_rows=1_000_000, limit=10, ef_search=200, has_bits=True)
    assert rare.path != "graph"


def test_no_plan_is_predicted_slower_than_exact_ranking() -> None:
    for rows in (1, 10, 300, 2_000, 20_000, 200_000, 1_000_000):
        for costs in (
            COSTS,
            dataclasses.replace(COSTS, graph_tuple_ms=0.5),
            dataclasses.replace(COSTS, exact_row_ms=1e-5),
        ):
            plan = choose(costs, rows=rows, level_rows=1_000_000, limit=10, ef_search=200, has_bits=True)
            exact_ms, _, _ = search_plan.predicted(
                costs, "exact", rows=rows, level_rows=1e6, limit=10, ef_search=200
            )
            assert plan.predicted_ms <= exact_ms


def test_costs_must_be_positive() -> None:
    with pytest.raises(ValueError, match="exact_row_ms"):
        dataclasses.replace(COSTS, exact_row_ms=0.0)
    with pytest.raises(ValueError, match="graph_tuple_ms"):
        dataclasses.replace(COSTS, graph_tuple_ms=float("nan"))


# --- calibration on the real database -------------------------------------------------------------


def test_calibration_measures_positive_costs_on_this_table(
    engine: Engine, corpus: Corpus, calibrated: PathCosts
) -> None:
    table = vectors.table_name(corpus.version_id)
    assert calibrated.source.startswith(f"{table} region")
    assert "probe" in calibrated.source  # a probe filter was found in the table's statistics
    for name in ("fixed_ms", "exact_row_ms", "bits_row_ms", "rerank_ms", "graph_fixed_ms", "graph_tuple_ms"):
        assert getattr(calibrated, name) > 0
    assert calibrated.index_oid > 0
    assert calibrated != search_plan.DEFAULT_COSTS
    # With what was measured here: a handful of matching rows are ranked exactly, and a level of
    # 1M rows without a filter walks the graph.
    few = choose(calibrated, rows=20, level_rows=1_000_000, limit=10, ef_search=200, has_bits=True)
    assert few.path == "exact"
    unfiltered = choose(
        calibrated, rows=1_000_000, level_rows=1_000_000, limit=10, ef_search=200, has_bits=True
    )
    assert unfiltered.path == "graph"


def test_calibration_stops_taking_probes_past_its_budget(engine: Engine, corpus: Corpus) -> None:
    statements: list[str] = []

    def record(conn, cursor, statement, *args) -> None:  # type: ignore[no-untyped-def]
        statements.append(statement)

    event.listen(engine, "before_cursor_execute", record)
    try:
        calibration.calibrate(engine, corpus.version_id, probes=20, budget_s=0.0)
    finally:
        event.remove(engine, "before_cursor_execute", record)
    distances = [s for s in statements if "<#>" in s or "<=>" in s or "<~>" in s]
    # Six probe queries, in a warm-up round and MIN_PROBES rounds, not 20.
    assert len(distances) == 6 * (1 + calibration.MIN_PROBES)


def test_calibrating_a_missing_table_is_a_lookup_error(engine: Engine) -> None:
    with pytest.raises(LookupError):
        calibration.calibrate(engine, uuid.uuid4())


# --- every path on a small table ------------------------------------------------------------------


@pytest.mark.parametrize("path", ["exact", "bits", "graph"])
def test_every_path_agrees_with_numpy(engine: Engine, corpus: Corpus, path: search_plan.PathName) -> None:
    keep = lambda r: r.license_group == "commercial"  # noqa: E731 - a third of the rows
    filters = SearchFilters(license_group="commercial")
    recall = 0.0
    qs = queries(corpus, "region", 10, seed=12)
    with engine.connect() as conn:
        for q in qs:
            hits = vectors.search(
                conn, corpus.version_id, q, level="region", k=10, filters=filters, force=path, ef_search=100
            )
            truth = corpus.exact(q, "region", 10, keep)
            assert len(hits) == 10
            assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
            if path == "exact":
                assert ids(hits) == truth
            recall += len(set(ids(hits)) & set(truth)) / 10
            conn.rollback()
    assert recall / len(qs) >= (1.0 if path == "exact" else 0.9)


def test_searches_with_calibrated_costs_match_exact_for_selective_filters(
    engine: Engine, corpus: Corpus, calibrated: PathCosts
) -> None:
    filters = SearchFilters(figure_type="rare")
    keep = lambda r: r.figure_type == "rare"  # noqa: E731
    with engine.connect() as conn:
        plan = vectors.plan_for(
            conn, corpus.version_id, level="region", k=10, filters=filters, costs=calibrated
        )
        assert plan.path == "exact"
        for q in queries(corpus, "region", 5, seed=13):
            hits = vectors.search(
                conn, corpus.version_id, q, level="region", k=10, filters=filters, costs=calibrated
            )
            assert ids(hits) == corpus.exact(q, "region", 10, keep)
            conn.rollback()


def test_the_iterative_scan_returns_k_where_a_plain_walk_returns_fewer(
    engine: Engine, corpus: Corpus
) -> None:
    """Under a 1 % filter a plain HNSW walk with ef_search 40 finds the few rare rows among its 40
    candidates; the graph path's iterative scan keeps walking until it has k of them."""
    table = vectors.table_name(corpus.version_id)
    rare = {r.item_id for r in corpus.by_level["region"] if r.figure_type == "rare"}
    assert len(rare) >= 10
    q = queries(corpus, "region", 1, seed=14)[0]
    sql = (
        f"SELECT item_id FROM {table} WHERE level = 'region' AND figure_type = 'rare' "
        f"ORDER BY embedding <=> %s::vector LIMIT 10"
    )
    with engine.connect() as conn:
        # Only the graph may answer: the btree on figure_type is gone and sorting is forbidden.
        conn.exec_driver_sql(f"DROP INDEX {table}_figure_type")
        conn.exec_driver_sql("SET LOCAL enable_sort = off")
        conn.exec_driver_sql("SET LOCAL enable_seqscan = off")
        conn.exec_driver_sql("SET LOCAL hnsw.ef_search = 40")
        conn.exec_driver_sql("SET LOCAL hnsw.iterative_scan = off")
        plain = conn.exec_driver_sql(sql, (str(q.tolist()),)).fetchall()
        assert len(plain) < 10
        prepared = vectors.prepare(
            conn, corpus.version_id, q, "region", SearchFilters(figure_type="rare"), 10
        )
        walk = search_plan.Plan("graph", ef_search=40, candidates=0, estimate=0.0, predicted_ms=0.0)
        found = vectors.run_plan(conn, prepared, walk, max_scan_tuples=vectors.DEFAULT_MAX_SCAN_TUPLES)
        assert len(found) == 10 and {r[1] for r in found} <= rare
        conn.rollback()  # the index comes back


def test_calibration_on_a_local_server_counts_cpu_time_not_waiting(engine: Engine, corpus: Corpus) -> None:
    """The test server runs on this machine: its backend's CPU time is readable, so the rounds are
    timed in CPU ms (wall time on a shared machine is mostly waiting for a core)."""
    costs = calibration.calibrate(engine, corpus.version_id, probes=3, budget_s=0.0)
    assert "rounds of cpu time" in costs.source
    with engine.connect() as conn:
        clock = calibration._Clock(conn)
        start = clock.now_ms()
        conn.exec_driver_sql("SELECT count(*) FROM generate_series(1, 2000000)").scalar_one()
        assert clock.kind == "cpu" and clock.now_ms() > start
