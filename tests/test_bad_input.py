"""Inputs that once answered 500 (found by schema fuzzing) answer their 4xx in the one envelope and
store nothing; a database that is down answers 503; no error closes the client's connection; the
OpenAPI specs declare the errors and every reference in them resolves."""

from __future__ import annotations

import io
import json
import shutil
import socket
import struct
import tempfile
import time
import uuid
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from PIL import Image

from p2p.apps.embedding import embedding_app as create_embedding_app
from p2p.apps.ingest import ingest_app as create_ingest_app
from p2p.shared.db.engine import make_engine, make_session_factory
from p2p.shared.runtime import Runtime
from tests.helpers import assert_error, image_bytes, object_count, row_counts, serve_in_thread, upload


@pytest.fixture
def store_kind() -> str:
    return "local"


def corrupt_png() -> bytes:
    """A PNG whose chunks are all complete with good CRCs, but whose image data does not inflate."""
    data = bytearray(image_bytes("PNG", (48, 32), seed=3))
    pos = 8
    while pos < len(data):
        length = int.from_bytes(data[pos : pos + 4], "big")
        kind = bytes(data[pos + 4 : pos + 8])
        if kind == b"IDAT":
            body = bytes((b * 7 + 13) & 0xFF for b in data[pos + 8 : pos + 8 + length])
            data[pos + 8 : pos + 8 + length] = body
            data[pos + 8 + length : pos + 12 + length] = struct.pack(">I", zlib.crc32(body, zlib.crc32(kind)))
        pos += 12 + length
    with pytest.raises(OSError), Image.open(io.BytesIO(bytes(data))) as img:
        img.load()
    return bytes(data)


@pytest.fixture
def ingest(runtime: Runtime) -> Iterator[TestClient]:
    with TestClient(create_ingest_app(runtime=runtime)) as client:
        yield client


@pytest.fixture
def embedding(runtime: Runtime) -> Iterator[TestClient]:
    with TestClient(create_embedding_app(runtime=runtime)) as client:
        yield client


def test_offsets_past_a_bigint_are_refused(ingest: TestClient, embedding: TestClient) -> None:
    assert_error(ingest.get("/v1/figures", params={"offset": 2**63}), 422, "validation_error")
    assert ingest.get("/v1/figures", params={"offset": 2**31 - 1}).status_code == 200
    assert_error(
        embedding.post("/v1/search", json={"text": "x", "offset": 2**63}), 422, "offset_out_of_range"
    )


def test_nul_characters_and_home_paths_are_refused_with_nothing_stored(
    runtime: Runtime, ingest: TestClient, embedding: TestClient
) -> None:
    before = row_counts(runtime.engine)
    for source in ("/data/a\x00b", "~nosuchuser/x", "~/x"):
        response = ingest.post("/v1/batches", json={"kind": "manifest", "source": source})
        assert response.status_code == 422, response.text
        assert response.json()["error"]["code"] == 422
    search = embedding.post("/v1/search", json={"text": "liver", "filters": {"journal": "J\x00"}})
    assert_error(search, 422, "validation_error")
    assert "NUL" in search.json()["error"]["message"]
    metadata = {"article": {"title": "a\x00b"}}
    assert_error(upload(ingest, image_bytes(), metadata=metadata), 422, "invalid_metadata")
    assert row_counts(runtime.engine) == before


def test_invalid_utf8_in_a_form_field_is_refused_not_stored_as_mojibake(
    runtime: Runtime, ingest: TestClient
) -> None:
    boundary = "b0undary"
    body = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="image"; filename="f.png"\r\n'
        "Content-Type: image/png\r\n\r\n"
    ).encode() + image_bytes()
    body += (
        f'\r\n--{boundary}\r\nContent-Disposition: form-data; name="caption"\r\n\r\n'.encode()
        + b"Figure 1. Liver \xff\xfe cells"
        + f"\r\n--{boundary}--\r\n".encode()
    )
    headers = {"content-type": f"multipart/form-data; boundary={boundary}"}
    response = ingest.post("/v1/figures", content=body, headers=headers)
    assert_error(response, 422, "invalid_utf8")
    assert "caption" in response.json()["error"]["message"]
    assert row_counts(runtime.engine)["figure"] == 0 and object_count(runtime.store) == 0
    # the same caption in UTF-8 (with non-ASCII text) is stored as sent
    accepted = upload(ingest, image_bytes(), caption="Figure 1. Liver café cells")
    assert accepted.status_code == 202, accepted.text
    figure = ingest.get(f"/v1/figures/{accepted.json()['figure_id']}").json()
    assert figure["caption"] == "Figure 1. Liver café cells"


