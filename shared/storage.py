"""Object storage behind one interface: a local folder (embedded profile) or an S3 server.

Writes are verified: the store hashes the bytes it actually writes and refuses (and removes)
an object whose sha256 differs from the one the caller computed beforehand (S3 refuses it before
sending anything, and has the server check the body against that sha256, or, from a server that
does not, checks its ETag against the MD5 of what it sent). A :class:`HashedBytes` body was hashed
already, from the very bytes that are sent: it is not hashed again.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import os
import tempfile
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, BinaryIO, Protocol

CHUNK = 1024 * 1024


class StorageError(Exception):
    pass


class ChecksumMismatch(StorageError):
    pass


class ObjectNotFound(StorageError):
    pass


def validate_key(key: str) -> str:
    """Keys are relative POSIX paths without '..' segments, so no key escapes the store's root."""
    path = PurePosixPath(key)
    if not key or key.startswith("/") or ".." in path.parts or "\\" in key or "\x00" in key:
        raise StorageError(f"invalid object key: {key!r}")
    return str(path)


def content_key(sha256: str, extension: str, prefix: str = "figures") -> str:
    """Content-addressed key: identical bytes always land on the same key."""
    return f"{prefix}/{sha256[:2]}/{sha256}.{extension.lower()}"


class ObjectStore(Protocol):
    description: str

    def put(self, key: str, stream: BinaryIO, *, size: int, sha256: str, content_type: str) -> None: ...

    def exists(self, key: str) -> bool: ...

    def open(self, key: str) -> BinaryIO: ...

    def get_bytes(self, key: str) -> bytes: ...

    def size(self, key: str) -> int: ...

    def delete(self, key: str) -> None: ...

    def list(self, prefix: str = "") -> Iterator[str]: ...

    def ping(self) -> None: ...


