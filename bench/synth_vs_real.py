"""Where synthetic and real scores disagree: the CPU miner on held-out synthetic sets of both
generator profiles and on the real development set's splits, scored alike, in one run.

    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python bench/synth_vs_real.py \\
        --real ../shared/data/real-dev --work /tmp/synth-vs-real \\
        --out bench/results/2026-11-27-synth-vs-real.json

The synthetic sets are written once into ``--work`` (``p2p synth`` would write the same:
``write_dataset(folder, count, seed, profile=...)``) and reused when present; every figure is
decoded as the miner's callers decode it (``flatten_on_white``) and mined by this tree's
``CpuMiner`` on one thread. Scores come from ``p2p.mining.lab.evaluate`` (the numbers ``p2p eval
mining`` prints), plus, per set, recall at IoU 0.9 by panel type and, for the realistic profile,
by block kind, size class and transparency, so a gap between synthetic and real points at what
the generator draws too easily or not at all.
"""

from __future__ import annotations

import argparse
import json
import pickle
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from p2p.mining.lab.eval_detection import BUCKETS

ROOT = Path(__file__).resolve().parent.parent
SETS = ("realistic", "classic", "real-dev/tune", "real-dev/check")


def synthetic_set(work: Path, profile: str, seed: int, count: int) -> Path:
    from p2p.mining.lab.synth.dataset import write_dataset

    folder = work / f"{profile}-seed{seed}-n{count}"
    if not (folder / "annotations.json").is_file():
        started = time.perf_counter()
        write_dataset(folder, count, seed, profile=profile)
        print(f"wrote {folder} in {time.perf_counter() - started:.0f} s", flush=True)
    return folder


def mine_folder(folder: Path, names: list[str], cache: Path) -> dict[str, tuple[Any, float]]:
    """name -> (MiningResult, CPU seconds), kept in ``cache`` every few figures (a stopped run
    resumes where it was)."""
    done: dict[str, tuple[Any, float]] = pickle.loads(cache.read_bytes()) if cache.is_file() else {}
    todo = [name for name in names if name not in done]
    if todo:
        _mine_into(folder, todo, done, cache)
    return {name: done[name] for name in names}


def _mine_into(folder: Path, names: list[str], done: dict[str, tuple[Any, float]], cache: Path) -> None:
    import cv2
    import torch
    from PIL import Image

    from p2p.mining.pipeline import CpuMiner
    from p2p.shared.images import flatten_on_white

    cv2.setNumThreads(1)
    torch.set_num_threads(1)
    annotations = json.loads((folder / "annotations.json").read_text())
    miner = CpuMiner()
    for k, name in enumerate(names, 1):
        with Image.open(folder / name) as img:
            image = np.asarray(flatten_on_white(img))
        started = time.process_time()
        result = miner.mine(image, annotations[name].get("caption") or "")
        done[name] = (result, time.process_time() - started)
        if k % 10 == 0 or k == len(names):
            cache.write_bytes(pickle.dumps(done))


def _recall_by(
    annotations: dict[str, Any], mined: dict[str, tuple[Any, float]], key: Any
) -> dict[str, dict[str, float]]:
    """Recall at IoU 0.9 of the true panels grouped by ``key(entry, panel_index)``."""
    from p2p.shared import geometry

    hits: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for name, (result, _) in mined.items():
        truth = annotations[name]
        boxes = [geometry.from_inclusive(p["box"]) for p in truth["panels"]]
        matched = {j for _, j, _ in geometry.match_greedy([p.box for p in result.panels], boxes, 0.9)}
        for j in range(len(boxes)):
            group = str(key(truth, j))
            hits[group][0] += int(j in matched)
            hits[group][1] += 1
    return {g: {"recall_0.9": h / n, "panels": n} for g, (h, n) in sorted(hits.items())}


