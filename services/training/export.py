"""Export the mined corpus as WebDataset tar shards, a Parquet index and a manifest in the object store.

One sample per mined figure (key = the figure's id, hex): ``{key}.figure.{jpg|png}`` (the stored
bytes; other formats are re-encoded as PNG), ``{key}.json`` (texts, article metadata and the
figure -> panel -> region hierarchy with the member name of every crop), ``{key}.panel_{i}.png`` and
``{key}.region_{i}_{j}.png``. Figures without panels (not mined yet, or mined into nothing; never
failed ones) may be mixed in as plain figure-caption pairs (``"plain": true``, no panels) so that
they make up about ``mix_plain_pairs`` of the samples; which ones is a salted hash of the figure id.

Rows are streamed in figure-id order (``yield_per``) and each split's current shard is a temp file,
so memory holds one sample at a time; a full shard is uploaded (checksum-verified by the store) and
removed. The export is a snapshot: a prefix that already holds a manifest is refused unless
``overwrite`` is set, which first deletes everything under it.
"""

from __future__ import annotations

import io
import json
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image
from sqlalchemy import ColumnElement, Select, and_, exists, func, or_, select
from sqlalchemy.orm import Session, selectinload

from p2p.shared.db.base import utcnow
from p2p.shared.db.models import Article, Figure, FigureStatus, JobStatus, LicenseGroup, Panel, Region
from p2p.shared.runtime import Runtime
from p2p.shared.storage import ObjectStore, put_bytes, put_file, validate_key
from p2p.training.splits import SPLITS, SplitConfig, assign_split, group_key, unit_interval

IMAGE_EXTENSIONS = {"JPEG": "jpg", "PNG": "png"}
INDEX_BATCH = 1000


class ExportError(ValueError):
    pass


@dataclass(frozen=True)
class ExportFilters:
    license_groups: tuple[str, ...] | None = None  # e.g. ("commercial",); None keeps every group
    figure_types: tuple[str, ...] | None = None  # panels of other types are left out of a sample
    min_panels: int = 1  # figures with fewer (kept) panels are skipped

    def __post_init__(self) -> None:
        known = {g.value for g in LicenseGroup}
        unknown = sorted(set(self.license_groups or ()) - known)
        if unknown:
            raise ExportError(f"unknown license group(s) {unknown}; known: {sorted(known)}")
        if self.min_panels < 1:
            raise ExportError(f"min_panels must be at least 1, got {self.min_panels}")

    def as_dict(self) -> dict[str, Any]:
        return {
            "license_groups": list(self.license_groups) if self.license_groups is not None else None,
            "figure_types": list(self.figure_types) if self.figure_types is not None else None,
            "min_panels": self.min_panels,
        }


@dataclass
class ShardInfo:
    key: str
    split: str
    samples: int
    size: int
    sha256: str


@dataclass
class ExportManifest:
    snapshot_name: str
    created_at: str
    out_prefix: str
    shard_size: int
    filters: dict[str, Any]
    mix_plain_pairs: float
    splits: dict[str, Any]
    counts: dict[str, dict[str, int]]
    shards: list[ShardInfo]
    source_counts: dict[str, int]
    index_key: str
    manifest_key: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def shard_keys(self, split: str) -> list[str]:
        return [s.key for s in self.shards if s.split == split]


@dataclass
class _Sample:
    key: str
    split: str
    members: list[tuple[str, bytes]]
    row: dict[str, Any]
    n_panels: int
    n_regions: int
    plain: bool


class _ShardWriter:
    """The shards of one split: a temp tar file that is uploaded and replaced every ``shard_size`` samples."""

    def __init__(self, store: ObjectStore, prefix: str, split: str, shard_size: int, tmp: Path) -> None:
        self.store, self.prefix, self.split, self.shard_size, self.tmp = store, prefix, split, shard_size, tmp
        self.shards: list[ShardInfo] = []
        self._tar: tarfile.TarFile | None = None
        self._count = 0

    @property
    def current_key(self) -> str:
        return f"{self.prefix}/{self.split}/shard-{len(self.shards):06d}.tar"

    def add(self, members: list[tuple[str, bytes]]) -> str:
        if self._tar is None:
            self._tar = tarfile.open(self.tmp / f"{self.split}.tar", mode="w", format=tarfile.PAX_FORMAT)  # noqa: SIM115
        for name, data in members:
            info = tarfile.TarInfo(name)
            # Fixed metadata: the same rows give byte-identical shards.
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            self._tar.addfile(info, io.BytesIO(data))
        self._count += 1
        key = self.current_key
        if self._count >= self.shard_size:
            self.flush()
        return key

    def flush(self) -> None:
        if self._tar is None:
            return
        self._tar.close()
        path = self.tmp / f"{self.split}.tar"
        key = self.current_key
        sha, size = put_file(self.store, key, path, "application/x-tar")
        path.unlink()
        self.shards.append(ShardInfo(key=key, split=self.split, samples=self._count, size=size, sha256=sha))
        self._tar, self._count = None, 0


