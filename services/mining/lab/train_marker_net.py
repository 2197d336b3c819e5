"""Train the marker network (``marker_net``) on synthetic compound figures.

The generator (``p2p.mining.lab.synth``) writes figures with exact ground truth per marker (kind,
glyph box, target point, target box, direction); this script crops their image panels, samples
fixed-size patches (most centred near a marker, the rest anywhere, so the network also learns
what is not a marker), flips them for variety and trains CenterNet-style: focal loss on the heat
maps, L1 on offsets, box sides and direction at the point cells. Deterministic given ``--seed``
(data order, augmentation and initialisation), CPU only, ``--threads`` torch threads.

    python -m p2p.mining.lab.train_marker_net --data /tmp/marker-a --data /tmp/marker-b \\
        --figures 1600 --data-seed 100000 --seed 0 --steps 7000 --batch 12 --patch 256 \\
        --threads 1 --out services/mining/artifacts/marker_net.pt

(the shipped weights: 3200 figures of seeds 100000 and 100001, 16 minutes on one thread).
Continuing them for 5500 more steps (``--init``, ``--lr 1.5e-3``, 1600 figures of seed 100000
and 1000 of 100002, 31 minutes) with a fusion model of their own raised synthetic recall
(validation seeds 310001/310002: 0.854/0.838 -> 0.862/0.861) but not on development seed 1001
(0.893 -> 0.882), and its peaks on real texture cut real precision (0.789 -> 0.659); levels
raised until real precision held (0.757) lost the synthetic gain. Not shipped.
Retrained from scratch the same way on 1000 figures each of seeds 160010/160011 (7000 steps,
29 minutes on one thread beside other work; 11,000 steps would not have fit the time), with a
fusion model of its own built as the shipped one (a base-features model on 300 figures each of
seeds 160020/160021 blended half and half with an all-features model on 160022/160023, 38,441
candidates): validation seeds 330101/330102 recall 0.880/0.921 -> 0.879/0.917 (precision
0.806/0.790 -> 0.799/0.784), development seed 1001 0.910 -> 0.910 (0.794 -> 0.784), real recall
0.905 unchanged but precision 0.773 -> 0.642 (53 predicted, was 44): its peaks on real texture
again. Not shipped; a retrain alone is a reshuffle of the same recipe, not a stronger network.

``--fusion`` trains the fusion model instead (``marker_net.TreeEnsemble``, stored in the same
weights file, whose network it keeps): every candidate of the rules and every network peak of
``markers.panel_candidates`` on the image panels of the ``--data`` figures, labelled true when
its target box holds a true target point (``eval_markers``' lenient rule) or its point lies near
one (the strict rule), fitted by scikit-learn's gradient-boosted trees:

    python -m p2p.mining.lab.train_marker_net --fusion --data /tmp/fusion-a --data /tmp/fusion-b \\
        --data /tmp/fusion-c --data /tmp/fusion-d --figures 400 --data-seed 120001 \\
        --out services/mining/artifacts/marker_net.pt

(the first shipped fusion model: 400 figures each of seeds 120001-120004, 55,224 candidates,
about six minutes on one thread). The shipped one is that model blended half and half (their
log-odds averaged) with one fitted with the glyph features (``markers._GLYPH_FEATURES``) on 400
figures each of seeds 160000-160003 (56,092 candidates):

    python -m p2p.mining.lab.train_marker_net --fusion --blend 0.5 --data /tmp/fusion-e \\
        --data /tmp/fusion-f --data /tmp/fusion-g --data /tmp/fusion-h --figures 400 \\
        --data-seed 160000 --out services/mining/artifacts/marker_net.pt

(``--blend`` keeps the model already in ``--out`` and adds the new one's trees; it reads the
columns it was fitted on, the first ones. Alone the new model found more on synthetic figures
and less well on the real ones; see ``markers._GLYPH_FEATURES``.) Its measurements include
the network's output: they are taken with the network stored in ``--out``, so after retraining
the network, retrain the fusion model into the new network's file.
A fusion model trained on more figures beside the shipped network (six folders of 400 figures,
``--data-seed 150000``, 83,159 candidates, 27 minutes on one thread under load) was no better on
synthetic figures (validation seeds 320001/320002 recall 0.870/0.897 -> 0.868/0.898) and worse
on the real ones (recall 0.905 -> 0.881, precision 0.780 -> 0.732): not shipped.
The figures are generated into ``--data`` when it holds no ``annotations.json`` yet; with several
``--data`` folders the n-th is generated with seed ``--data-seed + n``. Training seeds are
100000-199999 only: other seeds are for development and held-out evaluation.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from p2p.mining.cpu.markers.net import (
    DIR,
    N_KINDS,
    OFF,
    STRIDE,
    MarkerNet,
    encode_targets,
    save_weights,
)
from p2p.mining.cpu.nets import ALIGN, to_input

TRAIN_SEEDS = range(100000, 200000)
# The fusion model's trees (on ~55,000 candidates of 1600 figures, held-out AUC 0.953 with 200
# trees of depth 4, 0.956 with these).
FUSION_TREES: dict[str, Any] = {
    "max_iter": 300,
    "max_depth": 6,
    "learning_rate": 0.05,
    "early_stopping": False,
}


@dataclass
class _Crop:
    rgb: np.ndarray  # image panel, H x W x 3 uint8
    markers: list[dict[str, Any]]  # crop pixels, exclusive boxes


def _exclusive(box: list[float], x0: int, y0: int) -> tuple[float, float, float, float]:
    return (box[0] - x0, box[1] - y0, box[2] + 1 - x0, box[3] + 1 - y0)


def load_crops(folder: Path) -> list[_Crop]:
    """Image panels of every figure in ``folder`` with their markers in crop coordinates."""
    annotations = json.loads((folder / "annotations.json").read_text(encoding="utf-8"))
    crops: list[_Crop] = []
    for name, fig in sorted(annotations.items()):
        if name.startswith("_") or not isinstance(fig, dict):
            continue
        image = np.asarray(Image.open(folder / name).convert("RGB"))
        for index, panel in enumerate(fig.get("panels", [])):
            if panel.get("type") != "image":
                continue
            x1, y1, x2, y2 = (int(v) for v in panel["box"])
            rgb = np.ascontiguousarray(image[y1 : y2 + 1, x1 : x2 + 1])
            if rgb.shape[0] < 16 or rgb.shape[1] < 16:
                continue
            markers = [
                {
                    "kind": m["kind"],
                    "point": (float(m["target_point"][0] - x1), float(m["target_point"][1] - y1)),
                    "target": _exclusive(m["target_box"], x1, y1),
                    "glyph": _exclusive(m["glyph_box"], x1, y1),
                    "direction": m.get("direction_deg"),
                }
                for m in fig.get("markers", [])
                if m.get("panel_index") == index and m.get("context", "image") == "image"
            ]
            crops.append(_Crop(rgb, markers))
    return crops


def _flip(markers: list[dict[str, Any]], w: int, h: int, fx: bool, fy: bool) -> list[dict[str, Any]]:
    """Markers of a crop mirrored left-right (``fx``) and/or top-bottom (``fy``)."""
    out = []
    for m in markers:
        px, py = m["point"]
        t, g, d = m["target"], m["glyph"], m["direction"]
        if fx:
            px = w - 1 - px
            t = (w - t[2], t[1], w - t[0], t[3])
            g = (w - g[2], g[1], w - g[0], g[3])
            d = None if d is None else (180.0 - d) % 360.0
        if fy:
            py = h - 1 - py
            t = (t[0], h - t[3], t[2], h - t[1])
            g = (g[0], h - g[3], g[2], h - g[1])
            d = None if d is None else (-d) % 360.0
        out.append({"kind": m["kind"], "point": (px, py), "target": t, "glyph": g, "direction": d})
    return out


def _shift(m: dict[str, Any], dx: int, dy: int) -> dict[str, Any]:
    def mv(b: tuple[float, float, float, float]) -> tuple[float, float, float, float]:
        return (b[0] - dx, b[1] - dy, b[2] - dx, b[3] - dy)

    px, py = m["point"]
    return {**m, "point": (px - dx, py - dy), "target": mv(m["target"]), "glyph": mv(m["glyph"])}


class Sampler:
    """Patches of ``size`` x ``size`` pixels with their targets, from a seeded generator."""

    def __init__(self, crops: list[_Crop], size: int, seed: int, marker_share: float = 0.6) -> None:
        self.crops = crops
        self.size = size
        self.rng = np.random.default_rng(seed)
        self.marker_share = marker_share
        self.with_markers = [(i, j) for i, c in enumerate(crops) for j in range(len(c.markers))]
        area = np.array([c.rgb.shape[0] * c.rgb.shape[1] for c in crops], dtype=np.float64)
        self.area_p = area / area.sum()

    def _window(self, extent: int, focus: float | None) -> int:
        """Start of the patch along one axis; ``focus`` (a marker point) lands inside it."""
        if extent <= self.size:
            return 0
        hi = extent - self.size
        if focus is None:
            return int(self.rng.integers(0, hi + 1))
        margin = min(24, self.size // 4)
        lo_s = max(0, math.ceil(focus - self.size + margin))
        hi_s = min(hi, math.floor(focus - margin))
        if hi_s < lo_s:
            return int(np.clip(round(focus - self.size / 2), 0, hi))
        return int(self.rng.integers(lo_s, hi_s + 1))

    def sample(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        rng = self.rng
        focus: tuple[float, float] | None = None
        if self.with_markers and rng.random() < self.marker_share:
            ci, mi = self.with_markers[int(rng.integers(len(self.with_markers)))]
            focus = self.crops[ci].markers[mi]["point"]
        else:
            ci = int(rng.choice(len(self.crops), p=self.area_p))
        crop = self.crops[ci]
        h, w = crop.rgb.shape[:2]
        x0 = self._window(w, None if focus is None else focus[0])
        y0 = self._window(h, None if focus is None else focus[1])
        pw, ph = min(self.size, w), min(self.size, h)
        rgb = crop.rgb[y0 : y0 + ph, x0 : x0 + pw]
        markers = [_shift(m, x0, y0) for m in crop.markers]
        fx, fy = bool(rng.random() < 0.5), bool(rng.random() < 0.5)
        if fx:
            rgb = rgb[:, ::-1]
        if fy:
            rgb = rgb[::-1]
        markers = _flip(markers, pw, ph, fx, fy)
        # Pad bottom/right only, by edge replication, exactly as inference pads a panel.
        rgb = np.pad(rgb, ((0, self.size - ph), (0, self.size - pw), (0, 0)), mode="edge")
        inside = [m for m in markers if 0 <= m["point"][0] < pw and 0 <= m["point"][1] < ph]
        heat, reg, mask, dmask = encode_targets(inside, self.size, self.size)
        return np.ascontiguousarray(rgb), heat, reg, mask, dmask

    def batch(self, n: int) -> tuple[torch.Tensor, ...]:
        items = [self.sample() for _ in range(n)]
        x = to_input(np.stack([it[0] for it in items]))
        rest = [torch.from_numpy(np.stack([it[k] for it in items])) for k in range(1, 5)]
        return (x, *rest)


def losses(
    out: torch.Tensor, heat: torch.Tensor, reg: torch.Tensor, mask: torch.Tensor, dmask: torch.Tensor
) -> dict[str, torch.Tensor]:
    """CenterNet's penalty-reduced focal loss on the heat maps, L1 on the regressions."""
    pred = torch.sigmoid(out[:, :N_KINDS]).clamp(1e-4, 1 - 1e-4)
    pos = heat.eq(1.0).float()
    npos = pos.sum().clamp(min=1.0)
    pos_loss = (torch.log(pred) * (1 - pred) ** 2 * pos).sum()
    neg_loss = (torch.log(1 - pred) * pred**2 * (1 - heat) ** 4 * (1 - pos)).sum()
    focal = -(pos_loss + neg_loss) / npos
    n_reg = mask.sum().clamp(min=1.0)
    box = ((out[:, OFF:DIR] - reg[:, : DIR - OFF]).abs() * mask).sum() / n_reg
    n_dir = dmask.sum().clamp(min=1.0)
    direction = ((out[:, DIR:] - reg[:, DIR - OFF :]).abs() * dmask).sum() / n_dir
    return {"heat": focal, "box": box, "dir": direction, "total": focal + 0.25 * box + 0.5 * direction}