def test_bad_snapshot_paths_are_refused(embedding: TestClient) -> None:
    for snapshot in ("", "/", "../../etc", "a/../../b"):
        response = embedding.post(
            "/v1/training-runs", json={"preset": "small", "data": {"snapshot": snapshot}}
        )
        assert response.status_code == 422, (snapshot, response.text)
        assert "snapshot" in response.json()["error"]["message"]


def test_an_image_that_does_not_decode_is_refused_at_query_time(embedding: TestClient) -> None:
    bad = corrupt_png()
    files = [("files", ("bad.png", bad, "image/png"))]
    assert_error(embedding.post("/v1/embed/images", files=files), 422, "corrupt_image")
    classify = embedding.post("/v1/classify", files={"image": ("bad.png", bad, "image/png")})
    assert_error(classify, 422, "corrupt_image")
    search = embedding.post("/v1/search", files={"image": ("bad.png", bad, "image/png")})
    # no active model version: refusing the image comes first only if it is decoded before the
    # space is consulted, which it is for uploads
    assert search.status_code in (422, 503), search.text
    if search.status_code == 422:
        assert search.json()["error"]["type"] == "corrupt_image"


def test_a_database_that_is_down_answers_503_on_every_route(runtime: Runtime, ingest: TestClient) -> None:
    # Nothing listens on port 1: every connection attempt fails at once.
    dead = make_engine("postgresql+psycopg://p2p@127.0.0.1:1/nothing")
    live_engine, live_sessions = runtime.engine, runtime.session_factory
    runtime.engine, runtime.session_factory = dead, make_session_factory(dead)
    try:
        for method, path, kwargs in [
            ("get", "/v1/figures", {}),
            ("get", "/v1/figures/00000000-0000-0000-0000-000000000001", {}),
            ("get", "/v1/jobs/00000000-0000-0000-0000-000000000001", {}),
            ("post", "/v1/batches", {"json": {"kind": "manifest", "source": "s3://b/x/manifest.jsonl"}}),
        ]:
            response = getattr(ingest, method)(path, **kwargs)
            if response.status_code == 422:  # the source check refused it before the database
                continue
            assert_error(response, 503, "database_unavailable")
            assert response.headers["retry-after"]
        assert upload(ingest, image_bytes()).status_code == 503
        assert ingest.get("/readyz").status_code == 503
    finally:
        runtime.engine, runtime.session_factory = live_engine, live_sessions
        dead.dispose()


def _exchange(conn: socket.socket, request: bytes) -> tuple[int, bytes]:
    conn.sendall(request)
    data = b""
    while b"\r\n\r\n" not in data:
        data += conn.recv(65536)
    head, _, rest = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
    )
    while len(rest) < length:
        rest += conn.recv(65536)
    return int(head.split(b" ")[1]), rest


def test_errors_keep_the_connection_open(runtime: Runtime) -> None:
    app = create_ingest_app(runtime=runtime)

    def boom() -> dict[str, Any]:
        raise RuntimeError("a bug")

    app.add_api_route("/boom", boom)
    server, thread, port = serve_in_thread(app)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
            for path, expected in [
                (b"/boom", 500),
                (b"/v1/figures?offset=99999999999999999999", 422),
                (b"/v1/figures/nope", 422),
                (b"/healthz", 200),
            ]:
                status, body = _exchange(conn, b"GET " + path + b" HTTP/1.1\r\nHost: x\r\n\r\n")
                assert status == expected, body
                if status >= 400:
                    assert json.loads(body)["error"]["code"] == status
    finally:
        server.should_exit = True
        thread.join(30)


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref":
                yield value
            else:
                yield from _refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from _refs(value)