class HashedBytes(io.BytesIO):
    """A stream over ``data`` that carries the sha256 of exactly those bytes, computed here.

    ``data`` is an immutable ``bytes`` object and the hash was taken from it, so a store sending
    ``data`` sends the body hashed without hashing it again (the check :meth:`ObjectStore.put`
    makes of any other stream). What is read or written through the stream itself does not
    change ``data``."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.data = data
        self.sha256 = hashlib.sha256(data).hexdigest()


def _check_body(key: str, got_size: int, got_sha256: str, *, size: int, sha256: str) -> None:
    """Refuses a body that is not the one the caller hashed (before it is stored)."""
    if got_size != size or got_sha256 != sha256:
        raise ChecksumMismatch(
            f"object {key}: the body has {got_size} bytes with sha256 {got_sha256}, expected {size} "
            f"bytes with sha256 {sha256}; nothing was stored"
        )


def _hashed_body(stream: BinaryIO, size: int) -> tuple[bytes, str]:
    """The body to send and its sha256: taken as they are from a :class:`HashedBytes`, read and
    hashed here from any other stream."""
    if isinstance(stream, HashedBytes):
        return stream.data, stream.sha256
    body = _read_body(stream, size)
    return body, hashlib.sha256(body).hexdigest()


def put_bytes(store: ObjectStore, key: str, data: bytes, content_type: str) -> str:
    """Store ``data`` under ``key`` (the store verifies its sha256); returns the sha256."""
    sha = hashlib.sha256(data).hexdigest()
    store.put(key, io.BytesIO(data), size=len(data), sha256=sha, content_type=content_type)
    return sha


def file_sha256(path: Path) -> tuple[str, int]:
    """sha256 and size of a file, read in 1 MiB chunks."""
    digest, size = hashlib.sha256(), 0
    with path.open("rb") as fh:
        while chunk := fh.read(1024 * 1024):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def put_file(store: ObjectStore, key: str, path: Path, content_type: str) -> tuple[str, int]:
    """Stream a local file into the store (which verifies it); returns its sha256 and size."""
    sha, size = file_sha256(path)
    with path.open("rb") as fh:
        store.put(key, fh, size=size, sha256=sha, content_type=content_type)
    return sha, size


class LocalObjectStore:
    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.description = f"local folder {self.root}"

    def _path(self, key: str) -> Path:
        return self.root / validate_key(key)

    def put(self, key: str, stream: BinaryIO, *, size: int, sha256: str, content_type: str) -> None:
        target = self._path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        digest: Any = None
        if isinstance(stream, HashedBytes):
            # Hashed already: checked before anything is written, then written in one call.
            _check_body(key, len(stream.data), stream.sha256, size=size, sha256=sha256)
            chunks: Iterator[bytes] = iter((stream.data,))
        else:
            digest = hashlib.sha256()
            chunks = iter(lambda: stream.read(CHUNK), b"")
        written = 0
        fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=".upload-")
        try:
            with os.fdopen(fd, "wb") as out:
                for chunk in chunks:
                    if digest is not None:
                        digest.update(chunk)
                    written += len(chunk)
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
            if digest is not None:
                _check_body(key, written, digest.hexdigest(), size=size, sha256=sha256)
            os.replace(tmp_name, target)
        except BaseException:
            Path(tmp_name).unlink(missing_ok=True)
            raise

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def open(self, key: str) -> BinaryIO:
        try:
            return self._path(key).open("rb")
        except FileNotFoundError as exc:
            raise ObjectNotFound(key) from exc

    def get_bytes(self, key: str) -> bytes:
        with self.open(key) as fh:
            return fh.read()

    def size(self, key: str) -> int:
        try:
            return self._path(key).stat().st_size
        except FileNotFoundError as exc:
            raise ObjectNotFound(key) from exc

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def list(self, prefix: str = "") -> Iterator[str]:
        base = self.root
        for path in sorted(base.rglob("*")):
            if path.is_file() and not path.name.startswith(".upload-"):
                key = path.relative_to(base).as_posix()
                if key.startswith(prefix):
                    yield key

    def ping(self) -> None:
        if not os.access(self.root, os.W_OK):
            raise StorageError(f"{self.root} is not writable")


def _read_body(stream: BinaryIO, size: int) -> bytes:
    """The object's bytes, one read (a spooled upload is in memory already). One byte more than
    ``size`` is asked for, so a stream longer than announced is caught."""
    return stream.read(size + 1)


def _known_payload_client(minio_class: type[Minio]) -> type[Minio]:
    """A Minio client class that signs a body whose sha256 the store has just computed without
    hashing it again (over plain HTTP, SigV4 signs the payload's sha256: minio would otherwise
    hash every body a second time). The hash is handed over per thread, for one request."""

    class KnownPayloadMinio(minio_class):  # type: ignore[misc,valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.known_payload = threading.local()

        def _build_headers(
            self, host: str, headers: Any = None, body: bytes | None = None, creds: Any = None
        ) -> tuple[Any, Any]:
            known = getattr(self.known_payload, "body", None)
            if (
                known is None
                or body is None
                or len(body) != known[0]
                or creds is None
                or self._base_url.is_https
            ):
                built: tuple[Any, Any] = super()._build_headers(host, headers, body, creds)
                return built
            self.known_payload.body = None
            out, date = super()._build_headers(host, headers, None, creds)
            out["Content-Length"] = str(len(body))
            out["x-amz-content-sha256"] = known[1]
            return out, date

    return KnownPayloadMinio


if TYPE_CHECKING:
    import urllib3
    from minio import Minio

# Connections kept open to the S3 server. Minio's own pool keeps 10: with more uploads at once
# (16 ingest clients, a put thread each) every request past the tenth opened a connection and
# threw it away after one PUT, a TCP handshake on both sides per figure.
S3_MAX_CONNECTIONS = 64

# S3's additional checksum of a PUT's body: the server verifies it (a mismatch is BadDigest) and
# sends it back when it did (AWS S3, SeaweedFS).
CHECKSUM_HEADER = "x-amz-checksum-sha256"


def _connection_pool(max_connections: int) -> urllib3.PoolManager:
    """Minio's default HTTP client (timeouts, retries, CA bundle), keeping ``max_connections``."""
    import certifi
    import urllib3
    from urllib3.util import Retry, Timeout

    timeout = int(timedelta(minutes=5).total_seconds())
    return urllib3.PoolManager(
        timeout=Timeout(connect=timeout, read=timeout),
        maxsize=max_connections,
        cert_reqs="CERT_REQUIRED",
        ca_certs=os.environ.get("SSL_CERT_FILE") or certifi.where(),
        retries=Retry(total=5, backoff_factor=0.2, status_forcelist=[500, 502, 503, 504]),
    )


