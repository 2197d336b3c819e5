"""Vector storage and search in PostgreSQL + pgvector: one table per model version.

A version's table (``embedding_<16 hex digits of the version id>``) holds every figure, panel and
region vector of that version with the metadata search filters on, keyed by ``(level, item_id)``.
Each level has its own partial HNSW index (cosine), so a region query walks a graph of regions only.

Vectors are stored with unit length (normalised on write; cosine similarity does not depend on
length), so the exact path ranks by inner product, a third of the arithmetic of a cosine distance.
Vectors travel in pgvector's binary format through adapters registered once per database
connection, so a 512-d query costs no text formatting or parsing. Table names come only from
version ids (hex digits); levels are checked against :data:`LEVELS` before they reach SQL text;
every other value is a bound parameter.
"""

from __future__ import annotations

import math
import struct
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from psycopg.adapt import Dumper, Loader
from psycopg.pq import Format
from sqlalchemy import Connection, Engine

LEVELS = ("figure", "panel", "region")
FILTER_FIELDS = (
    "level",
    "figure_type",
    "license_group",
    "year_min",
    "year_max",
    "journal",
    "article_id",
    "figure_id",
)

# pgvector's limit for HNSW-indexed ``vector`` columns.
MAX_INDEXED_DIM = 2000
# Rows an iterative index scan may visit before it gives up (pgvector's default is 20,000).
DEFAULT_MAX_SCAN_TUPLES = 50_000
# A filtered query the planner expects to match at most this many rows is answered exactly (btree
# or bitmap scan of the matching rows + top-k sort): at 1M rows and a 1% filter that is faster
# than walking the graph past the 99% of neighbours that fail the filter, and its recall is 1.
EXACT_FILTER_ROWS = 20_000
# How long the planner's row estimate for one filter is reused (it only changes with ANALYZE).
ESTIMATE_TTL_S = 60.0
_ESTIMATES_MAX = 4096
_COLUMNS = (
    "level",
    "item_id",
    "figure_id",
    "panel_id",
    "region_id",
    "figure_type",
    "license_group",
    "year",
    "journal",
    "article_id",
    "embedding",
)


@dataclass(frozen=True)
class VectorRow:
    level: str
    item_id: uuid.UUID
    figure_id: uuid.UUID
    panel_id: uuid.UUID | None
    region_id: uuid.UUID | None
    figure_type: str | None
    license_group: str | None
    year: int | None
    journal: str | None
    article_id: uuid.UUID | None
    embedding: np.ndarray


@dataclass(frozen=True)
class SearchFilters:
    figure_type: str | None = None
    license_group: str | None = None
    year_min: int | None = None
    year_max: int | None = None
    journal: str | None = None
    article_id: uuid.UUID | None = None
    figure_id: uuid.UUID | None = None

    def is_empty(self) -> bool:
        return all(getattr(self, name) is None for name in FILTER_FIELDS if name != "level")


@dataclass(frozen=True)
class Hit:
    level: str
    item_id: uuid.UUID
    figure_id: uuid.UUID
    panel_id: uuid.UUID | None
    region_id: uuid.UUID | None
    score: float  # cosine similarity


# --- identifiers ------------------------------------------------------------------------------


def table_name(version_id: uuid.UUID) -> str:
    if not isinstance(version_id, uuid.UUID):
        raise TypeError(f"version id must be a UUID, not {type(version_id).__name__}")
    return "embedding_" + version_id.hex[:16]


def _check_level(level: str) -> str:
    if level not in LEVELS:
        raise ValueError(f"unknown level {level!r}: expected one of {', '.join(LEVELS)}")
    return level


def _index_name(table: str, level: str) -> str:
    return f"{table}_hnsw_{_check_level(level)}"


# --- binary vector adapters -----------------------------------------------------------------------

_HEADER = struct.Struct(">HH")
_ADAPTED = "p2p_vector_adapted"


class _VectorBinaryDumper(Dumper):
    format = Format.BINARY

    def dump(self, obj: Any) -> bytes:
        arr = np.asarray(obj, dtype=">f4").reshape(-1)
        return _HEADER.pack(arr.shape[0], 0) + arr.tobytes()


class _VectorBinaryLoader(Loader):
    format = Format.BINARY

    def load(self, data: Any) -> np.ndarray:
        dim, _ = _HEADER.unpack_from(data)
        return np.frombuffer(bytes(data[4 : 4 + 4 * dim]), dtype=">f4").astype(np.float32)


