"""A JSONL manifest next to its images: one figure per line.

Each line is ``{"image": "relative/path.png", "caption": "...", ...}`` where every other key is a
``FigureMetadata`` field (article, figure_label, inline_references, source_ref). Image paths are
relative to the folder holding the manifest. Blank lines are skipped; the item key is
``f"{manifest}:{line_number}:{image}"`` (line numbers start at 1).
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Iterator, Mapping
from pathlib import PurePosixPath
from typing import Any

from pydantic import ValidationError

from p2p.ingest.sources.base import ItemError, SourceError, SourceItem
from p2p.ingest.sources.files import FileTooLarge, SourceFiles, UnsafePath
from p2p.shared.licenses import normalize_license
from p2p.shared.schemas import ArticleIn, FigureMetadata

MAX_LINE_BYTES = 4 * 1024 * 1024
_ITEM_KEYS = frozenset({"image", "caption"})
_METADATA_KEYS = frozenset(FigureMetadata.model_fields)
_ARTICLE_KEYS = tuple(ArticleIn.model_fields)


def validation_message(exc: ValidationError) -> str:
    """One line naming every wrong field: ``article.pmcid: String should match pattern ...``."""
    parts = []
    for error in exc.errors():
        where = ".".join(str(p) for p in error["loc"]) or "(item)"
        parts.append(f"{where}: {error['msg']}")
    return "; ".join(parts)


def validation_error_type(exc: ValidationError) -> str:
    kinds = {error["type"] for error in exc.errors()}
    return "unknown_field" if kinds == {"extra_forbidden"} else "invalid_metadata"


def _normalize_pmcid(value: Any) -> Any:
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if isinstance(value, str):
        match = re.fullmatch(r"\s*(?:pmc)?\s*(\d+)\s*", value, re.IGNORECASE)
        if match:
            return f"PMC{match.group(1)}"
    return value


def article_from_fields(fields: Mapping[str, Any]) -> tuple[ArticleIn | None, list[str]]:
    """An ``ArticleIn`` from loosely typed fields, dropping (and naming) each field that is invalid.

    Numbers are accepted for pmcid and pmid, a bare number becomes a "PMC..." id, and the license
    is normalised. Returns ``None`` when no field survives.
    """
    kept: dict[str, Any] = {}
    dropped: list[str] = []
    for name, raw in fields.items():
        value = raw
        if value is None or (isinstance(value, str) and not value.strip()):
            continue
        if name not in _ARTICLE_KEYS:
            dropped.append(name)
            continue
        if name == "pmcid":
            value = _normalize_pmcid(value)
        elif name == "pmid" and isinstance(value, int) and not isinstance(value, bool):
            value = str(value)
        elif name == "license" and isinstance(value, str):
            value = normalize_license(value)
        try:
            checked = ArticleIn.model_validate({name: value})
        except ValidationError:
            dropped.append(name)
            continue
        kept[name] = getattr(checked, name)
    if not kept:
        return None, dropped
    return ArticleIn.model_validate(kept), dropped


def _read_line(fh: Any) -> tuple[bytes, bool]:
    """The next line (without its newline) and whether it was cut at ``MAX_LINE_BYTES``."""
    line = fh.readline(MAX_LINE_BYTES + 1)
    if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
        while True:  # skip the rest of the over-long line without holding it
            rest = fh.readline(MAX_LINE_BYTES)
            if not rest or rest.endswith(b"\n"):
                break
        return line, True
    return line, False


def iter_manifest(
    files: SourceFiles, manifest: str = "manifest.jsonl", *, max_image_bytes: int
) -> Iterator[SourceItem | ItemError]:
    try:
        found = files.exists(manifest)
    except UnsafePath as exc:
        raise SourceError("path_traversal", f"manifest name refused: {exc}") from exc
    if not found:
        raise SourceError("manifest_not_found", f"{manifest} not found in {files.describe}")
    base = posixpath.dirname(manifest.strip("/"))

    with files.open(manifest) as fh:
        line_number = 0
        while True:
            raw, too_long = _read_line(fh)
            if not raw:
                break
            line_number += 1
            if too_long:
                yield ItemError(
                    f"{manifest}:{line_number}:",
                    "invalid_json",
                    f"line {line_number} is longer than {MAX_LINE_BYTES} bytes",
                )
                continue
            if not raw.strip():
                continue
            yield _parse_line(files, manifest, base, line_number, raw, max_image_bytes)


def _parse_line(
    files: SourceFiles, manifest: str, base: str, line_number: int, raw: bytes, max_image_bytes: int
) -> SourceItem | ItemError:
    where = f"{manifest} line {line_number}"
    key = f"{manifest}:{line_number}:"
    try:
        text = raw.decode("utf-8-sig" if line_number == 1 else "utf-8")
        record = json.loads(text)
    except (UnicodeDecodeError, ValueError) as exc:
        return ItemError(key, "invalid_json", f"{where}: {exc}")
    if not isinstance(record, dict):
        return ItemError(key, "invalid_item", f"{where}: expected a JSON object, got {type(record).__name__}")

    image = record.get("image")
    if not isinstance(image, str) or not image.strip():
        return ItemError(key, "invalid_item", f"{where}: 'image' must be a non-empty string")
    key = f"{manifest}:{line_number}:{image}"

    unknown = sorted(set(record) - _ITEM_KEYS - _METADATA_KEYS)
    if unknown:
        allowed = ", ".join(sorted(_ITEM_KEYS | _METADATA_KEYS))
        return ItemError(
            key, "unknown_field", f"{where}: unknown field(s) {', '.join(unknown)} (allowed: {allowed})"
        )

    caption = record.get("caption")
    if not isinstance(caption, str):
        shown = "missing" if caption is None else type(caption).__name__
        return ItemError(key, "invalid_item", f"{where}: 'caption' must be a string, got {shown}")
    if not caption.strip():
        return ItemError(key, "missing_caption", f"{where}: caption is empty")

    try:
        metadata = FigureMetadata.model_validate({k: v for k, v in record.items() if k in _METADATA_KEYS})
    except ValidationError as exc:
        return ItemError(key, validation_error_type(exc), f"{where}: {validation_message(exc)}")

    pure = PurePosixPath(image)
    if image.startswith(("/", "\\")) or ".." in PurePosixPath(image.replace("\\", "/")).parts:
        return ItemError(key, "path_traversal", f"{where}: image path {image!r} leaves the source folder")
    rel = posixpath.join(base, image) if base else image
    try:
        data = files.read_bytes(rel, max_image_bytes)
    except UnsafePath as exc:
        return ItemError(key, "path_traversal", f"{where}: {exc}")
    except (FileNotFoundError, IsADirectoryError):
        return ItemError(key, "missing_image", f"{where}: image {image} not found in {files.describe}")
    except FileTooLarge as exc:
        return ItemError(key, "image_too_large", f"{where}: {exc}")
    return SourceItem(key=key, image=data, image_name=pure.name, caption=caption.strip(), metadata=metadata)
