"""Marker target recall of ``detect_markers`` on annotated figures.

Reads ``annotations.json`` in the format of the development set (figure name -> panels,
markers, extra_markers; boxes inclusive, points ``[x, y]``), runs the detector on every
image-type panel using the annotated panel box, and reports:

* lenient recall: a ground-truth marker is found when some predicted marker of its panel has a
  ``target_box`` containing its ``target_point``, allowing a margin of 3 % of the panel diagonal;
* strict recall: some predicted ``target_point`` lies within 5 % of the panel diagonal of it;
* precision: share of predicted markers that find (either rule) some annotated marker or extra
  marker of their panel; strict precision uses the strict rule only;
* recall per kind, milliseconds per figure (detection on its image panels only);
* when the annotations carry ``target_box`` (synthetic figures), the mean IoU of the best
  predicted target box per found marker;
* kind accuracy of found markers: some prediction that finds it has the same kind (exact), or
  a kind the caption's words for it also refer to (``regions.MENTION_KINDS``: "arrows" attach
  to arrowheads, "asterisk" to stars), so its caption fragment still attaches.

    python -m p2p.mining.lab.eval_markers --dir /work/shared/data/real-figures
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cv2
import numpy as np
from PIL import Image

from p2p.mining.cpu.markers.rules import detect_markers
from p2p.mining.regions import MENTION_KINDS
from p2p.mining.types import Marker
from p2p.shared.geometry import Box, contains_point, from_inclusive, iou
from p2p.shared.images import flatten_on_white

LENIENT_MARGIN = 0.03  # of the panel diagonal, around a predicted target box
STRICT_RADIUS = 0.05  # of the panel diagonal, between predicted and true target points


@dataclass
class Report:
    figures: int = 0
    panels: int = 0
    truth: int = 0
    found_lenient: int = 0
    found_strict: int = 0
    predicted: int = 0
    true_predicted: int = 0
    true_predicted_strict: int = 0
    ms_per_figure: float = 0.0  # wall clock
    cpu_ms_per_figure: float = 0.0  # CPU time of this process (OpenCV single-threaded in main())
    per_kind: dict[str, list[int]] = field(default_factory=dict)  # kind -> [truth, lenient, strict]
    target_iou: list[float] = field(default_factory=list)
    kind_exact: int = 0
    kind_attach: int = 0
    misses: list[str] = field(default_factory=list)
    false_positives: list[str] = field(default_factory=list)

    @property
    def recall_lenient(self) -> float:
        return self.found_lenient / self.truth if self.truth else 0.0

    @property
    def recall_strict(self) -> float:
        return self.found_strict / self.truth if self.truth else 0.0

    @property
    def precision(self) -> float:
        return self.true_predicted / self.predicted if self.predicted else 0.0

    @property
    def precision_strict(self) -> float:
        return self.true_predicted_strict / self.predicted if self.predicted else 0.0

    def _of_found(self, count: int) -> float | None:
        return round(count / self.found_lenient, 4) if self.found_lenient else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "figures": self.figures,
            "image_panels": self.panels,
            "markers": self.truth,
            "recall_lenient": round(self.recall_lenient, 4),
            "recall_strict": round(self.recall_strict, 4),
            "predicted": self.predicted,
            "precision": round(self.precision, 4),
            "precision_strict": round(self.precision_strict, 4),
            "ms_per_figure": round(self.ms_per_figure, 2),
            "cpu_ms_per_figure": round(self.cpu_ms_per_figure, 2),
            "per_kind": {
                k: {
                    "n": v[0],
                    "recall_lenient": round(v[1] / v[0], 4),
                    "recall_strict": round(v[2] / v[0], 4),
                }
                for k, v in sorted(self.per_kind.items())
            },
            "kind_accuracy_exact": self._of_found(self.kind_exact),
            "kind_accuracy_caption": self._of_found(self.kind_attach),
            "mean_target_iou": round(float(np.mean(self.target_iou)), 4) if self.target_iou else None,
            "lenient_margin": f"{LENIENT_MARGIN:.0%} of panel diagonal",
            "strict_radius": f"{STRICT_RADIUS:.0%} of panel diagonal",
        }


def _hit_lenient(pred: Marker, point: tuple[float, float], margin: float) -> bool:
    return contains_point(pred.target_box, point[0], point[1], margin)


def _hit_strict(pred: Marker, point: tuple[float, float], radius: float) -> bool:
    return math.hypot(pred.target_point[0] - point[0], pred.target_point[1] - point[1]) <= radius


def _in_panel(marker: dict[str, Any], index: int, label: str | None) -> bool:
    """Markers name their panel by index when the annotation has one, else by label."""
    if "panel_index" in marker:
        return bool(marker["panel_index"] == index)
    return bool(marker.get("panel") == label)


def evaluate(directory: Path, *, use_net: bool = True) -> Report:
    annotations = json.loads((directory / "annotations.json").read_text())
    report = Report()
    total_seconds = 0.0
    cpu_seconds = 0.0
    for name, fig in sorted(annotations.items()):
        if name.startswith("_") or not isinstance(fig, dict) or "panels" not in fig:
            continue
        path = directory / name
        if not path.exists():
            continue
        with Image.open(path) as img:
            image = np.asarray(flatten_on_white(img))
        report.figures += 1
        markers = [m for m in fig.get("markers", []) if m.get("context", "image") == "image"]
        extras = fig.get("extra_markers", [])
        for index, panel in enumerate(fig["panels"]):
            if panel.get("type") != "image":
                continue
            report.panels += 1
            pbox: Box = from_inclusive(panel["box"])
            diag = math.hypot(pbox[2] - pbox[0], pbox[3] - pbox[1])
            started, cpu_started = time.perf_counter(), time.process_time()
            preds = detect_markers(image, pbox, use_net=use_net)
            total_seconds += time.perf_counter() - started
            cpu_seconds += time.process_time() - cpu_started
            label = panel.get("label")
            truth = [m for m in markers if _in_panel(m, index, label)]
            others = [m for m in extras if _in_panel(m, index, label)]
            margin, radius = LENIENT_MARGIN * diag, STRICT_RADIUS * diag
            for gt in truth:
                point = (float(gt["target_point"][0]), float(gt["target_point"][1]))
                kind = gt["kind"]
                counts = report.per_kind.setdefault(kind, [0, 0, 0])
                counts[0] += 1
                report.truth += 1
                lenient = any(_hit_lenient(p, point, margin) for p in preds)
                strict = any(_hit_strict(p, point, radius) for p in preds)
                report.found_lenient += lenient
                report.found_strict += strict
                counts[1] += lenient
                counts[2] += strict
                if lenient:
                    kinds = {p.kind for p in preds if _hit_lenient(p, point, margin)}
                    report.kind_exact += kind in kinds
                    report.kind_attach += bool(kinds & set(MENTION_KINDS.get(kind, (kind,))))
                if "target_box" in gt and lenient:
                    tbox = from_inclusive(gt["target_box"])
                    report.target_iou.append(max(iou(p.target_box, tbox) for p in preds))
                if not lenient or not strict:
                    report.misses.append(
                        f"{name} {label} {kind} at {point} ({'lenient ok' if lenient else 'missed'})"
                        f" {gt.get('note', '')}"
                    )
            for pred in preds:
                report.predicted += 1
                points = [(float(m["target_point"][0]), float(m["target_point"][1])) for m in truth + others]
                strict_ok = any(_hit_strict(pred, pt, radius) for pt in points)
                ok = strict_ok or any(_hit_lenient(pred, pt, margin) for pt in points)
                report.true_predicted += ok
                report.true_predicted_strict += strict_ok
                if not ok:
                    report.false_positives.append(
                        f"{name} {label} {pred.kind} glyph={tuple(round(v) for v in pred.glyph_box)}"
                        f" conf={pred.confidence:.2f}"
                    )
    report.ms_per_figure = 1000.0 * total_seconds / max(report.figures, 1)
    report.cpu_ms_per_figure = 1000.0 * cpu_seconds / max(report.figures, 1)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--dir", required=True, type=Path, help="folder with annotations.json and the figures"
    )
    parser.add_argument("--json", action="store_true", help="print the summary as JSON only")
    parser.add_argument("--verbose", action="store_true", help="list misses and false positives")
    parser.add_argument("--no-net", action="store_true", help="the rule-based detector alone")
    args = parser.parse_args(argv)
    cv2.setNumThreads(1)  # the speed budget is for a single thread
    report = evaluate(args.dir, use_net=not args.no_net)
    summary = report.as_dict()
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    print(f"figures {report.figures}, image panels {report.panels}, markers {report.truth}")
    margin = f"{LENIENT_MARGIN:.0%}"
    print(f"recall lenient (target box contains point, margin {margin} diag): {report.recall_lenient:.3f}")
    print(f"recall strict (target point within {STRICT_RADIUS:.0%} diag): {report.recall_strict:.3f}")
    strict_p = f"{report.precision_strict:.3f}"
    print(f"precision {report.precision:.3f} (strict {strict_p}) of {report.predicted} predicted")
    for kind, (n, lenient, strict) in sorted(report.per_kind.items()):
        print(f"  {kind:10s} n={n:3d} lenient {lenient / n:.3f} strict {strict / n:.3f}")
    if report.found_lenient:
        exact, attach = summary["kind_accuracy_exact"], summary["kind_accuracy_caption"]
        print(f"kind of found markers: exact {exact:.3f}, caption words attach {attach:.3f}")
    if summary["mean_target_iou"] is not None:
        print(f"mean IoU of target boxes (found markers): {summary['mean_target_iou']:.3f}")
    wall, cpu = f"{report.ms_per_figure:.1f}", f"{report.cpu_ms_per_figure:.1f}"
    print(f"ms per figure (image panels, one thread): wall {wall}, cpu {cpu}")
    if args.verbose:
        counts: dict[str, int] = defaultdict(int)
        for line in report.misses:
            print("MISS", line)
        for line in report.false_positives:
            counts[line.split()[2]] += 1
            print("FP  ", line)
        if counts:
            print("false positives by kind:", dict(counts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
