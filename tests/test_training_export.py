"""Training data: export of the mined corpus to WebDataset shards + index + manifest, and the
streaming loader over them (splits by article, shuffling, rank and worker partitions, bad input)."""

from __future__ import annotations

import io
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from PIL import Image
from sqlalchemy import Engine, select, text
from sqlalchemy.orm import selectinload
from torch.utils.data import DataLoader

from p2p.ingest.samples import make_figure
from p2p.ingest.service import ingest_figure
from p2p.mining.jobs import mine_job
from p2p.mining.tasks import get_miner
from p2p.shared.db.base import Base
from p2p.shared.db.models import Figure, FigureStatus, Panel
from p2p.shared.runtime import Runtime, build_runtime
from p2p.shared.schemas import ArticleIn, FigureMetadata
from p2p.shared.settings import Settings
from p2p.training.dataset import (
    DatasetError,
    EmptySplit,
    FigureDataset,
    FigureRecord,
    ShardMissing,
    decode_sample,
    iter_samples,
    read_manifest,
)
from p2p.training.export import ExportError, ExportFilters, export_corpus
from p2p.training.splits import SPLITS, SplitConfig, assign_split, group_key

ARTICLES = [  # (seed, pmcid, license)
    (4, "PMC1000004", "CC BY 4.0"),
    (7, "PMC1000007", "CC BY-NC 4.0"),
    (9, "PMC1000009", "CC0 1.0"),
    (12, "PMC1000012", "CC BY 4.0"),
]
ALL_TRAIN = SplitConfig(train=1.0, val=0.0, test=0.0)
SPREAD = SplitConfig(train=0.34, val=0.33, test=0.33, salt="spread")


@dataclass
class Corpus:
    runtime: Runtime
    mined: list[uuid.UUID]
    plain: uuid.UUID  # not mined, shares the first article
    nc_figure: uuid.UUID


def _ingest(runtime: Runtime, seed: int, article: ArticleIn) -> tuple[uuid.UUID, uuid.UUID]:
    sample = make_figure(seed)
    meta = FigureMetadata(article=article, inline_references=[f"As shown in Figure {seed}, ..."])
    with runtime.session() as session:
        outcome = ingest_figure(
            session=session,
            store=runtime.store,
            dispatcher=runtime.dispatcher,
            settings=runtime.settings,
            image=io.BytesIO(sample.image),
            caption=sample.caption,
            metadata=meta,
            source="test",
        )
        return outcome.figure.id, outcome.job.id


def mine_articles(runtime: Runtime, articles: list[tuple[int, str]]) -> list[uuid.UUID]:
    """Ingest ``make_figure(seed)`` for each (seed, pmcid) and mine it with the CPU miner."""
    miner = get_miner()
    mined = []
    for seed, pmcid in articles:
        article = ArticleIn(pmcid=pmcid, title=f"Paper {seed}", journal="J Test", year=2000 + seed)
        figure_id, job_id = _ingest(runtime, seed, article)
        mine_job(runtime, job_id, miner)
        mined.append(figure_id)
    return mined


@pytest.fixture(scope="module")
def corpus(pg_url: str, engine: Engine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Corpus]:
    tables = ", ".join(f'"{t.name}"' for t in Base.metadata.sorted_tables)
    with engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {tables} CASCADE"))
    settings = Settings.model_validate(
        {
            "profile": "embedded",
            "data_dir": tmp_path_factory.mktemp("training") / "data",
            "db": {"url": pg_url},
            "queue": {"embedded_queues": ["ingest"]},
        }
    )
    runtime = build_runtime(settings)
    mined = []
    miner = get_miner()
    for seed, pmcid, license_ in ARTICLES:
        article = ArticleIn(
            pmcid=pmcid, title=f"Paper {seed}", journal="J Test", year=2000 + seed, license=license_
        )
        figure_id, job_id = _ingest(runtime, seed, article)
        mine_job(runtime, job_id, miner)
        mined.append(figure_id)
    plain, _ = _ingest(runtime, 21, ArticleIn(pmcid=ARTICLES[0][1]))
    export_corpus(
        runtime,
        out_prefix="snap/all",
        shard_size=1,
        mix_plain_pairs=0.2,
        snapshot_name="all",
        splits=ALL_TRAIN,
    )
    yield Corpus(runtime=runtime, mined=mined, plain=plain, nc_figure=mined[1])
    runtime.close()