_INDEX_SCHEMA = pa.schema(
    [
        ("key", pa.string()),
        ("figure_id", pa.string()),
        ("split", pa.string()),
        ("shard", pa.string()),
        ("plain", pa.bool_()),
        ("article", pa.string()),
        ("pmcid", pa.string()),
        ("license", pa.string()),
        ("license_group", pa.string()),
        ("year", pa.int32()),
        ("journal", pa.string()),
        ("n_panels", pa.int32()),
        ("n_regions", pa.int32()),
        ("figure_types", pa.list_(pa.string())),
    ]
)


class _IndexWriter:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._writer = pq.ParquetWriter(str(path), _INDEX_SCHEMA)
        self._rows: list[dict[str, Any]] = []

    def add(self, row: dict[str, Any]) -> None:
        self._rows.append(row)
        if len(self._rows) >= INDEX_BATCH:
            self._write()

    def _write(self) -> None:
        if self._rows:
            self._writer.write_table(pa.Table.from_pylist(self._rows, schema=_INDEX_SCHEMA))
            self._rows = []

    def close(self) -> None:
        self._write()
        self._writer.close()


def _license_clause(groups: tuple[str, ...] | None) -> ColumnElement[bool] | None:
    if groups is None:
        return None
    members = [LicenseGroup(g) for g in groups]
    clause = Article.license_group.in_(members)
    # A figure without an article has no license information: it counts as "other".
    return or_(clause, Article.id.is_(None)) if LicenseGroup.OTHER in members else and_(clause)


def _has_panels() -> ColumnElement[bool]:
    return exists().where(Panel.figure_id == Figure.id)


def _plain_clause() -> ColumnElement[bool]:
    return and_(~_has_panels(), Figure.status != FigureStatus.FAILED, Figure.caption != "")


def _count(session: Session, stmt: Select[Any]) -> int:
    return int(session.scalar(select(func.count()).select_from(stmt.subquery())) or 0)


def _plain_rate(session: Session, filters: ExportFilters, mix: float) -> float:
    """The chance that one plain candidate is kept, so that plain pairs make up ``mix`` of the samples."""
    if mix <= 0:
        return 0.0
    licensed = _license_clause(filters.license_groups)
    panels = select(Panel.figure_id).group_by(Panel.figure_id).having(func.count() >= filters.min_panels)
    if filters.figure_types is not None:
        panels = panels.where(Panel.figure_type.in_(filters.figure_types))
    mined = Figure.status == FigureStatus.MINED
    hier = select(Figure.id).outerjoin(Article).where(mined, Figure.id.in_(panels))
    plain = select(Figure.id).outerjoin(Article).where(_plain_clause())
    if licensed is not None:
        hier, plain = hier.where(licensed), plain.where(licensed)
    n_hier, n_plain = _count(session, hier), _count(session, plain)
    if n_plain == 0:
        return 0.0
    return min(1.0, mix / (1.0 - mix) * n_hier / n_plain)


def _stream(session: Session, filters: ExportFilters, with_plain: bool) -> Iterator[Figure]:
    wanted = and_(Figure.status == FigureStatus.MINED, _has_panels())
    if with_plain:
        wanted = or_(wanted, _plain_clause())
    stmt = select(Figure).outerjoin(Article).where(wanted)
    licensed = _license_clause(filters.license_groups)
    if licensed is not None:
        stmt = stmt.where(licensed)
    stmt = (
        stmt.order_by(Figure.id)
        .options(
            selectinload(Figure.article),
            selectinload(Figure.jobs),
            selectinload(Figure.panels).selectinload(Panel.regions),
        )
        .execution_options(yield_per=100)
    )
    yield from session.scalars(stmt)


