"""Reading tar archives as streams, shared by ingestion (WebDataset shards, PMC packages) and
training (dataset snapshots): member naming and telling a damaged archive from a complete one."""

from __future__ import annotations

import posixpath
import tarfile
from typing import Self


class TrackingTarInfo(tarfile.TarInfo):
    """Remembers why tarfile stopped reading headers.

    tarfile ends iteration silently when a header after the first is cut short or garbled, which
    would make a truncated download look like a complete archive; ``header_damage`` tells them apart.
    """

    @classmethod
    def fromtarfile(cls, tarfile_: tarfile.TarFile) -> Self:
        try:
            return super().fromtarfile(tarfile_)
        except tarfile.HeaderError as exc:
            tarfile_._p2p_header_error = exc  # type: ignore[attr-defined]
            raise


def header_damage(tar: tarfile.TarFile) -> str | None:
    """Why reading stopped, when it stopped at a damaged header rather than the end-of-archive marker."""
    error = getattr(tar, "_p2p_header_error", None)
    if error is not None and type(error).__name__ in ("TruncatedHeaderError", "InvalidHeaderError"):
        return str(error) or type(error).__name__
    return None


def split_member_name(name: str) -> tuple[str, str] | None:
    """(sample key, extension) of a member path, or None when it has no key or no extension."""
    directory, basename = posixpath.split(name)
    if basename.startswith(".") or "." not in basename:
        return None
    stem, extension = basename.split(".", 1)
    key = f"{directory}/{stem}" if directory else stem
    return key, extension.lower()
