"""WebDataset tar shards (the layout open_clip and BIOMEDICA use), read as a stream.

Consecutive members sharing a key (the member path up to the first '.' of its basename) form one
sample: ``0001.jpg`` + ``0001.txt`` and/or ``0001.json``. The caption comes from ``key.json``'s
"caption" field, else from ``key.txt``. ``key.json`` may carry ``FigureMetadata`` fields; the
top-level pmcid/pmid/doi/title/journal/year/license keys that BIOMEDICA-style records use are folded
into ``article`` (invalid ones are dropped); any other key is ignored. Shards are read strictly
sequentially (tarfile mode "r|*"), so they may come from non-seekable streams.
"""

from __future__ import annotations

import json
import posixpath
import tarfile
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from pydantic import ValidationError

from p2p.ingest.sources.base import ItemError, SourceError, SourceItem, member_problem
from p2p.ingest.sources.manifest import article_from_fields, validation_error_type, validation_message
from p2p.shared.schemas import FigureMetadata
from p2p.shared.tarstream import TrackingTarInfo, header_damage, split_member_name

IMAGE_EXTENSIONS = frozenset({"jpg", "jpeg", "png", "tif", "tiff", "webp", "gif", "bmp"})
MAX_TEXT_BYTES = 8 * 1024 * 1024  # a caption or json member larger than this is not metadata
_COMPAT_ARTICLE_KEYS = ("pmcid", "pmid", "doi", "title", "journal", "year", "license")
_METADATA_KEYS = ("figure_label", "inline_references", "source_ref")
_READ_ERRORS = (tarfile.TarError, EOFError, zlib.error, OSError)


@dataclass
class _Sample:
    key: str
    image: bytes | None = None
    image_name: str | None = None
    image_size: int = 0  # set when the image was too large to read
    text: bytes | None = None
    json_raw: bytes | None = None
    problems: list[tuple[str, str]] = field(default_factory=list)


