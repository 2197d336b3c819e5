"""PMC Open Access article packages: a ``.tar.gz`` with one article folder (JATS ``.nxml`` + images).

The whole package is checked before anything is yielded: it must be a tar (optionally compressed),
hold no absolute or '..' member paths and no symlink, hardlink or device members, stay within the
member-count and summed-size limits, and carry a well-formed ``.nxml`` (parsed with defusedxml,
which refuses entity declarations). Nothing is ever extracted to disk; each figure's image is read
from the archive when that figure is yielded, so only one image is held at a time.
"""

from __future__ import annotations

import posixpath
import re
import tarfile
import zlib
from collections.abc import Iterable, Iterator
from pathlib import PurePosixPath
from typing import Any, BinaryIO
from xml.etree.ElementTree import Element

import defusedxml
import defusedxml.ElementTree as SafeET
from pydantic import ValidationError

from p2p.ingest.sources.base import ItemError, SourceError, SourceItem, member_problem
from p2p.ingest.sources.manifest import article_from_fields, validation_message
from p2p.shared.licenses import normalize_license
from p2p.shared.schemas import ArticleIn, FigureMetadata
from p2p.shared.tarstream import TrackingTarInfo, header_damage

_READ_ERRORS = (tarfile.TarError, EOFError, zlib.error, OSError)

# Image files a ``graphic`` href may point at, best first when several share the href's stem.
_IMAGE_RANK = {"jpg": 0, "jpeg": 0, "png": 1, "gif": 2, "tif": 3, "tiff": 3, "webp": 4, "bmp": 5}

# Elements whose text is a block of its own: a space separates it from its neighbours.
_BLOCK = frozenset(
    {
        "p",
        "title",
        "label",
        "caption",
        "sec",
        "list",
        "list-item",
        "def-list",
        "def-item",
        "term",
        "def",
        "abstract",
        "disp-quote",
        "disp-formula",
        "table-wrap",
        "table",
        "tr",
        "td",
        "th",
        "boxed-text",
        "fig",
        "statement",
        "attrib",
        "break",
    }
)
# Floating objects: not part of the running text of the paragraph that holds them.
_FLOATS = frozenset({"fig", "fig-group", "table-wrap", "table-wrap-group", "supplementary-material"})
_NEVER_TEXT = frozenset({"tex-math"})

MAX_INLINE_REFERENCES = 200
MAX_TEXT = 100_000
MAX_LABEL = 128


# --------------------------------------------------------------------------- XML helpers


def _local(tag: Any) -> str:
    if not isinstance(tag, str):
        return ""
    return tag.rsplit("}", 1)[-1]


def _children(element: Element, name: str) -> list[Element]:
    return [child for child in element if _local(child.tag) == name]


def _child(element: Element | None, name: str) -> Element | None:
    if element is None:
        return None
    return next((child for child in element if _local(child.tag) == name), None)


def _descendant(element: Element | None, name: str) -> Element | None:
    if element is None:
        return None
    return next((node for node in element.iter() if _local(node.tag) == name), None)


def _attribute(element: Element, name: str) -> str | None:
    """An attribute by local name, whatever its namespace (``xlink:href`` -> ``href``)."""
    for key, value in element.attrib.items():
        if _local(key) == name:
            return value
    return None


def _text(element: Element, skip: frozenset[str] = _NEVER_TEXT) -> str:
    """All text under ``element``, inline markup flattened, blocks spaced, whitespace normalised."""
    parts: list[str] = []
    stack: list[tuple[bool, Any]] = [(False, element)]
    while stack:  # iterative, so deeply nested markup cannot exhaust the recursion limit
        is_text, item = stack.pop()
        if is_text:
            parts.append(item)
            continue
        block = _local(item.tag) in _BLOCK
        if block:
            parts.append(" ")
            stack.append((True, " "))
        if item.text:
            parts.append(item.text)
        for child in reversed(list(item)):
            if child.tail:
                stack.append((True, child.tail))
            if _local(child.tag) not in skip:
                stack.append((False, child))
    return " ".join("".join(parts).split())


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


# --------------------------------------------------------------------------- package checks


