"""Train the panel-boundary network (``seam_net``) on synthetic compound figures.

Every figure of the generator (``p2p.mining.lab.synth``) comes with its exact panel boxes. The
figures are kept as copies whose longer side is ``seam_net.SIDE``; a training sample is one such
copy scaled again by a random factor (``--jitter``: the network must not depend on one panel
size), mirrored left-right and/or top-bottom, cut or edge-padded to a ``--patch`` square (as
inference pads), with its targets from ``seam_net.encode_targets``. The loss is a focal binary
cross-entropy on the two boundary maps (they are rare; the soft line edges are targets between 0
and 1) plus a plain one on the panel-interior map. Deterministic given ``--seed`` (data order,
augmentation and initialisation), CPU only, ``--threads`` torch threads.

    python -m p2p.mining.lab.train_seam_net --data /tmp/seamnet/d140000 --data /tmp/seamnet/d140001 \\
        --figures 1500 --data-seed 140000 --seed 0 --steps 3500 --batch 8 --patch 384 \\
        --threads 1 --out services/mining/artifacts/seam_net.pt

(the shipped weights: 3000 figures of seeds 140000 and 140001, 21 minutes on one thread).

The figures are generated into ``--data`` when it holds no ``annotations.json`` yet; with several
``--data`` folders the n-th is generated with seed ``--data-seed + n``. Training seeds are
140000-140999 only: other seeds are for development and held-out evaluation.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from p2p.mining.cpu.nets import ALIGN, to_input
from p2p.mining.cpu.segmentation.seam_net import SeamNet, encode_targets, resize, save_weights, scale_for

TRAIN_SEEDS = range(140000, 141000)

Box = tuple[float, float, float, float]


@dataclass
class Figure:
    rgb: np.ndarray  # the copy, longer side SIDE, uint8
    boxes: list[Box]  # panels in copy pixels, x2/y2 exclusive


def load_figures(folder: Path) -> list[Figure]:
    """Every figure of ``folder`` as a network-sized copy with its panel boxes."""
    annotations = json.loads((folder / "annotations.json").read_text(encoding="utf-8"))
    figures: list[Figure] = []
    for name, fig in sorted(annotations.items()):
        if name.startswith("_") or not isinstance(fig, dict) or not fig.get("panels"):
            continue
        image = np.asarray(Image.open(folder / name).convert("RGB"))
        scale = scale_for(*image.shape[:2])
        boxes = [
            (b[0] * scale, b[1] * scale, (b[2] + 1) * scale, (b[3] + 1) * scale)
            for b in (p["box"] for p in fig["panels"])
        ]
        figures.append(Figure(resize(image, scale), boxes))
    return figures


def _mirror(boxes: list[Box], w: int, h: int, fx: bool, fy: bool) -> list[Box]:
    out = []
    for x1, y1, x2, y2 in boxes:
        if fx:
            x1, x2 = w - x2, w - x1
        if fy:
            y1, y2 = h - y2, h - y1
        out.append((x1, y1, x2, y2))
    return out


class Sampler:
    """Square samples of ``size`` pixels with their targets, from a seeded generator."""

    def __init__(self, figures: list[Figure], size: int, seed: int, jitter: float = 0.25) -> None:
        self.figures = figures
        self.size = size
        self.jitter = jitter
        self.rng = np.random.default_rng(seed)

    def sample(self) -> tuple[np.ndarray, np.ndarray]:
        rng = self.rng
        fig = self.figures[int(rng.integers(len(self.figures)))]
        factor = float(np.exp(rng.uniform(-self.jitter, self.jitter)))
        rgb = resize(fig.rgb, factor)
        h, w = rgb.shape[:2]
        fx, fy = bool(rng.random() < 0.5), bool(rng.random() < 0.5)
        if fx:
            rgb = rgb[:, ::-1]
        if fy:
            rgb = rgb[::-1]
        scaled = [(b[0] * factor, b[1] * factor, b[2] * factor, b[3] * factor) for b in fig.boxes]
        boxes = _mirror(scaled, w, h, fx, fy)
        x0 = int(rng.integers(0, w - self.size + 1)) if w > self.size else 0
        y0 = int(rng.integers(0, h - self.size + 1)) if h > self.size else 0
        rgb = rgb[y0 : y0 + self.size, x0 : x0 + self.size]
        ph, pw = rgb.shape[:2]
        rgb = np.pad(rgb, ((0, self.size - ph), (0, self.size - pw), (0, 0)), mode="edge")
        # Boxes are not clipped to the sample: a panel the sample cuts has no edge at the cut.
        shifted = [(b[0] - x0, b[1] - y0, b[2] - x0, b[3] - y0) for b in boxes]
        targets = encode_targets(shifted, self.size, self.size, 1.0)
        return np.ascontiguousarray(rgb), targets

    def batch(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        items = [self.sample() for _ in range(n)]
        images, targets = zip(*items, strict=True)
        return to_input(np.stack(images)), torch.from_numpy(np.stack(targets))


def losses(out: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
    """Focal BCE on the boundary maps (soft targets: weighted by the squared miss, normalised by
    the boundary mass), plain BCE on the interior map."""
    lines, line_t = out[:, :2], target[:, :2]
    bce = F.binary_cross_entropy_with_logits(lines, line_t, reduction="none")
    miss = (torch.sigmoid(lines) - line_t).abs() ** 2
    boundary = (bce * miss).sum() / line_t.sum().clamp(min=1.0)
    interior = F.binary_cross_entropy_with_logits(out[:, 2], target[:, 2])
    return {"boundary": boundary, "interior": interior, "total": boundary + 0.5 * interior}


@dataclass(frozen=True)
class Settings:
    """What a training run depends on besides its figures (stored in the weights' meta)."""

    steps: int = 3000
    batch: int = 8
    patch: int = 384  # sample side, a multiple of 32
    seed: int = 0  # sampling, augmentation and initialisation
    lr: float = 3e-3
    jitter: float = 0.25  # log of the largest rescaling either way


def train(
    figures: list[Figure],
    settings: Settings,
    *,
    report_every: int = 50,
    checkpoint: Path | None = None,
    meta: dict[str, Any] | None = None,
) -> SeamNet:
    """A network trained on ``figures``; with ``checkpoint``, its weights are written there at
    every report so a run cut short still leaves usable weights."""
    torch.manual_seed(settings.seed)
    net = SeamNet()
    net.train()
    sampler = Sampler(figures, settings.patch, settings.seed, settings.jitter)
    opt = torch.optim.AdamW(net.parameters(), lr=settings.lr, weight_decay=1e-4)
    warm = max(1, min(200, settings.steps // 10))
    sched = torch.optim.lr_scheduler.SequentialLR(
        opt,
        [
            torch.optim.lr_scheduler.LinearLR(opt, 1.0 / warm, 1.0, warm),
            torch.optim.lr_scheduler.CosineAnnealingLR(opt, max(1, settings.steps - warm)),
        ],
        [warm],
    )
    started = time.perf_counter()
    totals = np.zeros(3)
    for step in range(1, settings.steps + 1):
        x, target = sampler.batch(settings.batch)
        parts = losses(net(x), target)
        opt.zero_grad(set_to_none=True)
        parts["total"].backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 5.0)
        opt.step()
        sched.step()
        totals += [float(v.detach()) for v in parts.values()]
        if step % report_every and step < settings.steps:
            continue
        mean = totals / (report_every if step % report_every == 0 else step % report_every)
        names = " ".join(f"{k} {v:.4f}" for k, v in zip(parts, mean, strict=True))
        print(f"step {step}/{settings.steps} {names} {time.perf_counter() - started:.0f}s", flush=True)
        totals[:] = 0.0
        if checkpoint is not None and step < settings.steps:
            net.eval()
            save_weights(net, checkpoint, {**(meta or {}), "steps_done": step})
            net.train()
    net.eval()
    return net


def _figures(folders: list[Path], count: int, first_seed: int) -> list[Figure]:
    """The figures of ``folders``, generating ``count`` into each that has none yet (the n-th
    with seed ``first_seed + n``)."""
    from p2p.mining.lab.synth.dataset import write_dataset

    figures: list[Figure] = []
    for n, folder in enumerate(folders):
        if not (folder / "annotations.json").is_file():
            print(f"generating {count} figures (seed {first_seed + n}) into {folder}", flush=True)
            write_dataset(folder, count, first_seed + n)
        figures += load_figures(folder)
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--data", type=Path, action="append", required=True, help="figure folder (repeatable)"
    )
    parser.add_argument("--figures", type=int, default=1500, help="figures per folder made when it is empty")
    parser.add_argument("--data-seed", type=int, default=TRAIN_SEEDS.start, help="seed of the first folder")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--report-every", type=int, default=50, help="log and checkpoint every N steps")
    parser.add_argument("--out", type=Path, required=True, help="weights file to write")
    for option in fields(Settings):
        parser.add_argument(f"--{option.name}", type=type(option.default), default=option.default)
    args = parser.parse_args(argv)
    settings = Settings(**{option.name: getattr(args, option.name) for option in fields(Settings)})
    if args.data_seed not in TRAIN_SEEDS or args.data_seed + len(args.data) - 1 not in TRAIN_SEEDS:
        parser.error(f"--data-seed must be a training seed ({TRAIN_SEEDS.start}-{TRAIN_SEEDS.stop - 1})")
    if settings.patch % ALIGN or settings.patch < ALIGN:
        parser.error(f"--patch must be a positive multiple of {ALIGN}")
    torch.set_num_threads(max(1, args.threads))
    torch.use_deterministic_algorithms(True, warn_only=True)
    figures = _figures(args.data, args.figures, args.data_seed)
    if not figures:
        parser.error(f"no figures with panels in {[str(f) for f in args.data]}")
    print(f"{len(figures)} figures, {sum(len(f.boxes) for f in figures)} panels", flush=True)
    meta = {
        "data_seed": args.data_seed,
        "data_sets": len(args.data),
        "figures": len(figures),
        **asdict(settings),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    net = train(figures, settings, report_every=args.report_every, checkpoint=args.out, meta=meta)
    save_weights(net, args.out, meta)
    print(f"wrote {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
