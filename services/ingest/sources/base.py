"""What every bulk source (manifest, WebDataset shards, PMC package) yields, one item at a time.

Readers stream: they hold at most one item's image in memory, so a batch of any size runs in
flat memory. A reader that cannot parse one item yields an ``ItemError`` for it and goes on; a
source that cannot be read at all (missing, not a tar, hostile paths) raises ``SourceError``.
"""

from __future__ import annotations

import tarfile
from dataclasses import dataclass
from pathlib import PurePosixPath

from p2p.shared.schemas import FigureMetadata


class SourceError(Exception):
    """The whole source is unusable. ``error_type`` is a short machine-readable code."""

    def __init__(self, error_type: str, message: str) -> None:
        super().__init__(message)
        self.error_type = error_type
        self.message = message


@dataclass(frozen=True)
class SourceItem:
    key: str  # stable within its source, used to skip items already done when a batch re-runs
    image: bytes
    image_name: str
    caption: str
    metadata: FigureMetadata


@dataclass(frozen=True)
class ItemError:
    key: str
    error_type: str
    message: str


def member_problem(member: tarfile.TarInfo) -> str | None:
    """Why a tar member may not be read (a path escaping the archive, a link, a device), or None."""
    name = member.name
    parts = PurePosixPath(name.replace("\\", "/")).parts
    if name.startswith(("/", "\\")):
        return f"member {name!r} has an absolute path"
    if ".." in parts:
        return f"member {name!r} has a '..' path component"
    if member.issym() or member.islnk():
        return f"member {name!r} is a link (to {member.linkname!r})"
    if member.isdev():
        return f"member {name!r} is a device or fifo"
    return None