def _keys(records: Iterator[FigureRecord]) -> list[str]:
    return [r.key for r in records]


def _record_key(record: FigureRecord) -> str:
    return record.key


def test_export_writes_shards_index_and_manifest(corpus: Corpus) -> None:
    store = corpus.runtime.store
    manifest = export_corpus(
        corpus.runtime,
        out_prefix="snap/spread",
        shard_size=2,
        mix_plain_pairs=0.2,
        snapshot_name="s1",
        splits=SPREAD,
    )
    stored = json.loads(store.get_bytes("snap/spread/manifest.json"))
    assert stored == json.loads(json.dumps(manifest.as_dict()))
    assert stored["snapshot_name"] == "s1" and stored["created_at"].endswith("Z")
    assert stored["source_counts"]["figures"] == 5 and stored["source_counts"]["figures_mined"] == 4
    assert sum(c["figures"] for c in manifest.counts.values()) == 5
    assert sum(c["plain"] for c in manifest.counts.values()) == 1
    assert all(c["figures"] > 0 for c in manifest.counts.values()), manifest.counts
    for info in manifest.shards:
        assert info.key.startswith(f"snap/spread/{info.split}/shard-") and info.key.endswith(".tar")
        assert store.size(info.key) == info.size and 1 <= info.samples <= 2

    index = pq.read_table(io.BytesIO(store.get_bytes("snap/spread/index.parquet"))).to_pylist()
    assert len(index) == 5 and [r["key"] for r in index] == sorted(r["key"] for r in index)
    with corpus.runtime.session() as session:
        for row in index:
            figure = session.scalars(
                select(Figure)
                .where(Figure.id == uuid.UUID(row["figure_id"]))
                .options(selectinload(Figure.panels).selectinload(Panel.regions))
            ).one()
            assert row["n_panels"] == len(figure.panels)
            assert row["n_regions"] == sum(len(p.regions) for p in figure.panels)
            assert row["plain"] == (figure.id == corpus.plain)
            assert row["shard"] in manifest.shard_keys(row["split"])
            assert row["pmcid"] is not None and row["journal"] == "J Test"
    for split in SPLITS:
        assert manifest.counts[split]["panels"] == sum(r["n_panels"] for r in index if r["split"] == split)
    # Splits follow the article: the plain figure shares the first mined figure's article and split.
    split_of = {r["figure_id"]: r["split"] for r in index}
    assert split_of[str(corpus.plain)] == split_of[str(corpus.mined[0])]
    for row in index:
        assert row["split"] == assign_split(group_key(figure_id="-", pmcid=row["pmcid"]), SPREAD)
    # val+test: both held-out splits read as one, val first
    held_out = _keys(iter_samples(store, "snap/spread", "val+test", shuffle_buffer=0, seed=0, epoch=0))
    by_split = {
        s: _keys(iter_samples(store, "snap/spread", s, shuffle_buffer=0, seed=0, epoch=0)) for s in SPLITS
    }
    assert held_out == by_split["val"] + by_split["test"] and not set(held_out) & set(by_split["train"])
    with pytest.raises(DatasetError, match="no split 'tset'"):
        iter_samples(store, "snap/spread", "val+tset", shuffle_buffer=0, seed=0, epoch=0)
    with pytest.raises(ExportError, match="already holds a snapshot"):
        export_corpus(corpus.runtime, out_prefix="snap/spread", snapshot_name="again")


