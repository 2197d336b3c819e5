"""Is the CPU miner's output on real figures bit-identical to a recorded reference?

    # record what a checkout mines (any checkout: its own ``p2p`` is imported, not this tree's)
    .venv/bin/python bench/mining_identity.py record --checkout /tmp/p2p-a0df353 \
        --out bench/results/mining-identity-a0df353.json
    # mine with this tree (or --checkout DIR) and compare with the recording
    .venv/bin/python bench/mining_identity.py compare bench/results/mining-identity-a0df353.json
    # speed: two checkouts on the same figures, interleaved A B B A (--rounds times)
    nice -n 10 .venv/bin/python bench/mining_identity.py speed --a /tmp/p2p-a0df353 --b . --rounds 2

Figures: ../shared/data/real-figures and ../shared/data/real-dev (both splits), every figure
with its caption. Compared: panels (box, label, label box, figure type and its confidence,
confidence, subcaption), markers, regions and notes, floats exactly. Stage timings are not
compared. A difference is printed figure by figure with the first field that differs; the exit
status is 1 when anything differs.

The miner runs in a child process whose ``p2p`` is the checkout's (a ``p2p`` package of symbolic
links to its ``shared`` and ``services/*`` folders, first on ``sys.path``), so one script compares
any two commits without reinstalling anything.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# ../shared beside the checkout (a git worktree one level deeper finds it one level up).
SHARED = next(
    (p / "shared" / "data" for p in (ROOT.parent, ROOT.parent.parent) if (p / "shared" / "data").is_dir()),
    ROOT.parent / "shared" / "data",
)
FOLDERS = ("real-figures", "real-dev")

# The package layout of a checkout: p2p.<name> lives in <folder> (pyproject's package-dir).
_PACKAGE_DIRS = {
    "shared": "shared",
    "ingest": "services/ingest",
    "mining": "services/mining",
    "training": "services/training",
    "embedding_api": "services/embedding-api",
    "cli": "services/cli",
}


def result_record(result: Any) -> dict[str, Any]:
    """What the miner decided about one figure, as plain JSON (tuples as lists, floats exact)."""

    def box(value: Any) -> list[float] | None:
        return None if value is None else [float(v) for v in value]

    return {
        "width": result.width,
        "height": result.height,
        "panels": [
            {
                "box": box(p.box),
                "label": p.label,
                "label_box": box(p.label_box),
                "figure_type": p.figure_type,
                "type_confidence": float(p.type_confidence),
                "confidence": float(p.confidence),
                "subcaption": p.subcaption,
            }
            for p in result.panels
        ],
        "markers": [
            {
                "kind": m.kind,
                "glyph_box": box(m.glyph_box),
                "target_point": [float(v) for v in m.target_point],
                "target_box": box(m.target_box),
                "confidence": float(m.confidence),
                "direction_deg": None if m.direction_deg is None else float(m.direction_deg),
                "color": None if m.color is None else [int(v) for v in m.color],
            }
            for m in result.markers
        ],
        "regions": [
            {
                "panel_index": r.panel_index,
                "box": box(r.box),
                "kind": r.kind,
                "marker_type": r.marker_type,
                "caption_text": r.caption_text,
                "confidence": float(r.confidence),
            }
            for r in result.regions
        ],
        "notes": list(result.notes),
    }


def digest(records: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(records, sort_keys=True).encode()).hexdigest()


def first_difference(expected: Any, actual: Any, path: str = "", *, rel_tol: float = 0.0) -> str | None:
    """The path of the first field where two records differ, with both values; floats within
    ``rel_tol`` of each other (relative, and absolute below 1) count as equal."""
    if isinstance(expected, dict) and isinstance(actual, dict):
        if set(expected) != set(actual):
            key = min(set(expected) ^ set(actual))
            return f"{path}.{key}: present in only one"
        pairs = [(expected[key], actual[key], f"{path}.{key}") for key in sorted(expected)]
    elif isinstance(expected, list) and isinstance(actual, list):
        if len(expected) != len(actual):
            return f"{path}: {len(expected)} items expected, {len(actual)} found"
        pairs = [(e, a, f"{path}[{i}]") for i, (e, a) in enumerate(zip(expected, actual, strict=True))]
    else:
        same = (
            math.isclose(expected, actual, rel_tol=rel_tol, abs_tol=rel_tol)
            if isinstance(expected, float) and isinstance(actual, float)
            else expected == actual
        )
        return None if same else f"{path}: expected {expected!r}, found {actual!r}"
    for e, a, where in pairs:
        found = first_difference(e, a, where, rel_tol=rel_tol)
        if found:
            return found
    return None


def figures() -> list[tuple[str, Path, str]]:
    """(key, image path, caption) of every annotated figure in the real sets."""
    out = []
    for folder_name in FOLDERS:
        folder = SHARED / folder_name
        annotations = json.loads((folder / "annotations.json").read_text())
        for name in sorted(n for n in annotations if not n.startswith("_")):
            out.append((f"{folder_name}/{name}", folder / name, annotations[name].get("caption", "")))
    return out


def _child(out: Path) -> None:
    """Runs in the child process, with the checkout's ``p2p`` first on ``sys.path``."""
    import numpy as np
    import torch
    from PIL import Image

    from p2p.mining.pipeline import CpuMiner

    torch.set_num_threads(1)  # as a mining worker runs (settings.mining.torch_threads)
    miner = CpuMiner()
    records: dict[str, Any] = {}
    inputs = []
    for key, path, caption in figures():
        with Image.open(path) as img:
            inputs.append((key, np.asarray(img.convert("RGB")), caption))
    miner.mine(inputs[0][1], inputs[0][2])  # warm-up: first-call costs are not the miner's speed
    started, cpu_started = time.perf_counter(), time.process_time()
    for key, image, caption in inputs:
        records[key] = result_record(miner.mine(image, caption))
    payload = {
        "figures": records,
        "digest": digest(records),
        "seconds": time.perf_counter() - started,
        "cpu_seconds": time.process_time() - cpu_started,
    }
    out.write_text(json.dumps(payload, indent=1, sort_keys=True) + "\n")


