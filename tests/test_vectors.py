"""Vector storage and search (p2p.embedding_api.vectors) on the real PostgreSQL + pgvector."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pytest
from sqlalchemy import Engine

from p2p.embedding_api import search_plan, vectors
from p2p.embedding_api.vectors import SearchFilters, VectorRow

TYPES = ("microscopy", "plot", "blot", "diagram")
JOURNALS = ("Cell", "Nature", "PLoS One")
LICENSES = ("commercial", "noncommercial", "other")


@dataclass
class Corpus:
    version_id: uuid.UUID
    dim: int
    rows: list[VectorRow]
    matrix: dict[str, np.ndarray]  # level -> stacked embeddings (unit)
    by_level: dict[str, list[VectorRow]]

    def exact(self, query: np.ndarray, level: str, k: int, keep=lambda r: True) -> list[uuid.UUID]:
        rows = self.by_level[level]
        sims = self.matrix[level] @ (query / np.linalg.norm(query))
        order = np.argsort(-sims, kind="stable")
        return [rows[i].item_id for i in order if keep(rows[i])][:k]


def unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


def make_rows(
    rng: np.random.Generator, dim: int, counts: dict[str, int], clusters: int = 40
) -> list[VectorRow]:
    centres = unit(rng.standard_normal((clusters, dim)))
    articles = [uuid.uuid4() for _ in range(30)]
    figures = [uuid.uuid4() for _ in range(200)]
    rows = []
    for level, n in counts.items():
        assign = rng.integers(0, clusters, n)
        emb = unit(centres[assign] + 0.6 * rng.standard_normal((n, dim)) / np.sqrt(dim))
        for i in range(n):
            item = uuid.uuid4()
            fig = figures[int(rng.integers(0, len(figures)))]
            article = articles[int(rng.integers(0, len(articles)))]
            rare = rng.random() < 0.01
            rows.append(
                VectorRow(
                    level=level,
                    item_id=item,
                    figure_id=fig,
                    panel_id=item if level == "panel" else (uuid.uuid4() if level == "region" else None),
                    region_id=item if level == "region" else None,
                    figure_type="rare" if rare else TYPES[i % len(TYPES)],
                    license_group=LICENSES[i % 3],
                    year=2000 + int(rng.integers(0, 25)),
                    journal=JOURNALS[int(rng.integers(0, 3))],
                    article_id=article if i % 10 else None,
                    embedding=emb[i],
                )
            )
    return rows


def load(engine: Engine, rows: list[VectorRow], dim: int, *, bulk: bool = True) -> Corpus:
    version_id = uuid.uuid4()
    vectors.ensure_table(engine, version_id, dim, indexes=not bulk)
    with engine.begin() as conn:
        if bulk:
            vectors.copy_rows(conn, version_id, rows)
        else:
            vectors.upsert(conn, version_id, rows)
    if bulk:
        vectors.build_indexes(engine, version_id, m=16, ef_construction=64)
    with engine.begin() as conn:
        conn.exec_driver_sql(f"ANALYZE {vectors.table_name(version_id)}")
    by_level = {lv: [r for r in rows if r.level == lv] for lv in vectors.LEVELS}
    matrix = {
        lv: np.stack([r.embedding for r in rs]) if rs else np.zeros((0, dim)) for lv, rs in by_level.items()
    }
    return Corpus(version_id, dim, rows, matrix, by_level)


def loaded(engine: Engine, seed: int, dim: int, counts: dict[str, int]) -> Iterator[Corpus]:
    """A corpus of ``make_rows`` for a fixture, its table dropped afterwards."""
    corpus = load(engine, make_rows(np.random.default_rng(seed), dim, counts), dim)
    yield corpus
    vectors.drop_table(engine, corpus.version_id)


@pytest.fixture(scope="module")
def corpus64(engine: Engine) -> Iterator[Corpus]:
    yield from loaded(engine, 11, 64, {"figure": 300, "panel": 700, "region": 3000})


def queries(corpus: Corpus, level: str, n: int, seed: int = 3) -> np.ndarray:
    rng = np.random.default_rng(seed)
    base = corpus.matrix[level][rng.integers(0, len(corpus.matrix[level]), n)]
    return unit(base + 0.3 * rng.standard_normal(base.shape) / np.sqrt(corpus.dim))


def ids(hits: list[vectors.Hit]) -> list[uuid.UUID]:
    return [h.item_id for h in hits]


# --- identifiers and DDL ----------------------------------------------------------------------


def test_table_name_is_hex_of_the_version() -> None:
    vid = uuid.UUID("0123456789abcdef0123456789abcdef")
    assert vectors.table_name(vid) == "embedding_0123456789abcdef"
    with pytest.raises(TypeError):
        vectors.table_name("x; DROP TABLE figure")  # type: ignore[arg-type]


def test_ensure_table_is_idempotent_and_checks_dimension(engine: Engine) -> None:
    vid = uuid.uuid4()
    try:
        vectors.ensure_table(engine, vid, 8)
        vectors.ensure_table(engine, vid, 8)
        with engine.connect() as conn:
            names = {
                r[0]
                for r in conn.exec_driver_sql(
                    "SELECT indexname FROM pg_indexes WHERE tablename = %s", (vectors.table_name(vid),)
                )
            }
            defs = conn.exec_driver_sql(
                "SELECT indexdef FROM pg_indexes WHERE tablename = %s AND indexdef LIKE '%%hnsw%%'",
                (vectors.table_name(vid),),
            ).fetchall()
        assert {f"{vectors.table_name(vid)}_hnsw_{lv}" for lv in vectors.LEVELS} <= names
        assert len(defs) == 3 and all("vector_cosine_ops" in d[0] and "WHERE" in d[0] for d in defs)
        with pytest.raises(ValueError, match="8-d"):
            vectors.ensure_table(engine, vid, 16)
        with pytest.raises(ValueError):
            vectors.ensure_table(engine, uuid.uuid4(), 0)
    finally:
        vectors.drop_table(engine, vid)


# --- search quality -----------------------------------------------------------------------------


@pytest.mark.parametrize("level", vectors.LEVELS)
def test_ann_recall_against_exact(engine: Engine, corpus64: Corpus, level: str) -> None:
    total = 0.0
    qs = queries(corpus64, level, 40)
    with engine.connect() as conn:
        for q in qs:
            approx = ids(vectors.search(conn, corpus64.version_id, q, level=level, k=10))
            exact_hits = vectors.search(conn, corpus64.version_id, q, level=level, k=10, exact=True)
            assert ids(exact_hits) == corpus64.exact(q, level, 10)
            assert all(h.level == level for h in exact_hits)
            scores = [h.score for h in exact_hits]
            assert scores == sorted(scores, reverse=True)
            assert len(approx) == 10
            total += len(set(approx) & set(ids(exact_hits))) / 10
    assert total / len(qs) >= 0.95


def test_easy_queries_find_themselves_first(engine: Engine, corpus64: Corpus) -> None:
    with engine.connect() as conn:
        for row in corpus64.by_level["region"][:20]:
            hits = vectors.search(conn, corpus64.version_id, row.embedding, level="region", k=5)
            exact = vectors.search(conn, corpus64.version_id, row.embedding, level="region", k=5, exact=True)
            assert hits[0].item_id == row.item_id
            assert hits[0].score == pytest.approx(1.0, abs=1e-5)
            assert ids(hits) == ids(exact)
            assert hits[0].figure_id == row.figure_id
            assert hits[0].region_id == row.item_id and hits[0].panel_id == row.panel_id


def test_small_dimension_ann_matches_exact(engine: Engine) -> None:
    rng = np.random.default_rng(5)
    corpus = load(engine, make_rows(rng, 8, {"figure": 100, "panel": 200, "region": 1500}, clusters=10), 8)
    try:
        hit = 0.0
        qs = queries(corpus, "region", 30)
        with engine.connect() as conn:
            for q in qs:
                approx = ids(vectors.search(conn, corpus.version_id, q, level="region", k=10, ef_search=200))
                exact = ids(vectors.search(conn, corpus.version_id, q, level="region", k=10, exact=True))
                assert exact == corpus.exact(q, "region", 10)
                hit += len(set(approx) & set(exact)) / 10
        assert hit / len(qs) >= 0.95
    finally:
        vectors.drop_table(engine, corpus.version_id)


# --- filters ------------------------------------------------------------------------------------

FILTER_CASES = {
    "figure_type": (SearchFilters(figure_type="plot"), lambda r: r.figure_type == "plot"),
    "rare_type": (SearchFilters(figure_type="rare"), lambda r: r.figure_type == "rare"),
    "license": (SearchFilters(license_group="noncommercial"), lambda r: r.license_group == "noncommercial"),
    "years": (SearchFilters(year_min=2010, year_max=2012), lambda r: 2010 <= (r.year or 0) <= 2012),
    "journal": (SearchFilters(journal="Cell"), lambda r: r.journal == "Cell"),
    "combined": (
        SearchFilters(license_group="commercial", year_min=2015, journal="Nature"),
        lambda r: r.license_group == "commercial" and (r.year or 0) >= 2015 and r.journal == "Nature",
    ),
}


@pytest.mark.parametrize("exact", [False, True])
@pytest.mark.parametrize("case", sorted(FILTER_CASES))
def test_filters_return_only_matching_rows_and_k_of_them(
    engine: Engine, corpus64: Corpus, case: str, exact: bool
) -> None:
    filters, keep = FILTER_CASES[case]
    matching = [r for r in corpus64.by_level["region"] if keep(r)]
    assert len(matching) >= 10, "the fixture must hold enough rows for this case"
    by_id = {r.item_id: r for r in corpus64.rows}
    recall = 0.0
    qs = queries(corpus64, "region", 10, seed=9)
    with engine.connect() as conn:
        for q in qs:
            hits = vectors.search(
                conn, corpus64.version_id, q, level="region", k=10, filters=filters, exact=exact
            )
            assert len(hits) == 10
            assert all(keep(by_id[h.item_id]) and h.level == "region" for h in hits)
            truth = corpus64.exact(q, "region", 10, keep)
            if exact:
                assert ids(hits) == truth
            recall += len(set(ids(hits)) & set(truth)) / 10
    assert recall / len(qs) >= 0.8


def test_selective_filter_through_the_hnsw_index_still_returns_k(engine: Engine, corpus64: Corpus) -> None:
    """With the btree on figure_type out of the way the planner must walk the HNSW graph: the
    iterative scan keeps going until it has k rows of the 1% type."""
    table = vectors.table_name(corpus64.version_id)
    rare = {r.item_id for r in corpus64.by_level["region"] if r.figure_type == "rare"}
    assert 10 <= len(rare) <= 60
    with engine.connect() as conn:
        conn.exec_driver_sql(f"DROP INDEX {table}_figure_type")
        # At 3,000 rows a sort of the few rare rows is cheapest; forbid it to exercise the index.
        conn.exec_driver_sql("SET LOCAL enable_sort = off")
        conn.exec_driver_sql("SET LOCAL enable_seqscan = off")
        for q in queries(corpus64, "region", 5, seed=21):
            hits = vectors.search(
                conn,
                corpus64.version_id,
                q,
                level="region",
                k=10,
                filters=SearchFilters(figure_type="rare"),
                force="graph",
            )
            assert len(hits) == 10 and {h.item_id for h in hits} <= rare
            assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
        plan = "\n".join(
            r[0]
            for r in conn.exec_driver_sql(
                f"EXPLAIN SELECT item_id FROM {table} WHERE level = 'region' AND figure_type = 'rare' "
                f"ORDER BY embedding <=> %s::vector LIMIT 10",
                (str(queries(corpus64, "region", 1)[0].tolist()),),
            )
        )
        assert f"{table}_hnsw_region" in plan
        conn.rollback()  # the index comes back


def test_vectors_of_any_length_are_stored_unit_and_exact_search_ranks_by_cosine(engine: Engine) -> None:
    """The exact path ranks by inner product, which equals cosine order only for unit vectors:
    writes (upsert and COPY) store unit vectors whatever length they were given."""
    rng = np.random.default_rng(17)
    rows = make_rows(rng, 16, {"region": 400}, clusters=4)
    lengths = rng.uniform(0.05, 20.0, len(rows)).astype(np.float32)
    scaled = [
        VectorRow(**{**r.__dict__, "embedding": r.embedding * s}) for r, s in zip(rows, lengths, strict=True)
    ]
    unit_rows = np.stack([r.embedding for r in rows])
    for bulk in (True, False):
        corpus = load(engine, scaled, 16, bulk=bulk)
        try:
            with engine.connect() as conn:
                got = vectors.get_vector(conn, corpus.version_id, "region", rows[0].item_id)
                assert got is not None and float(np.linalg.norm(got)) == pytest.approx(1.0, abs=1e-6)
                for q in queries(corpus, "region", 5, seed=2):
                    hits = vectors.search(conn, corpus.version_id, 7.5 * q, level="region", k=10, exact=True)
                    sims = unit_rows @ q
                    order = np.argsort(-sims, kind="stable")[:10]
                    assert ids(hits) == [rows[i].item_id for i in order]
                    assert [h.score for h in hits] == pytest.approx(sims[order].tolist(), abs=1e-5)
        finally:
            vectors.drop_table(engine, corpus.version_id)


def test_a_filter_estimate_is_asked_once_and_forgotten_with_the_table(
    engine: Engine, corpus64: Corpus
) -> None:
    from sqlalchemy import event

    statements: list[str] = []

    def record(conn, cursor, statement, *args) -> None:  # type: ignore[no-untyped-def]
        statements.append(statement)

    q = queries(corpus64, "region", 1)[0]
    filters = SearchFilters(figure_type="plot", year_min=2003)
    event.listen(engine, "before_cursor_execute", record)
    try:
        with engine.connect() as conn:
            first = vectors.search(conn, corpus64.version_id, q, level="region", k=5, filters=filters)
            again = vectors.search(conn, corpus64.version_id, q, level="region", k=5, filters=filters)
            other = SearchFilters(figure_type="blot", year_min=2003)
            vectors.search(conn, corpus64.version_id, q, level="region", k=5, filters=other)
    finally:
        event.remove(engine, "before_cursor_execute", record)
    assert ids(first) == ids(again)
    explains = [s for s in statements if s.startswith("EXPLAIN")]
    assert len(explains) == 2  # one per distinct filter, not one per query
    table = vectors.table_name(corpus64.version_id)
    assert any(key[1] == table for key in vectors._estimates)
    vectors._forget(engine, table)
    assert not any(key[1] == table for key in vectors._estimates)


def test_a_filter_matching_many_rows_ranks_sign_bits_then_reranks_exactly(
    engine: Engine, corpus64: Corpus, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bits path: filtered rows are ranked by the Hamming distance of their
    stored sign bits (an index-only scan of the covering metadata index) and the best candidates
    exactly; a table without the bits column (made before it existed) is ranked exactly."""
    from sqlalchemy import event

    monkeypatch.setattr(search_plan, "RERANK_CANDIDATES", 60)
    filters, keep = FILTER_CASES["figure_type"]
    assert len([r for r in corpus64.by_level["region"] if keep(r)]) > 2 * 200  # 20 x k
    statements: list[str] = []

    def record(conn, cursor, statement, *args) -> None:  # type: ignore[no-untyped-def]
        statements.append(statement)

    table = vectors.table_name(corpus64.version_id)
    recall = 0.0
    qs = queries(corpus64, "region", 10, seed=4)
    event.listen(engine, "before_cursor_execute", record)
    try:
        with engine.connect() as conn:
            for q in qs:
                hits = vectors.search(
                    conn, corpus64.version_id, q, level="region", k=10, filters=filters, force="bits"
                )
                truth = corpus64.exact(q, "region", 10, keep)
                assert len(hits) == 10 and {h.item_id for h in hits} <= {
                    r.item_id for r in corpus64.rows if keep(r)
                }
                assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
                recall += len(set(ids(hits)) & set(truth)) / 10
    finally:
        event.remove(engine, "before_cursor_execute", record)
    with engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql(f"VACUUM {table}")
    with engine.connect() as conn:
        # The metadata index covers item id and bits: the candidates need no heap page.
        conn.exec_driver_sql("SET LOCAL enable_bitmapscan = off")
        conn.exec_driver_sql("SET LOCAL enable_seqscan = off")
        plan = "\n".join(
            r[0]
            for r in conn.exec_driver_sql(
                f"EXPLAIN SELECT item_id FROM {table} WHERE level = 'region' AND figure_type = 'plot' "
                f"ORDER BY embedding_bits <~> %s::bit(64) LIMIT 200",
                ("01" * 32,),
            )
        )
        conn.rollback()
    assert sum("embedding_bits <~>" in s for s in statements if not s.startswith("EXPLAIN")) == len(qs)
    assert f"Index Only Scan using {table}_figure_type" in plan
    assert recall / len(qs) >= 0.9

    with engine.connect() as conn:
        conn.exec_driver_sql(f"ALTER TABLE {table} DROP COLUMN embedding_bits")
        vectors._forget(engine, table)
        statements.clear()
        event.listen(engine, "before_cursor_execute", record)
        try:
            q = qs[0]
            hits = vectors.search(
                conn, corpus64.version_id, q, level="region", k=10, filters=filters, force="bits"
            )
        finally:
            event.remove(engine, "before_cursor_execute", record)
        assert ids(hits) == corpus64.exact(q, "region", 10, keep)
        assert not any(
            "embedding_bits" in s for s in statements if not s.startswith("SELECT 1 FROM pg_attribute")
        )
        conn.rollback()  # the column comes back
    vectors._forget(engine, table)