def _open_checked(
    fileobj: BinaryIO, name: str, max_members: int, max_total_bytes: int
) -> tuple[tarfile.TarFile, list[tarfile.TarInfo]]:
    try:
        tar = tarfile.open(fileobj=fileobj, mode="r:*", tarinfo=TrackingTarInfo)  # noqa: SIM115
    except _READ_ERRORS as exc:
        raise SourceError("not_a_tar", f"{name} is not a tar or tar.gz file: {exc}") from exc
    members: list[tarfile.TarInfo] = []
    total = 0
    try:
        while True:
            # Each header is checked before the next one is read, so an oversized or endless
            # package is refused without decompressing what lies past the limit.
            try:
                member = tar.next()
            except _READ_ERRORS as exc:
                raise SourceError("not_a_tar", f"{name} is damaged: {exc}") from exc
            if member is None:
                damage = header_damage(tar)
                if damage is not None:
                    raise SourceError("not_a_tar", f"{name} is damaged (truncated or corrupt): {damage}")
                break
            problem = member_problem(member)
            if problem:
                raise SourceError("hostile_package", f"{name}: {problem}")
            members.append(member)
            if len(members) > max_members:
                raise SourceError("too_many_members", f"{name} has more than {max_members} members")
            if member.isfile():
                total += member.size
            if total > max_total_bytes:
                raise SourceError(
                    "package_too_large", f"{name}: members sum to more than {max_total_bytes} bytes"
                )
    except BaseException:
        tar.close()
        raise
    return tar, members


def _pick_nxml(members: list[tarfile.TarInfo], name: str) -> tarfile.TarInfo:
    candidates = [m for m in members if m.isfile() and m.name.lower().endswith(".nxml")]
    if not candidates:
        raise SourceError("missing_nxml", f"{name} holds no .nxml article file")
    return min(candidates, key=lambda m: (len(PurePosixPath(m.name).parts), -m.size, m.name))


def _parse_nxml(tar: tarfile.TarFile, member: tarfile.TarInfo, name: str) -> Element:
    try:
        handle = tar.extractfile(member)
        data = handle.read() if handle is not None else b""
    except _READ_ERRORS as exc:
        raise SourceError("not_a_tar", f"{name}: cannot read {member.name}: {exc}") from exc
    try:
        root: Element = SafeET.fromstring(data, forbid_dtd=False, forbid_entities=True, forbid_external=True)
    except defusedxml.DefusedXmlException as exc:
        message = f"{name}: {member.name} uses forbidden XML (entities or external references): {exc!r}"
        raise SourceError("invalid_nxml", message) from exc
    except (SafeET.ParseError, ValueError) as exc:
        raise SourceError("invalid_nxml", f"{name}: {member.name} is not well-formed XML: {exc}") from exc
    return root


# --------------------------------------------------------------------------- article metadata


def _normalize_pmcid(value: str) -> str | None:
    match = re.fullmatch(r"(?:pmc)?(\d+)", value.strip(), re.IGNORECASE)
    return f"PMC{match.group(1)}" if match else None


def _year(article_meta: Element) -> int | None:
    ranked: list[tuple[int, int, int]] = []
    for position, date in enumerate(_children(article_meta, "pub-date")):
        year_el = _child(date, "year")
        match = re.search(r"\d{4}", _text(year_el)) if year_el is not None else None
        if not match:
            continue
        kind = (date.get("pub-type") or date.get("date-type") or "").lower()
        form = (date.get("publication-format") or "").lower()
        if kind == "epub" or (kind in ("", "pub") and form == "electronic"):
            rank = 0
        elif kind == "ppub" or (kind in ("", "pub") and form == "print"):
            rank = 1
        else:
            rank = 2
        ranked.append((rank, position, int(match.group())))
    return min(ranked)[2] if ranked else None