def test_round_trip_of_texts_boxes_and_crops(corpus: Corpus) -> None:
    store = corpus.runtime.store
    records = {r.key: r for r in iter_samples(store, "snap/all", "train", shuffle_buffer=0, seed=0, epoch=0)}
    assert len(records) == 5
    with corpus.runtime.session() as session:
        for figure_id in [*corpus.mined, corpus.plain]:
            figure = session.scalars(
                select(Figure)
                .where(Figure.id == figure_id)
                .options(
                    selectinload(Figure.article), selectinload(Figure.panels).selectinload(Panel.regions)
                )
            ).one()
            record = records[figure_id.hex]
            assert record.caption == figure.caption and record.inline_references == figure.inline_references
            assert figure.article is not None
            assert record.meta["title"] == figure.article.title and record.meta["year"] == figure.article.year
            assert record.meta["license_group"] == figure.article.license_group.value
            original = Image.open(io.BytesIO(store.get_bytes(figure.object_key)))
            assert record.figure_image.format == original.format
            assert record.figure_image.tobytes() == original.tobytes()
            assert record.plain == (figure.status is not FigureStatus.MINED)
            assert [p.label for p in record.panels] == [p.label for p in figure.panels]
            for got, panel in zip(record.panels, figure.panels, strict=True):
                assert list(got.box) == list(panel.box) and got.subcaption == (panel.subcaption or "")
                assert got.figure_type == panel.figure_type
                assert panel.crop_key is not None
                crop = Image.open(io.BytesIO(store.get_bytes(panel.crop_key)))
                assert got.image.tobytes() == crop.tobytes()
                assert [r.id for r in got.regions] == [str(r.id) for r in panel.regions]
                for got_region, region in zip(got.regions, panel.regions, strict=True):
                    assert list(got_region.box_in_panel) == list(region.box_in_panel)
                    assert list(got_region.box_in_figure) == list(region.box_in_figure)
                    assert got_region.caption_text == (region.caption_text or "")
                    assert got_region.kind == region.kind.value
                    if region.crop_key:
                        crop = Image.open(io.BytesIO(store.get_bytes(region.crop_key)))
                        assert got_region.image.tobytes() == crop.tobytes()
    assert any(p.regions for r in records.values() for p in r.panels), "the sample figures carry markers"


def test_splits_are_deterministic_and_disjoint_by_article() -> None:
    groups = [group_key(figure_id=uuid.uuid4(), pmcid=f"PMC{i}") for i in range(3000)]
    first = [assign_split(g) for g in groups]
    assert first == [assign_split(g) for g in groups]
    share = {s: first.count(s) / len(groups) for s in SPLITS}
    assert abs(share["train"] - 0.8) < 0.03 and abs(share["val"] - 0.1) < 0.03
    assert [assign_split(g, SplitConfig(salt="other")) for g in groups] != first
    # Every figure of an article shares its group; a figure without an article is its own group.
    assert group_key(figure_id="a", pmcid="pmc7 ") == group_key(figure_id="b", pmcid="PMC7")
    assert group_key(figure_id="a") != group_key(figure_id="b")
    assert group_key(figure_id="a", doi="10.1/X") == group_key(figure_id="b", doi="10.1/x")
    with pytest.raises(ValueError, match="sum to 1"):
        SplitConfig(train=0.8, val=0.1, test=0.2)


def test_license_and_figure_type_filters(corpus: Corpus) -> None:
    store = corpus.runtime.store
    filters = ExportFilters(license_groups=("commercial",))
    manifest = export_corpus(corpus.runtime, out_prefix="snap/com", filters=filters, snapshot_name="com")
    index = pq.read_table(io.BytesIO(store.get_bytes("snap/com/index.parquet"))).to_pylist()
    assert {r["figure_id"] for r in index} == {str(f) for f in corpus.mined if f != corpus.nc_figure}
    assert {r["license_group"] for r in index} == {"commercial"}
    assert manifest.filters["license_groups"] == ["commercial"]

    types = pq.read_table(io.BytesIO(store.get_bytes("snap/all/index.parquet"))).to_pylist()
    wanted = sorted({t for r in types for t in r["figure_types"]})[0]
    export_corpus(
        corpus.runtime,
        out_prefix="snap/typed",
        filters=ExportFilters(figure_types=(wanted,)),
        snapshot_name="typed",
        splits=ALL_TRAIN,
    )
    records = list(iter_samples(store, "snap/typed", "train", shuffle_buffer=0, seed=0, epoch=0))
    assert records and all(p.figure_type == wanted for r in records for p in r.panels)
    assert len(records) == sum(wanted in r["figure_types"] for r in types)
    with pytest.raises(ExportError, match="nothing to export"):
        export_corpus(
            corpus.runtime,
            out_prefix="snap/none",
            filters=ExportFilters(figure_types=("x",)),
            snapshot_name="n",
        )
    with pytest.raises(ExportError, match="unknown license group"):
        ExportFilters(license_groups=("free",))


