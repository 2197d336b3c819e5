"""The training runner on a tiny open_clip model and synthetic shards written in the export format:
checkpoints + final model, stop and resume (same weights as an uninterrupted run), refused
checkpoints, data errors before training, a non-finite loss, and the entry point."""

from __future__ import annotations

import io
import json
import math
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image, ImageDraw

from p2p.models.modeling import ModelSpec, load_model
from p2p.shared.storage import LocalObjectStore
from p2p.training import checkpoints as ckpt
from p2p.training.config import TrainConfig
from p2p.training.hierarchy import HierarchicalCLIP
from p2p.training.runner import RunResult, TrainingDataError, run_training
from tests import shards

ROOT = Path(__file__).resolve().parents[1]
TINY = {
    "embed_dim": 32,
    "vision_cfg": {"image_size": 64, "patch_size": 16, "width": 64, "layers": 2, "head_width": 32},
    "text_cfg": {"context_length": 32, "vocab_size": 49408, "width": 64, "heads": 2, "layers": 1},
}
FAST_LR = {"shared": 1e-3, "bbox_head": 1e-3, "fine": 1e-3, "coarse": 1e-3}
COLOURS = [(220, 30, 30), (30, 200, 30), (30, 30, 220), (230, 230, 20), (150, 30, 160), (250, 140, 0)]
NAMES = ["red", "green", "blue", "yellow", "purple", "orange"]
RUN: dict[str, Any] = {"checkpoint_every": 2, "keep_checkpoints": 2, "progress_every": 2, "shuffle_buffer": 3}


TINY_TRAINING: dict[str, Any] = {
    "model": {"name": "tiny", "config": TINY},
    "warmup_steps": 0,
    "lr": FAST_LR,
    "batch_sizes": {"figure": 2, "panel": 3, "region": 4},
    "max_steps": 6,
    "epochs": 5,
}


def tiny_cfg(**kw: Any) -> TrainConfig:
    return TrainConfig.model_validate({**TINY_TRAINING, **kw})


def _png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def _sample(f: int, regions: bool) -> list[tuple[str, bytes]]:
    """One figure of two 96x64 panels with two coloured boxes each, as export members."""
    key = f"fig{f:04d}"
    figure = Image.new("RGB", (200, 80), "white")
    members: list[tuple[str, bytes]] = []
    panel_docs = []
    for p in range(2):
        image = Image.new("RGB", (96, 64), "white")
        draw = ImageDraw.Draw(image)
        region_docs = []
        for r in range(2):
            c = (f * 4 + p * 2 + r) % len(COLOURS)
            box = (8 + r * 44, 10 + p * 4, 44 + r * 44, 50)
            draw.rectangle(box, fill=COLOURS[c])
            if regions:
                name = f"{key}.region_{p}_{r}.png"
                members.append((name, _png(image.crop(box))))
                region_docs.append(
                    {
                        "id": f"{key}-{p}-{r}",
                        "box_in_panel": list(box),
                        "box_in_figure": [box[0] + p * 100, box[1] + 8, box[2] + p * 100, box[3] + 8],
                        "caption_text": f"a {NAMES[c]} box",
                        "description": f"{NAMES[c]} square crop",
                        "kind": "marker",
                        "marker_type": None,
                        "crop": name,
                    }
                )
        figure.paste(image, (p * 100, 8))
        members.append((f"{key}.panel_{p}.png", _png(image)))
        panel_docs.append(
            {
                "id": f"{key}-{p}",
                "label": "ab"[p],
                "box": [p * 100, 8, p * 100 + 96, 72],
                "subcaption": f"panel {p} of figure {f}",
                "description": f"panel with {len(region_docs)} boxes",
                "figure_type": "chart",
                "crop": f"{key}.panel_{p}.png",
                "regions": region_docs,
            }
        )
    doc = {"key": key, "plain": False, "caption": f"figure {f} with two panels", "panels": panel_docs}
    return [(f"{key}.figure.png", _png(figure)), (f"{key}.json", json.dumps(doc).encode()), *members]


def write_snapshot(
    store: LocalObjectStore, prefix: str, n: int, *, split: str = "train", regions: bool = True
) -> None:
    """``n`` figures in shards of 3 under ``prefix/{split}/`` and a manifest like ``export_corpus``'s."""
    counts = {"figures": n, "panels": 2 * n, "regions": 4 * n if regions else 0}
    shards.write_snapshot(
        store,
        prefix,
        n,
        lambda f: _sample(f, regions),
        split=split,
        per_shard=3,
        counts=counts,
        snapshot_name=prefix.replace("/", "-"),
    )


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # steadier on a loaded machine, and bitwise repeatable
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> LocalObjectStore:
    store = LocalObjectStore(tmp_path_factory.mktemp("runner") / "objects")
    write_snapshot(store, "snap/tiny", 6)
    return store


@pytest.fixture(scope="module")
def full_run(store: LocalObjectStore) -> tuple[RunResult, list[dict[str, Any]]]:
    events: list[dict[str, Any]] = []
    result = run_training(
        store=store,
        data_prefix="snap/tiny",
        out_prefix="runs/full",
        config=tiny_cfg(),
        progress=events.append,
        **RUN,
    )
    return result, events


