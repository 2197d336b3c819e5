"""Read-only access to the files of a bulk source, in a local folder or under an S3 prefix.

Names are relative POSIX paths. Neither implementation lets a name reach outside its root: an
absolute name, a '..' segment or (locally) a symlink that leads out of the root raises
``UnsafePath``. Missing names raise ``FileNotFoundError``; ``read_bytes`` refuses files larger than
its cap with ``FileTooLarge`` before reading them.
"""

from __future__ import annotations

import io
import os
import shutil
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO, Protocol

CHUNK = 1024 * 1024

_S3_MISSING = ("NoSuchKey", "NoSuchObject", "NotFound", "ResourceNotFound")


class UnsafePath(ValueError):
    """A name that is absolute, has a '..' segment or leads outside the source's root."""


class FileTooLarge(Exception):
    def __init__(self, rel: str, size: int | None, max_bytes: int) -> None:
        shown = f"{size} bytes" if size is not None else "more bytes"
        super().__init__(f"{rel}: {shown}, above the limit of {max_bytes} bytes")
        self.rel = rel
        self.size = size
        self.max_bytes = max_bytes


def check_relative(rel: str) -> str:
    """``rel`` as a normalised relative POSIX path, or ``UnsafePath``."""
    if not isinstance(rel, str) or not rel or "\x00" in rel:
        raise UnsafePath(f"invalid name: {rel!r}")
    if rel.startswith(("/", "\\")):
        raise UnsafePath(f"absolute path not allowed: {rel!r}")
    parts = PurePosixPath(rel.replace("\\", "/")).parts
    if ".." in parts:
        raise UnsafePath(f"'..' not allowed in path: {rel!r}")
    if not parts:
        raise UnsafePath(f"invalid name: {rel!r}")
    return "/".join(parts)


def _matches(name: str, suffixes: tuple[str, ...]) -> bool:
    return not suffixes or name.lower().endswith(tuple(s.lower() for s in suffixes))


class SourceFiles(Protocol):
    describe: str

    def list(self, suffixes: tuple[str, ...]) -> list[str]:
        """Relative names of all files ending with one of ``suffixes`` (all files if empty), sorted."""
        ...

    def exists(self, rel: str) -> bool: ...

    def size(self, rel: str) -> int: ...

    def open(self, rel: str) -> BinaryIO: ...

    def read_bytes(self, rel: str, max_bytes: int) -> bytes: ...

    def download(self, rel: str, fileobj: BinaryIO) -> None: ...


class LocalFiles:
    def __init__(self, root: Path) -> None:
        self.root = Path(root).resolve()
        self.describe = f"local folder {self.root}"

    def _path(self, rel: str) -> Path:
        clean = check_relative(rel)
        resolved = (self.root / clean).resolve()
        if not resolved.is_relative_to(self.root):
            raise UnsafePath(f"{rel!r} leads outside {self.root}")
        return resolved

    def _file(self, rel: str) -> Path:
        path = self._path(rel)
        if not path.is_file():
            raise FileNotFoundError(f"{rel} not found in {self.describe}")
        return path

    def list(self, suffixes: tuple[str, ...] = ()) -> list[str]:
        names: list[str] = []
        for dirpath, dirnames, filenames in os.walk(self.root):
            dirnames.sort()
            for filename in filenames:
                full = Path(dirpath) / filename
                rel = full.relative_to(self.root).as_posix()
                if not _matches(rel, suffixes):
                    continue
                target = full.resolve()
                if target.is_relative_to(self.root) and target.is_file():
                    names.append(rel)
        return sorted(names)

    def exists(self, rel: str) -> bool:
        return self._path(rel).is_file()

    def size(self, rel: str) -> int:
        return self._file(rel).stat().st_size

    def open(self, rel: str) -> BinaryIO:
        return self._file(rel).open("rb")

    def read_bytes(self, rel: str, max_bytes: int) -> bytes:
        path = self._file(rel)
        with path.open("rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size > max_bytes:
                raise FileTooLarge(rel, size, max_bytes)
            data = fh.read(max_bytes + 1)  # the file may have grown since fstat
        if len(data) > max_bytes:
            raise FileTooLarge(rel, None, max_bytes)
        return data

    def download(self, rel: str, fileobj: BinaryIO) -> None:
        with self.open(rel) as fh:
            shutil.copyfileobj(fh, fileobj, CHUNK)


class _ResponseReader(io.RawIOBase):
    """A streaming S3 GET response as a file; closing it returns the connection to the pool."""

    def __init__(self, response: Any) -> None:
        self._response = response

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        data = self._response.read(len(view))
        view[: len(data)] = data
        return len(data)

    def close(self) -> None:
        if not self.closed:
            try:
                self._response.close()
                self._response.release_conn()
            finally:
                super().close()


class S3Files:
    def __init__(self, client: Any, bucket: str, prefix: str = "") -> None:
        self.client = client
        self.bucket = bucket
        self.prefix = check_relative(prefix) + "/" if prefix.strip("/") else ""
        self.describe = f"s3://{bucket}/{self.prefix}"

    def _key(self, rel: str) -> str:
        return self.prefix + check_relative(rel)

    def _missing(self, exc: Exception) -> bool:
        return getattr(exc, "code", None) in _S3_MISSING

    def _stat_size(self, rel: str) -> int:
        from minio.error import S3Error

        try:
            return int(self.client.stat_object(self.bucket, self._key(rel)).size or 0)
        except S3Error as exc:
            if self._missing(exc):
                raise FileNotFoundError(f"{rel} not found in {self.describe}") from exc
            raise

    def _get(self, rel: str) -> Any:
        from minio.error import S3Error

        try:
            return self.client.get_object(self.bucket, self._key(rel))
        except S3Error as exc:
            if self._missing(exc):
                raise FileNotFoundError(f"{rel} not found in {self.describe}") from exc
            raise

    def list(self, suffixes: tuple[str, ...] = ()) -> list[str]:
        names: list[str] = []
        for obj in self.client.list_objects(self.bucket, prefix=self.prefix or None, recursive=True):
            key = obj.object_name
            if key is None or obj.is_dir or not key.startswith(self.prefix):
                continue
            rel = key[len(self.prefix) :]
            if rel and _matches(rel, suffixes):
                names.append(rel)
        return sorted(names)

    def exists(self, rel: str) -> bool:
        try:
            self._stat_size(rel)
        except FileNotFoundError:
            return False
        return True

    def size(self, rel: str) -> int:
        return self._stat_size(rel)

    def open(self, rel: str) -> BinaryIO:
        return io.BufferedReader(_ResponseReader(self._get(rel)), CHUNK)

    def read_bytes(self, rel: str, max_bytes: int) -> bytes:
        size = self._stat_size(rel)
        if size > max_bytes:
            raise FileTooLarge(rel, size, max_bytes)
        with self.open(rel) as fh:
            data = fh.read(max_bytes + 1)  # the object may have been replaced since the stat
        if len(data) > max_bytes:
            raise FileTooLarge(rel, None, max_bytes)
        return data

    def download(self, rel: str, fileobj: BinaryIO) -> None:
        response = self._get(rel)
        try:
            for chunk in response.stream(CHUNK):
                fileobj.write(chunk)
        finally:
            response.close()
            response.release_conn()
