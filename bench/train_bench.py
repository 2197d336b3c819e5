"""Hierarchical CLIP training (``p2p.training``): step cost, resume after a kill, memory across epochs.

Machines are noisy and shared, so every number that is compared is compared with a reference
measured in the same run (ratios hold, absolute times do not). Nothing here asserts on timing.

1. Step cost, in this process, with ``--threads`` torch threads. One in-memory batch of synthetic
   figures (2-3 panels each, 1-3 regions per panel) is trained at every step kind, interleaved
   round by round (the order rotates each round), the first round is warm-up and left out, medians
   are reported:

   ``mixed``   every level and every objective (intra-level CLIP, fine ROI alignment, inter-level);
   ``flat``    the plain CLIP baseline: one CLIP loss over every image-text pair of the same batch;
   ``region`` / ``panel`` / ``figure``   the alternating schedule's steps (each with its objectives);
   ``flat_panel_region`` / ``flat_figure_panel``   plain CLIP over the pairs those level steps
               encode (the batch without its figures / without its regions), their reference.

   For (a) the default model (frozen MiniLM text tower + small random ViT 224/32, width 256, 4 layers)
   and (b) open_clip ``ViT-B-32``, random init, text tower frozen, last 5 vision blocks trainable.
   Target: hierarchical / plain <= 1.5x.

2. Resume after a kill. A synthetic snapshot (WebDataset shards + manifest, written with
   ``tests.shards.write_snapshot``) goes into a temp ``LocalObjectStore``; ``python -m p2p.training``
   runs once uninterrupted (the reference), then per trial it is started, SIGKILLed at a random
   point after a few checkpoints (a random step, then a random fraction of a step later), and
   started again with the same ``--out``. Steps lost = the last step the killed run reported minus
   the step the second run resumed from (target: <= ``--checkpoint-every``). The trial's final
   checkpoint (model and optimizer tensors) is compared with the reference's: the runner claims a
   resumed run ends bitwise identical to an uninterrupted one.

3. Memory across epochs: the reference run of (2) trains ``--epochs`` epochs; its RSS is sampled
   from outside every 0.1 s (psutil) and read at the end of each epoch (right after the epoch's last
   progress line). Target: flat from epoch 2 on (growth < 5 % or < 50 MB).

4. Frozen text tower, first epoch (``--skip texts`` to leave out): the texts of ``--text-figures``
   ``p2p synth`` figures (captions, subcaptions, marker texts) in batches of 8 figures, encoded
   each alone (the reference: what the trainer did before) and by ``encode_texts`` (a batch's new
   texts together, in chunks of similar length), alternating, a fresh cache each round.

    .venv/bin/python bench/train_bench.py [--quick] [--threads 2] [--out bench/results/train.json]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import hashlib
import io
import itertools
import json
import os
import platform
import queue
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import psutil
import torch
from abba import interleave, machine_record, summary_line
from PIL import Image, ImageDraw

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # ``tests.shards`` lives in the repository, not in the installed package
    sys.path.insert(0, str(ROOT))

from p2p.shared.storage import LocalObjectStore  # noqa: E402
from p2p.training import checkpoints as ckpt  # noqa: E402
from p2p.training.batch import FigureSample, HierBatch, PanelSample, RegionSample, collate  # noqa: E402
from p2p.training.config import TrainConfig, load_config  # noqa: E402
from p2p.training.hierarchy import build_model  # noqa: E402
from p2p.training.optim import build_optimizer  # noqa: E402
from p2p.training.step import train_step  # noqa: E402
from tests.shards import write_snapshot  # noqa: E402

SEED = 20_261_122
COLOURS = {
    "crimson": (200, 20, 60),
    "teal": (0, 128, 128),
    "amber": (255, 191, 0),
    "indigo": (75, 0, 130),
    "olive": (128, 128, 0),
    "coral": (255, 127, 80),
    "navy": (0, 0, 128),
    "lime": (50, 205, 50),
}
SHAPES = ("square", "disc", "bar")
FIGURE_TYPES = ("microscopy", "chart", "blot", "diagram")
PANEL_SIZE = (88, 72)  # small images: the model resizes every image to its input size anyway
LEVEL_KINDS = ("mixed", "flat", "region", "panel", "figure", "flat_panel_region", "flat_figure_panel")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def load() -> list[float]:
    return [round(v, 2) for v in os.getloadavg()]


def training_code_fingerprint() -> str:
    """sha256 over ``services/training/*.py``: the children import the code when they start, so a run
    whose code changed between two child processes compares two versions (reported, not hidden)."""
    digest = hashlib.sha256()
    for path in sorted((ROOT / "services" / "training").glob("*.py")):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


# --- synthetic figures ------------------------------------------------------------------------


@dataclasses.dataclass
class SyntheticRegion:
    box: tuple[int, int, int, int]  # in panel pixels
    colour: str
    shape: str


@dataclasses.dataclass
class SyntheticPanel:
    image: Image.Image
    figure_type: str
    regions: list[SyntheticRegion]


@dataclasses.dataclass
class SyntheticFigure:
    index: int
    image: Image.Image
    panels: list[SyntheticPanel]

    @property
    def caption(self) -> str:
        kinds = ", ".join(f"({chr(97 + p)}) {panel.figure_type}" for p, panel in enumerate(self.panels))
        return f"Figure {self.index}: {len(self.panels)} panels: {kinds}."


def make_figure(index: int) -> SyntheticFigure:
    """2-3 panels side by side, each with 1-3 coloured shapes (the regions), seeded by ``index``."""
    rng = random.Random(SEED * 1_000 + index)
    width, height = PANEL_SIZE
    panels = []
    for _ in range(rng.randint(2, 3)):
        image = Image.new("RGB", PANEL_SIZE, (255, 255, 255))
        draw = ImageDraw.Draw(image)
        regions = []
        n_regions = rng.randint(1, 3)
        slot = width // n_regions
        for r in range(n_regions):
            colour, shape = rng.choice(list(COLOURS)), rng.choice(SHAPES)
            x0 = r * slot + rng.randint(1, 4)
            y0 = rng.randint(4, 20)
            box = (x0, y0, x0 + slot - 6, min(y0 + rng.randint(24, 44), height - 2))
            if shape == "disc":
                draw.ellipse(box, fill=COLOURS[colour])
            elif shape == "bar":
                draw.rectangle((box[0], (box[1] + box[3]) // 2, box[2], box[3]), fill=COLOURS[colour])
            else:
                draw.rectangle(box, fill=COLOURS[colour])
            regions.append(SyntheticRegion(box, colour, shape))
        panels.append(SyntheticPanel(image, rng.choice(FIGURE_TYPES), regions))
    figure = Image.new("RGB", (len(panels) * (width + 8) + 8, height + 16), (245, 245, 245))
    for p, panel in enumerate(panels):
        figure.paste(panel.image, (8 + p * (width + 8), 8))
    return SyntheticFigure(index, figure, panels)


def region_caption(region: SyntheticRegion) -> str:
    return f"the {region.colour} {region.shape}"


def to_figure_sample(figure: SyntheticFigure) -> FigureSample:
    return FigureSample(
        figure_image=figure.image,
        caption=figure.caption,
        panels=[
            PanelSample(
                image=panel.image,
                subcaption=f"({chr(97 + p)}) a {panel.figure_type} with {len(panel.regions)} marks",
                description=f"{panel.figure_type} panel",
                regions=[
                    RegionSample(
                        image=panel.image.crop(region.box),
                        box_in_panel=(
                            float(region.box[0]),
                            float(region.box[1]),
                            float(region.box[2]),
                            float(region.box[3]),
                        ),
                        caption_text=region_caption(region),
                        description=f"{region.colour} {region.shape} crop",
                    )
                    for region in panel.regions
                ],
            )
            for p, panel in enumerate(figure.panels)
        ],
    )


def _png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def export_members(figure: SyntheticFigure) -> list[tuple[str, bytes]]:
    """One figure as the tar members ``export_corpus`` writes (figure, crops, the json document)."""
    key = f"bench{figure.index:05d}"
    width, _ = PANEL_SIZE
    members: list[tuple[str, bytes]] = [(f"{key}.figure.png", _png(figure.image))]
    panel_docs = []
    for p, panel in enumerate(figure.panels):
        px, py = 8 + p * (width + 8), 8
        region_docs = []
        for r, region in enumerate(panel.regions):
            crop = f"{key}.region_{p}_{r}.png"
            members.append((crop, _png(panel.image.crop(region.box))))
            x0, y0, x1, y1 = region.box
            region_docs.append(
                {
                    "id": f"{key}-{p}-{r}",
                    "box_in_panel": [x0, y0, x1, y1],
                    "box_in_figure": [x0 + px, y0 + py, x1 + px, y1 + py],
                    "caption_text": region_caption(region),
                    "description": f"{region.colour} {region.shape} crop",
                    "kind": "marker",
                    "marker_type": None,
                    "crop": crop,
                }
            )
        crop = f"{key}.panel_{p}.png"
        members.append((crop, _png(panel.image)))
        panel_docs.append(
            {
                "id": f"{key}-{p}",
                "label": chr(97 + p),
                "box": [px, py, px + panel.image.width, py + panel.image.height],
                "subcaption": f"({chr(97 + p)}) a {panel.figure_type} with {len(panel.regions)} marks",
                "description": f"{panel.figure_type} panel",
                "figure_type": panel.figure_type,
                "crop": crop,
                "regions": region_docs,
            }
        )
    doc = {"key": key, "plain": False, "caption": figure.caption, "panels": panel_docs}
    members.append((f"{key}.json", json.dumps(doc).encode()))
    return members


def write_bench_snapshot(store: LocalObjectStore, prefix: str, n_figures: int) -> dict[str, int]:
    figures = [make_figure(i) for i in range(n_figures)]
    counts = {
        "figures": n_figures,
        "panels": sum(len(f.panels) for f in figures),
        "regions": sum(len(p.regions) for f in figures for p in f.panels),
    }
    write_snapshot(
        store,
        prefix,
        n_figures,
        lambda i: export_members(figures[i]),
        split="train",
        per_shard=4,
        counts=counts,
        snapshot_name="train-bench",
    )
    return counts


# --- 1. step cost -----------------------------------------------------------------------------


def without_figures(batch: HierBatch) -> HierBatch:
    """The panel + region pairs only (what the region and panel steps encode)."""
    size = batch.figure_images.shape[-1]
    return dataclasses.replace(batch, figure_images=torch.zeros((0, 3, size, size)), figure_texts=[])


def without_regions(batch: HierBatch) -> HierBatch:
    """The figure + panel pairs only (what the figure step encodes)."""
    size = batch.region_images.shape[-1]
    return dataclasses.replace(
        batch,
        region_images=torch.zeros((0, 3, size, size)),
        region_captions=[],
        region_descriptions=[],
        region_panel=torch.zeros((0,), dtype=torch.long),
        region_boxes=torch.zeros((0, 4)),
    )


def step_cost(label: str, config: TrainConfig, n_figures: int, rounds: int) -> dict[str, Any]:
    """Every step kind of LEVEL_KINDS on one batch, interleaved; round 0 is warm-up."""
    started = time.perf_counter()
    code = training_code_fingerprint()  # this process imported the code once, at its start
    model = build_model(config)
    optimizer = build_optimizer(model, config)
    build_s = time.perf_counter() - started
    samples = [to_figure_sample(make_figure(i)) for i in range(n_figures)]
    batch = collate(samples, image_size=model.image_size).to(config.device)
    n_fig, n_pan, n_reg = batch.sizes
    # Which (level, batch) each kind trains and how many image-text pairs it encodes.
    plan: dict[str, tuple[str, HierBatch, int]] = {
        "mixed": ("mixed", batch, n_fig + n_pan + n_reg),
        "flat": ("flat", batch, n_fig + n_pan + n_reg),
        "region": ("region", batch, n_pan + n_reg),
        "panel": ("panel", batch, n_pan + n_reg),
        "figure": ("figure", batch, n_fig + n_pan),
        "flat_panel_region": ("flat", without_figures(batch), n_pan + n_reg),
        "flat_figure_panel": ("flat", without_regions(batch), n_fig + n_pan),
    }
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    blocks = list(cast(Any, model.clip).visual.transformer.resblocks)
    trainable_blocks = sum(any(p.requires_grad for p in block.parameters()) for block in blocks)
    total = sum(p.numel() for p in model.parameters())
    log(
        f"[{label}] batch {n_fig} figures / {n_pan} panels / {n_reg} regions; "
        f"{trainable / 1e6:.1f}M of {total / 1e6:.1f}M parameters train ({trainable_blocks} of "
        f"{len(blocks)} vision blocks, train_last_vision_blocks={config.train_last_vision_blocks}); "
        f"built in {build_s:.1f} s"
    )
    times: dict[str, list[float]] = {kind: [] for kind in LEVEL_KINDS}
    paired: dict[str, list[float]] = {"mixed/flat": [], "cycle/flat_same_pairs": []}
    load_before = load()
    for round_index in range(rounds + 1):
        shift = round_index % len(LEVEL_KINDS)
        order = LEVEL_KINDS[shift:] + LEVEL_KINDS[:shift]  # rotating: no kind always runs first
        this_round: dict[str, float] = {}
        for kind in order:
            level, kind_batch, _ = plan[kind]
            start = time.perf_counter()
            train_step(model, optimizer, None, kind_batch, level, config)
            this_round[kind] = time.perf_counter() - start
        if round_index == 0:
            log(f"[{label}] warm-up round: " + ", ".join(f"{k} {v:.2f}s" for k, v in this_round.items()))
            continue
        for kind, seconds in this_round.items():
            times[kind].append(seconds)
        paired["mixed/flat"].append(this_round["mixed"] / this_round["flat"])
        cycle = this_round["region"] + this_round["panel"] + this_round["figure"]
        cycle_ref = 2 * this_round["flat_panel_region"] + this_round["flat_figure_panel"]
        paired["cycle/flat_same_pairs"].append(cycle / cycle_ref)
        log(f"[{label}] round {round_index}: " + ", ".join(f"{k} {v:.2f}s" for k, v in this_round.items()))
    med = {kind: median(v) for kind, v in times.items()}
    kinds = {
        kind: {
            "level": plan[kind][0],
            "pairs": plan[kind][2],
            "median_s": round(med[kind], 3),
            "min_s": round(min(times[kind]), 3),
            "max_s": round(max(times[kind]), 3),
            "pairs_per_s": round(plan[kind][2] / med[kind], 2),
        }
        for kind in LEVEL_KINDS
    }
    for kind in ("mixed", "flat"):
        kinds[kind]["figures_per_s"] = round(n_fig / med[kind], 3)
    cycle_s = med["region"] + med["panel"] + med["figure"]
    cycle_ref_s = 2 * med["flat_panel_region"] + med["flat_figure_panel"]
    result = {
        "label": label,
        "model": config.model.model_dump(mode="json"),
        "threads": torch.get_num_threads(),
        "batch": {"figures": n_fig, "panels": n_pan, "regions": n_reg, "pairs": n_fig + n_pan + n_reg},
        "parameters": {
            "trainable": trainable,
            "total": total,
            "trainable_vision_blocks": trainable_blocks,
            "vision_blocks": len(blocks),
            "train_last_vision_blocks": config.train_last_vision_blocks,
        },
        "build_s": round(build_s, 2),
        "measured_rounds": rounds,
        "steps": kinds,
        "ratios": {
            "mixed_over_flat": round(med["mixed"] / med["flat"], 3),
            "mixed_over_flat_paired_median": round(median(paired["mixed/flat"]), 3),
            "region_over_flat_panel_region": round(med["region"] / med["flat_panel_region"], 3),
            "panel_over_flat_panel_region": round(med["panel"] / med["flat_panel_region"], 3),
            "figure_over_flat_figure_panel": round(med["figure"] / med["flat_figure_panel"], 3),
            "alternating_cycle_over_flat_same_pairs": round(cycle_s / cycle_ref_s, 3),
            "alternating_cycle_paired_median": round(median(paired["cycle/flat_same_pairs"]), 3),
        },
        "load_before": load_before,
        "load_after": load(),
        "training_code": code,
        "training_code_changed_during_measurement": training_code_fingerprint() != code,
    }
    del model, optimizer, batch
    gc.collect()
    return result


# --- 2 + 3. subprocess runs: resume after a kill, memory across epochs ------------------------


class TrainingProcess:
    """``python -m p2p.training`` as a child: progress lines on a queue, RSS sampled every 0.1 s."""

    def __init__(self, args: list[str], env: dict[str, str], stderr_path: Path) -> None:
        self.stderr = stderr_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "p2p.training", *args],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
        )
        self.started = time.monotonic()
        self.code = training_code_fingerprint()
        self.lines: queue.Queue[tuple[float, dict[str, Any]] | None] = queue.Queue()
        self.rss: list[tuple[float, int]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._reader.start()
        self._sampler.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            line = line.strip()
            if line.startswith("{"):
                with contextlib.suppress(json.JSONDecodeError):  # a log line that looks like JSON
                    self.lines.put((time.monotonic(), json.loads(line)))
        self.lines.put(None)  # end of output

    def _sample(self) -> None:
        try:
            child = psutil.Process(self.proc.pid)
            while self.proc.poll() is None:
                self.rss.append((time.monotonic(), child.memory_info().rss))
                time.sleep(0.1)
        except psutil.Error:  # the child is gone
            return

    def events(self, timeout: float) -> Any:
        """Yield (time, event) until the output ends; raise TimeoutError when the child goes silent."""
        while True:
            try:
                item = self.lines.get(timeout=timeout)
            except queue.Empty as exc:
                raise TimeoutError(f"no output from the training process for {timeout:.0f} s") from exc
            if item is None:
                return
            yield item

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)

    def wait(self) -> int:
        code = self.proc.wait(timeout=120)
        self._reader.join(timeout=10)
        self._sampler.join(timeout=10)
        self.stderr.close()
        return code


def child_env(threads: int, tmp_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    # checkpoints.save_checkpoint stages each checkpoint in the system temp folder; a killed run
    # leaves its staging file behind, so the children get a temp folder of their own to count them in.
    env["TMPDIR"] = str(tmp_dir)
    # Same thread count in every run: CPU kernels are only bitwise repeatable at a fixed thread count.
    env["OMP_NUM_THREADS"] = str(threads)
    env["MKL_NUM_THREADS"] = str(threads)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_args(config_path: Path, store_root: Path, data: str, out: str, checkpoint_every: int) -> list[str]:
    return [
        "--config",
        str(config_path),
        "--data",
        data,
        "--out",
        out,
        "--store",
        str(store_root),
        "--checkpoint-every",
        str(checkpoint_every),
        "--progress-every",
        "1",
    ]


def run_to_end(
    args: list[str], env: dict[str, str], stderr_path: Path, timeout: float
) -> tuple[list[tuple[float, dict[str, Any]]], dict[str, Any] | None, TrainingProcess]:
    child = TrainingProcess(args, env, stderr_path)
    events: list[tuple[float, dict[str, Any]]] = []
    result = None
    try:
        for at, event in child.events(timeout):
            events.append((at, event))
            if event.get("event") == "result":
                result = event
    finally:
        child.kill()  # only if it is still running (a timeout)
        child.wait()
    return events, result, child


def memory_per_epoch(
    events: list[tuple[float, dict[str, Any]]], rss: list[tuple[float, int]]
) -> list[dict[str, Any]]:
    """RSS right after each epoch's last progress line, and the peak while the epoch ran."""
    progress = [(at, e) for at, e in events if e.get("event") == "progress"]
    by_epoch: dict[int, list[tuple[float, int]]] = {}
    for at, event in progress:
        by_epoch.setdefault(int(event["epoch"]), []).append((at, int(event["step"])))
    rows = []
    previous_end = rss[0][0] if rss else 0.0
    for epoch in sorted(by_epoch):
        first_at, last_at = by_epoch[epoch][0][0], by_epoch[epoch][-1][0]
        after = [value for at, value in rss if at >= last_at]
        during = [value for at, value in rss if previous_end <= at <= last_at]
        if not after:
            continue
        rows.append(
            {
                "epoch": epoch,
                "steps": [by_epoch[epoch][0][1], by_epoch[epoch][-1][1]],
                "seconds": round(last_at - first_at, 1),
                "rss_end_mb": round(after[0] / 2**20, 1),
                "rss_peak_mb": round(max(during or after[:1]) / 2**20, 1),
            }
        )
        previous_end = last_at
    return rows


def compare_states(reference: ckpt.TrainState, other: ckpt.TrainState) -> dict[str, Any]:
    """How many model and optimizer tensors differ, and by how much (0 everywhere when bitwise equal)."""

    def tensors(state: Any, prefix: str = "") -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        if isinstance(state, torch.Tensor):
            out[prefix] = state
        elif isinstance(state, dict):
            for key, value in state.items():
                out.update(tensors(value, f"{prefix}.{key}" if prefix else str(key)))
        elif isinstance(state, list | tuple):
            for index, value in enumerate(state):
                out.update(tensors(value, f"{prefix}[{index}]"))
        return out

    report: dict[str, Any] = {"step_reference": reference.step, "step_resumed": other.step}
    for part in ("model", "optimizer"):
        ref, got = tensors(getattr(reference, part)), tensors(getattr(other, part))
        differing = [
            name
            for name in ref
            if name not in got or ref[name].shape != got[name].shape or not torch.equal(ref[name], got[name])
        ]
        max_diff = 0.0
        for name in differing:
            if name in got and ref[name].shape == got[name].shape and ref[name].is_floating_point():
                max_diff = max(max_diff, float((ref[name] - got[name]).abs().max()))
        report[part] = {
            "tensors": len(ref),
            "missing_or_extra": len(set(ref) ^ set(got)),
            "differing": len(differing),
            "differing_examples": differing[:5],
            "max_abs_diff": max_diff,
        }
    report["bitwise_equal"] = report["model"]["differing"] == 0 and report["optimizer"]["differing"] == 0
    return report


def resume_and_memory(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    store_root = work / "objects"
    store = LocalObjectStore(store_root)
    counts = write_bench_snapshot(store, "snap/bench", args.figures)
    config = load_config(
        {
            "batch_sizes": {"figure": 2, "panel": 4, "region": 8},
            "epochs": args.epochs,
            "warmup_steps": 2,
            # Larger than the default rates so the weights move visibly between steps.
            "lr": {"shared": 1e-4, "bbox_head": 1e-4, "fine": 1e-4, "coarse": 1e-4},
        }
    )
    config_path = work / "train.json"
    config_path.write_text(config.model_dump_json())
    child_tmp = work / "tmp"
    child_tmp.mkdir()
    env = child_env(args.threads, child_tmp)
    every = args.checkpoint_every
    log(f"snapshot: {counts}; config: alternating R/P/M, batch sizes 2/4/8, {args.epochs} epochs")

    # The uninterrupted reference run; its RSS is the memory measurement (3).
    load_before = load()
    events, result, child = run_to_end(
        run_args(config_path, store_root, "snap/bench", "runs/reference", every),
        env,
        work / "reference.stderr",
        timeout=300,
    )
    if result is None or result.get("status") != "completed":
        tail = (work / "reference.stderr").read_text()[-2000:]
        raise RuntimeError(f"the reference run did not complete: {result}\n{tail}")
    total_steps = int(result["step"])
    fingerprints = {"reference": child.code}
    step_times = [
        b[0] - a[0]
        for a, b in itertools.pairwise(events)
        if a[1].get("event") == b[1].get("event") == "progress"
    ]
    step_s = median(step_times) if step_times else 1.0
    epochs = memory_per_epoch(events, child.rss)
    log(f"reference: {total_steps} steps, {step_s:.2f} s/step (checkpoints included)")
    for epoch_row in epochs:
        log(
            f"  epoch {epoch_row['epoch']}: RSS {epoch_row['rss_end_mb']} MB at its end, "
            f"peak {epoch_row['rss_peak_mb']} MB"
        )
    memory: dict[str, Any] = {"epochs": epochs, "load_before": load_before, "load_after": load()}
    if len(epochs) >= 3:
        second, last = epochs[1], epochs[-1]
        growth = last["rss_end_mb"] - second["rss_end_mb"]
        memory["growth_epoch2_to_last_mb"] = round(growth, 1)
        memory["growth_epoch2_to_last_pct"] = round(100 * growth / second["rss_end_mb"], 2)
        peak_growth = last["rss_peak_mb"] - second["rss_peak_mb"]
        memory["peak_growth_epoch2_to_last_mb"] = round(peak_growth, 1)
        memory["flat"] = growth < 50 or growth / second["rss_end_mb"] < 0.05
    reference = ckpt.load_latest(store, "runs/reference")
    assert reference is not None

    rng = random.Random(SEED)
    trials = []
    for trial in range(args.trials):
        out = f"runs/trial-{trial}"
        # A random step after at least two checkpoints and before the end, then a random part of a step.
        kill_after_step = rng.randint(2 * every + 1, max(2 * every + 1, total_steps - 2))
        delay = rng.uniform(0.0, 1.0) * step_s
        child = TrainingProcess(
            run_args(config_path, store_root, "snap/bench", out, every), env, work / f"{out[5:]}.stderr"
        )
        last_reported = 0
        killed_at: float | None = None
        try:
            for at, event in child.events(timeout=300):
                if event.get("event") == "progress":
                    last_reported = max(last_reported, int(event["step"]))
                if killed_at is None and last_reported >= kill_after_step:
                    time.sleep(delay)
                    child.kill()
                    killed_at = at + delay
        finally:
            child.kill()
            code = child.wait()
        pointer = ckpt.read_pointer(store, out)
        orphans = sorted(child_tmp.glob(".step-*.tmp"))
        upload_orphans = [path for path in store_root.rglob(".upload-*") if path.is_file()]
        orphan_bytes = sum(path.stat().st_size for path in orphans)
        for path in orphans:  # counted per trial
            path.unlink()
        committed = int(pointer["step"]) if pointer else 0
        fingerprints[f"trial-{trial}-killed"] = child.code
        events, result, resumed_child = run_to_end(
            run_args(config_path, store_root, "snap/bench", out, every),
            env,
            work / f"{out[5:]}-resumed.stderr",
            timeout=300,
        )
        fingerprints[f"trial-{trial}-resumed"] = resumed_child.code
        first_progress = next((e["step"] for _, e in events if e.get("event") == "progress"), None)
        resumed_from = result.get("resumed_from") if result else None
        row: dict[str, Any] = {
            "trial": trial,
            "kill_after_step": kill_after_step,
            "kill_delay_s": round(delay, 2),
            "killed_exit_code": code,
            "orphaned_staging_files": len(orphans),
            "orphaned_staging_mb": round(orphan_bytes / 2**20, 1),
            "orphaned_store_uploads": len(upload_orphans),
            "last_reported_step": last_reported,
            "latest_json_step_after_kill": committed,
            "resumed_from": resumed_from,
            "first_resumed_progress_step": first_progress,
            "steps_lost": None if resumed_from is None else last_reported - int(resumed_from),
            "resumed_status": result.get("status") if result else None,
            "final_step": result.get("step") if result else None,
        }
        state = ckpt.load_latest(store, out)
        if state is not None and result is not None and result.get("status") == "completed":
            row["final_vs_uninterrupted"] = compare_states(reference, state)
        trials.append(row)
        log(
            f"trial {trial}: killed after step {last_reported} (+{delay:.2f} s), latest.json step "
            f"{committed}, resumed from {resumed_from}, lost {row['steps_lost']} "
            f"(interval {every}); bitwise equal: {row.get('final_vs_uninterrupted', {}).get('bitwise_equal')}"
        )
    lost = [t["steps_lost"] for t in trials if t["steps_lost"] is not None]
    resume = {
        "checkpoint_every": every,
        "total_steps": total_steps,
        "median_step_s": round(step_s, 3),
        "trials": trials,
        "max_steps_lost": max(lost) if lost else None,
        "all_within_one_interval": bool(lost) and max(lost) <= every and len(lost) == len(trials),
        "training_code": fingerprints,
        "same_code_in_every_run": len(set(fingerprints.values())) == 1,
        "all_bitwise_equal": bool(trials)
        and all(t.get("final_vs_uninterrupted", {}).get("bitwise_equal") for t in trials),
    }
    return {
        "snapshot_counts": counts,
        "config": config.model_dump(mode="json"),
        "resume": resume,
        "memory": memory,
    }


# --- main -------------------------------------------------------------------------------------


def synthetic_text_batches(n_figures: int, per_batch: int) -> list[list[str]]:
    """The texts training meets, batch by batch: ``p2p synth`` captions (with their preamble),
    subcaptions and marker texts of ``n_figures`` figures, ``per_batch`` figures per batch."""
    from p2p.mining.lab.synth import generate_figure

    batches: list[list[str]] = []
    for start in range(0, n_figures, per_batch):
        texts: list[str] = []
        for index in range(start, min(start + per_batch, n_figures)):
            _, truth = generate_figure(SEED * 1_000 + index)
            texts.append(truth["caption"])
            texts += [v for k, v in truth["subcaptions"].items() if k != "preamble" and v]
            texts += [m["text"] for m in truth["markers"] if m.get("text")]
        batches.append(texts)
    return batches


def text_encoding(n_figures: int, rounds: int) -> dict[str, Any]:
    """First-epoch cost of the frozen text tower: every new text encoded alone (the reference,
    what the trainer did before) against ``HierarchicalCLIP.encode_texts`` (a batch's new texts
    together, in chunks of similar length), on the same texts, A B B A (``abba``), a fresh cache
    each slice. The speed-up is the median of the per-round ratios; CPU seconds per text beside."""
    from p2p.models.modeling import trim_padding

    batches = synthetic_text_batches(n_figures, per_batch=8)
    unique = len({t for batch in batches for t in batch})
    model = build_model(load_config({}))
    clip: Any = model.clip

    def chunked() -> int:
        model.load_text_cache(None)
        with torch.no_grad():
            for batch in batches:
                model.encode_texts(batch)
        return unique

    def alone() -> int:
        model.load_text_cache(None)
        seen: set[str] = set()
        with torch.no_grad():
            for batch in batches:
                for text in dict.fromkeys(batch):
                    if text not in seen:
                        seen.add(text)
                        clip.encode_text(trim_padding(clip, model.tokenizer([text])))
        return unique

    def progress(round_: int, side: str) -> None:
        log(f"[texts] round {round_}: {side}")

    result = interleave(chunked, alone, rounds=rounds, between=progress)
    record = result.as_dict()
    log(f"[texts] {summary_line('batched / one by one', result)}")
    return {
        "figures": n_figures,
        "unique_texts": unique,
        "seconds": {
            "alone": [r["wall_s"] for r in record["reference"]["rounds"]],
            "chunked": [r["wall_s"] for r in record["product"]["rounds"]],
        },
        "texts_per_s": {
            "alone": record["reference"]["items_per_s"],
            "chunked": record["product"]["items_per_s"],
        },
        "cpu_s_per_text": {
            "alone": record["reference"]["cpu_s_per_item"],
            "chunked": record["product"]["cpu_s_per_item"],
        },
        "speedup": result.median_ratio,
        "speedup_spread": record["ratio_product_over_reference"],
        "abba": record,
        "machine": machine_record(),
    }


def machine() -> dict[str, Any]:
    return {
        "nproc": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="a fast smoke run: few steps, default model only"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "train.json")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (here and in the child runs)")
    parser.add_argument("--rounds", type=int, help="measured rounds of step kinds (default 5, ViT-B-32 3)")
    parser.add_argument("--figures", type=int, default=12, help="figures in the resume/memory snapshot")
    parser.add_argument("--epochs", type=int, default=6, help="epochs of the reference run")
    parser.add_argument("--trials", type=int, default=3, help="kill-and-resume trials")
    parser.add_argument("--checkpoint-every", type=int, default=3)
    parser.add_argument("--text-figures", type=int, default=48, help="synthetic figures for the texts part")
    parser.add_argument("--skip", default="", help="comma list of parts to skip: small,vit,texts,resume")
    args = parser.parse_args()
    if args.quick:
        args.rounds = args.rounds or 2
        args.figures, args.epochs, args.trials = 8, 3, 1
        args.skip = ",".join(filter(None, [args.skip, "vit"]))
    skip = set(filter(None, args.skip.split(",")))
    torch.set_num_threads(args.threads)
    torch.manual_seed(SEED)

    report: dict[str, Any] = {
        "bench": "train_bench",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "load_at_start": load(),
        "training_code_at_start": training_code_fingerprint(),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "step_cost": [],
    }
    started = time.monotonic()
    steps: list[tuple[str, Callable[[], TrainConfig], int, int]] = [
        ("default model (MiniLM + ViT 224/32 w256 4L)", lambda: load_config({"schedule": "mixed"}), 4, 5),
        (
            "ViT-B-32 (random init, text frozen, last 5 vision blocks)",
            lambda: load_config(
                {
                    "schedule": "mixed",
                    "model": {"name": "vit-b-32-random", "architecture": "ViT-B-32"},
                    "train_last_vision_blocks": 5,
                    "freeze_text": True,
                }
            ),
            4,
            3,
        ),
    ]
    for key, (label, make_config, n_figures, rounds) in zip(("small", "vit"), steps, strict=True):
        if key in skip:
            continue
        report["step_cost"].append(step_cost(label, make_config(), n_figures, args.rounds or rounds))
        ratios = report["step_cost"][-1]["ratios"]
        log(f"[{label}] ratios: {ratios}")

    if "texts" not in skip:
        report["text_encoding"] = text_encoding(args.text_figures, args.rounds or 3)
        log(f"[texts] speedup {report['text_encoding']['speedup']:.2f}x")

    if "resume" not in skip:
        work = Path(tempfile.mkdtemp(prefix="p2p-train-bench-"))
        try:
            report.update(resume_and_memory(args, work))
        finally:
            shutil.rmtree(work, ignore_errors=True)

    report["load_at_end"] = load()
    report["wall_s"] = round(time.monotonic() - started, 1)
    summary: dict[str, Any] = {"wall_s": report["wall_s"], "load": [report["load_at_start"], load()]}
    for cost in report["step_cost"]:
        summary[cost["label"]] = {
            "mixed_s": cost["steps"]["mixed"]["median_s"],
            "flat_s": cost["steps"]["flat"]["median_s"],
            "figures_per_s": [
                cost["steps"]["mixed"]["figures_per_s"],
                cost["steps"]["flat"]["figures_per_s"],
            ],
            "trainable_vision_blocks": cost["parameters"]["trainable_vision_blocks"],
            **cost["ratios"],
        }
    if "resume" in report:
        resume = report["resume"]
        summary["resume"] = {
            "steps_lost": [t["steps_lost"] for t in resume["trials"]],
            "checkpoint_every": resume["checkpoint_every"],
            "within_one_interval": resume["all_within_one_interval"],
            "bitwise_equal": resume["all_bitwise_equal"],
            "orphaned_staging_files": [t["orphaned_staging_files"] for t in resume["trials"]],
            "same_code_in_every_run": resume["same_code_in_every_run"],
        }
        summary["memory"] = {
            "rss_end_mb": [e["rss_end_mb"] for e in report["memory"]["epochs"]],
            "growth_epoch2_to_last_mb": report["memory"].get("growth_epoch2_to_last_mb"),
            "flat": report["memory"].get("flat"),
        }
    report["summary"] = summary
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    log(f"wrote {args.out}")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