def test_a_table_made_before_the_bits_column_is_not_rewritten_and_still_searches(engine: Engine) -> None:
    rng = np.random.default_rng(8)
    rows = make_rows(rng, 8, {"panel": 60}, clusters=3)
    version_id = uuid.uuid4()
    table = vectors.table_name(version_id)
    vectors.ensure_table(engine, version_id, 8)
    try:
        with engine.begin() as conn:  # as it was made before the column existed
            conn.exec_driver_sql(f"ALTER TABLE {table} DROP COLUMN embedding_bits")
        vectors.ensure_table(engine, version_id, 8)
        with engine.begin() as conn:
            assert not vectors._column_exists(conn, table, "embedding_bits")
            indexdef = conn.exec_driver_sql(
                "SELECT indexdef FROM pg_indexes WHERE indexname = %s", (f"{table}_figure_type",)
            ).scalar()
            assert indexdef is not None and "INCLUDE" not in indexdef
            vectors.upsert(conn, version_id, rows)
        with engine.connect() as conn:
            q = rows[0].embedding
            hits = vectors.search(
                conn, version_id, q, level="panel", k=3, filters=SearchFilters(journal="Cell")
            )
            expected = [r for r in rows if r.journal == "Cell"]
            sims = np.stack([r.embedding for r in expected]) @ q
            assert ids(hits) == [expected[i].item_id for i in np.argsort(-sims, kind="stable")[:3]]
    finally:
        vectors.drop_table(engine, version_id)


