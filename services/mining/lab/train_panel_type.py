"""Train the panel type classifier and write ``panel_type_model.json``.

    python -m p2p.mining.lab.train_panel_type [--real-dir /work/shared/data/real-figures]

Training data:

* synthetic panels drawn directly by the generator (``p2p.mining.lab.synth``) from seeds
  ``0 .. train-1``: micrographs/medical images (with markers, scale bars, inside labels, groups of
  sub-images), plots (matplotlib and PIL), schematics (flow charts, cartoons) and tables, then JPEG
  compressed, rescaled and cropped a little loose or tight, as a segmenter would;
* panels cropped from whole synthetic figures (seeds ``FIGURE_SEED_BASE + k``) by their ground-truth
  boxes, with box jitter;
* the real development figures' panels (``annotations.json`` boxes and ``type``), when given.

Held out: synthetic seeds ``TEST_SEED_BASE ..`` (never used for training) and, for the real set,
leave-one-figure-out (each real figure is scored by a model trained on the synthetic data and the
other 13 figures). The final model is trained on all synthetic training data plus every real panel.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from p2p.mining.artifacts import artifact_path
from p2p.mining.cpu.panel_type import FEATURE_NAMES, MODEL_FILE, PanelTypeClassifier, panel_features
from p2p.mining.types import PANEL_TYPES

TEST_SEED_BASE = 1_000_000
FIGURE_SEED_BASE = 500_000
DEFAULT_REAL_DIR = Path("/work/shared/data/real-figures")
TYPE_WEIGHTS = {"image": 0.4, "plot": 0.3, "schematic": 0.15, "table": 0.15}


# -- synthetic panels ----------------------------------------------------------------------------


def _augment(rng: np.random.Generator, crop: np.ndarray) -> np.ndarray:
    """Loose or tight crop, rescale and JPEG round trip, as panels cut from published figures are."""
    import io

    out = crop
    if rng.random() < 0.5:
        if rng.random() < 0.6:
            pads = [int(rng.integers(0, 7)) for _ in range(4)]
            out = np.pad(out, ((pads[0], pads[1]), (pads[2], pads[3]), (0, 0)), constant_values=255)
        else:
            cut = [int(rng.integers(0, 4)) for _ in range(4)]
            h, w = out.shape[:2]
            if h > 20 and w > 20:
                out = out[cut[0] : h - cut[1], cut[2] : w - cut[3]]
    img = Image.fromarray(np.ascontiguousarray(out))
    if rng.random() < 0.3:
        f = float(rng.uniform(0.5, 1.5))
        img = img.resize(
            (max(8, round(img.width * f)), max(8, round(img.height * f))), Image.Resampling.BILINEAR
        )
    if rng.random() < 0.6:
        buf = io.BytesIO()
        img.save(buf, format="JPEG", quality=int(rng.integers(35, 96)))
        buf.seek(0)
        with Image.open(buf) as jpg:
            img = jpg.convert("RGB")
    return np.asarray(img)


def synthetic_panel(seed: int, kind: str | None = None) -> tuple[np.ndarray, str]:
    """One panel of a random (or the given) type drawn from ``seed``; deterministic."""
    from p2p.mining.lab.synth import charts, sources
    from p2p.mining.lab.synth.markers import Painter

    rng = np.random.default_rng(np.random.SeedSequence([seed, 77]))
    if kind is None:
        kinds = list(TYPE_WEIGHTS)
        p = np.array([TYPE_WEIGHTS[k] for k in kinds])
        kind = kinds[int(rng.choice(len(kinds), p=p / p.sum()))]
    w = int(rng.uniform(70, 560))
    h = int(np.clip(w * rng.uniform(0.5, 1.4), 60, 520))
    if kind == "image":
        if rng.random() < 0.12 and w > 150:
            gap = int(rng.integers(0, 6))
            k = int(rng.integers(2, 4))
            sub_w = (w - gap * (k - 1)) // k
            crop = np.full((h, sub_w * k + gap * (k - 1), 3), 255, np.uint8)
            modality = sources.choose_modality(rng)
            for i in range(k):
                sub, _, _ = sources.render_image(rng, sub_w, h, modality)
                crop[:, i * (sub_w + gap) : i * (sub_w + gap) + sub_w] = sub
        else:
            crop, _, _ = sources.render_image(rng, w, h)
            crop = crop.copy()
        painter = Painter(rng, crop, [])
        if rng.random() < 0.5 and min(w, h) >= 70:
            for _ in range(int(rng.integers(1, 4))):
                choice = rng.random()
                if choice < 0.5:
                    painter.arrow(str(rng.choice(["arrow", "arrowhead"])))
                elif choice < 0.75:
                    painter.enclosure(str(rng.choice(["box", "circle"])))
                elif choice < 0.9:
                    painter.symbol(str(rng.choice(["asterisk", "star"])))
                else:
                    painter.inset()
        if rng.random() < 0.3 and min(w, h) >= 60:
            painter.scale_bar("right")
        if rng.random() < 0.3 and min(w, h) >= 60:
            painter.text_overlay(str(rng.choice(["A", "b", "DAPI", "t = 10 s", "(c)"])), "white", "top-left")
    elif kind == "plot":
        crop, _ = charts.render_plot(rng, w, h)
    elif kind == "schematic":
        crop, _ = charts.render_schematic(rng, w, h)
    else:
        crop, _ = charts.render_table(rng, w, h)
    return _augment(rng, crop), kind


def figure_panels(seed: int) -> Iterator[tuple[np.ndarray, str]]:
    """Panels cut from one whole synthetic figure by their boxes (with a little box jitter)."""
    from p2p.mining.lab.synth import generate_figure

    rng = np.random.default_rng(np.random.SeedSequence([seed, 78]))
    w = int(rng.integers(500, 1100))
    image, gt = generate_figure(seed, width=w, height=int(w * rng.uniform(0.6, 1.0)))
    arr = np.asarray(image)
    for p in gt["panels"]:
        x0, y0, x1, y1 = p["box"]
        j = [int(rng.integers(-2, 4)) for _ in range(4)]
        x0, y0 = max(0, x0 - j[0]), max(0, y0 - j[1])
        x1, y1 = min(arr.shape[1], x1 + 1 + j[2]), min(arr.shape[0], y1 + 1 + j[3])
        if x1 - x0 >= 8 and y1 - y0 >= 8:
            yield _augment(rng, arr[y0:y1, x0:x1]), p["type"]


def synthetic_set(seeds: range, figure_seeds: range) -> tuple[np.ndarray, np.ndarray]:
    feats, labels = [], []
    for s in seeds:
        crop, kind = synthetic_panel(s)
        feats.append(panel_features(crop))
        labels.append(kind)
    for s in figure_seeds:
        for crop, kind in figure_panels(s):
            feats.append(panel_features(crop))
            labels.append(kind)
    return np.array(feats), np.array(labels)


# -- real panels ---------------------------------------------------------------------------------


def real_set(folder: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Features, types and figure names of every annotated panel of the real development set."""
    data = json.loads((folder / "annotations.json").read_text(encoding="utf-8"))
    feats, labels, figs = [], [], []
    for name in sorted(k for k in data if not k.startswith("_")):
        with Image.open(folder / name) as img:
            arr = np.asarray(img.convert("RGB"))
        for p in data[name]["panels"]:
            x0, y0, x1, y1 = p["box"]
            feats.append(panel_features(arr[y0 : y1 + 1, x0 : x1 + 1]))
            labels.append(p["type"])
            figs.append(name)
    return np.array(feats), np.array(labels), np.array(figs)