class _VectorTextLoader(Loader):
    format = Format.TEXT

    def load(self, data: Any) -> np.ndarray:
        body = bytes(data).strip()[1:-1]
        if not body:
            return np.zeros(0, dtype=np.float32)
        return np.array(body.split(b","), dtype=np.float32)


def _adapt(conn: Connection) -> Any:
    """The psycopg connection under ``conn``, with numpy <-> vector adapters registered once."""
    proxied = conn.connection
    raw = proxied.driver_connection
    if raw is None:  # pragma: no cover - only a closed connection has none
        raise RuntimeError("the database connection is closed")
    if not proxied.info.get(_ADAPTED):
        row = raw.execute("SELECT 'vector'::regtype::oid").fetchone()
        if row is None:  # pragma: no cover - the cast raises when the extension is missing
            raise RuntimeError("the pgvector extension is not installed in this database")
        oid = int(row[0])
        dumper = type("NdarrayVectorBinaryDumper", (_VectorBinaryDumper,), {"oid": oid})
        adapters = raw.adapters
        adapters.register_dumper(np.ndarray, dumper)
        adapters.register_loader(oid, _VectorBinaryLoader)
        adapters.register_loader(oid, _VectorTextLoader)
        proxied.info[_ADAPTED] = oid
    return raw


def _vector_oid(conn: Connection) -> int:
    _adapt(conn)
    return int(conn.connection.info[_ADAPTED])


# --- DDL --------------------------------------------------------------------------------------


# (database URL, table) -> dimension. A version's dimension never changes while its table exists;
# drop_table and ensure_table forget entries, and missing tables are never remembered.
_dims: dict[tuple[str, str], int] = {}


def _dim_key(conn: Connection | Engine, table: str) -> tuple[str, str]:
    url = conn.engine.url if isinstance(conn, Connection) else conn.url
    return (url.render_as_string(hide_password=True), table)


def _forget(engine: Engine, table: str) -> None:
    """Drop what this process remembers of ``table`` (its dimension, filter estimates)."""
    key = _dim_key(engine, table)
    _dims.pop(key, None)
    for cached in [k for k in _estimates if k[:2] == key]:
        _estimates.pop(cached, None)


def _table_dim(conn: Connection, table: str) -> int | None:
    """The declared dimension of ``table``'s embedding column, None when the table does not exist."""
    key = _dim_key(conn, table)
    cached = _dims.get(key)
    if cached is not None:
        return cached
    dim = _catalog_dim(conn, table)
    if dim is not None:
        _dims[key] = dim
    return dim


def _catalog_dim(conn: Connection, table: str) -> int | None:
    row = conn.exec_driver_sql(
        "SELECT a.atttypmod FROM pg_attribute a WHERE a.attrelid = to_regclass(%s) "
        "AND a.attname = 'embedding' AND NOT a.attisdropped",
        (table,),
    ).fetchone()
    return None if row is None else int(row[0])


def ensure_table(
    engine: Engine,
    version_id: uuid.UUID,
    dim: int,
    *,
    m: int = 16,
    ef_construction: int = 64,
    indexes: bool = True,
) -> None:
    """Create the version's table if it does not exist (idempotent).

    With ``indexes=False`` the HNSW indexes are left out, for bulk loads: load, then
    :func:`build_indexes`. An existing table of another dimension is an error.
    """
    if not isinstance(dim, int) or isinstance(dim, bool) or not 1 <= dim <= MAX_INDEXED_DIM:
        raise ValueError(f"dimension must be an integer in 1..{MAX_INDEXED_DIM}, got {dim!r}")
    table = table_name(version_id)
    _forget(engine, table)
    with engine.begin() as conn:
        # Concurrent creators of the same table serialise here instead of racing in the catalog.
        conn.exec_driver_sql("SELECT pg_advisory_xact_lock(hashtext(%s))", (table,))
        existing = _catalog_dim(conn, table)
        if existing is not None and existing != dim:
            raise ValueError(f"table {table} holds {existing}-d vectors, not {dim}-d")
        levels = ", ".join(f"'{level}'" for level in LEVELS)
        conn.exec_driver_sql(
            f"""
            CREATE TABLE IF NOT EXISTS {table} (
                level varchar(8) NOT NULL CHECK (level IN ({levels})),
                item_id uuid NOT NULL,
                figure_id uuid NOT NULL,
                panel_id uuid,
                region_id uuid,
                figure_type varchar(64),
                license_group varchar(32),
                year integer,
                journal varchar(512),
                article_id uuid,
                embedding vector({dim}) NOT NULL,
                PRIMARY KEY (level, item_id)
            )
            """
        )
        # Vectors up to 2000-d fit a page: keep them inline instead of TOASTed (random floats do
        # not compress), which keeps index builds and exact scans off the TOAST table.
        conn.exec_driver_sql(f"ALTER TABLE {table} ALTER COLUMN embedding SET STORAGE PLAIN")
        for column in ("figure_type", "license_group", "year", "journal"):
            conn.exec_driver_sql(f"CREATE INDEX IF NOT EXISTS {table}_{column} ON {table} (level, {column})")
        for column in ("figure_id", "article_id"):
            conn.exec_driver_sql(f"CREATE INDEX IF NOT EXISTS {table}_{column} ON {table} ({column})")
    if indexes:
        build_indexes(engine, version_id, m=m, ef_construction=ef_construction)


