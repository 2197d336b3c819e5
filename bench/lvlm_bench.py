"""LVLM mining against the simulated vLLM server: robustness, cost of paper vs hybrid mode, throughput.

    .venv/bin/python bench/lvlm_bench.py [--count N] [--seed S] [--latency 1.0] [--throughput-figures N]

* Quality under faults: synthetic figures (a seed never used in development) mined by the
  paper-faithful and the hybrid mode while the simulated server jitters 10% of boxes by 8% of
  their size and misses, hallucinates and malforms 5% of its answers; the CPU backend on the same
  figures is the reference of the same run. Panel F1 at IoU 0.5/0.75/0.9, labels, subcaptions,
  marker target recall; how many hallucinated caption boxes the tau gate removed; figures lost.
* Cost per figure and mode: requests, prompt and completion tokens, retries, repairs, fallbacks,
  and simulated GPU-seconds (see GPU_MODEL).
* Throughput: figures/s through one worker process (32 threads, as `--pool threads
  --concurrency 32`, 64 requests in flight) against a server answering after 1 s.

The simulated server is the test double in tests/lvlm_sim; it answers from ground truth, so the
numbers measure the product's handling of a model's answers, not a model's vision.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# Simulated GPU time: a 72B model on 4 GPUs (tensor parallel 4) prefilling ~10k tokens/s and
# decoding ~1.5k tokens/s summed over a full batch; GPU-seconds = 4 x server-seconds.
GPU_MODEL = {"gpus": 4, "prefill_tokens_per_s": 10_000.0, "decode_tokens_per_s": 1_500.0}
QUALITY_FAULTS = {
    "jitter_rate": 0.10,
    "jitter_scale": 0.08,
    "miss_rate": 0.05,
    "hallucinate_rate": 0.05,
    "malformed_rate": 0.05,
}


def gpu_seconds(prompt_tokens: float, completion_tokens: float) -> float:
    g = GPU_MODEL
    return g["gpus"] * (
        prompt_tokens / g["prefill_tokens_per_s"] + completion_tokens / g["decode_tokens_per_s"]
    )


def load(folder: Path) -> list[tuple[str, Any, dict[str, Any]]]:
    import numpy as np
    from PIL import Image

    annotations = json.loads((folder / "annotations.json").read_text())
    items = []
    for name in sorted(n for n in annotations if not n.startswith("_")):
        with Image.open(folder / name) as img:
            items.append((name, np.asarray(img.convert("RGB")), annotations[name]))
    return items


def mine_all(miner: Any, items: list[Any], threads: int) -> tuple[list[Any], list[float], list[str], float]:
    def one(item: Any) -> tuple[Any, float, str | None]:
        _, image, truth = item
        started = time.perf_counter()
        try:
            result = miner.mine(image, truth["caption"])
        except Exception as exc:  # a lost figure is what this benchmark counts
            return None, time.perf_counter() - started, f"{type(exc).__name__}: {exc}"
        return result, time.perf_counter() - started, None

    started = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        outs = list(pool.map(one, items))
    wall = time.perf_counter() - started
    return [o[0] for o in outs], [o[1] for o in outs], [o[2] for o in outs if o[2]], wall


def quality(items: list[Any], results: list[Any], seconds: list[float]) -> dict[str, Any]:
    from p2p.mining.lab.evaluate import Tally, score_figure

    tally = Tally()
    for (name, _, truth), result, secs in zip(items, results, seconds, strict=True):
        if result is not None:
            score_figure(tally, name, truth, result, secs)
    report = tally.report()
    report.pop("per_figure")
    report.pop("stage_seconds_per_figure")
    return report


def costs(results: list[Any]) -> dict[str, Any]:
    keys = ("requests", "prompt_tokens", "completion_tokens", "retries", "repairs", "fallbacks", "failures")
    done = [r for r in results if r is not None]
    n = max(len(done), 1)
    per = {k: sum(int(r.cost.get(k, 0)) for r in done) / n for k in keys}
    per["gpu_seconds"] = gpu_seconds(per["prompt_tokens"], per["completion_tokens"])
    per["figures_with_fallback"] = sum(1 for r in done if r.cost.get("fallbacks"))
    per["decomposed_figures"] = sum(1 for r in done if "panels" in r.cost.get("stages", {}))
    stages: dict[str, dict[str, float]] = {}
    for r in done:
        for stage, values in r.cost.get("stages", {}).items():
            row = stages.setdefault(stage, dict.fromkeys(("requests", "prompt_tokens"), 0.0))
            row["requests"] += values["requests"] / n
            row["prompt_tokens"] += values["prompt_tokens"] / n
    per["stages"] = stages
    return per


def gate(items: list[Any], results: list[Any], hallucinated: list[dict[str, Any]]) -> dict[str, Any]:
    from p2p.shared import geometry

    by_name = {name: r for (name, _, _), r in zip(items, results, strict=True)}
    kept = 0
    for h in hallucinated:
        result = by_name.get(h["figure"])
        if result is None:
            continue
        box = tuple(h["box"])
        if any(r.kind == "caption" and geometry.iou(r.box, box) >= 0.5 for r in result.regions):
            kept += 1
    total = len(hallucinated)
    return {
        "hallucinated_caption_boxes": total,
        "kept": kept,
        "removed_fraction": 1 - kept / total if total else None,
    }


def run_mode(
    mode: str, folder: Path, items: list[Any], cpu: Any, faults: dict[str, Any], threads: int
) -> dict[str, Any]:
    from p2p.mining.lvlm.miner import LvlmMiner
    from p2p.shared.settings import LvlmSettings
    from tests.lvlm_sim import SimFaults, SimServer

    with SimServer([folder], faults=SimFaults(seed=11, **faults)) as sim:
        sim.warm()
        miner = LvlmMiner(LvlmSettings(base_url=sim.url, mode=mode, backoff_s=0.05), cpu=cpu)
        try:
            results, seconds, errors, wall = mine_all(miner, items, threads)
        finally:
            miner.close()
        hallucinated = [h for h in sim.stats.hallucinated_objects]
        served = {"requests": sim.stats.total_requests, "malformed": dict(sim.stats.malformed)}
    return {
        "mode": mode,
        "quality": quality(items, results, seconds),
        "cost_per_figure": costs(results),
        "tau_gate": gate(items, results, hallucinated),
        "figures_lost": len(errors),
        "errors": errors[:5],
        "server": served,
        "wall_s": wall,
    }


def throughput(
    mode: str, folder: Path, items: list[Any], cpu: Any, latency: float, threads: int
) -> dict[str, Any]:
    """The server runs in its own process here, so its work (decoding, locating views) does not
    share the client's interpreter; both still share the machine's cores."""
    import subprocess

    from p2p.mining.lvlm.miner import LvlmMiner
    from p2p.shared.settings import LvlmSettings

    server = subprocess.Popen(
        [sys.executable, "-m", "tests.lvlm_sim", str(folder), "--latency", str(latency), "--seed", "3"],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        if not line.startswith("URL "):
            raise RuntimeError(f"simulated server did not start: {line!r}")
        miner = LvlmMiner(LvlmSettings(base_url=line.split()[1], mode=mode, max_in_flight=64), cpu=cpu)
        try:
            miner.mine(items[0][1], items[0][2]["caption"])  # warm-up: connections, lazy imports
            cpu_started = time.process_time()
            results, _, errors, wall = mine_all(miner, items, threads)
            client_cpu = time.process_time() - cpu_started
            peak = miner.client.peak_in_flight
        finally:
            miner.close()
    finally:
        server.terminate()
        server.wait(timeout=30)
    requests = sum(int(r.cost.get("requests", 0)) for r in results if r is not None) / max(len(items), 1)
    return {
        "mode": mode,
        "figures": len(items),
        "seconds": wall,
        "figures_per_s": len(items) / wall,
        "requests_per_figure": requests,
        # With every request taking `latency` and 64 in flight, no client can do better than this.
        "latency_bound_figures_per_s": 64 / (requests * latency) if requests and latency else None,
        "client_cpu_s_per_figure": client_cpu / len(items),
        "peak_in_flight": peak,
        "lost": len(errors),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=40)
    parser.add_argument("--seed", type=int, default=90210)
    parser.add_argument("--latency", type=float, default=1.0)
    parser.add_argument("--throughput-figures", type=int, default=48)
    parser.add_argument("--threads", type=int, default=32)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "lvlm.json")
    args = parser.parse_args()

    from p2p.mining.lab.synth.dataset import write_dataset
    from p2p.mining.pipeline import CpuMiner

    report: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "faults": QUALITY_FAULTS}
    report["gpu_model"] = GPU_MODEL
    cpu = CpuMiner()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        write_dataset(folder, args.count, args.seed)
        items = load(folder)
        results, seconds, _errors, wall = mine_all(cpu, items, 2)
        report["cpu_reference"] = {"quality": quality(items, results, seconds), "wall_s": wall}
        for mode in ("paper", "hybrid"):
            report[mode] = run_mode(mode, folder, items, cpu, QUALITY_FAULTS, threads=8)
            print(mode, json.dumps(report[mode]["quality"]["panels"]), file=sys.stderr)
        paper, hybrid = report["paper"]["cost_per_figure"], report["hybrid"]["cost_per_figure"]
        report["hybrid_vs_paper"] = {
            "requests": hybrid["requests"] / paper["requests"],
            "prompt_tokens": hybrid["prompt_tokens"] / paper["prompt_tokens"],
            "gpu_seconds": hybrid["gpu_seconds"] / paper["gpu_seconds"],
            "panel_f1_0.9_difference": report["hybrid"]["quality"]["panels"]["0.9"]["f1"]
            - report["paper"]["quality"]["panels"]["0.9"]["f1"],
        }
        speed_items = (items * (args.throughput_figures // len(items) + 1))[: args.throughput_figures]
        report["throughput"] = [
            throughput(mode, folder, speed_items, cpu, args.latency, args.threads)
            for mode in ("paper", "hybrid")
        ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(json.dumps({k: v for k, v in report.items() if k != "args"}, indent=2))


if __name__ == "__main__":
    main()