def _weights(store: LocalObjectStore, prefix: str) -> dict[str, torch.Tensor]:
    state = ckpt.load_latest(store, prefix)
    assert state is not None
    return state.model


def test_run_writes_checkpoints_and_the_final_model(
    store: LocalObjectStore, full_run: tuple[RunResult, list[dict[str, Any]]]
) -> None:
    result, events = full_run
    assert result.status == "completed" and result.ok and result.reason is None
    assert result.step == 6 and result.steps_run == 6 and result.resumed_from is None
    assert result.last_loss is not None and math.isfinite(result.last_loss)
    assert result.epoch >= 1  # 6 figures do not last 6 steps: the run went into a second epoch
    steps = sorted(k for k in store.list("runs/full/") if "/step-" in k)
    assert steps == ["runs/full/step-00000004.pt", "runs/full/step-00000006.pt"]  # keep the last 2
    pointer = json.loads(store.get_bytes("runs/full/latest.json"))
    assert pointer["key"] == result.checkpoint == "runs/full/step-00000006.pt" and pointer["step"] == 6
    assert [e["step"] for e in events] == [2, 4, 6]
    assert {"epoch", "losses", "samples_per_s", "eta_s"} <= set(events[-1])
    assert all(math.isfinite(v) for e in events for v in e["losses"].values())
    assert set().union(*(e["losses"] for e in events)) == {"region", "panel", "figure"}
    state = ckpt.load_latest(store, "runs/full")
    assert state is not None and state.step == 6 and state.snapshot == "snap-tiny"
    assert any(k.startswith("roi_head.") for k in state.model)
    assert any(k.startswith("logit_scales.") for k in state.model)
    # The final model is an embedding-API checkpoint with the trained CLIP weights.
    assert result.final_model == "runs/full/final-model.pt"
    spec = ModelSpec(name="tiny", architecture="custom", config=TINY, source=f"s3:{result.final_model}")
    embedding = load_model(spec, store=store)
    trained = {k[len("clip.") :]: v for k, v in state.model.items() if k.startswith("clip.")}
    for name, value in embedding.model.state_dict().items():
        assert torch.equal(value, trained[name]), name
    assert embedding.encode_texts(["a red box"]).shape == (1, 32)


def test_stop_then_resume_reaches_the_same_weights(
    store: LocalObjectStore, full_run: tuple[RunResult, list[dict[str, Any]]]
) -> None:
    calls = {"n": 0}

    def stop_after_three() -> bool:
        calls["n"] += 1
        return calls["n"] >= 3

    first = run_training(
        store=store,
        data_prefix="snap/tiny",
        out_prefix="runs/resumed",
        config=tiny_cfg(),
        should_stop=stop_after_three,
        **RUN,
    )
    assert first.status == "stopped" and first.step == 3
    assert first.checkpoint == "runs/resumed/step-00000003.pt"  # written on stop (not a multiple of 2)
    assert not store.exists("runs/resumed/final-model.pt")
    second = run_training(
        store=store, data_prefix="snap/tiny", out_prefix="runs/resumed", config=tiny_cfg(), **RUN
    )
    assert second.status == "completed" and second.resumed_from == 3
    assert second.step == 6 and second.steps_run == 3 and second.epoch == full_run[0].epoch
    resumed, full = _weights(store, "runs/resumed"), _weights(store, "runs/full")
    assert resumed.keys() == full.keys()
    for name in full:
        assert torch.equal(resumed[name], full[name]), name
    # A finished run resumed again does no more steps and re-exports the final model.
    again = run_training(
        store=store, data_prefix="snap/tiny", out_prefix="runs/resumed", config=tiny_cfg(), **RUN
    )
    assert again.status == "completed" and again.steps_run == 0 and again.step == 6


def test_a_checkpoint_of_another_config_is_refused(
    store: LocalObjectStore, full_run: tuple[RunResult, list[dict[str, Any]]]
) -> None:
    pointer = store.get_bytes("runs/full/latest.json")
    other_model = {**TINY, "embed_dim": 16}
    with pytest.raises(ckpt.CheckpointMismatch, match=r"another run configuration.*model\.config\.embed_dim"):
        run_training(
            store=store,
            data_prefix="snap/tiny",
            out_prefix="runs/full",
            config=tiny_cfg(model={"name": "tiny", "config": other_model}),
            **RUN,
        )
    with pytest.raises(ckpt.CheckpointMismatch, match="seed"):
        run_training(
            store=store, data_prefix="snap/tiny", out_prefix="runs/full", config=tiny_cfg(seed=1), **RUN
        )
    write_snapshot(store, "snap/other", 6)
    with pytest.raises(ckpt.CheckpointMismatch, match="data snapshot"):
        run_training(store=store, data_prefix="snap/other", out_prefix="runs/full", config=tiny_cfg(), **RUN)
    assert store.get_bytes("runs/full/latest.json") == pointer  # nothing was trained or written