def test_article_and_figure_filters(engine: Engine, corpus64: Corpus) -> None:
    row = next(r for r in corpus64.by_level["region"] if r.article_id is not None)
    q = queries(corpus64, "region", 1)[0]
    with engine.connect() as conn:
        for filters, keep in (
            (SearchFilters(article_id=row.article_id), lambda r: r.article_id == row.article_id),
            (SearchFilters(figure_id=row.figure_id), lambda r: r.figure_id == row.figure_id),
        ):
            expected = [r.item_id for r in corpus64.by_level["region"] if keep(r)]
            k = min(10, len(expected))
            hits = vectors.search(conn, corpus64.version_id, q, level="region", k=50, filters=filters)
            assert {h.item_id for h in hits} <= set(expected)
            assert len(hits) == min(50, len(expected)) >= k
            assert ids(hits)[:k] == corpus64.exact(q, "region", k, keep)


def test_filter_without_matches_returns_nothing(engine: Engine, corpus64: Corpus) -> None:
    q = queries(corpus64, "figure", 1)[0]
    with engine.connect() as conn:
        for exact in (False, True):
            hits = vectors.search(
                conn,
                corpus64.version_id,
                q,
                level="figure",
                k=5,
                filters=SearchFilters(journal="nope"),
                exact=exact,
            )
            assert hits == []