def build_indexes(engine: Engine, version_id: uuid.UUID, *, m: int = 16, ef_construction: int = 64) -> None:
    """Create the per-level HNSW indexes (cosine) that do not exist yet."""
    if not (isinstance(m, int) and 2 <= m <= 100):
        raise ValueError(f"m must be an integer in 2..100, got {m!r}")
    if not (isinstance(ef_construction, int) and 4 <= ef_construction <= 1000):
        raise ValueError(f"ef_construction must be an integer in 4..1000, got {ef_construction!r}")
    if ef_construction < 2 * m:
        raise ValueError(f"ef_construction ({ef_construction}) must be at least 2 * m ({2 * m})")
    table = table_name(version_id)
    for level in LEVELS:
        with engine.begin() as conn:
            conn.exec_driver_sql(
                f"CREATE INDEX IF NOT EXISTS {_index_name(table, level)} ON {table} "
                f"USING hnsw (embedding vector_cosine_ops) "
                f"WITH (m = {m}, ef_construction = {ef_construction}) WHERE level = '{level}'"
            )


def drop_table(engine: Engine, version_id: uuid.UUID) -> None:
    table = table_name(version_id)
    with engine.begin() as conn:
        conn.exec_driver_sql(f"DROP TABLE IF EXISTS {table}")
    _forget(engine, table)


# --- writes -----------------------------------------------------------------------------------


def _vector(value: Any, dim: int, what: str) -> np.ndarray:
    arr = np.asarray(value, dtype=np.float32)
    if arr.ndim == 2 and arr.shape[0] == 1:
        arr = arr[0]
    if arr.ndim != 1 or arr.shape[0] != dim:
        raise ValueError(f"{what} has shape {tuple(arr.shape)}, this version's vectors are {dim}-d")
    if not np.isfinite(arr).all():
        raise ValueError(f"{what} holds NaN or infinite values")
    if not float(np.dot(arr, arr)) > 0.0:
        raise ValueError(f"{what} is the zero vector: cosine similarity is undefined")
    return arr


def _require_dim(conn: Connection, version_id: uuid.UUID) -> tuple[str, int]:
    table = table_name(version_id)
    dim = _table_dim(conn, table)
    if dim is None:
        raise LookupError(f"no vector table for model version {version_id}: call ensure_table first")
    return table, dim


def _unit(arr: np.ndarray) -> np.ndarray:
    return (arr / np.float32(math.sqrt(float(np.dot(arr, arr))))).astype(np.float32, copy=False)


def _params(row: VectorRow, dim: int) -> tuple[Any, ...]:
    _check_level(row.level)
    return (
        row.level,
        row.item_id,
        row.figure_id,
        row.panel_id,
        row.region_id,
        row.figure_type,
        row.license_group,
        row.year,
        row.journal,
        row.article_id,
        _unit(_vector(row.embedding, dim, f"embedding of {row.level} {row.item_id}")),
    )


