"""Stream an exported snapshot's WebDataset shards from the object store, one shard at a time.

The snapshot's ``manifest.json`` lists the shards of each split. Per epoch the shard order is
shuffled with (seed, epoch); the shards are then partitioned across ``nparts`` consumers (DDP ranks
times DataLoader workers): by shard when there are at least as many shards as consumers, otherwise
every consumer reads the shards and keeps every ``nparts``-th sample. Either way each sample goes to
exactly one consumer. A shuffle buffer mixes samples within a consumer. Samples stay raw bytes in
the buffer and become a :class:`FigureRecord` (lazily opened PIL images) only when yielded.
"""

from __future__ import annotations

import io
import json
import random
import tarfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from PIL import Image
from torch.utils.data import IterableDataset, get_worker_info

from p2p.shared.storage import ObjectNotFound, ObjectStore
from p2p.shared.tarstream import TrackingTarInfo, header_damage, split_member_name

Box = tuple[float, float, float, float]
_READ_ERRORS = (tarfile.TarError, EOFError, OSError)


class DatasetError(RuntimeError):
    pass


class ShardMissing(DatasetError):
    pass


class EmptySplit(DatasetError):
    pass


@dataclass
class RegionRecord:
    id: str
    image: Image.Image
    box_in_panel: Box
    box_in_figure: Box
    caption_text: str = ""
    description: str = ""
    kind: str = ""
    marker_type: str | None = None


@dataclass
class PanelRecord:
    id: str
    image: Image.Image
    box: Box
    label: str | None = None
    subcaption: str = ""
    description: str = ""
    figure_type: str | None = None
    regions: list[RegionRecord] = field(default_factory=list)


@dataclass
class FigureRecord:
    key: str
    figure_image: Image.Image
    caption: str
    panels: list[PanelRecord]
    meta: dict[str, Any]  # the sample's json: article, license, year, journal, inline references...

    @property
    def plain(self) -> bool:
        return bool(self.meta.get("plain"))

    @property
    def inline_references(self) -> list[str]:
        return list(self.meta.get("inline_references") or [])


def read_manifest(store: ObjectStore, prefix: str) -> dict[str, Any]:
    key = f"{prefix.strip('/')}/manifest.json"
    try:
        loaded: dict[str, Any] = json.loads(store.get_bytes(key))
    except ObjectNotFound as exc:
        raise DatasetError(f"no snapshot at {prefix}: {key} is missing from {store.description}") from exc
    return loaded


def split_figures(counts: dict[str, Any], split: str) -> int:
    """Figures of ``split`` in a manifest's counts; ``val+test`` is the union of both."""
    return sum(int(counts.get(part, {}).get("figures", 0)) for part in split.split("+"))


def split_shards(manifest: dict[str, Any], split: str) -> list[str]:
    """The shard keys of ``split`` (``a+b``: both splits, in that order); raises :class:`EmptySplit`
    when it has no samples."""
    counts = manifest.get("counts", {})
    parts = split.split("+")
    unknown = [part for part in parts if part not in counts]
    if unknown:
        raise DatasetError(f"snapshot {manifest.get('snapshot_name')} has no split {unknown[0]!r}")
    listed = [s for s in manifest.get("shards", []) if s["samples"] > 0]
    shards = [s["key"] for part in parts for s in listed if s["split"] == part]
    if not shards or split_figures(counts, split) == 0:
        raise EmptySplit(
            f"split {split} has no samples in snapshot {manifest.get('snapshot_name')} "
            f"({manifest.get('out_prefix')})"
        )
    return shards


def iter_samples(
    store: ObjectStore,
    prefix: str,
    split: str,
    *,
    shuffle_buffer: int,
    seed: int,
    epoch: int,
    rank: int = 0,
    world_size: int = 1,
) -> Iterator[FigureRecord]:
    """This rank's samples of ``split`` for one epoch. ``shuffle_buffer`` 0 keeps the export order.

    The manifest is read (and an empty split reported) at the call, before the first sample.
    """
    shards = split_shards(read_manifest(store, prefix), split)
    return iter_part(
        store, shards, shuffle_buffer=shuffle_buffer, seed=seed, epoch=epoch, part=rank, nparts=world_size
    )


def iter_part(
    store: ObjectStore,
    shards: list[str],
    *,
    shuffle_buffer: int,
    seed: int,
    epoch: int,
    part: int,
    nparts: int,
) -> Iterator[FigureRecord]:
    if nparts < 1 or not 0 <= part < nparts:
        raise ValueError(f"part {part} is not one of {nparts} parts")
    shuffle = shuffle_buffer > 0
    order = list(shards)
    if shuffle:
        random.Random(f"shards:{seed}:{epoch}").shuffle(order)
    return _generate(
        store, order, shuffle_buffer, random.Random(f"samples:{seed}:{epoch}:{part}"), part, nparts
    )


def _generate(
    store: ObjectStore, order: list[str], buffer: int, rng: random.Random, part: int, nparts: int
) -> Iterator[FigureRecord]:
    raw: Iterable[tuple[str, dict[str, bytes]]]
    if len(order) >= nparts:
        raw = _read_shards(store, order[part::nparts])
    else:
        raw = (s for i, s in enumerate(_read_shards(store, order)) if i % nparts == part)
    if buffer > 0:
        raw = _shuffled(raw, buffer, rng)
    for key, members in raw:
        yield decode_sample(key, members)


