"""Hybrid LVLM mining against CPU-only on real-dev check, the simulated server answering from
the real annotations (fault mix of lvlm_bench.QUALITY_FAULTS). The server answers from ground
truth: this measures how the product handles a model's answers on real layouts, not a model.

    OMP_NUM_THREADS=1 .venv/bin/python bench/realdev_hybrid.py DIR   # DIR: check images + annotations.json
"""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
import lvlm_bench as lb  # noqa: E402

from p2p.mining.pipeline import CpuMiner  # noqa: E402


def main() -> None:
    folder = Path(sys.argv[1])
    items = lb.load(folder)
    items = [(name, image, {**truth, "caption": truth.get("caption") or ""}) for name, image, truth in items]
    cpu = CpuMiner()
    results, seconds, _, _ = lb.mine_all(cpu, items, 2)
    report = {
        "cpu": lb.quality(items, results, seconds),
        "hybrid": lb.run_mode("hybrid", folder, items, cpu, lb.QUALITY_FAULTS, 2),
    }
    out = Path(sys.argv[2]) if len(sys.argv) > 2 else Path("realdev-hybrid.json")
    out.write_text(json.dumps(report, indent=1, default=str))
    for name, quality in (("cpu", report["cpu"]), ("hybrid", report["hybrid"]["quality"])):
        panels = quality["panels"]["0.9"]["f1"]
        labels, subs = quality["label_accuracy"] or 0, quality["subcaption_token_f1"] or 0
        print(f"{name} F1@0.9 {panels:.3f} labels {labels:.3f} subcaption F1 {subs:.3f}")
    print(
        "hybrid cost per figure:",
        {
            k: report["hybrid"]["cost_per_figure"][k]
            for k in ("requests", "prompt_tokens", "completion_tokens", "fallbacks")
        },
        "figures lost:",
        report["hybrid"]["figures_lost"],
    )


if __name__ == "__main__":
    main()