# -- model ---------------------------------------------------------------------------------------


def fit(
    features: np.ndarray,
    labels: np.ndarray,
    *,
    weights: np.ndarray | None = None,
    hidden: int = 32,
    alpha: float = 1e-3,
    lr: float = 0.01,
    max_iter: int = 1500,
    seed: int = 0,
) -> dict[str, Any]:
    """Standardise, fit a one-hidden-layer ReLU MLP (softmax, weighted cross-entropy + L2, full-batch
    Adam; plain numpy, deterministic by ``seed``) and return the JSON-able model."""
    with _one_blas_thread():  # these matrices are tiny: BLAS threads only add overhead
        return _fit(
            features, labels, weights=weights, hidden=hidden, alpha=alpha, lr=lr, max_iter=max_iter, seed=seed
        )


def _one_blas_thread() -> contextlib.AbstractContextManager[Any]:
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - threadpoolctl comes with scikit-learn
        return contextlib.nullcontext()
    return threadpool_limits(limits=1, user_api="blas")


def _fit(
    features: np.ndarray,
    labels: np.ndarray,
    *,
    weights: np.ndarray | None,
    hidden: int,
    alpha: float,
    lr: float,
    max_iter: int,
    seed: int,
) -> dict[str, Any]:
    classes = sorted({str(c) for c in labels})
    y = np.array([classes.index(str(c)) for c in labels])
    n, d = features.shape
    k = len(classes)
    sw = np.ones(n) if weights is None else np.asarray(weights, dtype=np.float64)
    sw = sw / sw.sum()
    mean = features.mean(axis=0)
    scale = features.std(axis=0)
    scale[scale < 1e-6] = 1.0
    x = (features - mean) / scale
    onehot = np.eye(k)[y]
    rng = np.random.default_rng(seed)
    params = [
        rng.normal(0.0, math.sqrt(2.0 / d), (d, hidden)),
        np.zeros(hidden),
        rng.normal(0.0, math.sqrt(1.0 / hidden), (hidden, k)),
        np.zeros(k),
    ]
    m1 = [np.zeros_like(p) for p in params]
    m2 = [np.zeros_like(p) for p in params]
    beta1, beta2, eps = 0.9, 0.999, 1e-8
    for step in range(1, max_iter + 1):
        w1, b1, w2, b2 = params
        pre = x @ w1 + b1
        hid = np.maximum(pre, 0.0)
        logits = hid @ w2 + b2
        logits -= logits.max(axis=1, keepdims=True)
        prob = np.exp(logits)
        prob /= prob.sum(axis=1, keepdims=True)
        g_logits = (prob - onehot) * sw[:, None]
        g_w2 = hid.T @ g_logits + alpha * w2 / n
        g_b2 = g_logits.sum(axis=0)
        g_hid = (g_logits @ w2.T) * (pre > 0)
        g_w1 = x.T @ g_hid + alpha * w1 / n
        g_b1 = g_hid.sum(axis=0)
        for i, g in enumerate((g_w1, g_b1, g_w2, g_b2)):
            m1[i] = beta1 * m1[i] + (1 - beta1) * g
            m2[i] = beta2 * m2[i] + (1 - beta2) * g * g
            corr1 = m1[i] / (1 - beta1**step)
            corr2 = m2[i] / (1 - beta2**step)
            params[i] = params[i] - lr * corr1 / (np.sqrt(corr2) + eps)

    def r(a: np.ndarray) -> list[Any]:
        return np.round(np.asarray(a, dtype=np.float64), 6).tolist()

    return {
        "format": "p2p panel-type mlp v1",
        "features": list(FEATURE_NAMES),
        "classes": classes,
        "mean": r(mean),
        "scale": r(scale),
        "layers": [
            {"W": r(params[0]), "b": r(params[1]), "activation": "relu"},
            {"W": r(params[2]), "b": r(params[3]), "activation": "softmax"},
        ],
    }