def train(
    crops: list[_Crop],
    *,
    steps: int,
    batch: int,
    patch: int,
    seed: int,
    lr: float = 3e-3,
    log_every: int = 50,
    checkpoint: Path | None = None,
    save_every: int = 0,
    meta: dict[str, Any] | None = None,
    init: MarkerNet | None = None,
) -> MarkerNet:
    torch.manual_seed(seed)
    net = MarkerNet()
    if init is not None:
        net.load_state_dict(init.state_dict())
    net.train()
    sampler = Sampler(crops, patch, seed)
    opt = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=1e-4)
    warm = max(1, min(200, steps // 10))

    def rate(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        return 0.5 * (1.0 + math.cos(math.pi * (step - warm) / max(1, steps - warm)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, rate)
    started = time.perf_counter()
    running: dict[str, float] = {}
    for step in range(steps):
        x, heat, reg, mask, dmask = sampler.batch(batch)
        parts = losses(net(x), heat, reg, mask, dmask)
        opt.zero_grad(set_to_none=True)
        parts["total"].backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 5.0)
        opt.step()
        sched.step()
        for k, v in parts.items():
            running[k] = running.get(k, 0.0) + float(v.detach())
        if log_every and ((step + 1) % log_every == 0 or step + 1 == steps):
            n = log_every if (step + 1) % log_every == 0 else (step + 1) % log_every
            text = " ".join(f"{k} {v / n:.4f}" for k, v in running.items())
            print(f"step {step + 1}/{steps} {text} {time.perf_counter() - started:.0f}s", flush=True)
            running = {}
        if checkpoint is not None and save_every and (step + 1) % save_every == 0 and step + 1 < steps:
            net.eval()
            save_weights(net, checkpoint, {**(meta or {}), "steps_done": step + 1})
            net.train()
    net.eval()
    return net


def fusion_data(folder: Path, net: MarkerNet | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Features and labels of every fusion candidate on the image panels of ``folder``, measured
    with ``net`` (the shipped network by default)."""
    from p2p.mining.cpu.markers.rules import FUSION_FEATURES, panel_candidates
    from p2p.mining.lab.eval_markers import LENIENT_MARGIN, STRICT_RADIUS, _hit_lenient, _hit_strict
    from p2p.shared.geometry import from_inclusive

    annotations = json.loads((folder / "annotations.json").read_text(encoding="utf-8"))
    rows: list[np.ndarray] = []
    labels: list[bool] = []
    for name, fig in sorted(annotations.items()):
        if name.startswith("_") or not isinstance(fig, dict):
            continue
        image = np.asarray(Image.open(folder / name).convert("RGB"))
        truth = [m for m in fig.get("markers", []) if m.get("context", "image") == "image"]
        truth += fig.get("extra_markers", [])
        for index, panel in enumerate(fig.get("panels", [])):
            if panel.get("type") != "image":
                continue
            box = from_inclusive(panel["box"])
            diag = math.hypot(box[2] - box[0], box[3] - box[1])
            points = [
                (float(m["target_point"][0]), float(m["target_point"][1]))
                for m in truth
                if m.get("panel_index") == index
            ]
            cands, features = panel_candidates(image, box, net)
            for cand, row in zip(cands, features, strict=True):
                if cand is None:
                    continue
                rows.append(row)
                labels.append(
                    any(
                        _hit_lenient(cand, pt, LENIENT_MARGIN * diag)
                        or _hit_strict(cand, pt, STRICT_RADIUS * diag)
                        for pt in points
                    )
                )
    return np.array(rows, dtype=np.float64).reshape(-1, len(FUSION_FEATURES)), np.array(labels, dtype=bool)


def fit_fusion(x: np.ndarray, y: np.ndarray, *, seed: int = 0) -> Any:
    """Gradient-boosted trees on the candidates' features -> ``marker_net.TreeEnsemble``."""
    from sklearn.ensemble import HistGradientBoostingClassifier

    from p2p.mining.cpu.markers.net import TreeEnsemble
    from p2p.mining.cpu.markers.rules import FUSION_FEATURES

    model = HistGradientBoostingClassifier(**FUSION_TREES, random_state=seed).fit(x, y)
    trees = [predictors[0].nodes for predictors in model._predictors]
    width = max(len(t) for t in trees)
    shape = (len(trees), width)
    feature = np.zeros(shape, dtype=np.int64)
    threshold = np.zeros(shape, dtype=np.float64)
    left = np.tile(np.arange(width, dtype=np.int64), (len(trees), 1))  # padding: leaves of themselves
    right = left.copy()
    value = np.zeros(shape, dtype=np.float64)
    depth = 0
    for t, nodes in enumerate(trees):
        n = len(nodes)
        leaf = nodes["is_leaf"].astype(bool)
        feature[t, :n] = np.where(leaf, 0, nodes["feature_idx"])
        threshold[t, :n] = np.where(leaf, np.inf, nodes["num_threshold"])
        left[t, :n] = np.where(leaf, np.arange(n), nodes["left"])
        right[t, :n] = np.where(leaf, np.arange(n), nodes["right"])
        value[t, :n] = np.where(leaf, nodes["value"], 0.0)
        depth = max(depth, int(nodes["depth"].max()))
    return TreeEnsemble(
        feature=feature,
        threshold=threshold,
        left=left,
        right=right,
        value=value,
        baseline=float(np.ravel(model._baseline_prediction)[0]),
        depth=depth,
        names=FUSION_FEATURES,
    )


def blend(base: Any, model: Any, weight: float) -> Any:
    """One ``TreeEnsemble`` whose log-odds are ``weight`` of ``model``'s plus the rest of
    ``base``'s: both sets of trees, their leaves scaled. ``base`` may read fewer columns than
    ``model`` (a model fitted before features were appended), never other ones."""
    if tuple(model.names[: len(base.names)]) != tuple(base.names):
        raise ValueError("the base model's features must be the first of the new model's")
    width = max(base.feature.shape[1], model.feature.shape[1])

    def padded(m: Any, scale: float) -> list[np.ndarray]:
        n_trees, w = m.feature.shape
        own = np.tile(np.arange(width, dtype=np.int64), (n_trees, 1))  # padding: leaves of themselves
        feature, left, right = np.zeros((n_trees, width), np.int64), own.copy(), own.copy()
        threshold, value = np.full((n_trees, width), np.inf), np.zeros((n_trees, width))
        feature[:, :w], threshold[:, :w], left[:, :w], right[:, :w] = m.feature, m.threshold, m.left, m.right
        value[:, :w] = scale * m.value
        return [feature, threshold, left, right, value]

    parts = zip(padded(base, 1.0 - weight), padded(model, weight), strict=True)
    feature, threshold, left, right, value = (np.concatenate(pair) for pair in parts)
    return replace(
        model,
        feature=feature,
        threshold=threshold,
        left=left,
        right=right,
        value=value,
        baseline=(1.0 - weight) * base.baseline + weight * model.baseline,
        depth=max(base.depth, model.depth),
    )


def main_fusion(args: argparse.Namespace) -> int:
    from p2p.mining.cpu.markers.net import load_fusion, load_weights, save_fusion

    # The candidates are measured with the network the model will sit beside, not the shipped one.
    net = load_weights(args.out)
    xs, ys = [], []
    for n, folder in enumerate(args.data):
        if not (folder / "annotations.json").is_file():
            from p2p.mining.lab.synth.dataset import write_dataset

            seed = args.data_seed + n
            print(f"generating {args.figures} figures (seed {seed}) into {folder}", flush=True)
            write_dataset(folder, args.figures, seed)
        x, y = fusion_data(folder, net)
        print(f"{folder}: {len(y)} candidates, {int(y.sum())} true", flush=True)
        xs.append(x)
        ys.append(y)
    model = fit_fusion(np.concatenate(xs), np.concatenate(ys), seed=args.seed)
    if args.blend is not None:
        model = blend(load_fusion(args.out), model, args.blend)
    save_fusion(model, args.out)
    print(
        f"wrote the fusion model ({model.feature.shape[0]} trees) into {args.out}",
        flush=True,
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--data",
        type=Path,
        action="append",
        required=True,
        help="figures (made if empty); repeat for more, the n-th made with --data-seed + n",
    )
    parser.add_argument("--figures", type=int, default=1600, help="figures to generate when --data is empty")
    parser.add_argument("--data-seed", type=int, default=100000, help="generator seed, 100000-199999")
    parser.add_argument("--seed", type=int, default=0, help="sampling, augmentation and initialisation")
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--patch", type=int, default=256, help="patch side, a multiple of 32")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--save-every", type=int, default=500, help="checkpoint to --out every N steps")
    parser.add_argument("--log-every", type=int, default=50)
    parser.add_argument("--out", type=Path, required=True, help="weights file to write")
    parser.add_argument("--init", type=Path, default=None, help="continue from these weights")
    parser.add_argument(
        "--fusion", action="store_true", help="train the fusion model into --out (keeps its network)"
    )
    parser.add_argument(
        "--blend",
        type=float,
        default=None,
        help="with --fusion: average the new model's log-odds, this weight, with the one in --out",
    )
    args = parser.parse_args(argv)
    if args.data_seed not in TRAIN_SEEDS or args.data_seed + len(args.data) - 1 not in TRAIN_SEEDS:
        parser.error("--data-seed must be a training seed (100000-199999)")
    if args.fusion:
        torch.set_num_threads(max(1, args.threads))
        return main_fusion(args)
    if args.patch % ALIGN or args.patch < ALIGN:
        parser.error(f"--patch must be a positive multiple of {ALIGN}")
    torch.set_num_threads(max(1, args.threads))
    torch.use_deterministic_algorithms(True, warn_only=True)
    crops: list[_Crop] = []
    for n, folder in enumerate(args.data):
        if not (folder / "annotations.json").is_file():
            from p2p.mining.lab.synth.dataset import write_dataset

            seed = args.data_seed + n
            print(f"generating {args.figures} figures (seed {seed}) into {folder}", flush=True)
            write_dataset(folder, args.figures, seed)
        crops += load_crops(folder)
    if not crops:
        parser.error(f"no image panels in {[str(f) for f in args.data]}")
    n_markers = sum(len(c.markers) for c in crops)
    print(f"{len(crops)} image panels, {n_markers} markers, stride {STRIDE}", flush=True)
    meta = {
        "data_seed": args.data_seed,
        "data_sets": len(args.data),
        "figures": args.figures,
        "seed": args.seed,
        "steps": args.steps,
        "batch": args.batch,
        "patch": args.patch,
        "lr": args.lr,
    }
    init = None
    if args.init is not None:
        blob = torch.load(args.init, map_location="cpu", weights_only=True)
        init = MarkerNet()
        init.load_state_dict(blob["state_dict"])
        meta["init"] = {"file": args.init.name, **blob.get("meta", {})}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    settings = {k: meta[k] for k in ("steps", "batch", "patch", "seed", "lr")}
    net = train(
        crops,
        **settings,
        log_every=args.log_every,
        checkpoint=args.out,
        save_every=args.save_every,
        meta=meta,
        init=init,
    )
    save_weights(net, args.out, meta)
    print(f"wrote {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