class S3ObjectStore:
    def __init__(
        self,
        *,
        endpoint: str,
        access_key: str,
        secret_key: str,
        bucket: str,
        secure: bool = False,
        region: str | None = None,
        max_connections: int = S3_MAX_CONNECTIONS,
    ) -> None:
        from minio import Minio  # lazy (~0.2 s): the local-folder profile never needs it

        client_class = _known_payload_client(Minio)

        def new_client() -> Minio:
            return client_class(
                endpoint,
                access_key=access_key,
                secret_key=secret_key,
                secure=secure,
                region=region,
                http_client=_connection_pool(max_connections),
            )

        self._new_client: Callable[[], Minio] = new_client
        self._client = self._new_client()
        self._client_pid = os.getpid()
        self.bucket = bucket
        self.description = f"s3 {'https' if secure else 'http'}://{endpoint}/{bucket}"

    @property
    def client(self) -> Minio:
        """The S3 client of this process. A forked child (DataLoader workers, prefork Celery
        children) gets a client of its own: sharing the parent's pooled connections, two processes
        read one socket, take each other's bytes and hang."""
        if self._client_pid != os.getpid():
            self._client = self._new_client()
            self._client_pid = os.getpid()
        return self._client

    def ensure_bucket(self) -> None:
        if not self.client.bucket_exists(self.bucket):
            self.client.make_bucket(self.bucket)

    def put(self, key: str, stream: BinaryIO, *, size: int, sha256: str, content_type: str) -> None:
        """One PUT of the whole body, hashed once here (or already, a :class:`HashedBytes`): a body
        that is not what the caller hashed is refused before anything is sent; the sha256 also
        signs the request (the client does not hash it again) and goes with it as its checksum
        (``x-amz-checksum-sha256``): a server that checks it refuses a body that arrived otherwise
        and says so by sending it back. Only from a server that does not is the ETag it computed
        from what it stored compared with the body's MD5 (1.1 ms of CPU per MB here)."""
        from minio.error import S3Error

        key = validate_key(key)
        body, sent_sha = _hashed_body(stream, size)
        _check_body(key, len(body), sent_sha, size=size, sha256=sha256)
        checksum = base64.b64encode(bytes.fromhex(sent_sha)).decode()
        client = self.client
        client.known_payload.body = (len(body), sent_sha)  # type: ignore[attr-defined]
        try:
            # A single PUT (part size above the object size) so the ETag is the MD5 of the body.
            result = client.put_object(
                self.bucket,
                key,
                io.BytesIO(body),
                length=size,
                content_type=content_type,
                part_size=max(size, 5 * CHUNK),
                metadata={"x-amz-meta-sha256": sha256, CHECKSUM_HEADER: checksum},
            )
        except S3Error as exc:
            if exc.code == "BadDigest":
                raise ChecksumMismatch(
                    f"object {key}: the server received a body whose sha256 is not {sha256}; "
                    "nothing was stored"
                ) from exc
            raise
        finally:
            client.known_payload.body = None  # type: ignore[attr-defined]
        echoed = result.http_headers.get(CHECKSUM_HEADER)
        if echoed == checksum:
            return  # the server checked what it received against the sha256: no MD5 to compare
        etag = (result.etag or "").strip('"')
        md5 = hashlib.md5(body, usedforsecurity=False).hexdigest()
        if echoed is not None or etag != md5:
            with contextlib.suppress(S3Error):
                client.remove_object(self.bucket, key)
            raise ChecksumMismatch(
                f"object {key}: the server stored ETag {etag} (sha256 {echoed or 'not given'}), the body "
                f"sent has MD5 {md5} (sha256 {checksum})"
            )

    def exists(self, key: str) -> bool:
        from minio.error import S3Error

        try:
            self.client.stat_object(self.bucket, validate_key(key))
            return True
        except S3Error as exc:
            if exc.code in ("NoSuchKey", "NoSuchObject", "NotFound"):
                return False
            raise

    def open(self, key: str) -> BinaryIO:
        return io.BytesIO(self.get_bytes(key))

    def get_bytes(self, key: str) -> bytes:
        from minio.error import S3Error

        try:
            response = self.client.get_object(self.bucket, validate_key(key))
        except S3Error as exc:
            if exc.code in ("NoSuchKey", "NoSuchObject", "NotFound"):
                raise ObjectNotFound(key) from exc
            raise
        try:
            return response.read()
        finally:
            response.close()
            response.release_conn()

    def size(self, key: str) -> int:
        from minio.error import S3Error

        try:
            return int(self.client.stat_object(self.bucket, validate_key(key)).size or 0)
        except S3Error as exc:
            if exc.code in ("NoSuchKey", "NoSuchObject", "NotFound"):
                raise ObjectNotFound(key) from exc
            raise

    def delete(self, key: str) -> None:
        self.client.remove_object(self.bucket, validate_key(key))

    def list(self, prefix: str = "") -> Iterator[str]:
        for obj in self.client.list_objects(self.bucket, prefix=prefix, recursive=True):
            if obj.object_name is not None:
                yield obj.object_name

    def ping(self) -> None:
        if not self.client.bucket_exists(self.bucket):
            raise StorageError(f"bucket {self.bucket} does not exist")

    def presigned_url(self, key: str, expires_s: int = 3600) -> str:
        return self.client.presigned_get_object(
            self.bucket, validate_key(key), expires=timedelta(seconds=expires_s)
        )