# --- pagination ---------------------------------------------------------------------------------


@pytest.mark.parametrize("exact", [False, True])
def test_pages_are_disjoint_and_consecutive(engine: Engine, corpus64: Corpus, exact: bool) -> None:
    q = queries(corpus64, "panel", 1, seed=4)[0]
    with engine.connect() as conn:
        pages = [
            vectors.search(conn, corpus64.version_id, q, level="panel", k=10, offset=off, exact=exact)
            for off in (0, 10, 20)
        ]
        whole = vectors.search(conn, corpus64.version_id, q, level="panel", k=30, exact=exact)
    flat = [h.item_id for page in pages for h in page]
    assert all(len(p) == 10 for p in pages)
    assert len(set(flat)) == 30
    assert flat == ids(whole)
    scores = [h.score for page in pages for h in page]
    assert scores == sorted(scores, reverse=True)


# --- writes -----------------------------------------------------------------------------------


@pytest.fixture
def small(engine: Engine) -> Iterator[Corpus]:
    rng = np.random.default_rng(2)
    corpus = load(
        engine, make_rows(rng, 8, {"figure": 20, "panel": 40, "region": 100}, clusters=5), 8, bulk=False
    )
    yield corpus
    vectors.drop_table(engine, corpus.version_id)


def test_upsert_replaces_and_counts(engine: Engine, small: Corpus) -> None:
    vid = small.version_id
    target = small.by_level["panel"][0]
    new_vec = unit(np.arange(1, 9, dtype=np.float32))
    with engine.connect() as conn:
        assert vectors.count(conn, vid) == 160
        assert vectors.count(conn, vid, "panel") == 40
        stored = vectors.get_vector(conn, vid, "panel", target.item_id)
        assert stored is not None and np.allclose(stored, target.embedding)
        assert vectors.get_vector(conn, vid, "region", target.item_id) is None
    replacement = VectorRow(**{**target.__dict__, "embedding": new_vec, "figure_type": "blot", "year": 1999})
    with engine.begin() as conn:
        assert vectors.upsert(conn, vid, [replacement, replacement]) == 1
    with engine.connect() as conn:
        assert vectors.count(conn, vid) == 160
        got = vectors.get_vector(conn, vid, "panel", target.item_id)
        assert got is not None and got.dtype == np.float32 and np.allclose(got, new_vec)
        hits = vectors.search(
            conn, vid, new_vec, level="panel", k=1, filters=SearchFilters(figure_type="blot", year_max=1999)
        )
        assert ids(hits) == [target.item_id] and hits[0].score == pytest.approx(1.0, abs=1e-5)
        assert vectors.upsert(conn, vid, []) == 0