def upsert(conn: Connection, version_id: uuid.UUID, rows: Sequence[VectorRow]) -> int:
    """Insert or replace ``rows`` (keyed by level and item id); returns the number written."""
    if not rows:
        return 0
    table, dim = _require_dim(conn, version_id)
    params = [_params(row, dim) for row in rows]
    # One statement per (level, item) key: the last row of a duplicated key wins, as it would
    # when written one after another.
    unique = list({(p[0], p[1]): p for p in params}.values())
    _adapt(conn)
    updates = ", ".join(f"{c} = EXCLUDED.{c}" for c in _COLUMNS[2:])
    placeholders = ", ".join(["%s"] * (len(_COLUMNS) - 1) + ["%b"])
    sql = (
        f"INSERT INTO {table} ({', '.join(_COLUMNS)}) VALUES ({placeholders}) "
        f"ON CONFLICT (level, item_id) DO UPDATE SET {updates}"
    )
    conn.exec_driver_sql(sql, unique)
    return len(unique)


def copy_rows(conn: Connection, version_id: uuid.UUID, rows: Iterable[VectorRow]) -> int:
    """Bulk-load new rows with binary COPY (no conflict handling: for empty tables and fresh
    items). Far faster than :func:`upsert` for large loads; commit with the connection."""
    table, dim = _require_dim(conn, version_id)
    raw = _adapt(conn)
    oid = _vector_oid(conn)
    conn.exec_driver_sql("SELECT 1")  # begins the transaction the COPY runs in
    written = 0
    with (
        raw.cursor() as cur,
        cur.copy(f"COPY {table} ({', '.join(_COLUMNS)}) FROM STDIN WITH (FORMAT BINARY)") as copy,
    ):
        copy.set_types(
            ["varchar", "uuid", "uuid", "uuid", "uuid", "varchar", "varchar", "int4", "varchar", "uuid", oid]
        )
        for row in rows:
            copy.write_row(_params(row, dim))
            written += 1
    return written


def delete_items(conn: Connection, version_id: uuid.UUID, *, figure_id: uuid.UUID) -> int:
    """Delete every vector (all levels) of one figure; returns the number deleted."""
    table = table_name(version_id)
    if _table_dim(conn, table) is None:
        return 0
    result = conn.exec_driver_sql(f"DELETE FROM {table} WHERE figure_id = %s", (figure_id,))
    return int(result.rowcount)


# --- reads ------------------------------------------------------------------------------------


def count(conn: Connection, version_id: uuid.UUID, level: str | None = None) -> int:
    table = table_name(version_id)
    if _table_dim(conn, table) is None:
        return 0
    if level is None:
        row = conn.exec_driver_sql(f"SELECT count(*) FROM {table}").fetchone()
    else:
        row = conn.exec_driver_sql(
            f"SELECT count(*) FROM {table} WHERE level = %s", (_check_level(level),)
        ).fetchone()
    return int(row[0]) if row else 0


def get_vector(conn: Connection, version_id: uuid.UUID, level: str, item_id: uuid.UUID) -> np.ndarray | None:
    """The stored vector of one item (for query-by-example), None when it has none."""
    _check_level(level)
    table = table_name(version_id)
    if _table_dim(conn, table) is None:
        return None
    _adapt(conn)
    row = conn.exec_driver_sql(
        f"SELECT embedding FROM {table} WHERE level = %s AND item_id = %s", (level, item_id)
    ).fetchone()
    if row is None:
        return None
    return np.asarray(row[0], dtype=np.float32)


def _where(level: str, filters: SearchFilters) -> tuple[str, list[Any]]:
    # The level is a literal (checked against LEVELS) so the planner can match the partial index
    # on every plan, generic ones included.
    clauses = [f"level = '{_check_level(level)}'"]
    params: list[Any] = []
    for column, op, value in (
        ("figure_type", "=", filters.figure_type),
        ("license_group", "=", filters.license_group),
        ("year", ">=", filters.year_min),
        ("year", "<=", filters.year_max),
        ("journal", "=", filters.journal),
        ("article_id", "=", filters.article_id),
        ("figure_id", "=", filters.figure_id),
    ):
        if value is not None:
            clauses.append(f"{column} {op} %s")
            params.append(value)
    return " AND ".join(clauses), params


# (database URL, table, where, params) -> (estimate, monotonic time it expires)
_estimates: dict[tuple[Any, ...], tuple[float, float]] = {}


