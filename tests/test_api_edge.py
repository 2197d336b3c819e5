"""The edge middleware (``p2p.shared.api.ApiEdge``): one layer around every route of both APIs, and
its multipart watcher, which must agree with Starlette's parser however the body is chunked."""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import AsyncIterator

import pytest
from fastapi.testclient import TestClient
from starlette.datastructures import Headers
from starlette.formparsers import MultiPartParser

from p2p.apps.embedding import embedding_app
from p2p.apps.ingest import ingest_app
from p2p.shared.api import ApiEdge, _TextPartWatcher
from p2p.shared.runtime import Runtime
from tests.conftest import RuntimeFactory
from tests.helpers import assert_error, image_bytes

BOUNDARY = b"a1b2-c3d4"


def _body(parts: list[tuple[str, bytes, bool]], *, preamble: bytes = b"", epilogue: bytes = b"") -> bytes:
    """A multipart body: (name, content, is_file) parts."""
    out = bytearray(preamble + (b"\r\n" if preamble else b""))
    for name, content, is_file in parts:
        out += b"--" + BOUNDARY + b"\r\n"
        filename = f'; filename="{name}.bin"' if is_file else ""
        out += f'Content-Disposition: form-data; name="{name}"{filename}\r\n'.encode()
        if is_file:
            out += b"Content-Type: application/octet-stream\r\n"
        out += b"\r\n" + content + b"\r\n"
    out += b"--" + BOUNDARY + b"--\r\n" + epilogue
    return bytes(out)


def _starlette_text(body: bytes) -> dict[str, str]:
    """Starlette's reading of the text fields (undecodable text comes back as Latin-1)."""

    async def stream() -> AsyncIterator[bytes]:
        yield body

    async def parse() -> dict[str, str]:
        headers = Headers({"content-type": f"multipart/form-data; boundary={BOUNDARY.decode()}"})
        form = await MultiPartParser(headers, stream()).parse()
        return {k: v for k, v in form.multi_items() if isinstance(v, str)}

    return asyncio.run(parse())


def _watch(body: bytes, cuts: list[int]) -> _TextPartWatcher:
    watcher = _TextPartWatcher(BOUNDARY)
    edges = [0, *sorted(cuts), len(body)]
    for start, end in itertools.pairwise(edges):
        watcher.feed(body[start:end])
    return watcher


def _utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _cases() -> list[tuple[list[tuple[str, bytes, bool]], bytes, bytes]]:
    rng = random.Random(7)
    # File bytes full of near-delimiters: CRLF, dashes, the boundary without its dashes.
    tricky = b"\r\n-" + BOUNDARY + b"\r\n--a1b2\r\n\r\n--" + bytes(rng.randrange(256) for _ in range(300))
    return [
        ([("caption", "Liver café (A) ✓".encode(), False), ("image", tricky, True)], b"", b""),
        ([("image", tricky, True), ("caption", b"Liver \xff\xfe cells", False)], b"", b""),
        ([("caption", b"ok", False), ("metadata", b'{"a": "\xc3"}', False)], b"", b""),
        ([("image", b"", True), ("caption", b"", False)], b"", b"epilogue"),
        ([("a", tricky, True), ("b", tricky, True), ("c", b"\xe2\x82", False)], b"", b""),
        ([("c", b"\xe2\x82\xac" * 50, False), ("image", tricky * 20, True)], b"", b""),
    ]


@pytest.mark.parametrize("case", range(6))
def test_the_watcher_finds_what_starlette_would_decode_as_latin1_at_every_chunking(case: int) -> None:
    parts, preamble, epilogue = _cases()[case]
    body = _body(parts, preamble=preamble, epilogue=epilogue)
    bad = next((name for name, content, is_file in parts if not is_file and not _utf8(content)), None)
    # Starlette reads the same text parts: UTF-8 where it decodes, Latin-1 (mojibake) where not.
    assert _starlette_text(body) == {
        name: content.decode("utf-8" if _utf8(content) else "latin-1")
        for name, content, is_file in parts
        if not is_file
    }
    rng = random.Random(case)
    chunkings = [[cut] for cut in range(1, len(body))]  # every split in two (delimiters cut anywhere)
    chunkings += [rng.sample(range(1, len(body)), k) for k in (2, 3, 5, 9, 17) for _ in range(40)]
    chunkings.append(list(range(1, len(body))))  # one byte at a time
    for cuts in chunkings:
        watcher = _watch(body, cuts)
        assert not watcher.broken, cuts
        assert watcher.bad_field == bad, cuts