def test_upsert_is_rolled_back_with_its_transaction(engine: Engine, small: Corpus) -> None:
    row = VectorRow(**{**small.rows[0].__dict__, "item_id": uuid.uuid4()})
    with engine.connect() as conn:
        vectors.upsert(conn, small.version_id, [row])
        conn.rollback()
        assert vectors.get_vector(conn, small.version_id, row.level, row.item_id) is None


def test_delete_items_removes_every_level_of_a_figure(engine: Engine, small: Corpus) -> None:
    fig = small.rows[0].figure_id
    mine = [r for r in small.rows if r.figure_id == fig]
    with engine.begin() as conn:
        assert vectors.delete_items(conn, small.version_id, figure_id=fig) == len(mine)
        assert vectors.delete_items(conn, small.version_id, figure_id=fig) == 0
    with engine.connect() as conn:
        assert vectors.count(conn, small.version_id) == 160 - len(mine)
        for level in vectors.LEVELS:
            hits = vectors.search(conn, small.version_id, mine[0].embedding, level=level, k=200, exact=True)
            assert all(h.figure_id != fig for h in hits)


# --- bad input ----------------------------------------------------------------------------------


def test_bad_input_raises_clear_errors(engine: Engine, small: Corpus) -> None:
    vid = small.version_id
    q = unit(np.ones(8, dtype=np.float32))
    with engine.connect() as conn:
        with pytest.raises(ValueError, match="8-d"):
            vectors.search(conn, vid, np.ones(9, dtype=np.float32), level="region", k=5)
        with pytest.raises(ValueError, match="unknown level"):
            vectors.search(conn, vid, q, level="patch", k=5)
        with pytest.raises(ValueError, match="unknown level"):
            vectors.search(conn, vid, q, level="region'; DROP TABLE figure; --", k=5)
        for k in (0, -1):
            with pytest.raises(ValueError, match="k must be"):
                vectors.search(conn, vid, q, level="region", k=k)
        with pytest.raises(ValueError, match="offset"):
            vectors.search(conn, vid, q, level="region", k=5, offset=-1)
        with pytest.raises(ValueError, match="zero vector"):
            vectors.search(conn, vid, np.zeros(8), level="region", k=5)
        with pytest.raises(ValueError, match="NaN"):
            vectors.search(conn, vid, np.full(8, np.nan), level="region", k=5)
        with pytest.raises(ValueError, match="unknown level"):
            vectors.count(conn, vid, "patch")
        bad = VectorRow(**{**small.rows[0].__dict__, "embedding": np.ones(4, dtype=np.float32)})
        with pytest.raises(ValueError, match="8-d"):
            vectors.upsert(conn, vid, [bad])
        bad_level = VectorRow(**{**small.rows[0].__dict__, "level": "patch"})
        with pytest.raises(ValueError, match="unknown level"):
            vectors.upsert(conn, vid, [bad_level])
        with pytest.raises(LookupError):
            vectors.search(conn, uuid.uuid4(), q, level="region", k=5)
        with pytest.raises(LookupError):
            vectors.upsert(conn, uuid.uuid4(), [small.rows[0]])
        assert vectors.count(conn, uuid.uuid4()) == 0


