"""The live parts a process works with (database, object store, task dispatch), built from settings.

API servers keep theirs on ``app.state``; Celery workers and the CLI hold one per process.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from alembic.script import ScriptDirectory
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session, sessionmaker

from p2p.shared.db import migrate
from p2p.shared.db.engine import make_engine, make_session_factory
from p2p.shared.embedded import EmbeddedPostgres
from p2p.shared.metrics.jobs import JobMetrics
from p2p.shared.queue import CeleryDispatcher, InProcessDispatcher, TaskDispatcher, configure_celery
from p2p.shared.ratelimit import MemoryWindow, RateLimiter, RedisWindow
from p2p.shared.settings import Settings, get_settings
from p2p.shared.storage import LocalObjectStore, ObjectStore, S3ObjectStore

log = logging.getLogger(__name__)


class SchemaOutOfDate(RuntimeError):
    pass


@dataclass
class Runtime:
    settings: Settings
    engine: Engine
    session_factory: sessionmaker[Session]
    store: ObjectStore
    dispatcher: TaskDispatcher
    embedded_pg: EmbeddedPostgres | None = None
    _restart_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    rate_limiter: RateLimiter | None = None
    # Told of every durable-job event (p2p.shared.jobs.JobObserver): metrics plug in here.
    job_observers: list[Any] = field(default_factory=list)

    @contextmanager
    def session(self) -> Iterator[Session]:
        with self.session_factory() as session:
            yield session

    @contextmanager
    def autocommit_session(self) -> Iterator[Session]:
        """A session whose statements commit one by one, for a read that needs no transaction (or
        a one-statement write): no BEGIN and no ROLLBACK round trip around it."""
        engine = self.engine.execution_options(isolation_level="AUTOCOMMIT")
        with Session(bind=engine, expire_on_commit=False) as session:
            yield session

    def check_database(self) -> None:
        try:
            with self.engine.connect() as conn:
                conn.execute(text("SELECT 1"))
        except Exception:
            self.database_unavailable()
            raise

    def database_unavailable(self) -> None:
        """Told when a database call failed for want of a server: the embedded profile restarts its
        own PostgreSQL (on a thread of its own, one restart at a time); a configured server is the
        operator's."""
        if self.embedded_pg is None or not self._restart_lock.acquire(blocking=False):
            return
        threading.Thread(target=self._restart_embedded, name="p2p-pg-restart", daemon=True).start()

    def _restart_embedded(self) -> None:
        try:
            assert self.embedded_pg is not None
            self.embedded_pg.ensure_running()
            self.engine.dispose()  # its pooled connections point at the dead server
        except Exception as exc:  # the next failing request tries again
            log.warning("could not restart the embedded PostgreSQL: %s", exc)
        finally:
            self._restart_lock.release()

    def close(self) -> None:
        self.dispatcher.close()
        self.engine.dispose()
        if self.embedded_pg is not None:
            self.embedded_pg.stop()


def build_store(settings: Settings) -> ObjectStore:
    if settings.embedded_store:
        return LocalObjectStore(settings.data_dir / "objects")
    assert settings.s3.endpoint is not None
    store = S3ObjectStore(
        endpoint=settings.s3.endpoint,
        access_key=settings.s3.access_key,
        secret_key=settings.s3.secret_key.get_secret_value(),
        bucket=settings.s3.bucket,
        secure=settings.s3.secure,
        region=settings.s3.region,
    )
    store.ensure_bucket()
    return store


def build_runtime(settings: Settings, *, in_process_tasks: bool | None = None) -> Runtime:
    """Start what the profile embeds and connect to the rest.

    The embedded database is migrated on start; a configured server must already be at the
    current schema (``p2p db upgrade``), so that a deploy never migrates behind an operator's back.
    """
    embedded_pg: EmbeddedPostgres | None = None
    if settings.embedded_db:
        embedded_pg = EmbeddedPostgres(settings.data_dir / "pg")
        url = embedded_pg.start()
    else:
        assert settings.db.url is not None
        url = settings.db.url
    try:
        engine = make_engine(url, settings.db)
    except BaseException:
        if embedded_pg is not None:
            embedded_pg.stop()
        raise
    try:
        if embedded_pg is not None:
            migrate.upgrade(url)
        else:
            _check_schema(engine)
        store = build_store(settings)
        app = configure_celery(settings)
        run_locally = settings.embedded_queue if in_process_tasks is None else in_process_tasks
        dispatcher: TaskDispatcher = (
            InProcessDispatcher(app, settings.queue.embedded_workers, settings.queue.embedded_queues)
            if run_locally
            else CeleryDispatcher(app, settings.redis.url or "memory://", settings=settings)
        )
    except BaseException:
        engine.dispose()
        if embedded_pg is not None:
            embedded_pg.stop()
        raise
    return Runtime(
        rate_limiter=build_rate_limiter(settings),
        settings=settings,
        engine=engine,
        session_factory=make_session_factory(engine),
        store=store,
        dispatcher=dispatcher,
        embedded_pg=embedded_pg,
        job_observers=[JobMetrics()] if settings.metrics.enabled else [],
    )


def build_rate_limiter(settings: Settings) -> RateLimiter | None:
    limits = settings.rate_limit
    if limits.writes_per_window == 0:
        return None
    if settings.redis.url:
        return RedisWindow(settings.redis.url, limits.writes_per_window, limits.window_s)
    return MemoryWindow(limits.writes_per_window, limits.window_s)


def _check_schema(engine: Engine) -> None:
    head = ScriptDirectory.from_config(migrate.alembic_config(str(engine.url))).get_current_head()
    current = migrate.current_revision(engine)
    if current != head:
        raise SchemaOutOfDate(
            f"database schema is at {current or 'nothing'}, this release needs {head}: run `p2p db upgrade`"
        )


_process_runtime: Runtime | None = None
_process_lock = threading.Lock()


def get_process_runtime() -> Runtime:
    """The runtime of this process, built on first use from the environment's settings."""
    global _process_runtime
    with _process_lock:
        if _process_runtime is None:
            _process_runtime = build_runtime(get_settings())
        return _process_runtime


def set_process_runtime(runtime: Runtime | None) -> None:
    global _process_runtime
    with _process_lock:
        _process_runtime = runtime