def confusion(truth: np.ndarray, pred: np.ndarray) -> dict[str, dict[str, int]]:
    return {t: {p: int(((truth == t) & (pred == p)).sum()) for p in PANEL_TYPES} for t in PANEL_TYPES}


def predict(model: dict[str, Any], features: np.ndarray) -> np.ndarray:
    clf = PanelTypeClassifier(model)
    probs = clf.predict_proba_features(features)
    return np.array([clf.classes[i] for i in probs.argmax(axis=1)])


def format_confusion(conf: dict[str, dict[str, int]]) -> str:
    rows = [t for t in PANEL_TYPES if sum(conf[t].values())]
    lines = ["| truth \\ predicted | " + " | ".join(PANEL_TYPES) + " |", "|---|" + "---|" * len(PANEL_TYPES)]
    for t in rows:
        lines.append(f"| {t} | " + " | ".join(str(conf[t][p]) for p in PANEL_TYPES) + " |")
    return "\n".join(lines)


def train(
    *,
    real_dir: Path | None = DEFAULT_REAL_DIR,
    n_train: int = 3000,
    n_test: int = 800,
    n_figures: int = 150,
    real_weight: float = 4.0,
    max_iter: int = 1500,
    cache: Path | None = None,
    out: Path | None = None,
    log: Any = print,
) -> dict[str, Any]:
    """Build the data, score held-out sets, fit the final model and write it; returns the report."""
    started = time.perf_counter()
    cached = False
    if cache is not None and Path(cache).is_file():
        with np.load(Path(cache)) as data:
            cached = [int(v) for v in data["sizes"]] == [n_train, n_figures, n_test]
            if cached:
                xs, ys, xt, yt = data["xs"], data["ys"].astype(str), data["xt"], data["yt"].astype(str)
                log(f"synthetic features read from {cache}")
    if not cached:
        log(f"synthetic training panels: {n_train} direct + panels of {n_figures} figures ...")
        xs, ys = synthetic_set(range(n_train), range(FIGURE_SEED_BASE, FIGURE_SEED_BASE + n_figures))
        log(f"synthetic held-out panels: seeds {TEST_SEED_BASE}..{TEST_SEED_BASE + n_test - 1} ...")
        xt, yt = synthetic_set(range(TEST_SEED_BASE, TEST_SEED_BASE + n_test), range(0))
        if cache is not None:
            np.savez(Path(cache), xs=xs, ys=ys, xt=xt, yt=yt, sizes=np.array([n_train, n_figures, n_test]))
    log(f"  {len(ys)} training panels: " + ", ".join(f"{t}={int((ys == t).sum())}" for t in PANEL_TYPES))
    report: dict[str, Any] = {"train_panels": len(ys), "synthetic_test_panels": len(yt)}

    xr = yr = fr = None
    if real_dir is not None and (Path(real_dir) / "annotations.json").is_file():
        xr, yr, fr = real_set(Path(real_dir))
        log(f"real panels: {len(yr)} from {len(set(fr.tolist()))} figures")

    # synthetic-only model: scored on held-out synthetic seeds and on every real panel
    synth_model = fit(xs, ys, max_iter=max_iter)
    pred = predict(synth_model, xt)
    report["synthetic_heldout"] = {"accuracy": float((pred == yt).mean()), "confusion": confusion(yt, pred)}
    binary = float(((pred == "image") == (yt == "image")).mean())
    report["synthetic_heldout"]["image_vs_rest_accuracy"] = binary
    log(f"held-out synthetic accuracy (synthetic-only model): {report['synthetic_heldout']['accuracy']:.3f}")
    if xr is not None and yr is not None and fr is not None:
        pred_r = predict(synth_model, xr)
        report["real_synthetic_only"] = {
            "accuracy": float((pred_r == yr).mean()),
            "confusion": confusion(yr, pred_r),
        }
        log(f"real accuracy, synthetic-only model: {report['real_synthetic_only']['accuracy']:.3f}")
        # leave one real figure out
        lofo = np.empty(len(yr), dtype=object)
        for fig in sorted(set(fr.tolist())):
            keep = fr != fig
            x_train = np.concatenate([xs, xr[keep]])
            y_train = np.concatenate([ys, yr[keep]])
            w_train = np.concatenate([np.ones(len(ys)), np.full(int(keep.sum()), real_weight)])
            lofo[~keep] = predict(fit(x_train, y_train, weights=w_train, max_iter=max_iter), xr[~keep])
        lofo = lofo.astype(str)
        report["real_leave_one_figure_out"] = {
            "accuracy": float((lofo == yr).mean()),
            "confusion": confusion(yr, lofo),
        }
        log(f"real accuracy, leave-one-figure-out: {report['real_leave_one_figure_out']['accuracy']:.3f}")
        x_final = np.concatenate([xs, xr])
        y_final = np.concatenate([ys, yr])
        w_final = np.concatenate([np.ones(len(ys)), np.full(len(yr), real_weight)])
    else:
        x_final, y_final, w_final = xs, ys, np.ones(len(ys))
    model = fit(x_final, y_final, weights=w_final, max_iter=max_iter)
    pred = predict(model, xt)
    report["synthetic_heldout_final_model"] = {
        "accuracy": float((pred == yt).mean()),
        "confusion": confusion(yt, pred),
    }
    final_acc = report["synthetic_heldout_final_model"]["accuracy"]
    log(f"held-out synthetic accuracy (final model): {final_acc:.3f}")
    report["seconds"] = round(time.perf_counter() - started, 1)
    model["trained_on"] = {
        "synthetic_direct_seeds": [0, n_train - 1],
        "synthetic_figure_seeds": [FIGURE_SEED_BASE, FIGURE_SEED_BASE + n_figures - 1],
        "heldout_synthetic_seeds_from": TEST_SEED_BASE,
        "real_panels": len(yr) if yr is not None else 0,
        "real_weight": real_weight,
    }
    model["heldout"] = {
        k: {"accuracy": round(v["accuracy"], 4)}
        for k, v in report.items()
        if isinstance(v, dict) and "accuracy" in v
    }
    if out is not None:
        Path(out).write_text(json.dumps(model, separators=(",", ":")), encoding="utf-8")
        log(f"wrote {out} ({Path(out).stat().st_size / 1024:.0f} KiB)")
    for key in (
        "synthetic_heldout",
        "real_synthetic_only",
        "real_leave_one_figure_out",
        "synthetic_heldout_final_model",
    ):
        if key in report:
            table = format_confusion(report[key]["confusion"])
            log(f"\n{key}: accuracy {report[key]['accuracy']:.3f}\n{table}")
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--real-dir", type=Path, default=DEFAULT_REAL_DIR, help="real figures + annotations.json"
    )
    parser.add_argument("--no-real", action="store_true", help="train on synthetic panels only")
    parser.add_argument("--train", type=int, default=3000, help="synthetic training panels drawn directly")
    parser.add_argument("--figures", type=int, default=150, help="whole synthetic figures cut into panels")
    parser.add_argument("--test", type=int, default=800, help="held-out synthetic panels")
    parser.add_argument("--out", type=Path, default=artifact_path(MODEL_FILE))
    parser.add_argument("--report", type=Path, default=None, help="also write the report as JSON here")
    parser.add_argument("--cache", type=Path, default=None, help="npz to keep/reuse the synthetic features")
    args = parser.parse_args(argv)
    report = train(
        real_dir=None if args.no_real else args.real_dir,
        n_train=args.train,
        n_test=args.test,
        n_figures=args.figures,
        cache=args.cache,
        out=args.out,
    )
    if args.report is not None:
        args.report.write_text(json.dumps(report, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