def _panel_kinds(truth: dict[str, Any]) -> list[str]:
    """The block kind of each true panel, in order: a sub-labelled grid's block gives one panel
    per picture, every other block one."""
    kinds: list[str] = []
    for block in truth["synth"]["blocks"]:
        pictures = (
            block["parts"].get("subimages", []) if block["kind"] == "sub_grid" and block["label"] else []
        )
        kinds += [block["kind"]] * max(1, len(pictures))
    return kinds


def _figure_groups(
    annotations: dict[str, Any], mined: dict[str, tuple[Any, float]], key: Any
) -> dict[str, dict[str, Any]]:
    """The evaluator's report per group of figures (``key(entry)``)."""
    from p2p.mining.lab.evaluate import Tally, score_figure

    tallies: dict[str, Tally] = defaultdict(Tally)
    for name, (result, seconds) in mined.items():
        score_figure(tallies[str(key(annotations[name]))], name, annotations[name], result, seconds)
    return {g: _summary(t.report()) for g, t in sorted(tallies.items())}


def _summary(report: dict[str, Any]) -> dict[str, Any]:
    counts = report["counts"]
    return {
        "figures": report["figures"],
        "f1_0.5": report["panels"]["0.5"]["f1"],
        "f1_0.9": report["panels"]["0.9"]["f1"],
        "precision_0.9": report["panels"]["0.9"]["precision"],
        "recall_0.9": report["panels"]["0.9"]["recall"],
        "ap50_95": report["coco"]["panels_ap50_95"],
        "wrong_count": counts["too_many"] + counts["too_few"],
        "too_many": counts["too_many"],
        "too_few": counts["too_few"],
        "labels": report["label_accuracy"],
        "buckets": report["buckets"]["counts"],
        "misses": report["buckets"]["misses"],
    }


def score_set(
    folder: Path, names: list[str], mined: dict[str, tuple[Any, float]], synth: bool
) -> dict[str, Any]:
    from p2p.mining.lab.evaluate import Tally, score_figure

    annotations = json.loads((folder / "annotations.json").read_text())
    tally = Tally()
    for name in names:
        result, seconds = mined[name]
        score_figure(tally, name, annotations[name], result, seconds)
    entry = _summary(tally.report())
    entry["panels"] = sum(len(annotations[n]["panels"]) for n in names)
    entry["cpu_seconds_median"] = float(np.median([mined[n][1] for n in names]))
    entry["recall_by_type"] = _recall_by(annotations, mined, lambda t, j: t["panels"][j].get("type"))
    entry["recall_by_outer_box"] = _recall_by(
        annotations, mined, lambda t, j: "outer_box" if t["panels"][j].get("outer_box") else "no outer_box"
    )
    entry["by_labels"] = _figure_groups(
        annotations, mined, lambda t: "labelled" if any(p.get("label") for p in t["panels"]) else "unlabelled"
    )
    if synth and any("blocks" in annotations[n].get("synth", {}) for n in names):
        entry["recall_by_kind"] = _recall_by(annotations, mined, lambda t, j: _panel_kinds(t)[j])
        entry["by_size_class"] = _figure_groups(annotations, mined, lambda t: t["synth"]["size_class"])
        entry["by_transparency"] = _figure_groups(
            annotations, mined, lambda t: "transparent" if t["synth"]["transparent"] else "opaque"
        )
    return entry


def _num(value: object) -> str:
    return "-" if value is None else f"{value:.3f}"


def table(report: dict[str, Any]) -> str:
    head = (
        "| set | figures | panels | F1@0.5 | F1@0.9 | P@0.9 | R@0.9 | AP50:95 | wrong count | labels | "
        + " | ".join(BUCKETS)
        + " | CPU s median |"
    )
    rows = [head, "|" + "---|" * 2 + "---:|" * (9 + len(BUCKETS))]
    for name in SETS:
        r = report[name]
        buckets = " | ".join(str(r["buckets"].get(b, 0)) for b in BUCKETS)
        rows.append(
            f"| {name} | {r['figures']} | {r['panels']} | {r['f1_0.5']:.3f} | {r['f1_0.9']:.3f} "
            f"| {r['precision_0.9']:.3f} | {r['recall_0.9']:.3f} | {r['ap50_95']:.3f} "
            f"| {r['wrong_count']}/{r['figures']} ({r['too_many']} many, {r['too_few']} few) "
            f"| {_num(r['labels'])} | {buckets} | {r['cpu_seconds_median']:.2f} |"
        )
    return "\n".join(rows)


