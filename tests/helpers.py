"""Data the tests make for themselves."""

from __future__ import annotations

import hashlib
import io
import json
import random
import socket
import subprocess
import sys
import threading
import time
import uuid
from typing import Any

import uvicorn
from PIL import Image
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session

from p2p.shared.db.models import Article, Batch, Figure, MiningJob, Panel, Region
from p2p.shared.storage import ObjectStore


def image_bytes(fmt: str = "PNG", size: tuple[int, int] = (64, 48), seed: int = 0) -> bytes:
    rng = random.Random(seed)
    img = Image.new("RGB", size, (rng.randrange(256), rng.randrange(256), rng.randrange(256)))
    for _ in range(20):
        x, y = rng.randrange(size[0]), rng.randrange(size[1])
        img.putpixel((x, y), (rng.randrange(256), rng.randrange(256), rng.randrange(256)))
    buffer = io.BytesIO()
    img.save(buffer, format=fmt)
    return buffer.getvalue()


def upload(
    client: Any,
    data: bytes,
    *,
    caption: str = "Figure 1. (A) Liver. (B) Kidney.",
    metadata: dict[str, Any] | str | None = None,
    filename: str = "fig.png",
    headers: dict[str, str] | None = None,
    extra: dict[str, str] | None = None,
) -> Any:
    form: dict[str, str] = {"caption": caption}
    if metadata is not None:
        form["metadata"] = metadata if isinstance(metadata, str) else json.dumps(metadata)
    form.update(extra or {})
    return client.post(
        "/v1/figures",
        files={"image": (filename, data, "application/octet-stream")},
        data=form,
        headers=headers or {},
    )


def row_counts(engine: Engine) -> dict[str, int]:
    with Session(engine) as session:
        return {
            "figure": session.scalar(select(func.count()).select_from(Figure)) or 0,
            "article": session.scalar(select(func.count()).select_from(Article)) or 0,
            "job": session.scalar(select(func.count()).select_from(MiningJob)) or 0,
            "batch": session.scalar(select(func.count()).select_from(Batch)) or 0,
        }


def object_count(store: ObjectStore) -> int:
    return len(list(store.list("")))


def assert_error(response: Any, status: int, error_type: str) -> None:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}, body
    assert body["error"]["type"] == error_type, body
    assert body["error"]["code"] == status
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]


def job_row_counts(runtime: Any, job_id: str) -> tuple[int, int]:
    """Panels and regions a mining job stored."""
    with runtime.session() as session:
        panels = session.scalar(
            select(func.count()).select_from(Panel).where(Panel.mining_job_id == uuid.UUID(job_id))
        )
        regions = session.scalar(
            select(func.count())
            .select_from(Region)
            .join(Panel)
            .where(Panel.mining_job_id == uuid.UUID(job_id))
        )
    return int(panels or 0), int(regions or 0)


def run_module(module: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``python -m module args`` in a fresh interpreter, as a user would run it (output captured)."""
    return subprocess.run(
        [sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=timeout
    )


def serve_in_thread(app: Any) -> tuple[uvicorn.Server, threading.Thread, int]:
    """Serve an app with uvicorn on a free loopback port, on a thread; stop it by
    ``server.should_exit = True`` and joining the thread."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started, "uvicorn did not start"
    return server, thread, port


def wait_for(check: Any, timeout: float, what: str = "a condition", interval: float = 0.1) -> Any:
    """Poll ``check`` until it returns something true (returned), or fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}")


class Sha256Bytes:
    """Counts the bytes every ``hashlib.sha256`` made while installed hashes (its first argument
    and every ``update``), whoever makes it: a test reads how many passes a body was hashed in."""

    def __init__(self) -> None:
        self.total = 0
        self._real = hashlib.sha256

    def install(self, monkeypatch: Any) -> Sha256Bytes:
        counter = self

        class Counting:
            def __init__(self, data: bytes = b"", **kwargs: Any) -> None:
                self._hash = counter._real(data, **kwargs)
                counter.total += len(data)

            def update(self, data: bytes) -> None:
                counter.total += len(data)
                self._hash.update(data)

            def __getattr__(self, name: str) -> Any:
                return getattr(self._hash, name)

        monkeypatch.setattr(hashlib, "sha256", Counting)
        return self
