"""Retrieval evaluation on tiny synthetic shards in the export format: an oracle encoder scores 1,
a random one about 1/N, identical texts are one target, zero-shot accuracy, and the CLI command."""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import typer
from PIL import Image

from p2p.cli import eval_retrieval_cmd as cmd
from p2p.shared.storage import LocalObjectStore
from p2p.training import evaluate as ev
from p2p.training.dataset import FigureRecord, iter_samples
from tests import shards

NAMES = ["red", "green", "blue"]
TYPES = ["image", "plot", "table"]


def _png(ident: int, size: tuple[int, int]) -> bytes:
    """A solid image whose colour encodes ``ident``."""
    image = Image.new("RGB", size, (ident % 256, ident // 256, 7))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def ident_of(image: Image.Image) -> int:
    r, g, _ = image.convert("RGB").getpixel((0, 0))  # type: ignore[misc]
    return int(r) + 256 * int(g)


class Truth:
    """What the synthetic snapshot holds: each image id's text, and each panel id's type."""

    def __init__(self) -> None:
        self.text: dict[int, str] = {}
        self.type: dict[int, str] = {}
        self.next = 1

    def new(self, text: str, figure_type: str | None = None) -> int:
        ident, self.next = self.next, self.next + 1
        self.text[ident] = text
        if figure_type is not None:
            self.type[ident] = figure_type
        return ident


def _sample(f: int, truth: Truth) -> list[tuple[str, bytes]]:
    key = f"fig{f:04d}"
    caption = f"figure {f} with two panels"
    members = [(f"{key}.figure.png", _png(truth.new(caption), (60, 30)))]
    panels = []
    for p in range(2):
        subcaption = f"panel {p} of figure {f}"
        figure_type = TYPES[(2 * f + p) % len(TYPES)]
        members.append((f"{key}.panel_{p}.png", _png(truth.new(subcaption, figure_type), (28, 28))))
        regions = []
        for r in range(2):
            c = (f + p + r) % len(NAMES)
            caption_text = "" if r == 1 and f % 2 else f"a {NAMES[c]} box"  # some only describe
            description = f"{NAMES[c]} square crop"
            name = f"{key}.region_{p}_{r}.png"
            members.append((name, _png(truth.new(caption_text or description), (10, 10))))
            regions.append(
                {
                    "id": f"{key}-{p}-{r}",
                    "box_in_panel": [0, 0, 10, 10],
                    "box_in_figure": [0, 0, 10, 10],
                    "caption_text": caption_text,
                    "description": description,
                    "kind": "marker",
                    "crop": name,
                }
            )
        panels.append(
            {
                "id": f"{key}-{p}",
                "label": "ab"[p],
                "box": [p * 30, 0, p * 30 + 28, 28],
                "subcaption": subcaption,
                "figure_type": figure_type,
                "crop": f"{key}.panel_{p}.png",
                "regions": regions,
            }
        )
    doc = {"key": key, "plain": False, "caption": caption, "panels": panels}
    return [*members, (f"{key}.json", json.dumps(doc).encode())]


def write_snapshot(store: LocalObjectStore, prefix: str, n: int, split: str = "test") -> Truth:
    truth = Truth()
    counts = {"figures": n, "panels": 2 * n, "regions": 4 * n}
    shards.write_snapshot(
        store, prefix, n, lambda f: _sample(f, truth), split=split, per_shard=4, counts=counts
    )
    return truth


class Oracle:
    """One dimension per distinct text and per type phrase: an image is its text's one-hot (plus
    half of its type's, for panels), a text its own one-hot, a zero-shot prompt its type's."""

    def __init__(self, truth: Truth) -> None:
        self.truth = truth
        keys = sorted(set(truth.text.values())) + [f"type:{t}" for t in TYPES]
        self.dim = {k: i for i, k in enumerate(keys)}

    def _onehot(self, key: str) -> np.ndarray:
        vector = np.zeros(len(self.dim), dtype=np.float32)
        vector[self.dim[key]] = 1.0
        return vector

    def encode_texts(self, texts: Sequence[str]) -> np.ndarray:
        rows = []
        for text in texts:
            if text in self.dim:
                rows.append(self._onehot(text))
                continue
            kinds = [t for t in TYPES if ev.type_phrase(t) in text]
            assert len(kinds) == 1, text
            rows.append(self._onehot(f"type:{kinds[0]}"))
        return np.stack(rows)

    def encode_images(self, images: Sequence[Image.Image]) -> np.ndarray:
        rows = []
        for image in images:
            ident = ident_of(image)
            vector = self._onehot(self.truth.text[ident])
            if ident in self.truth.type:
                vector = vector + 0.5 * self._onehot(f"type:{self.truth.type[ident]}")
            rows.append(vector / np.linalg.norm(vector))
        return np.stack(rows)


class RandomEncoder:
    def __init__(self, seed: int, dim: int = 64) -> None:
        self.rng = np.random.default_rng(seed)
        self.dim = dim

    def _random(self, n: int) -> np.ndarray:
        vectors = self.rng.standard_normal((n, self.dim)).astype(np.float32)
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)

    def encode_texts(self, texts: Sequence[str]) -> np.ndarray:
        return self._random(len(texts))

    def encode_images(self, images: Sequence[Image.Image]) -> np.ndarray:
        return self._random(len(images))


N = 24


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory: pytest.TempPathFactory) -> tuple[LocalObjectStore, Truth]:
    store = LocalObjectStore(tmp_path_factory.mktemp("evaluate") / "objects")
    return store, write_snapshot(store, "snap/eval", N)