def test_shuffle_is_deterministic_per_seed_and_epoch(corpus: Corpus) -> None:
    store = corpus.runtime.store

    def order(seed: int, epoch: int) -> list[str]:
        return _keys(iter_samples(store, "snap/all", "train", shuffle_buffer=3, seed=seed, epoch=epoch))

    assert order(5, 0) == order(5, 0)
    assert sorted(order(5, 0)) == sorted(order(5, 1)) and len(order(5, 0)) == 5
    assert order(5, 0) != order(5, 1)
    unshuffled = _keys(iter_samples(store, "snap/all", "train", shuffle_buffer=0, seed=5, epoch=0))
    assert unshuffled == sorted(unshuffled)  # export order: figure id


@pytest.mark.parametrize("world_size", [2, 3, 7])  # 7 > 5 shards: every rank reads and strides
def test_rank_partition_covers_every_sample_once(corpus: Corpus, world_size: int) -> None:
    store = corpus.runtime.store
    parts = [
        _keys(
            iter_samples(
                store, "snap/all", "train", shuffle_buffer=2, seed=1, epoch=3, rank=r, world_size=world_size
            )
        )
        for r in range(world_size)
    ]
    flat = [k for part in parts for k in part]
    assert len(flat) == len(set(flat)) == 5


def test_dataloader_workers_yield_each_sample_once(corpus: Corpus) -> None:
    dataset = FigureDataset(
        corpus.runtime.store, "snap/all", "train", shuffle_buffer=4, transform=_record_key
    )
    assert dataset.num_samples == 5
    dataset.set_epoch(2)
    keys = list(DataLoader(dataset, batch_size=None, num_workers=2))
    assert sorted(keys) == sorted(f.hex for f in [*corpus.mined, corpus.plain])


def test_missing_shard_and_empty_split_are_reported(corpus: Corpus) -> None:
    store = corpus.runtime.store
    manifest = export_corpus(
        corpus.runtime, out_prefix="snap/broken", shard_size=2, snapshot_name="b", splits=ALL_TRAIN
    )
    lost = manifest.shard_keys("train")[1]
    store.delete(lost)
    with pytest.raises(ShardMissing, match=lost):
        list(iter_samples(store, "snap/broken", "train", shuffle_buffer=0, seed=0, epoch=0))
    with pytest.raises(EmptySplit, match="split test has no samples"):
        FigureDataset(store, "snap/broken", "test")
    with pytest.raises(EmptySplit, match="split val has no samples"):
        iter_samples(store, "snap/broken", "val", shuffle_buffer=0, seed=0, epoch=0)
    assert read_manifest(store, "snap/broken")["counts"]["val"]["figures"] == 0


def test_crop_missing_from_a_sample_is_cut_from_the_figure() -> None:
    buffer = io.BytesIO()
    Image.new("RGB", (40, 30), "red").save(buffer, format="PNG")
    region = {"id": "r", "box_in_panel": [1, 1, 5, 5], "box_in_figure": [11, 1, 15, 5], "crop": None}
    panel = {"id": "p", "box": [10, 0, 30, 20], "crop": None, "subcaption": None, "regions": [region]}
    doc = {"caption": "c", "panels": [panel]}
    record = decode_sample("k", {"figure.png": buffer.getvalue(), "json": json.dumps(doc).encode()})
    assert record.panels[0].image.size == (20, 20) and record.panels[0].subcaption == ""
    assert record.panels[0].regions[0].image.size == (4, 4)
    with pytest.raises(DatasetError, match="no figure image"):
        decode_sample("k", {"json": b"{}"})


# Last: the per-test database fixture empties the tables the module corpus lives in.
@pytest.mark.parametrize("store_kind", ["local"], indirect=True)
def test_empty_corpus_is_a_clear_error(runtime: Runtime, tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="nothing to export"):
        export_corpus(runtime, out_prefix="snap/empty", snapshot_name="empty")
    assert not list(runtime.store.list("snap/"))
