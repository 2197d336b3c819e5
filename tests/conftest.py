from __future__ import annotations

import shutil
import tempfile
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

pytest_plugins = ["tests.lvlm_fixtures"]


@pytest.fixture(scope="session")
def servers_dir() -> Iterator[Path]:
    # Not under pytest's 0700 temp root: the embedded PostgreSQL runs as its own system user
    # when the tests run as root, and must be able to reach its data folder to stop cleanly.
    path = Path(tempfile.mkdtemp(prefix="p2p-test-servers-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


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


@pytest.fixture(scope="session")
def s3_bucket(s3_server: S3Handle) -> str:
    # One bucket for the session: every SeaweedFS bucket is a collection with volumes of its own.
    return f"p2p-test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def s3_store(s3_server: S3Handle, s3_bucket: str) -> S3ObjectStore:
    """The session bucket, emptied before the test."""
    store = S3ObjectStore(
        endpoint=s3_server.endpoint,
        access_key=s3_server.access_key,
        secret_key=s3_server.secret_key,
        bucket=s3_bucket,
    )
    store.ensure_bucket()
    for key in list(store.list("")):
        store.delete(key)
    return store


@pytest.fixture
def local_store(tmp_path: Path) -> LocalObjectStore:
    return LocalObjectStore(tmp_path / "objects")


# --- application fixtures -------------------------------------------------------------------

from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

from fastapi.testclient import TestClient  # noqa: E402

from p2p.apps.tasks import register_tasks  # noqa: E402
from p2p.ingest.app import create_app  # noqa: E402
from p2p.shared.runtime import Runtime, build_runtime, set_process_runtime  # noqa: E402
from p2p.shared.settings import Settings  # noqa: E402

SettingsFactory = Callable[..., Settings]


@pytest.fixture(scope="session", autouse=True)
def _task_modules() -> None:
    """What p2p.apps does for a real process: in-process dispatchers find every service's tasks."""
    register_tasks()


@pytest.fixture
def make_settings(tmp_path: Path, pg_url: str) -> SettingsFactory:
    """Settings on the test database and a temp data folder; keyword sections override."""

    def factory(**overrides: Any) -> Settings:
        # Mining is left queued unless a test asks for it: ingest tests stay independent of the miner.
        values: dict[str, Any] = {
            "profile": "embedded",
            "data_dir": tmp_path / "data",
            "db": {"url": pg_url},
            "queue": {"embedded_queues": ["ingest"]},
        }
        for key, value in overrides.items():
            if isinstance(value, dict) and isinstance(values.get(key), dict):
                values[key] = {**values[key], **value}
            else:
                values[key] = value
        return Settings(**values)

    return factory


@pytest.fixture
def s3_settings(s3_server: S3Handle, s3_store: S3ObjectStore) -> dict[str, Any]:
    return {
        "endpoint": s3_server.endpoint,
        "access_key": s3_server.access_key,
        "secret_key": s3_server.secret_key,
        "bucket": s3_store.bucket,
    }


@pytest.fixture(params=["local", "s3"])
def store_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


RuntimeFactory = Callable[..., Runtime]


@pytest.fixture
def make_runtime(
    db: Engine, make_settings: SettingsFactory, store_kind: str, request: pytest.FixtureRequest
) -> Iterator[RuntimeFactory]:
    """Embedded-style runtimes (in-process tasks) on the real database and the parametrized store."""
    built: list[Runtime] = []

    def factory(**overrides: Any) -> Runtime:
        if store_kind == "s3":
            overrides.setdefault("s3", request.getfixturevalue("s3_settings"))
        rt = build_runtime(make_settings(**overrides))
        set_process_runtime(rt)
        built.append(rt)
        return rt

    yield factory
    set_process_runtime(None)
    for rt in built:
        rt.close()


@pytest.fixture
def runtime(make_runtime: RuntimeFactory) -> Runtime:
    return make_runtime()


@pytest.fixture
def client(runtime: Runtime) -> Iterator[TestClient]:
    with TestClient(create_app(runtime=runtime)) as test_client:
        yield test_client
