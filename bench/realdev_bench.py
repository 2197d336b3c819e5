"""Real figures: the CPU miner of this tree against a starting commit and the naive XY-cut, in one run.

    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python bench/realdev_bench.py \\
        --data ../shared/data/real-dev --base-ref a0df353 --out bench/results/realdev.json

Each miner runs in its own process (one thread: OMP, OpenCV and torch pinned to one) over every
figure of the set, ABBA (this tree, base, base, this tree) so that load on a shared machine
falls on both alike; CPU seconds per figure are the mean of a figure's two runs. The base
commit is taken with ``git archive`` into a scratch folder and imported from there. All results
are scored by this tree's ``p2p.mining.lab.evaluate`` per split of ``splits.json`` (tune, check),
with the naive XY-cut reference beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def mine_all(data: Path, out: Path) -> None:
    """Child mode: mine every figure with whichever ``p2p`` is importable; pickle the results."""
    import cv2
    import torch
    from PIL import Image

    cv2.setNumThreads(1)
    torch.set_num_threads(1)
    from p2p.mining.pipeline import CpuMiner

    annotations = json.loads((data / "annotations.json").read_text())
    miner = CpuMiner()  # every model loaded before the first figure is timed
    results: dict[str, Any] = {}
    for name in sorted(k for k in annotations if not k.startswith("_")):
        with Image.open(data / name) as img:
            image = np.asarray(img.convert("RGB"))
        caption = annotations[name].get("caption") or ""
        started = time.process_time()
        result = miner.mine(image, caption)
        results[name] = (result, time.process_time() - started)
    version = str(getattr(miner, "revision", None) or miner.version)
    out.write_bytes(pickle.dumps({"version": version, "results": results}))


def base_tree(ref: str, scratch: Path) -> Path:
    """The ``ref`` commit unpacked under ``scratch``, with a ``p2p`` package of links into it
    (the package layout its pyproject declares); returns the folder to put on PYTHONPATH."""
    src = scratch / "src"
    src.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    layout = tomllib.loads((src / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    package = scratch / "pkg" / "p2p"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    for name, folder in layout.items():
        (package / name.split(".", 1)[1]).symlink_to(src / folder)
    return package.parent


def run_child(data: Path, out: Path, pythonpath: Path | None) -> float:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, __file__, "--mine", str(out), "--data", str(data)],
        check=True,
        env=env,
        cwd=str(ROOT),
    )
    return time.perf_counter() - started


def score(data: Path, runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    from PIL import Image

    from p2p.mining.lab.evaluate import Tally, naive_reference, score_figure

    annotations = json.loads((data / "annotations.json").read_text())
    splits = json.loads((data / "splits.json").read_text())
    report: dict[str, Any] = {}
    for split in ("tune", "check"):
        for label, dumps in [*runs.items(), ("naive_xycut", [])]:
            tally = Tally()
            seconds = []
            for name in sorted(splits[split]):
                truth = annotations[name]
                if dumps:
                    result = dumps[0]["results"][name][0]
                    spent = float(np.mean([d["results"][name][1] for d in dumps]))
                else:
                    with Image.open(data / name) as img:
                        image = np.asarray(img.convert("RGB"))
                    started = time.process_time()
                    result = naive_reference(image, truth.get("caption") or "")
                    spent = time.process_time() - started
                seconds.append(spent)
                score_figure(tally, name, truth, result, spent)
            entry = tally.report()
            entry["version"] = dumps[0]["version"] if dumps else "naive"
            entry["cpu_seconds"] = _spread(seconds)
            report[f"{label}/{split}"] = entry
    for label, dumps in runs.items():
        everything = [float(np.mean([d["results"][n][1] for d in dumps])) for n in dumps[0]["results"]]
        report[f"{label}/all_cpu_seconds"] = _spread(everything)
    return report


def _spread(values: list[float]) -> dict[str, float]:
    array = np.asarray(values, dtype=float)
    return {
        "median": float(np.median(array)),
        "p90": float(np.percentile(array, 90)),
        "max": float(array.max()),
    }


def table(report: dict[str, Any]) -> str:
    rows = [
        "| run | split | F1@0.5 | F1@0.9 | P@0.9 | R@0.9 | AP50 | AP50:95 | label AP50 | wrong count "
        "| labels | markers R / P | subcaption F1 | CPU s median / p90 / max |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for key, r in report.items():
        if key.endswith("all_cpu_seconds"):
            continue
        label, split = key.split("/")
        panels, coco, counts, cpu = r["panels"], r["coco"], r["counts"], r["cpu_seconds"]

        def num(value: object) -> str:
            return "-" if value is None else f"{value:.3f}"

        rows.append(
            f"| {label} ({r['version']}) | {split} | {panels['0.5']['f1']:.3f} | {panels['0.9']['f1']:.3f} "
            f"| {panels['0.9']['precision']:.3f} | {panels['0.9']['recall']:.3f} | {coco['panels_ap50']:.3f} "
            f"| {coco['panels_ap50_95']:.3f} | {coco['labels_ap50']:.3f} "
            f"| {counts['too_many'] + counts['too_few']}/{r['figures']} | {num(r['label_accuracy'])} "
            f"| {num(r['marker_target_recall'])} / {num(r['marker_precision'])} "
            f"| {num(r['subcaption_token_f1'])} "
            f"| {cpu['median']:.2f} / {cpu['p90']:.2f} / {cpu['max']:.2f} |"
        )
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "real-dev")
    parser.add_argument("--base-ref", default="a0df353", help="The commit to compare with.")
    parser.add_argument("--out", type=Path, default=Path("realdev-bench.json"))
    parser.add_argument("--mine", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mine is not None:
        mine_all(args.data, args.mine)
        return
    with tempfile.TemporaryDirectory(prefix="realdev-bench-") as scratch_dir:
        scratch = Path(scratch_dir)
        base_path = base_tree(args.base_ref, scratch / "base")
        dumps: dict[str, list[dict[str, Any]]] = {"this_tree": [], f"base_{args.base_ref}": []}
        for k, label in enumerate(
            ["this_tree", f"base_{args.base_ref}", f"base_{args.base_ref}", "this_tree"]
        ):
            out = scratch / f"run{k}.pkl"
            wall = run_child(args.data, out, base_path if label.startswith("base") else None)
            print(f"run {k}: {label} {wall:.0f} s wall", flush=True)
            dumps[label].append(pickle.loads(out.read_bytes()))
        report = score(args.data, dumps)
    args.out.write_text(json.dumps(report, indent=1, default=str))
    print(table(report))
    for key, value in report.items():
        if key.endswith("all_cpu_seconds"):
            print(f"{key}: median {value['median']:.3f} p90 {value['p90']:.3f} max {value['max']:.3f}")


if __name__ == "__main__":
    main()