def _shim(checkout: Path, into: Path) -> Path:
    package = into / "p2p"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name, folder in _PACKAGE_DIRS.items():
        if (checkout / folder).is_dir():
            (package / name).symlink_to(checkout / folder)
    return into


def mine_with(checkout: Path | None) -> dict[str, Any]:
    """Mine every figure with ``checkout``'s miner (None: the installed ``p2p``) in a child process."""
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ)
        if checkout is not None:
            shim = _shim(checkout.resolve(), Path(tmp))
            env["PYTHONPATH"] = os.pathsep.join([str(shim), str(ROOT)])
        out = Path(tmp) / "out.json"
        subprocess.run([sys.executable, __file__, "_child", str(out)], check=True, env=env)
        return json.loads(out.read_text())


def compare(expected: dict[str, Any], actual: dict[str, Any]) -> list[str]:
    problems = []
    for key in sorted(set(expected) | set(actual)):
        if key not in actual or key not in expected:
            problems.append(f"{key}: mined by only one side")
            continue
        found = first_difference(expected[key], actual[key])
        if found:
            problems.append(f"{key}{found}")
    return problems


def _speed(a: Path, b: Path, rounds: int) -> int:
    """Each checkout mines every figure in a process of its own (one torch thread, models loaded
    and one figure mined before the clock starts), A B B A ``rounds`` times; the ratios of the
    sums cancel the machine's drift between runs."""
    totals: dict[str, dict[str, float]] = {
        "a": {"seconds": 0.0, "cpu_seconds": 0.0},
        "b": dict.fromkeys(("seconds", "cpu_seconds"), 0.0),
    }
    runs = []
    for _ in range(rounds):
        for side in ("a", "b", "b", "a"):
            mined = mine_with(a if side == "a" else b)
            for key in ("seconds", "cpu_seconds"):
                totals[side][key] += mined[key]
            runs.append(
                {
                    "side": side,
                    "seconds": round(mined["seconds"], 2),
                    "cpu_seconds": round(mined["cpu_seconds"], 2),
                    "digest": mined["digest"],
                }
            )
            print(json.dumps(runs[-1]), flush=True)
    report = {
        "a": str(a),
        "b": str(b),
        "figures": len(figures()),
        "runs": runs,
        "wall_ratio_b_over_a": totals["b"]["seconds"] / totals["a"]["seconds"],
        "cpu_ratio_b_over_a": totals["b"]["cpu_seconds"] / totals["a"]["cpu_seconds"],
        "same_outputs": len({r["digest"] for r in runs}) == 1,
    }
    print(json.dumps(report, indent=1))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    record = sub.add_parser("record")
    record.add_argument("--checkout", type=Path, default=None, help="a source tree (default: installed p2p)")
    record.add_argument("--out", type=Path, required=True)
    check = sub.add_parser("compare")
    check.add_argument("recording", type=Path)
    check.add_argument("--checkout", type=Path, default=None)
    speed = sub.add_parser("speed")
    speed.add_argument("--a", type=Path, required=True, help="the reference checkout")
    speed.add_argument("--b", type=Path, required=True, help="the checkout measured against it")
    speed.add_argument("--rounds", type=int, default=2, help="A B B A this many times")
    child = sub.add_parser("_child")
    child.add_argument("out", type=Path)
    args = parser.parse_args()

    if args.command == "_child":
        _child(args.out)
        return 0
    if args.command == "speed":
        return _speed(args.a, args.b, args.rounds)
    mined = mine_with(args.checkout)
    if args.command == "record":
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(mined, indent=1, sort_keys=True) + "\n")
        print(
            f"{len(mined['figures'])} figures recorded in {mined['seconds']:.0f} s, digest {mined['digest']}"
        )
        return 0
    expected = json.loads(args.recording.read_text())
    problems = compare(expected["figures"], mined["figures"])
    for line in problems:
        print(line)
    print(
        f"{len(mined['figures'])} figures mined in {mined['seconds']:.0f} s; "
        f"{len(problems)} differ from {args.recording.name}"
    )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