def _current_panels(figure: Figure, filters: ExportFilters) -> list[Panel]:
    """The panels of the figure's latest succeeded mining job, of the wanted figure types."""
    panels = list(figure.panels)
    job_ids = {p.mining_job_id for p in panels}
    if len(job_ids) > 1:
        done = [j for j in figure.jobs if j.id in job_ids and j.status is JobStatus.SUCCEEDED]
        if done:
            chosen = max(done, key=lambda j: (j.finished_at or j.created_at, str(j.id))).id
        else:
            chosen = max(panels, key=lambda p: (p.created_at, str(p.mining_job_id))).mining_job_id
        panels = [p for p in panels if p.mining_job_id == chosen]
    if filters.figure_types is not None:
        panels = [p for p in panels if p.figure_type in filters.figure_types]
    return panels


def _figure_member(store: ObjectStore, figure: Figure) -> tuple[str, bytes]:
    data = store.get_bytes(figure.object_key)
    extension = IMAGE_EXTENSIONS.get(figure.format.upper())
    if extension is None:
        with Image.open(io.BytesIO(data)) as image:
            buffer = io.BytesIO()
            image.convert("RGB").save(buffer, format="PNG")
        data, extension = buffer.getvalue(), "png"
    return f"figure.{extension}", data


def _region_json(region: Region, crop: str | None) -> dict[str, Any]:
    return {
        "id": str(region.id),
        "box_in_panel": list(region.box_in_panel),
        "box_in_figure": list(region.box_in_figure),
        "caption_text": region.caption_text,
        "description": region.description,
        "kind": region.kind.value,
        "marker_type": region.marker_type,
        "crop": crop,
    }


def _build_sample(
    store: ObjectStore, figure: Figure, panels: list[Panel], *, plain: bool, splits: SplitConfig
) -> _Sample:
    key = figure.id.hex
    article = figure.article
    group = group_key(
        figure_id=figure.id,
        article_id=article.id if article else None,
        pmcid=article.pmcid if article else None,
        doi=article.doi if article else None,
        pmid=article.pmid if article else None,
    )
    split = assign_split(group, splits)
    image_name, image_data = _figure_member(store, figure)
    members: list[tuple[str, bytes]] = [(f"{key}.{image_name}", image_data)]
    panel_docs, n_regions = [], 0
    for i, panel in enumerate(panels):
        crop = None
        if panel.crop_key:
            crop = f"{key}.panel_{i}.png"
            members.append((crop, store.get_bytes(panel.crop_key)))
        region_docs = []
        for j, region in enumerate(panel.regions):
            region_crop = None
            if region.crop_key:
                region_crop = f"{key}.region_{i}_{j}.png"
                members.append((region_crop, store.get_bytes(region.crop_key)))
            region_docs.append(_region_json(region, region_crop))
        n_regions += len(region_docs)
        panel_docs.append(
            {
                "id": str(panel.id),
                "label": panel.label,
                "box": list(panel.box),
                "subcaption": panel.subcaption,
                "description": panel.description,
                "figure_type": panel.figure_type,
                "crop": crop,
                "regions": region_docs,
            }
        )
    figure_types = sorted({p.figure_type for p in panels if p.figure_type})
    license_group = article.license_group.value if article else LicenseGroup.OTHER.value
    doc = {
        "key": key,
        "figure_id": str(figure.id),
        "split": split,
        "plain": plain,
        "image": f"{key}.{image_name}",
        "width": figure.width,
        "height": figure.height,
        "caption": figure.caption,
        "figure_label": figure.figure_label,
        "inline_references": list(figure.inline_references or []),
        "article": group,
        "pmcid": article.pmcid if article else None,
        "doi": article.doi if article else None,
        "title": article.title if article else None,
        "license": article.license if article else None,
        "license_group": license_group,
        "year": article.year if article else None,
        "journal": article.journal if article else None,
        "figure_types": figure_types,
        "mining_job_id": str(panels[0].mining_job_id) if panels else None,
        "panels": panel_docs,
    }
    members.insert(1, (f"{key}.json", json.dumps(doc, ensure_ascii=False, sort_keys=True).encode()))
    row = {
        k: doc[k]
        for k in ("key", "figure_id", "split", "plain", "article", "pmcid", "license", "license_group")
    }
    row.update(year=doc["year"], journal=doc["journal"], figure_types=figure_types)
    row.update(n_panels=len(panels), n_regions=n_regions)
    return _Sample(key, split, members, row, len(panels), n_regions, plain)


def _source_counts(session: Session) -> dict[str, int]:
    def count(stmt: Select[Any]) -> int:
        return int(session.scalar(stmt) or 0)

    return {
        "articles": count(select(func.count()).select_from(Article)),
        "figures": count(select(func.count()).select_from(Figure)),
        "figures_mined": count(select(func.count()).where(Figure.status == FigureStatus.MINED)),
        "panels": count(select(func.count()).select_from(Panel)),
        "regions": count(select(func.count()).select_from(Region)),
    }