def _estimated_rows(conn: Connection, table: str, where: str, params: list[Any]) -> float:
    """The planner's estimate of the rows matching ``where`` (no rows are read), remembered for
    :data:`ESTIMATE_TTL_S` so that repeated filters cost no extra round trip."""
    key = (*_dim_key(conn, table), where, tuple(params))
    now = time.monotonic()
    cached = _estimates.get(key)
    if cached is not None and cached[1] > now:
        return cached[0]
    row = conn.exec_driver_sql(
        f"EXPLAIN (FORMAT JSON) SELECT 1 FROM {table} WHERE {where}", tuple(params)
    ).one()
    plan = row[0]
    if isinstance(plan, (str, bytes)):
        import json

        plan = json.loads(plan)
    estimate = float(plan[0]["Plan"]["Plan Rows"])
    if len(_estimates) >= _ESTIMATES_MAX:
        _estimates.clear()
    _estimates[key] = (estimate, now + ESTIMATE_TTL_S)
    return estimate


def search(
    conn: Connection,
    version_id: uuid.UUID,
    query: np.ndarray,
    *,
    level: str,
    k: int,
    offset: int = 0,
    filters: SearchFilters = SearchFilters(),
    exact: bool = False,
    ef_search: int = 100,
    max_scan_tuples: int = DEFAULT_MAX_SCAN_TUPLES,
    exact_below: int = EXACT_FILTER_ROWS,
) -> list[Hit]:
    """The ``k`` items of ``level`` nearest to ``query`` (cosine) after skipping ``offset``.

    Approximate search walks the level's HNSW index with ``ef_search`` candidates (at least
    ``k + offset``) and, when the filters reject candidates, continues with pgvector's iterative
    scan (relaxed order, re-sorted here) until it has ``k + offset`` rows or has visited
    ``max_scan_tuples``. A filtered query whose filter the planner expects to match at most
    ``exact_below`` rows of the level is answered exactly instead (0 turns this off).
    ``exact=True`` computes every distance (for evaluation and recall).

    The ``hnsw.*`` settings are transaction-local: run it inside a transaction (SQLAlchemy's
    connections begin one implicitly), not on an AUTOCOMMIT connection.
    """
    _check_level(level)
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ValueError(f"offset must be a non-negative integer, got {offset!r}")
    if not isinstance(ef_search, int) or not 1 <= ef_search <= 1000:
        raise ValueError(f"ef_search must be an integer in 1..1000, got {ef_search!r}")
    table = table_name(version_id)
    dim = _table_dim(conn, table)
    if dim is None:
        raise LookupError(f"no vector table for model version {version_id}")
    q = _unit(_vector(query, dim, "query vector"))
    _adapt(conn)
    where, params = _where(level, filters)
    limit = k + offset
    columns = "level, item_id, figure_id, panel_id, region_id"
    if not exact and params and exact_below > 0:
        exact = _estimated_rows(conn, table, where, params) <= exact_below
    if exact:
        # Every matching row's distance, computed once: for unit vectors the cosine distance is
        # 1 + the negative inner product (pgvector's <#>), which costs one sum instead of three. The
        # sort key is an expression no index provides.
        sql = (
            f"SELECT {columns}, (embedding <#> %b) + 1 AS distance FROM {table} WHERE {where} "
            f"ORDER BY distance, item_id LIMIT %s"
        )
        rows = conn.exec_driver_sql(sql, (q, *params, limit)).fetchall()
    else:
        conn.exec_driver_sql(
            "SELECT set_config('hnsw.ef_search', %s, true), set_config('hnsw.iterative_scan', %s, true), "
            "set_config('hnsw.max_scan_tuples', %s, true)",
            (str(min(1000, max(ef_search, limit))), "relaxed_order", str(max(int(max_scan_tuples), 1))),
        )
        sql = (
            f"SELECT {columns}, embedding <=> %b AS distance FROM {table} WHERE {where} "
            f"ORDER BY embedding <=> %b LIMIT %s"
        )
        rows = conn.exec_driver_sql(sql, (q, *params, q, limit)).fetchall()
        rows = sorted(rows, key=lambda r: (r[5], r[1]))
    hits = []
    for row in rows[offset:limit]:
        distance = float(row[5])
        hits.append(
            Hit(
                level=row[0],
                item_id=row[1],
                figure_id=row[2],
                panel_id=row[3],
                region_id=row[4],
                score=1.0 - distance if math.isfinite(distance) else float("nan"),
            )
        )
    return hits
