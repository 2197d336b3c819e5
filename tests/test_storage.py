from __future__ import annotations

import hashlib
import io
from typing import Any

import pytest

from p2p.shared.storage import (
    CHECKSUM_HEADER,
    ChecksumMismatch,
    HashedBytes,
    LocalObjectStore,
    ObjectNotFound,
    ObjectStore,
    S3ObjectStore,
    StorageError,
    content_key,
    validate_key,
)
from tests.helpers import Sha256Bytes


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest) -> ObjectStore:
    return request.getfixturevalue("local_store" if request.param == "local" else "s3_store")


def _put(store: ObjectStore, key: str, data: bytes, sha: str | None = None, size: int | None = None) -> None:
    store.put(
        key,
        io.BytesIO(data),
        size=len(data) if size is None else size,
        sha256=sha or hashlib.sha256(data).hexdigest(),
        content_type="application/octet-stream",
    )


def test_round_trip_list_delete(store: ObjectStore) -> None:
    data = bytes(range(256)) * 4096  # 1 MiB
    key = content_key(hashlib.sha256(data).hexdigest(), "bin")
    _put(store, key, data)
    _put(store, "other/x.txt", b"x")
    assert store.exists(key) and store.size(key) == len(data)
    assert store.get_bytes(key) == data
    with store.open(key) as fh:
        assert fh.read(10) == data[:10]
    assert sorted(store.list("")) == sorted([key, "other/x.txt"])
    assert list(store.list("other/")) == ["other/x.txt"]
    store.delete(key)
    assert not store.exists(key)
    with pytest.raises(ObjectNotFound):
        store.get_bytes(key)
    store.ping()


def test_checksum_mismatch_leaves_nothing(store: ObjectStore) -> None:
    with pytest.raises(ChecksumMismatch):
        _put(store, "bad/one", b"payload", sha="0" * 64)
    assert not store.exists("bad/one")
    assert list(store.list("bad/")) == []


@pytest.mark.parametrize("key", ["", "/abs", "a/../b", "..", "a\\b", "a\x00b"])
def test_keys_cannot_escape(key: str, local_store: LocalObjectStore) -> None:
    with pytest.raises(StorageError):
        validate_key(key)
    with pytest.raises(StorageError):
        _put(local_store, key, b"x")


def test_content_key_is_stable() -> None:
    sha = hashlib.sha256(b"abc").hexdigest()
    assert content_key(sha, "PNG") == f"figures/{sha[:2]}/{sha}.png"


def test_s3_presigned_url_serves_the_object(s3_store: S3ObjectStore) -> None:
    import httpx

    _put(s3_store, "p/q.txt", b"presigned")
    url = s3_store.presigned_url("p/q.txt", expires_s=60)
    assert httpx.get(url).content == b"presigned"


def test_s3_ping_fails_for_missing_bucket(s3_server) -> None:  # type: ignore[no-untyped-def]
    store = S3ObjectStore(
        endpoint=s3_server.endpoint,
        access_key=s3_server.access_key,
        secret_key=s3_server.secret_key,
        bucket="does-not-exist-here",
    )
    with pytest.raises(StorageError):
        store.ping()


def test_a_forked_process_reads_s3_through_a_client_of_its_own(s3_store: S3ObjectStore) -> None:
    """DataLoader workers and prefork children are forks: reading through the parent's pooled
    connections, two processes share one socket and one of them waits for ever."""
    import multiprocessing

    _put(s3_store, "fork/a.txt", b"parent and child")
    assert s3_store.get_bytes("fork/a.txt") == b"parent and child"  # the pool holds a connection now
    parent_client = id(s3_store.client)
    context = multiprocessing.get_context("fork")
    results = context.Queue()

    def child() -> None:
        results.put((id(s3_store.client) != parent_client, s3_store.get_bytes("fork/a.txt")))

    process = context.Process(target=child)
    process.start()
    own_client, data = results.get(timeout=120)
    process.join(60)
    assert own_client
    assert data == b"parent and child"
    assert s3_store.get_bytes("fork/a.txt") == b"parent and child"