def _license(article_meta: Element) -> str | None:
    license_el = _descendant(_descendant(article_meta, "permissions"), "license")
    if license_el is None:
        return None
    candidates: list[str] = []
    href = _attribute(license_el, "href")
    if href:
        candidates.append(href)
    candidates.extend(_text(ref) for ref in license_el.iter() if _local(ref.tag) == "license_ref")
    candidates.append(" ".join(_text(p) for p in _children(license_el, "license-p")))
    normalized = [n for n in (normalize_license(c) for c in candidates) if n]
    for value in normalized:  # a Creative Commons reading wins, in the order href, ref, text
        if value.startswith(("CC ", "CC0", "Public Domain Mark")):
            return value
    return normalized[0] if normalized else None


def _article_fields(root: Element) -> dict[str, Any]:
    article_meta = _descendant(root, "article-meta")
    fields: dict[str, Any] = {}
    journal_meta = _descendant(root, "journal-meta")
    journal = _descendant(journal_meta, "journal-title")
    if journal is not None:
        fields["journal"] = _text(journal)
    if article_meta is None:
        return fields
    for article_id in _children(article_meta, "article-id"):
        kind = (article_id.get("pub-id-type") or "").lower()
        value = _text(article_id)
        if kind in ("pmc", "pmcid") and "pmcid" not in fields:
            pmcid = _normalize_pmcid(value)
            if pmcid:
                fields["pmcid"] = pmcid
        elif kind == "pmid" and "pmid" not in fields:
            fields["pmid"] = value
        elif kind == "doi" and "doi" not in fields:
            fields["doi"] = value
    title = _descendant(_child(article_meta, "title-group"), "article-title")
    if title is not None:
        fields["title"] = _clip(_text(title), MAX_TEXT)
    abstracts = _children(article_meta, "abstract")
    if abstracts:
        plain = [a for a in abstracts if not a.get("abstract-type")]
        fields["abstract"] = _clip(_text((plain or abstracts)[0]), MAX_TEXT)
    year = _year(article_meta)
    if year is not None:
        fields["year"] = year
    license_text = _license(article_meta)
    if license_text:
        fields["license"] = license_text
    return fields


# --------------------------------------------------------------------------- figures


def _figure_id(fig: Element, index: int) -> str:
    return (fig.get("id") or "").strip() or f"fig{index}"


def _inline_references(root: Element, group_members: dict[str, list[str]]) -> dict[str, list[str]]:
    """Figure id -> texts of the body paragraphs that cite it through ``<xref ref-type="fig">``."""
    parents = {child: parent for parent in root.iter() for child in parent}
    cited: dict[str, list[Element]] = {}
    seen: dict[str, set[int]] = {}
    for body in (node for node in root.iter() if _local(node.tag) == "body"):
        for xref in body.iter():
            if _local(xref.tag) != "xref" or (xref.get("ref-type") or "").lower() not in ("fig", "figure"):
                continue
            paragraph: Element | None = None
            floating = False
            node: Element | None = xref
            while node is not None and node is not body:
                name = _local(node.tag)
                if name in _FLOATS:
                    floating = True
                    break
                if name == "p" and paragraph is None:
                    paragraph = node
                node = parents.get(node)
            if floating or paragraph is None:
                continue
            for rid in (xref.get("rid") or "").split():
                for fig_id in group_members.get(rid, [rid]):
                    if id(paragraph) not in seen.setdefault(fig_id, set()):
                        seen[fig_id].add(id(paragraph))
                        cited.setdefault(fig_id, []).append(paragraph)
    references: dict[str, list[str]] = {}
    for fig_id, paragraphs in cited.items():
        texts = [_clip(t, MAX_TEXT) for t in (_text(p, _FLOATS | _NEVER_TEXT) for p in paragraphs) if t]
        references[fig_id] = texts[:MAX_INLINE_REFERENCES]
    return references


def _image_stem(basename: str) -> tuple[str, str]:
    stem, dot, extension = basename.rpartition(".")
    if dot and extension.lower() in _IMAGE_RANK:
        return stem, extension.lower()
    return basename, ""