def _records(store: LocalObjectStore) -> list[FigureRecord]:
    return list(iter_samples(store, "snap/eval", "test", shuffle_buffer=0, seed=0, epoch=0))


def _metrics(report: dict[str, Any]) -> list[float]:
    values = [
        v
        for task in ev.RETRIEVAL_TASKS
        for d in ("image_to_text", "text_to_image")
        for v in report[task][d].values()
    ]
    return [*values, report["zero_shot"]["accuracy"]]


def test_oracle_scores_one_on_every_task(snapshot: tuple[LocalObjectStore, Truth]) -> None:
    store, truth = snapshot
    report = ev.evaluate_retrieval(Oracle(truth), _records(store))
    assert report["figures"] == N
    assert report["figure"]["images"] == N and report["figure"]["texts"] == N
    assert report["panel"]["images"] == 2 * N and report["panel"]["texts"] == 2 * N
    assert report["region"]["images"] == 4 * N
    assert report["region"]["texts"] == 6  # 3 colours x (caption or description)
    for value in _metrics(report):
        assert value == 1.0
    zs = report["zero_shot"]
    assert zs["panels"] == 2 * N and zs["labels"] == sorted(TYPES)
    assert sum(t["panels"] for t in zs["per_type"].values()) == 2 * N
    assert zs["balanced_accuracy"] == 1.0


def test_random_model_scores_about_one_over_n(snapshot: tuple[LocalObjectStore, Truth]) -> None:
    store, _ = snapshot
    records = _records(store)
    totals: dict[str, list[float]] = {"i2t1": [], "t2i1": [], "i2t10": []}
    for seed in range(5):
        report = ev.evaluate_retrieval(RandomEncoder(seed), records, ks=(1, 10))
        assert all(0.0 <= v <= 1.0 for v in _metrics(report))
        totals["i2t1"].append(report["panel"]["image_to_text"]["R@1"])
        totals["t2i1"].append(report["panel"]["text_to_image"]["R@1"])
        totals["i2t10"].append(report["panel"]["image_to_text"]["R@10"])
    n = 2 * N
    assert np.mean(totals["i2t1"]) < 4 / n
    assert np.mean(totals["t2i1"]) < 4 / n
    assert abs(np.mean(totals["i2t10"]) - 10 / n) < 0.12


def test_max_items_caps_the_figures(snapshot: tuple[LocalObjectStore, Truth]) -> None:
    store, truth = snapshot
    report = ev.evaluate_retrieval(Oracle(truth), _records(store), ks=(1,), max_items=5)
    assert report["figures"] == 5 and report["panel"]["images"] == 10
    assert report["panel"]["image_to_text"] == {"R@1": 1.0}


