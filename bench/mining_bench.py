"""Mining quality and speed: the CPU miner against the naive XY-cut reference, in one run.

    .venv/bin/python bench/mining_bench.py [--real DIR] [--captions JSONL] [--synthetic N] [--seed S]

* real development figures (../shared/data/real-figures): panel F1 at IoU 0.5/0.75/0.9, mean IoU,
  label accuracy, subcaption exact / token F1, marker target recall, figure-type accuracy;
* synthetic figures generated on a seed never used in development, same metrics;
* the caption-splitting set (../shared/data/caption-splitting/prostate.jsonl) with its baselines;
* speed: 1000x800 synthetic figures through CpuMiner.mine, one process and one process per core,
  each set up as a mining worker process is (``prepare_worker_process``: one torch thread), with
  wall and CPU time and each worker's resident memory after the run.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"


def _speed_worker(args: tuple[list[str], list[str]]) -> dict[str, float]:
    import numpy as np
    import psutil
    from PIL import Image

    from p2p.mining.tasks import get_miner, prepare_worker_process
    from p2p.shared.settings import get_settings

    paths, captions = args
    prepare_worker_process(get_settings())  # as a mining worker process starts: torch threads, models
    miner = get_miner("cpu")
    images = [np.asarray(Image.open(p).convert("RGB")) for p in paths]
    miner.mine(images[0], captions[0])  # warm-up: lazy imports
    started, cpu_started = time.perf_counter(), time.process_time()
    for image, caption in zip(images, captions, strict=True):
        miner.mine(image, caption)
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    return {
        "figures": len(images),
        "seconds": elapsed,
        "cpu_seconds": cpu,
        "rss_mb": psutil.Process().memory_info().rss / 2**20,
    }


def speed(folder: Path, processes: int) -> dict[str, Any]:
    annotations = json.loads((folder / "annotations.json").read_text())
    names = sorted(n for n in annotations if not n.startswith("_"))
    paths = [str(folder / n) for n in names]
    captions = [annotations[n].get("caption", "") for n in names]
    chunks = [(paths[i::processes], captions[i::processes]) for i in range(processes)]
    ctx = mp.get_context("spawn")
    started = time.perf_counter()
    with ctx.Pool(processes) as pool:
        parts = pool.map(_speed_worker, chunks)
    wall = time.perf_counter() - started
    busy = max(p["seconds"] for p in parts)
    figures = sum(int(p["figures"]) for p in parts)
    return {
        "processes": processes,
        "figures": figures,
        "figures_per_s": figures / busy,
        # Waiting for a core shared with other jobs does not count here: the miner's own cost.
        "figures_per_cpu_s": figures / sum(p["cpu_seconds"] for p in parts),
        "wall_s_including_model_load": wall,
        "rss_mb_per_worker": [round(p["rss_mb"], 1) for p in parts],
    }


def speed_abba(folder: Path, rounds: int) -> dict[str, Any]:
    """Worker set-up scaling: all cores' processes (product) against one process (reference), A B B A
    (``abba``), each slice's rate over the workers' own mining time (model loading left out); the
    ratio says how much a second worker adds on this machine. Absolute figures/s are per machine:
    they are recorded with the CPU model and SIMD flags."""
    from abba import interleave, machine_record

    cores = os.cpu_count() or 1

    def side(processes: int) -> Any:
        def run() -> tuple[int, dict[str, Any]]:
            out = speed(folder, processes)
            return out["figures"], {
                "wall_s": out["figures"] / out["figures_per_s"],
                "cpu_s": out["figures"] / out["figures_per_cpu_s"],
                "processes": processes,
            }

        return run

    result = interleave(side(cores), side(1), rounds=rounds)
    record = result.as_dict()
    return {
        "processes": cores,
        "figures_per_s": {
            "one": record["reference"]["items_per_s"],
            "all_cores": record["product"]["items_per_s"],
        },
        "figures_per_cpu_s": {
            "one": 1 / record["reference"]["cpu_s_per_item"],
            "all_cores": 1 / record["product"]["cpu_s_per_item"],
        },
        "scaling": result.median_ratio,
        "abba": record,
        "machine": machine_record(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--real", type=Path, default=SHARED / "real-figures")
    parser.add_argument("--captions", type=Path, default=SHARED / "caption-splitting" / "prostate.jsonl")
    parser.add_argument("--synthetic", type=int, default=200, help="synthetic figures to generate and score")
    parser.add_argument("--seed", type=int, default=424242, help="a seed never used in development")
    parser.add_argument("--speed-figures", type=int, default=120)
    parser.add_argument(
        "--speed-only",
        type=int,
        default=0,
        metavar="ROUNDS",
        help="only the speed part, A B B A over ROUNDS rounds",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "mining.json")
    args = parser.parse_args()

    from p2p.mining.lab.eval_captions import evaluate_prostate
    from p2p.mining.lab.evaluate import cpu_miner, evaluate_folder, naive_reference
    from p2p.mining.lab.synth import write_dataset

    report: dict[str, Any] = {
        "benchmark": "mining",
        "date": time.strftime("%Y-%m-%d"),
        "machine": {
            "nproc": os.cpu_count(),
            "python": sys.version.split()[0],
            "platform": platform.platform(),
        },
    }
    if args.speed_only:
        return speed_only(args, report)
    miner = cpu_miner()
    if (args.real / "annotations.json").is_file():
        report["real"] = {
            "cpu": evaluate_folder(args.real, miner),
            "naive_xycut": evaluate_folder(args.real, naive_reference),
        }
    if args.captions.is_file():
        report["captions"] = evaluate_prostate(args.captions)
    with tempfile.TemporaryDirectory(prefix="p2p-synth-bench-") as tmp:
        synth = Path(tmp) / "synthetic"
        write_dataset(synth, args.synthetic, args.seed)
        report["synthetic"] = {
            "seed": args.seed,
            "cpu": evaluate_folder(synth, miner),
            "naive_xycut": evaluate_folder(synth, naive_reference),
        }
        fast = Path(tmp) / "speed"
        write_dataset(fast, args.speed_figures, args.seed + 1)
        report["speed"] = [speed(fast, 1), speed(fast, os.cpu_count() or 1)]
    for section in ("real", "synthetic"):
        for run in report.get(section, {}).values():
            if isinstance(run, dict):
                run.pop("per_figure", None)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    return 0


def speed_only(args: argparse.Namespace, report: dict[str, Any]) -> int:
    from p2p.mining.lab.synth import write_dataset

    with tempfile.TemporaryDirectory(prefix="p2p-synth-bench-") as tmp:
        fast = Path(tmp) / "speed"
        write_dataset(fast, args.speed_figures, args.seed + 1)
        report["speed_abba"] = speed_abba(fast, args.speed_only)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    r = report["speed_abba"]
    print(
        json.dumps(
            {k: r[k] for k in ("processes", "figures_per_s", "figures_per_cpu_s", "scaling")}, indent=1
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