class _ImageIndex:
    def __init__(self, members: Iterable[tarfile.TarInfo]) -> None:
        self.by_stem: dict[str, list[tarfile.TarInfo]] = {}
        self.by_name: dict[str, list[tarfile.TarInfo]] = {}
        for member in members:
            if not member.isfile():
                continue
            basename = posixpath.basename(member.name)
            self.by_name.setdefault(basename, []).append(member)
            stem, extension = _image_stem(basename)
            if extension:
                self.by_stem.setdefault(stem.lower(), []).append(member)

    def find(self, href: str) -> tarfile.TarInfo | None:
        basename = posixpath.basename(href.strip().replace("\\", "/"))
        if not basename:
            return None
        stem, _ = _image_stem(basename)
        candidates = self.by_stem.get(stem.lower())
        if candidates:
            return min(
                candidates,
                key=lambda m: (
                    _IMAGE_RANK[_image_stem(posixpath.basename(m.name))[1]],
                    len(PurePosixPath(m.name).parts),
                    m.name,
                ),
            )
        exact = self.by_name.get(basename)
        if exact:
            return min(exact, key=lambda m: (len(PurePosixPath(m.name).parts), m.name))
        return None


def iter_pmc_package(
    fileobj: BinaryIO, name: str, *, max_image_bytes: int, max_members: int, max_total_bytes: int
) -> Iterator[SourceItem | ItemError]:
    tar, members = _open_checked(fileobj, name, max_members, max_total_bytes)
    with tar:
        nxml = _pick_nxml(members, name)
        root = _parse_nxml(tar, nxml, name)
        fields = _article_fields(root)
        article, _dropped = article_from_fields(fields)
        prefix = article.pmcid if article is not None and article.pmcid else name

        figures = [node for node in root.iter() if _local(node.tag) == "fig"]
        fig_ids = {id(fig): _figure_id(fig, index) for index, fig in enumerate(figures, start=1)}
        group_members: dict[str, list[str]] = {}
        for group in root.iter():
            group_id = (group.get("id") or "").strip()
            if _local(group.tag) == "fig-group" and group_id:
                group_members[group_id] = [fig_ids[id(f)] for f in group.iter() if id(f) in fig_ids]
        references = _inline_references(root, group_members)
        images = _ImageIndex(members)

        for fig in figures:
            fig_id = fig_ids[id(fig)]
            key = f"{prefix}/{fig_id}"
            yield _figure_item(tar, images, fig, fig_id, key, name, article, references, max_image_bytes)


def _figure_item(
    tar: tarfile.TarFile,
    images: _ImageIndex,
    fig: Element,
    fig_id: str,
    key: str,
    name: str,
    article: ArticleIn | None,
    references: dict[str, list[str]],
    max_image_bytes: int,
) -> SourceItem | ItemError:
    graphic = _descendant(fig, "graphic")
    href = _attribute(graphic, "href") if graphic is not None else None
    if not href or not href.strip():
        return ItemError(key, "missing_image", f"{name}: figure {fig_id} has no graphic")
    caption_el = _child(fig, "caption")
    caption = _text(caption_el) if caption_el is not None else ""
    if not caption:
        return ItemError(key, "missing_caption", f"{name}: figure {fig_id} has no caption")
    member = images.find(href)
    if member is None:
        message = f"{name}: figure {fig_id} image {href!r} is not in the package"
        return ItemError(key, "missing_image", message)
    if member.size > max_image_bytes:
        return ItemError(
            key,
            "image_too_large",
            f"{name}: {member.name} is {member.size} bytes, above the limit of {max_image_bytes}",
        )
    label_el = _child(fig, "label")
    label = _clip(_text(label_el), MAX_LABEL) if label_el is not None else ""
    try:
        metadata = FigureMetadata(
            article=article,
            figure_label=label or None,
            inline_references=references.get(fig_id, []),
            source_ref=_clip(f"{name}#{fig_id}", 2048),
        )
    except ValidationError as exc:
        return ItemError(key, "invalid_metadata", f"{name}: figure {fig_id}: {validation_message(exc)}")
    try:
        handle = tar.extractfile(member)
        data = handle.read() if handle is not None else b""
    except _READ_ERRORS as exc:
        return ItemError(key, "missing_image", f"{name}: cannot read {member.name}: {exc}")
    return SourceItem(
        key=key, image=data, image_name=posixpath.basename(member.name), caption=caption, metadata=metadata
    )