def _read_member(tar: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    handle = tar.extractfile(member)
    if handle is None:
        return b""
    with handle:
        return handle.read()


@dataclass(frozen=True)
class ShardLimits:
    """Per shard, like a PMC package's: members and their summed (decompressed) bytes, counted from
    the headers before anything is read, so a small gzip that expands to gigabytes stops early."""

    max_members: int = 20_000
    max_total_bytes: int = 4 * 1024**3


def iter_webdataset(
    shards: Iterable[tuple[str, BinaryIO]], *, max_image_bytes: int, limits: ShardLimits | None = None
) -> Iterator[SourceItem | ItemError]:
    for shard_name, fileobj in shards:
        yield from _iter_shard(shard_name, fileobj, max_image_bytes, limits or ShardLimits())


def _check_budget(shard_name: str, members: int, total: int, limits: ShardLimits) -> None:
    if members > limits.max_members:
        raise SourceError(
            "too_many_members", f"shard {shard_name} has more than {limits.max_members} members"
        )
    if total > limits.max_total_bytes:
        raise SourceError(
            "package_too_large",
            f"shard {shard_name}: members sum to more than {limits.max_total_bytes} bytes",
        )


def check_shard(shard_name: str, fileobj: BinaryIO, limits: ShardLimits) -> None:
    """Walk every header of an uploaded shard (data skipped) within the limits, before it is kept."""
    try:
        with tarfile.open(fileobj=fileobj, mode="r|*") as tar:
            members = total = 0
            for member in tar:
                members, total = members + 1, total + max(member.size, 0)
                _check_budget(shard_name, members, total, limits)
    except _READ_ERRORS as exc:
        raise SourceError("not_a_tar", f"shard {shard_name} is not a readable tar file: {exc}") from exc


def _iter_shard(
    shard_name: str, fileobj: BinaryIO, max_image_bytes: int, limits: ShardLimits
) -> Iterator[SourceItem | ItemError]:
    try:  # closed by the `with tar` below
        tar = tarfile.open(fileobj=fileobj, mode="r|*", tarinfo=TrackingTarInfo)  # noqa: SIM115
    except _READ_ERRORS as exc:
        raise SourceError("not_a_tar", f"shard {shard_name} is not a readable tar file: {exc}") from exc

    sample: _Sample | None = None
    members = total = 0
    with tar:
        try:
            for member in tar:
                members, total = members + 1, total + max(member.size, 0)
                _check_budget(shard_name, members, total, limits)
                if not member.isfile():
                    continue  # links, folders and devices are never read
                problem = member_problem(member)
                if problem is not None:
                    yield ItemError(f"{shard_name}/{member.name}", "unsafe_member", problem)
                    continue
                split = split_member_name(member.name)
                if split is None:
                    continue
                key, extension = split
                if sample is not None and sample.key != key:
                    yield _finish(shard_name, sample)
                    sample = None
                if sample is None:
                    sample = _Sample(key=key)
                _add_member(tar, member, extension, sample, max_image_bytes)
        except _READ_ERRORS as exc:
            where = f"{shard_name}/{sample.key}" if sample is not None else shard_name
            message = f"shard {shard_name} is damaged and was read only up to here: {exc}"
            yield ItemError(where, "corrupt_shard", message)
            return
        damage = header_damage(tar)
        if damage is not None:
            if sample is not None:
                yield _finish(shard_name, sample)
                sample = None
            message = f"shard {shard_name} ends in a damaged header, later samples are lost: {damage}"
            yield ItemError(shard_name, "corrupt_shard", message)
    if sample is not None:
        yield _finish(shard_name, sample)


def _add_member(
    tar: tarfile.TarFile, member: tarfile.TarInfo, extension: str, sample: _Sample, max_image_bytes: int
) -> None:
    basename = posixpath.basename(member.name)
    if extension in IMAGE_EXTENSIONS:
        if sample.image is not None or sample.image_size:
            return  # one image per sample; further ones are not read
        if member.size > max_image_bytes:
            sample.image_name = basename
            sample.image_size = member.size
            return
        sample.image = _read_member(tar, member)
        sample.image_name = basename
    elif extension in ("txt", "json"):
        if member.size > MAX_TEXT_BYTES:
            message = f"{basename} is {member.size} bytes, above {MAX_TEXT_BYTES} for a text member"
            sample.problems.append(("invalid_item", message))
            return
        data = _read_member(tar, member)
        if extension == "txt":
            sample.text = data
        else:
            sample.json_raw = data


def _finish(shard_name: str, sample: _Sample) -> SourceItem | ItemError:
    key = f"{shard_name}/{sample.key}"
    if sample.problems:
        error_type, message = sample.problems[0]
        return ItemError(key, error_type, message)

    record: dict[str, Any] = {}
    if sample.json_raw is not None:
        try:
            loaded = json.loads(sample.json_raw.decode("utf-8-sig"))
        except (UnicodeDecodeError, ValueError) as exc:
            return ItemError(key, "invalid_json", f"{sample.key}.json: {exc}")
        if not isinstance(loaded, dict):
            return ItemError(key, "invalid_json", f"{sample.key}.json must hold an object")
        record = loaded

    if sample.image_name is None:
        return ItemError(key, "missing_image", f"sample {sample.key} has no image member")
    if sample.image is None:
        return ItemError(
            key,
            "image_too_large",
            f"{sample.image_name} is {sample.image_size} bytes, above the limit for one image",
        )

    caption = record.get("caption")
    if not isinstance(caption, str) or not caption.strip():
        caption = None
        if sample.text is not None:
            try:
                caption = sample.text.decode("utf-8-sig")
            except UnicodeDecodeError as exc:
                return ItemError(key, "invalid_caption", f"{sample.key}.txt is not UTF-8: {exc}")
    if caption is None or not caption.strip():
        message = f"sample {sample.key} has no caption (neither .txt nor a json 'caption')"
        return ItemError(key, "missing_caption", message)

    try:
        metadata = _metadata(record)
    except ValidationError as exc:
        return ItemError(key, validation_error_type(exc), f"{sample.key}.json: {validation_message(exc)}")
    return SourceItem(
        key=key, image=sample.image, image_name=sample.image_name, caption=caption.strip(), metadata=metadata
    )


def _metadata(record: dict[str, Any]) -> FigureMetadata:
    values: dict[str, Any] = {k: record[k] for k in _METADATA_KEYS if record.get(k) is not None}

    article_fields: dict[str, Any] = {}
    explicit = record.get("article")
    if isinstance(explicit, dict):
        article_fields.update(explicit)
    elif explicit is not None:
        values["article"] = explicit  # let validation name the wrong type
    lowered = {k.lower(): v for k, v in record.items() if isinstance(k, str)}
    for name in _COMPAT_ARTICLE_KEYS:
        if article_fields.get(name) is None and lowered.get(name) is not None:
            article_fields[name] = lowered[name]
    if "article" not in values and article_fields:
        article, _dropped = article_from_fields(article_fields)
        if article is not None:
            values["article"] = article
    return FigureMetadata.model_validate(values)