def test_bad_data_raises_before_training(store: LocalObjectStore) -> None:
    write_snapshot(store, "snap/val-only", 3, split="val")
    with pytest.raises(TrainingDataError, match="split train has no samples"):
        run_training(store=store, data_prefix="snap/val-only", out_prefix="runs/x", config=tiny_cfg(), **RUN)
    with pytest.raises(TrainingDataError, match=r"fewer than one figure batch \(batch_sizes.figure=8\)"):
        run_training(
            store=store,
            data_prefix="snap/tiny",
            out_prefix="runs/x",
            config=tiny_cfg(batch_sizes={"figure": 8, "panel": 3, "region": 4}),
            **RUN,
        )
    write_snapshot(store, "snap/no-regions", 4, regions=False)
    with pytest.raises(TrainingDataError, match="has no regions but the config trains the region level"):
        run_training(
            store=store, data_prefix="snap/no-regions", out_prefix="runs/x", config=tiny_cfg(), **RUN
        )
    assert not list(store.list("runs/x/"))


def test_non_finite_loss_fails_and_keeps_the_last_good_checkpoint(
    store: LocalObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = HierarchicalCLIP.loss
    calls = {"n": 0}

    def loss(self: HierarchicalCLIP, batch: Any, level: str, cfg: TrainConfig) -> Any:
        total, parts = original(self, batch, level, cfg)
        calls["n"] += 1
        if calls["n"] >= 3:
            return total * float("nan"), {**parts, "total": float("nan")}
        return total, parts

    monkeypatch.setattr(HierarchicalCLIP, "loss", loss)
    result = run_training(
        store=store, data_prefix="snap/tiny", out_prefix="runs/nan", config=tiny_cfg(), **RUN
    )
    assert result.status == "failed" and not result.ok and result.step == 2
    assert result.reason is not None and "non-finite loss" in result.reason
    assert result.checkpoint == "runs/nan/step-00000002.pt" and result.final_model is None
    assert json.loads(store.get_bytes("runs/nan/latest.json"))["step"] == 2
    assert not store.exists("runs/nan/final-model.pt")


def test_entry_point(store: LocalObjectStore, tmp_path: Path) -> None:
    env_python = sys.executable
    out = subprocess.run(
        [env_python, "-m", "p2p.training", "--help"], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert "--config" in out.stdout and "--store" in out.stdout and "--checkpoint-every" in out.stdout

    from p2p.training.__main__ import main

    config = tmp_path / "run.json"
    config.write_text(tiny_cfg(max_steps=2).model_dump_json())
    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    try:
        args = [
            "--config",
            str(config),
            "--data",
            "snap/tiny",
            "--out",
            "runs/cli",
            "--store",
            str(store.root),
        ]
        assert main([*args, "--checkpoint-every", "1", "--shuffle-buffer", "0"]) == 0
        bad = tmp_path / "bad.json"
        bad.write_text(json.dumps({"lrs": 1}))
        assert main(["--config", str(bad), "--data", "snap/tiny", "--out", "runs/cli2"]) == 2
    finally:
        signal.signal(signal.SIGINT, handlers[0])
        signal.signal(signal.SIGTERM, handlers[1])
    assert json.loads(store.get_bytes("runs/cli/latest.json"))["step"] == 2
    assert store.exists("runs/cli/final-model.pt")


def test_a_save_clears_what_a_killed_save_of_the_same_run_left_in_staging(
    store: LocalObjectStore, full_run: tuple[RunResult, list[dict[str, Any]]]
) -> None:
    state = ckpt.load_latest(store, "runs/full")
    assert state is not None
    folder = ckpt.staging_dir("runs/staged")
    folder.mkdir(parents=True, exist_ok=True)
    stale = folder / ".step-00000004.pt.abc123.tmp"  # what a SIGKILL during torch.save leaves
    stale.write_bytes(b"half a checkpoint")
    other_run = ckpt.staging_dir("runs/other")
    assert other_run != folder
    key = ckpt.save_checkpoint(store, "runs/staged", state, keep=2)
    assert key == "runs/staged/step-00000006.pt" and store.exists(key)
    assert list(folder.iterdir()) == []  # the stale file and the save's own staging file are gone


def test_torchrun_trains_on_two_cpu_ranks_with_gloo(store: LocalObjectStore, tmp_path: Path) -> None:
    """The same entry point under torchrun: two ranks join a gloo group, split the data, average
    gradients, and rank 0 alone reports and writes checkpoints and the final model."""
    config = tmp_path / "run.json"
    config.write_text(tiny_cfg(max_steps=4).model_dump_json())
    command = [
        *(sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"),
        *("-m", "p2p.training", "--config", str(config), "--data", "snap/tiny", "--out", "runs/ddp"),
        *("--store", str(store.root), "--checkpoint-every", "2", "--progress-every", "1"),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith('{"event"')]
    assert [e["step"] for e in events if e["event"] == "progress"] == [1, 2, 3, 4]  # rank 0 only
    (result,) = [e for e in events if e["event"] == "result"]
    assert result["status"] == "completed" and result["step"] == 4
    assert result["final_model"] == "runs/ddp/final-model.pt" and store.exists(result["final_model"])
    state = ckpt.load_latest(store, "runs/ddp")
    assert state is not None and state.step == 4