def test_identical_texts_are_one_target() -> None:
    # Two images share text 0; image 1 is closest to text 0 and to query 0 beats image 0.
    images = np.array([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0]], dtype=np.float32)
    texts = np.array([[0.6, 0.8], [0.0, 1.0]], dtype=np.float32)
    targets = np.array([0, 0, 1])
    i2t = ev.image_to_text_ranks(images, texts, targets)
    assert list(i2t) == [0, 0, 0]
    t2i = ev.text_to_image_ranks(texts, images, targets)
    assert list(t2i) == [0, 0]  # query 0's best is image 1, which carries text 0 too
    # A wrong image scoring higher than every right one counts.
    query = np.array([[1.0, 0.0]], dtype=np.float32)
    assert list(ev.text_to_image_ranks(query, images, np.array([1, 0, 1]))) == [1]


def test_ties_count_against_the_query() -> None:
    constant = np.ones((3, 2), dtype=np.float32) / np.sqrt(2)
    targets = np.arange(3)
    assert list(ev.image_to_text_ranks(constant, constant, targets)) == [2, 2, 2]
    assert ev.recalls(ev.text_to_image_ranks(constant, constant, targets), (1, 3)) == {"R@1": 0.0, "R@3": 1.0}


def test_zero_shot_accuracy_of_a_wrong_model(snapshot: tuple[LocalObjectStore, Truth]) -> None:
    store, truth = snapshot

    class Swapped(Oracle):
        def encode_texts(self, texts: Sequence[str]) -> np.ndarray:
            # "a plot" prompts land on the image type's dimension and vice versa.
            swap = {
                ev.type_phrase("plot"): ev.type_phrase("image"),
                ev.type_phrase("image"): ev.type_phrase("plot"),
            }
            fixed = []
            for text in texts:
                for a, b in swap.items():
                    if a in text:
                        text = text.replace(a, b)
                        break
                fixed.append(text)
            return super().encode_texts(fixed)

    report = ev.evaluate_retrieval(Swapped(truth), _records(store))
    zs = report["zero_shot"]
    assert zs["per_type"]["table"]["accuracy"] == 1.0
    assert zs["per_type"]["plot"]["accuracy"] == 0.0 and zs["per_type"]["image"]["accuracy"] == 0.0
    expected = zs["per_type"]["table"]["panels"] / zs["panels"]
    assert zs["accuracy"] == pytest.approx(expected)
    assert zs["balanced_accuracy"] == pytest.approx(1 / 3)  # one of three types always right
    assert report["panel"]["image_to_text"]["R@1"] == 1.0


def test_compare_models_gives_one_row_per_model(snapshot: tuple[LocalObjectStore, Truth]) -> None:
    store, truth = snapshot
    loaded: list[str] = []

    def loader(spec: str) -> Any:
        loaded.append(spec)
        return RandomEncoder(3)

    rows = ev.compare_models(
        {"oracle": Oracle(truth), "random": "spec-r"}, iter(_records(store)), loader=loader
    )
    assert [r["model"] for r in rows] == ["oracle", "random"] and loaded == ["spec-r"]
    assert rows[0]["panel i2t R@1"] == 1.0 and rows[0]["zero-shot acc"] == 1.0
    assert rows[1]["panel i2t R@1"] < 0.5
    assert rows[0]["region n"] == rows[1]["region n"] == 4 * N


def test_cli_writes_json(
    snapshot: tuple[LocalObjectStore, Truth], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, truth = snapshot
    monkeypatch.setattr(cmd, "_store", lambda: store)
    monkeypatch.setattr(cmd, "_load", lambda store: lambda spec: Oracle(truth))
    out = tmp_path / "report.json"
    cmd.eval_retrieval(
        "snap/eval", split="test", model=["default", "local:/x/model.pt"], max_items=None, json_out=out
    )
    payload = json.loads(out.read_text())
    assert payload["split"] == "test" and [m["model"] for m in payload["models"]] == [
        "default",
        "local:/x/model.pt",
    ]
    report = payload["models"][0]["report"]
    assert report["panel"]["text_to_image"]["R@10"] == 1.0 and report["figures"] == N


def test_cli_resolves_local_specs(tmp_path: Path) -> None:
    config = tmp_path / "cfg.json"
    config.write_text(json.dumps({"embed_dim": 32}))
    specs = cmd.resolve_specs(["local:/m/run.pt"], "custom", config, None)
    spec = specs["local:/m/run.pt"]
    assert spec.source == "local:/m/run.pt" and spec.config == {"embed_dim": 32} and spec.name == "run"
    with pytest.raises(typer.Exit):
        cmd.resolve_specs(["not-a-model"], None, None, None)