def breakdowns(report: dict[str, Any]) -> str:
    lines = ["| set | panel type | recall@0.9 | panels |", "|---|---|---:|---:|"]
    for name in SETS:
        for group, value in report[name]["recall_by_type"].items():
            lines.append(f"| {name} | {group} | {value['recall_0.9']:.3f} | {value['panels']} |")
    lines += ["", "| set | panel | recall@0.9 | panels |", "|---|---|---:|---:|"]
    for name in SETS:
        for group, value in report[name]["recall_by_outer_box"].items():
            lines.append(f"| {name} | {group} | {value['recall_0.9']:.3f} | {value['panels']} |")
    lines += ["", "| set | figures | count | F1@0.9 | P@0.9 | wrong count |", "|---|---|---:|---:|---:|---:|"]
    for name in SETS:
        groups = {**report[name]["by_labels"], **report[name].get("by_size_class", {})}
        groups.update(report[name].get("by_transparency", {}))
        for group, g in groups.items():
            lines.append(
                f"| {name} | {group} | {g['figures']} | {g['f1_0.9']:.3f} | {g['precision_0.9']:.3f} "
                f"| {g['wrong_count']} |"
            )
    kinds = report["realistic"].get("recall_by_kind", {})
    lines += ["", "| realistic block kind | recall@0.9 | panels |", "|---|---:|---:|"]
    lines += [f"| {k} | {v['recall_0.9']:.3f} | {v['panels']} |" for k, v in kinds.items()]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--real", type=Path, default=ROOT.parent / "shared" / "data" / "real-dev")
    parser.add_argument("--work", type=Path, default=Path("/tmp/synth-vs-real"))
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument(
        "--realistic-seed", type=int, default=20261127, help="held out: tune on no figure of it"
    )
    parser.add_argument("--classic-seed", type=int, default=424242)
    parser.add_argument(
        "--classic-count", type=int, default=None, help="figures of the classic set (default --count)"
    )
    parser.add_argument(
        "--limit", type=int, default=None, help="mine and score the first N realistic figures"
    )
    parser.add_argument("--classic-limit", type=int, default=None, help="the same for the classic set")
    parser.add_argument("--out", type=Path, default=Path("synth-vs-real.json"))
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    from p2p.mining.lab.synth.dataset import load_annotations

    report: dict[str, Any] = {}
    for profile, seed, count, limit in (
        ("realistic", args.realistic_seed, args.count, args.limit),
        ("classic", args.classic_seed, args.classic_count or args.count, args.classic_limit),
    ):
        folder = synthetic_set(args.work, profile, seed, count)
        names = sorted(load_annotations(folder))[:limit]
        started = time.perf_counter()
        mined = mine_folder(folder, names, args.work / f"mined-{folder.name}.pkl")
        print(f"{profile}: mined {len(names)} in {time.perf_counter() - started:.0f} s wall", flush=True)
        report[profile] = score_set(folder, names, mined, synth=True)
        report[profile]["seed"] = seed
    splits = json.loads((args.real / "splits.json").read_text())
    everything = sorted(splits["tune"]) + sorted(splits["check"])
    mined = mine_folder(args.real, everything, args.work / "mined-real-dev.pkl")
    for split in ("tune", "check"):
        names = sorted(splits[split])
        report[f"real-dev/{split}"] = score_set(args.real, names, {n: mined[n] for n in names}, synth=False)
    args.out.write_text(json.dumps(report, indent=1))
    print(table(report))
    print()
    print(breakdowns(report))


if __name__ == "__main__":
    main()