@pytest.mark.parametrize("which", ["ingest", "embedding"])
def test_openapi_declares_the_errors_and_every_reference_resolves(
    which: str, ingest: TestClient, embedding: TestClient
) -> None:
    client = ingest if which == "ingest" else embedding
    spec = client.get("/openapi.json").json()
    schemas = spec["components"]["schemas"]
    for ref in _refs(spec):
        assert ref.startswith("#/components/schemas/") and ref.rsplit("/", 1)[1] in schemas, ref
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            responses = operation["responses"]
            if path != "/healthz":
                assert "503" in responses, (method, path)
            for code, answer in responses.items():
                if int(code) >= 400:
                    schema = answer["content"]["application/json"]["schema"]
                    assert schema == {"$ref": "#/components/schemas/ErrorBody"}, (method, path, code)
            if method == "post":
                assert {"422", "429"} <= set(responses), (method, path)


def test_a_request_session_whose_connection_died_closes_without_error(make_runtime: Any) -> None:
    # the session closes after the answer is sent: a lost connection must not fail it half sent
    from sqlalchemy import text

    from p2p.shared.deps import get_session

    runtime = make_runtime()
    sessions = get_session(runtime)
    session = next(sessions)
    backend = session.scalar(text("SELECT pg_backend_pid()"))
    with runtime.engine.connect() as admin:
        assert admin.scalar(text("SELECT pg_terminate_backend(:pid)"), {"pid": backend})
    with pytest.raises(StopIteration):
        next(sessions)
    with runtime.session() as fresh:  # the dead connection left the pool
        assert fresh.scalar(text("SELECT pg_backend_pid()")) != backend


def test_the_embedded_postgres_is_restarted_when_it_dies(make_settings: Any) -> None:
    import os
    import signal

    from p2p.shared.runtime import build_runtime

    # Not under pytest's temp root: other pytest runs prune it, and PostgreSQL runs as its own user.
    folder = Path(tempfile.mkdtemp(prefix="p2p-pg-restart-"))
    folder.chmod(0o755)
    runtime = build_runtime(make_settings(db={"url": None}, data_dir=folder / "own"))
    try:
        assert runtime.embedded_pg is not None
        with TestClient(create_ingest_app(runtime=runtime)) as client:
            assert client.get("/v1/figures").status_code == 200
            pid = runtime.embedded_pg._server.get_pid()  # type: ignore[union-attr]
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 300  # crash recovery on a loaded machine
            codes = []
            while time.monotonic() < deadline:
                response = client.get("/v1/figures")
                codes.append(response.status_code)
                if response.status_code == 200 and 503 in codes:
                    break
                assert response.status_code in (200, 503), response.text
                time.sleep(0.2)
            assert codes[-1] == 200 and 503 in codes, codes
    finally:
        runtime.close()
        shutil.rmtree(folder, ignore_errors=True)


def test_a_figure_that_does_not_decode_ends_failed_with_its_reason_on_the_figure(
    runtime: Runtime, ingest: TestClient
) -> None:
    """Ingest checks structure, not every pixel (a full decode would add ~7 ms CPU per 1 MB
    figure, bench/decode_check_bench.py); the miner's decode fails it with the reason shown."""
    from p2p.mining.jobs import mine_job
    from p2p.mining.tasks import get_miner

    accepted = upload(ingest, corrupt_png())
    assert accepted.status_code == 202, accepted.text
    outcome = mine_job(runtime, uuid.UUID(accepted.json()["job_id"]), get_miner())
    assert outcome.status.value == "failed"
    figure = ingest.get(f"/v1/figures/{accepted.json()['figure_id']}").json()
    assert figure["status"] == "failed"
    assert "cannot be decoded" in figure["mining_error"]
    listed = ingest.get("/v1/figures").json()
    assert [f["mining_error"] for f in listed] == [figure["mining_error"]]
