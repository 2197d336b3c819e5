"""Bounded work and security details: WebDataset shards limited like PMC packages, uploads removed
after their batch, per-key write rate limits, batch items in their figure's transaction, loopback
only without keys, the viewer's security headers and session-only key."""

from __future__ import annotations

import asyncio
import gzip
import io
import json
import tarfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from p2p.apps.embedding import embedding_app as create_embedding_app
from p2p.ingest.app import create_app
from p2p.ingest.service import ingest_figure
from p2p.shared.queue import InProcessDispatcher
from p2p.shared.ratelimit import RedisWindow
from p2p.shared.runtime import Runtime
from p2p.shared.schemas import FigureMetadata
from tests.conftest import RuntimeFactory
from tests.helpers import assert_error, image_bytes, object_count, row_counts, upload

STATIC = Path(__file__).resolve().parents[1] / "services" / "embedding-api" / "static"


@pytest.fixture
def store_kind() -> str:
    return "local"


def _shard(members: list[tuple[str, bytes]], *, compress: bool = False) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    raw = buffer.getvalue()
    return gzip.compress(raw) if compress else raw


def _post_shard(client: TestClient, data: bytes, name: str = "s.tar") -> Any:
    return client.post("/v1/batches/upload", data={"kind": "webdataset"}, files={"file": (name, data)})


def _wait_batch(client: TestClient, runtime: Runtime, batch_id: str) -> dict[str, Any]:
    assert isinstance(runtime.dispatcher, InProcessDispatcher)
    assert runtime.dispatcher.wait_idle(120)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        body: dict[str, Any] = client.get(f"/v1/batches/{batch_id}").json()
        if body["status"] not in ("queued", "running"):
            return body
        time.sleep(0.1)
    raise AssertionError("batch did not end")


@pytest.fixture
def small_limits(make_runtime: RuntimeFactory) -> Iterator[tuple[TestClient, Runtime]]:
    runtime = make_runtime(ingest={"max_package_bytes": 512 * 1024, "max_package_members": 8})
    with TestClient(create_app(runtime=runtime)) as client:
        yield client, runtime


def test_a_shard_that_expands_past_the_limit_is_refused_before_it_is_read(
    small_limits: tuple[TestClient, Runtime],
) -> None:
    client, runtime = small_limits
    bomb = _shard([("0001.txt", b"caption"), ("0001.bin", bytes(8 * 1024 * 1024))], compress=True)
    assert len(bomb) < 64 * 1024  # small on the wire, 8 MiB inside
    response = _post_shard(client, bomb, "bomb.tar")
    assert_error(response, 422, "package_too_large")
    many = _shard([(f"{i:04d}.txt", b"x") for i in range(9)])
    assert_error(_post_shard(client, many), 422, "too_many_members")
    assert row_counts(runtime.engine)["batch"] == 0 and object_count(runtime.store) == 0


def test_unsafe_member_names_are_item_errors_and_the_upload_is_removed_after_the_batch(
    small_limits: tuple[TestClient, Runtime],
) -> None:
    client, runtime = small_limits
    shard = _shard(
        [
            ("0001.png", image_bytes(seed=1)),
            ("0001.txt", b"Figure 1. Liver."),
            ("../0002.png", image_bytes(seed=2)),
            ("/abs/0003.png", image_bytes(seed=3)),
        ]
    )
    response = _post_shard(client, shard)
    assert response.status_code == 202, response.text
    body = _wait_batch(client, runtime, response.json()["id"])
    assert (body["ingested"], body["failed"]) == (1, 2), body
    assert {f["error_type"] for f in body["failures"]} == {"unsafe_member"}
    assert not [key for key in runtime.store.list("uploads/")]  # the package went with its batch
    assert row_counts(runtime.engine)["figure"] == 1


def test_write_routes_are_rate_limited_per_key_with_retry_after(make_runtime: RuntimeFactory) -> None:
    runtime = make_runtime(rate_limit={"writes_per_window": 2, "window_s": 3600})
    with TestClient(create_app(runtime=runtime)) as client:
        assert upload(client, image_bytes(seed=1)).status_code == 202
        assert upload(client, image_bytes(seed=2)).status_code == 202
        limited = upload(client, image_bytes(seed=3))
        assert_error(limited, 429, "rate_limited")
        assert 0 < int(limited.headers["retry-after"]) <= 3600
        assert client.get("/v1/figures").status_code == 200  # reads are not limited
    assert row_counts(runtime.engine)["figure"] == 2


def test_the_redis_window_is_shared_and_fails_open(redis_url: str) -> None:
    key = f"test:{uuid.uuid4().hex}"
    first, second = RedisWindow(redis_url, 1, 3600), RedisWindow(redis_url, 1, 3600)
    assert first.hit(key) is None
    assert second.hit(key) is not None  # another replica sees the same count
    assert RedisWindow("redis://127.0.0.1:1/0", 1, 60).hit(key) is None  # no Redis: let it through


def test_batch_items_are_written_in_their_figure_transaction(runtime: Runtime) -> None:
    def crash_before_commit(*_: Any) -> None:
        raise RuntimeError("killed between the figure and its item")

    with runtime.session() as session, pytest.raises(RuntimeError):
        ingest_figure(
            session=session,
            store=runtime.store,
            dispatcher=runtime.dispatcher,
            settings=runtime.settings,
            image=io.BytesIO(image_bytes(seed=9)),
            caption="Figure 1.",
            metadata=FigureMetadata(),
            source="batch",
            record=crash_before_commit,
        )
    assert row_counts(runtime.engine)["figure"] == 0  # no figure without its item


def _call(app: Any, path: str, client_host: str) -> httpx.Response:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app, client=(client_host, 4321))
        async with httpx.AsyncClient(transport=transport, base_url="http://p2p") as client:
            return await client.get(path)

    return asyncio.run(go())


def test_without_keys_only_loopback_clients_are_served_whoever_started_the_app(
    make_runtime: RuntimeFactory,
) -> None:
    open_app = create_app(runtime=make_runtime())
    refused = _call(open_app, "/healthz", "10.1.2.3")
    assert_error(refused, 403, "keys_required_off_loopback")
    assert _call(open_app, "/healthz", "127.0.0.1").status_code == 200
    keyed = create_app(runtime=make_runtime(auth={"required": True}))
    assert _call(keyed, "/healthz", "10.1.2.3").status_code == 200


def test_the_viewer_sends_security_headers_and_keeps_the_key_for_the_session(runtime: Runtime) -> None:
    with TestClient(create_embedding_app(runtime=runtime)) as client:
        page = client.get("/")
        assert page.status_code == 200
        csp = page.headers["content-security-policy"]
        assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp
        assert page.headers["x-frame-options"] == "DENY"
        assert page.headers["x-content-type-options"] == "nosniff"
        assert page.headers["referrer-policy"] == "no-referrer"
        script = client.get("/static/viewer.js")
        assert "content-security-policy" in script.headers
        docs = client.get("/docs")  # Swagger UI comes from a CDN: no CSP there
        assert "content-security-policy" not in docs.headers
        assert docs.headers["x-content-type-options"] == "nosniff"
    viewer = (STATIC / "viewer.js").read_text()
    assert "sessionStorage" in viewer and "localStorage" not in viewer
    assert json.dumps("p2p-api-key") in viewer