def test_s3_put_hashes_the_body_once_and_the_server_keeps_it(
    s3_store: S3ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The store hashes the body itself (to refuse a stream that is not what the caller hashed) and
    # signs the request with that hash: the S3 client must not hash the megabyte again.
    import minio.api

    hashed: list[int] = []
    real = minio.api.sha256_hash

    def counting(data: str | bytes | None) -> str:
        hashed.append(len(data or b""))
        return real(data)

    monkeypatch.setattr(minio.api, "sha256_hash", counting)
    data = bytes(range(256)) * 4096
    key = content_key(hashlib.sha256(data).hexdigest(), "bin")
    _put(s3_store, key, data)
    assert s3_store.get_bytes(key) == data
    assert not [n for n in hashed if n >= len(data)]
    # A second put of other bytes of the same length is not signed with the first one's hash.
    other = bytes(reversed(data))
    other_key = content_key(hashlib.sha256(other).hexdigest(), "bin")
    _put(s3_store, other_key, other)
    assert s3_store.get_bytes(other_key) == other


def test_s3_put_of_a_stream_longer_than_announced_stores_nothing(s3_store: S3ObjectStore) -> None:
    data = b"0123456789" * 100
    with pytest.raises(ChecksumMismatch):
        s3_store.put(
            "bad/long",
            io.BytesIO(data + b"extra"),
            size=len(data),
            sha256=hashlib.sha256(data).hexdigest(),
            content_type="application/octet-stream",
        )
    assert not s3_store.exists("bad/long")


def test_s3_keeps_a_connection_for_each_of_many_requests_at_once(
    s3_store: S3ObjectStore, caplog: pytest.LogCaptureFixture
) -> None:
    """Sixteen ingest clients upload at once: every connection goes back to the pool afterwards
    instead of being closed after one request (minio's own pool keeps ten)."""
    _put(s3_store, "pool/a.txt", b"held")
    at_once = 16
    responses = [s3_store.client.get_object(s3_store.bucket, "pool/a.txt") for _ in range(at_once)]
    with caplog.at_level("WARNING", logger="urllib3.connectionpool"):
        for response in responses:  # each holds its connection until released
            assert response.read() == b"held"
            response.close()
            response.release_conn()
    assert not [r for r in caplog.records if "pool is full" in r.getMessage()]
    pools = list(s3_store.client._http.pools._container.values())  # type: ignore[attr-defined]
    kept = [conn for pool in pools if pool.pool is not None for conn in pool.pool.queue if conn is not None]
    assert len(kept) >= at_once


def test_a_hashed_body_is_stored_without_hashing_it_again(
    store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = bytes(range(256)) * 4096
    body = HashedBytes(data)
    assert body.sha256 == hashlib.sha256(data).hexdigest()
    key = content_key(body.sha256, "bin")
    hashed = Sha256Bytes().install(monkeypatch)
    store.put(key, body, size=len(data), sha256=body.sha256, content_type="application/octet-stream")
    assert hashed.total < len(data)  # the request's signature hashes a few hundred bytes
    assert store.get_bytes(key) == data


def test_a_hashed_body_sends_the_bytes_it_hashed(store: ObjectStore) -> None:
    # Whatever is written through the stream, the store sends the bytes the hash was taken from.
    data = b"the bytes that were hashed" * 100
    body = HashedBytes(data)
    body.write(b"X" * 50)
    body.seek(0)
    store.put("hashed/a.bin", body, size=len(data), sha256=body.sha256, content_type="text/plain")
    assert store.get_bytes("hashed/a.bin") == data


def test_a_hashed_body_that_is_not_what_the_caller_hashed_stores_nothing(store: ObjectStore) -> None:
    body = HashedBytes(b"payload")
    for size, sha in ((7, "0" * 64), (8, body.sha256)):
        with pytest.raises(ChecksumMismatch):
            store.put("bad/hashed", body, size=size, sha256=sha, content_type="text/plain")
    assert not store.exists("bad/hashed")
    assert list(store.list("bad/")) == []


def _count_md5(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Lengths of the MD5s taken from now on, anywhere."""
    taken: list[int] = []
    real = hashlib.md5

    def counting(data: bytes = b"", **kwargs: Any) -> Any:
        taken.append(len(data))
        return real(data, **kwargs)

    monkeypatch.setattr(hashlib, "md5", counting)
    return taken


def test_s3_put_leaves_the_body_check_to_a_server_that_verifies_its_sha256(
    s3_store: S3ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # SeaweedFS checks x-amz-checksum-sha256 and sends it back: no MD5 of the body to compare.
    data = bytes(range(256)) * 4096
    md5s = _count_md5(monkeypatch)
    _put(s3_store, "checked/a.bin", data)
    assert not [n for n in md5s if n >= len(data)]
    assert s3_store.get_bytes("checked/a.bin") == data


def test_s3_a_body_the_server_finds_otherwise_than_hashed_is_not_stored(s3_store: S3ObjectStore) -> None:
    # The body arrives with a sha256 that is not its own (as if changed on the way): the server
    # refuses it.
    data = b"what was sent" * 100
    body = HashedBytes(data)
    body.sha256 = hashlib.sha256(b"what was meant").hexdigest()
    with pytest.raises(ChecksumMismatch):
        s3_store.put("bad/sent", body, size=len(data), sha256=body.sha256, content_type="text/plain")
    assert not s3_store.exists("bad/sent")


def test_s3_without_the_server_checking_the_sha256_the_etag_is_compared_with_the_md5(
    s3_store: S3ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A server that does not check x-amz-checksum-sha256 does not send it back: the real
    # answer without that header stands for one.
    client = s3_store.client
    real_put = client.put_object

    def unchecked(*args: Any, **kwargs: Any) -> Any:
        result = real_put(*args, **kwargs)
        result.http_headers.pop(CHECKSUM_HEADER, None)
        return result

    monkeypatch.setattr(client, "put_object", unchecked)
    data = bytes(range(256)) * 4096
    md5s = _count_md5(monkeypatch)
    _put(s3_store, "etag/a.bin", data)
    assert len(data) in md5s
    assert s3_store.get_bytes("etag/a.bin") == data
