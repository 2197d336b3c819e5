from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from p2p.shared.db import migrate
from p2p.shared.db.base import Base
from p2p.shared.db.engine import make_engine
from p2p.shared.storage import LocalObjectStore, S3ObjectStore
from tests.servers import PostgresHandle, RedisHandle, S3Handle, start_postgres, start_redis, start_s3


@pytest.fixture(scope="session")
def servers_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("servers")


@pytest.fixture(scope="session")
def postgres(servers_dir: Path) -> Iterator[PostgresHandle]:
    handle = start_postgres(servers_dir)
    try:
        migrate.upgrade(handle.url)
        yield handle
    finally:
        handle.stop()


@pytest.fixture(scope="session")
def pg_url(postgres: PostgresHandle) -> str:
    return postgres.url


@pytest.fixture(scope="session")
def redis_server(servers_dir: Path) -> Iterator[RedisHandle]:
    handle = start_redis(servers_dir / "redis")
    yield handle
    handle.stop()


@pytest.fixture(scope="session")
def redis_url(redis_server: RedisHandle) -> str:
    return redis_server.url


@pytest.fixture(scope="session")
def s3_server(servers_dir: Path) -> Iterator[S3Handle]:
    handle = start_s3(servers_dir / "s3")
    yield handle
    handle.stop()


@pytest.fixture(scope="session")
def engine(pg_url: str) -> Iterator[Engine]:
    eng = make_engine(pg_url)
    yield eng
    eng.dispose()


@pytest.fixture
def db(engine: Engine) -> Engine:
    """A database with the current schema and no rows."""
    tables = ", ".join(f'"{t.name}"' for t in Base.metadata.sorted_tables)
    with engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {tables} CASCADE"))
    return engine


@pytest.fixture
def s3_store(s3_server: S3Handle) -> S3ObjectStore:
    store = S3ObjectStore(
        endpoint=s3_server.endpoint,
        access_key=s3_server.access_key,
        secret_key=s3_server.secret_key,
        bucket=f"t-{uuid.uuid4().hex[:20]}",
    )
    store.ensure_bucket()
    return store


@pytest.fixture
def local_store(tmp_path: Path) -> LocalObjectStore:
    return LocalObjectStore(tmp_path / "objects")