def test_the_watcher_leaves_a_body_it_cannot_follow_to_starlette() -> None:
    watcher = _TextPartWatcher(BOUNDARY)
    watcher.feed(b"--" + BOUNDARY + b"\r\n" + b"X-Header: " + b"y" * 20000)  # headers never end
    assert watcher.broken and watcher.bad_field is None


def test_both_apis_run_one_middleware_of_their_own(runtime: Runtime) -> None:
    for build in (ingest_app, embedding_app):
        app = build(runtime=runtime)
        assert [m.cls for m in app.user_middleware] == [ApiEdge]


def test_a_refusal_by_content_length_carries_the_request_id_and_the_security_headers(
    runtime: Runtime,
) -> None:
    limit = runtime.settings.ingest.max_upload_bytes
    with TestClient(ingest_app(runtime=runtime)) as client:
        refused = client.post(
            "/v1/figures",
            content=b"x" * 16,
            headers={"content-length": str(limit * 4), "X-Request-ID": "req-too-big"},
        )
    assert_error(refused, 413, "payload_too_large")
    assert refused.headers["X-Request-ID"] == "req-too-big"
    assert refused.json()["error"]["request_id"] == "req-too-big"
    assert refused.headers["x-content-type-options"] == "nosniff"


def _multipart(fields: list[tuple[str, bytes, str | None]]) -> tuple[bytes, dict[str, str]]:
    """A raw multipart body of (name, content, filename or None) parts, and its content type."""
    body = b""
    for name, content, filename in fields:
        disposition = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
        body += (
            b"--" + BOUNDARY + f"\r\nContent-Disposition: {disposition}\r\n\r\n".encode() + content + b"\r\n"
        )
    body += b"--" + BOUNDARY + b"--\r\n"
    return body, {"content-type": f"multipart/form-data; boundary={BOUNDARY.decode()}"}


def test_forms_their_routes_read_are_parsed_once_and_still_refuse_text_that_is_not_utf8(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    fed: list[int] = []
    feed = _TextPartWatcher.feed
    monkeypatch.setattr(
        _TextPartWatcher, "feed", lambda self, chunk: (fed.append(len(chunk)), feed(self, chunk))
    )
    png = image_bytes()
    with TestClient(ingest_app(runtime=runtime)) as ingest:
        # POST /v1/figures reads its form with read_form: one parse, which checks the text itself.
        body, headers = _multipart([("image", png, "f.png"), ("caption", b"Liver \xff cells", None)])
        assert_error(ingest.post("/v1/figures", content=body, headers=headers), 422, "invalid_utf8")
        body, headers = _multipart([("image", png, "f.png"), ("caption", "Liver café".encode(), None)])
        assert ingest.post("/v1/figures", content=body, headers=headers).status_code == 202
        assert fed == []  # the edge's watcher stood down
        # A route with FastAPI Form parameters is still guarded by the watcher.
        body, headers = _multipart([("kind", b"pmc\xff", None), ("file", b"x", "p.tar.gz")])
        assert_error(ingest.post("/v1/batches/upload", content=body, headers=headers), 422, "invalid_utf8")
        assert fed
    fed.clear()
    with TestClient(embedding_app(runtime=runtime)) as embedding:
        body, headers = _multipart([("files", png, "f.png"), ("object_ids", b"\xfe", None)])
        assert_error(embedding.post("/v1/embed/images", content=body, headers=headers), 422, "invalid_utf8")
        body, headers = _multipart([("files", png, "f.png")])
        assert embedding.post("/v1/embed/images", content=body, headers=headers).status_code == 200
        # A broken body is still the 400 request.form() gives.
        broken = {"content-type": "multipart/form-data; boundary=zz"}
        assert_error(
            embedding.post("/v1/embed/images", content=b"nonsense", headers=broken), 400, "bad_request"
        )
    assert fed == []


@pytest.mark.parametrize("store_kind", ["local"], indirect=True)
def test_an_image_embed_without_a_key_gets_its_401_before_the_model_is_looked_for(
    make_runtime: RuntimeFactory,
) -> None:
    keyed = make_runtime(auth={"required": True})
    app = embedding_app(runtime=keyed)
    app.state.runtime = keyed  # no lifespan: the model is never loaded
    body, headers = _multipart([("files", image_bytes(), "f.png")])
    answer = TestClient(app).post("/v1/embed/images", content=body, headers=headers)
    assert_error(answer, 401, "missing_api_key")
    with_key = TestClient(app).post(
        "/v1/embed/images", content=body, headers={**headers, "Authorization": "Bearer p2p_nope_nope"}
    )
    assert with_key.status_code == 401  # an unknown key: refused before the model is asked for