# --- versions side by side --------------------------------------------------------------------


def test_two_versions_side_by_side_and_drop(engine: Engine) -> None:
    rng = np.random.default_rng(8)
    a = load(engine, make_rows(rng, 8, {"figure": 10, "panel": 20, "region": 50}, clusters=4), 8, bulk=False)
    b_rows = [
        VectorRow(**{**r.__dict__, "embedding": unit(rng.standard_normal(64))})
        for r in a.rows  # the same items under another model version
    ]
    b = load(engine, b_rows, 64)
    try:
        with engine.connect() as conn:
            assert vectors.count(conn, a.version_id) == vectors.count(conn, b.version_id) == 80
            for corpus in (a, b):
                row = corpus.by_level["region"][3]
                hits = vectors.search(conn, corpus.version_id, row.embedding, level="region", k=3)
                assert hits[0].item_id == row.item_id and hits[0].score == pytest.approx(1.0, abs=1e-5)
                got = vectors.get_vector(conn, corpus.version_id, "region", row.item_id)
                assert got is not None and got.shape == (corpus.dim,)
            with pytest.raises(ValueError, match="64-d"):
                vectors.search(conn, b.version_id, a.rows[0].embedding, level="region", k=3)
        with engine.begin() as conn:
            vectors.delete_items(conn, a.version_id, figure_id=a.rows[0].figure_id)
        with engine.connect() as conn:
            assert vectors.count(conn, b.version_id) == 80
        vectors.drop_table(engine, a.version_id)
        vectors.drop_table(engine, a.version_id)  # idempotent
        with engine.connect() as conn:
            assert vectors.count(conn, a.version_id) == 0
            assert (
                conn.exec_driver_sql("SELECT to_regclass(%s)", (vectors.table_name(a.version_id),)).scalar()
                is None
            )
            assert vectors.count(conn, b.version_id) == 80
        # The same version id may come back with another dimension after a drop.
        vectors.ensure_table(engine, a.version_id, 16)
        with engine.connect() as conn:
            with pytest.raises(ValueError, match="16-d"):
                vectors.search(conn, a.version_id, np.ones(8), level="figure", k=1)
            assert vectors.search(conn, a.version_id, np.ones(16), level="figure", k=1) == []
    finally:
        vectors.drop_table(engine, a.version_id)
        vectors.drop_table(engine, b.version_id)