def _prepare_prefix(store: ObjectStore, prefix: str, overwrite: bool) -> None:
    existing = store.exists(f"{prefix}/manifest.json")
    if existing and not overwrite:
        raise ExportError(f"{prefix} already holds a snapshot (manifest.json): use a new prefix or overwrite")
    if overwrite:
        for key in list(store.list(f"{prefix}/")):
            store.delete(key)


def export_corpus(
    runtime: Runtime,
    *,
    out_prefix: str,
    shard_size: int = 1000,
    filters: ExportFilters | None = None,
    mix_plain_pairs: float = 0.0,
    snapshot_name: str,
    splits: SplitConfig | None = None,
    overwrite: bool = False,
) -> ExportManifest:
    """Write the shards, ``index.parquet`` and ``manifest.json`` under ``out_prefix`` in the store."""
    filters = filters or ExportFilters()
    splits = splits or SplitConfig()
    prefix = validate_key(out_prefix.strip("/"))
    if shard_size < 1:
        raise ExportError(f"shard_size must be at least 1, got {shard_size}")
    if not 0.0 <= mix_plain_pairs < 1.0:
        raise ExportError(f"mix_plain_pairs must be in [0, 1), got {mix_plain_pairs}")
    store = runtime.store
    _prepare_prefix(store, prefix, overwrite)
    counts = {s: {"figures": 0, "plain": 0, "panels": 0, "regions": 0} for s in SPLITS}
    with runtime.session() as session, tempfile.TemporaryDirectory(prefix="p2p-export-") as tmp_name:
        tmp = Path(tmp_name)
        source_counts = _source_counts(session)
        rate = _plain_rate(session, filters, mix_plain_pairs)
        writers = {s: _ShardWriter(store, prefix, s, shard_size, tmp) for s in SPLITS}
        index = _IndexWriter(tmp / "index.parquet")
        for figure in _stream(session, filters, rate > 0):
            plain = not figure.panels
            if plain:
                if unit_interval(f"{splits.salt}:plain", str(figure.id)) >= rate:
                    continue
                panels: list[Panel] = []
            else:
                panels = _current_panels(figure, filters)
                if figure.status is not FigureStatus.MINED or len(panels) < filters.min_panels:
                    continue
            sample = _build_sample(store, figure, panels, plain=plain, splits=splits)
            shard = writers[sample.split].add(sample.members)
            index.add({**sample.row, "shard": shard})
            tally = counts[sample.split]
            tally["figures"] += 1
            tally["plain"] += int(plain)
            tally["panels"] += sample.n_panels
            tally["regions"] += sample.n_regions
        for writer in writers.values():
            writer.flush()
        index.close()
        if sum(c["figures"] for c in counts.values()) == 0:
            raise ExportError(
                f"nothing to export: no mined figure matches the filters {filters.as_dict()} "
                f"(the database holds {source_counts['figures_mined']} mined figures "
                f"of {source_counts['figures']})"
            )
        index_key = f"{prefix}/index.parquet"
        put_file(store, index_key, tmp / "index.parquet", "application/vnd.apache.parquet")
    manifest = ExportManifest(
        snapshot_name=snapshot_name,
        created_at=_iso(utcnow()),
        out_prefix=prefix,
        shard_size=shard_size,
        filters=filters.as_dict(),
        mix_plain_pairs=mix_plain_pairs,
        splits=splits.as_dict(),
        counts=counts,
        shards=[info for s in SPLITS for info in writers[s].shards],
        source_counts=source_counts,
        index_key=index_key,
        manifest_key=f"{prefix}/manifest.json",
    )
    data = json.dumps(manifest.as_dict(), indent=2, sort_keys=True).encode()
    put_bytes(store, manifest.manifest_key, data, "application/json")
    return manifest


def _iso(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


def load_manifest(store: ObjectStore, prefix: str) -> dict[str, Any]:
    """The manifest of the snapshot under ``prefix`` as written by ``export_corpus``."""
    loaded: dict[str, Any] = json.loads(store.get_bytes(f"{prefix.strip('/')}/manifest.json"))
    return loaded


__all__ = [
    "ExportError",
    "ExportFilters",
    "ExportManifest",
    "ShardInfo",
    "export_corpus",
    "load_manifest",
]