def _shuffled(items: Iterable[Any], size: int, rng: random.Random) -> Iterator[Any]:
    pool: list[Any] = []
    for item in items:
        if len(pool) < size:
            pool.append(item)
            continue
        index = rng.randrange(len(pool))
        pool[index], item = item, pool[index]
        yield item
    rng.shuffle(pool)
    yield from pool


def _read_shards(store: ObjectStore, keys: list[str]) -> Iterator[tuple[str, dict[str, bytes]]]:
    for key in keys:
        yield from _read_shard(store, key)


def _read_shard(store: ObjectStore, shard: str) -> Iterator[tuple[str, dict[str, bytes]]]:
    try:
        handle = store.open(shard)
    except ObjectNotFound as exc:
        raise ShardMissing(
            f"shard {shard} is listed in the manifest but missing from {store.description}"
        ) from exc
    current: str | None = None
    members: dict[str, bytes] = {}
    with handle:
        try:
            with tarfile.open(fileobj=handle, mode="r|", tarinfo=TrackingTarInfo) as tar:
                for member in tar:
                    parts = split_member_name(member.name) if member.isfile() else None
                    if parts is None:
                        continue
                    key, extension = parts
                    if current is not None and key != current:
                        yield current, members
                        members = {}
                    current = key
                    source = tar.extractfile(member)
                    members[extension] = source.read() if source is not None else b""
                damage = header_damage(tar)
        except _READ_ERRORS as exc:
            raise DatasetError(f"shard {shard} is damaged: {exc}") from exc
    if damage is not None:
        raise DatasetError(f"shard {shard} is damaged: {damage}")
    if current is not None:
        yield current, members


def _box(values: Any) -> Box:
    x0, y0, x1, y1 = (float(v) for v in values)
    return (x0, y0, x1, y1)


def _open(data: bytes) -> Image.Image:
    return Image.open(io.BytesIO(data))  # lazy: pixels are decoded on first use


def _image(
    members: dict[str, bytes], key: str, name: str | None, figure: Image.Image, box: Box
) -> Image.Image:
    extension = name[len(key) + 1 :] if name and name.startswith(f"{key}.") else None
    if extension is not None and extension in members:
        return _open(members[extension])
    x0, y0, x1, y1 = (round(v) for v in box)
    return figure.crop((x0, y0, x1, y1))  # a crop too small to store: cut from the figure


def decode_sample(key: str, members: dict[str, bytes]) -> FigureRecord:
    if "json" not in members:
        raise DatasetError(f"sample {key} has no json member")
    meta: dict[str, Any] = json.loads(members["json"])
    image_ext = next((e for e in members if e.startswith("figure.")), None)
    if image_ext is None:
        raise DatasetError(f"sample {key} has no figure image member")
    figure = _open(members[image_ext])
    panels = []
    for p in meta.get("panels", []):
        box = _box(p["box"])
        regions = [
            RegionRecord(
                id=r["id"],
                image=_image(members, key, r.get("crop"), figure, _box(r["box_in_figure"])),
                box_in_panel=_box(r["box_in_panel"]),
                box_in_figure=_box(r["box_in_figure"]),
                caption_text=r.get("caption_text") or "",
                description=r.get("description") or "",
                kind=r.get("kind") or "",
                marker_type=r.get("marker_type"),
            )
            for r in p.get("regions", [])
        ]
        panels.append(
            PanelRecord(
                id=p["id"],
                image=_image(members, key, p.get("crop"), figure, box),
                box=box,
                label=p.get("label"),
                subcaption=p.get("subcaption") or "",
                description=p.get("description") or "",
                figure_type=p.get("figure_type"),
                regions=regions,
            )
        )
    return FigureRecord(
        key=key, figure_image=figure, caption=meta.get("caption") or "", panels=panels, meta=meta
    )


class FigureDataset(IterableDataset[Any]):
    """One split of a snapshot for a ``DataLoader``: partitioned across ranks and workers.

    Call :meth:`set_epoch` before each epoch. ``transform`` maps a :class:`FigureRecord` (e.g. to
    the training batch's sample type) inside the worker.
    """

    def __init__(
        self,
        store: ObjectStore,
        prefix: str,
        split: str,
        *,
        shuffle_buffer: int = 1000,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        transform: Callable[[FigureRecord], Any] | None = None,
    ) -> None:
        super().__init__()
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not one of {world_size} ranks")
        self.store, self.prefix, self.split = store, prefix, split
        self.manifest = read_manifest(store, prefix)
        self.shards = split_shards(self.manifest, split)  # an empty split fails here, before training
        self.num_samples = int(self.manifest["counts"][split]["figures"])
        self.shuffle_buffer, self.seed, self.epoch = shuffle_buffer, seed, 0
        self.rank, self.world_size, self.transform = rank, world_size, transform

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        workers, worker = (1, 0) if info is None else (info.num_workers, info.id)
        records = iter_part(
            self.store,
            self.shards,
            shuffle_buffer=self.shuffle_buffer,
            seed=self.seed,
            epoch=self.epoch,
            part=self.rank * workers + worker,
            nparts=self.world_size * workers,
        )
        for record in records:
            yield self.transform(record) if self.transform is not None else record
