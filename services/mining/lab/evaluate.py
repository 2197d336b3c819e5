"""`p2p eval mining`: score a miner on figures with ground truth.

Reads a folder holding images and an ``annotations.json`` (file name -> entry) in the format of
the real development set, which the synthetic generator also writes. Boxes there are inclusive.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from p2p.mining.lab.eval_captions import split_names, token_f1
from p2p.mining.lab.eval_detection import (
    FigureBoxes,
    Prediction,
    TruthPanel,
    coco_summary,
    count_table,
    miss_buckets,
)
from p2p.mining.types import MiningResult
from p2p.shared import geometry
from p2p.shared.images import flatten_on_white

IOU_LEVELS = (0.5, 0.75, 0.9)
MARKER_MARGIN = 0.03  # of the panel diagonal: how far outside a target box a GT point may lie

Miner = Callable[[np.ndarray, str], MiningResult]


def normalize_ws(text: str) -> str:
    return " ".join(text.split())


@dataclass
class Tally:
    true_pos: dict[float, int] = field(default_factory=lambda: dict.fromkeys(IOU_LEVELS, 0))
    predicted: int = 0
    truth: int = 0
    matched_ious: list[float] = field(default_factory=list)
    labels_right: int = 0
    labelled_truth: int = 0
    types_right: int = 0
    types_total: int = 0
    sub_exact: list[float] = field(default_factory=list)
    sub_f1: list[float] = field(default_factory=list)
    markers_hit: int = 0
    markers_total: int = 0
    found_right: int = 0  # predicted markers whose target holds a true marker's target point
    found_total: int = 0
    stage_seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    seconds: float = 0.0
    figures: int = 0
    per_figure: list[dict[str, Any]] = field(default_factory=list)
    boxes: list[FigureBoxes] = field(default_factory=list)

    def report(self) -> dict[str, Any]:
        def prf(level: float) -> dict[str, float]:
            tp = self.true_pos[level]
            p = tp / self.predicted if self.predicted else 0.0
            r = tp / self.truth if self.truth else 0.0
            return {"precision": p, "recall": r, "f1": 2 * p * r / (p + r) if p + r else 0.0}

        return {
            "figures": self.figures,
            "panels": {str(level): prf(level) for level in IOU_LEVELS},
            "mean_iou": float(np.mean(self.matched_ious)) if self.matched_ious else 0.0,
            "label_accuracy": self.labels_right / self.labelled_truth if self.labelled_truth else None,
            "figure_type_accuracy": self.types_right / self.types_total if self.types_total else None,
            "subcaption_exact": float(np.mean(self.sub_exact)) if self.sub_exact else None,
            "subcaption_token_f1": float(np.mean(self.sub_f1)) if self.sub_f1 else None,
            "marker_target_recall": self.markers_hit / self.markers_total if self.markers_total else None,
            "marker_precision": self.found_right / self.found_total if self.found_total else None,
            "markers": self.markers_total,
            "seconds_per_figure": self.seconds / self.figures if self.figures else 0.0,
            "figures_per_second": self.figures / self.seconds if self.seconds else 0.0,
            "stage_seconds_per_figure": {
                k: v / max(self.figures, 1) for k, v in sorted(self.stage_seconds.items())
            },
            "coco": coco_summary(self.boxes),
            "counts": count_table(self.boxes),
            "buckets": miss_buckets(self.boxes),
            "per_figure": self.per_figure,
        }


def score_figure(
    tally: Tally, name: str, truth: dict[str, Any], result: MiningResult, seconds: float
) -> None:
    gt_panels = truth.get("panels", [])
    gt_boxes = [geometry.from_inclusive(p["box"]) for p in gt_panels]
    pred_boxes = [p.box for p in result.panels]
    tally.figures += 1
    tally.seconds += seconds
    tally.predicted += len(pred_boxes)
    tally.truth += len(gt_boxes)
    for stage, value in result.stage_seconds.items():
        tally.stage_seconds[stage] += value
    matches = {level: geometry.match_greedy(pred_boxes, gt_boxes, level) for level in IOU_LEVELS}
    for level in IOU_LEVELS:
        tally.true_pos[level] += len(matches[level])
    by_truth = {j: i for i, j, _ in matches[0.5]}
    tally.matched_ious.extend(value for _, _, value in matches[0.5])
    subcaptions = truth.get("subcaptions", {})
    for j, gt in enumerate(gt_panels):
        predicted = result.panels[by_truth[j]] if j in by_truth else None
        if gt.get("label") is not None:
            tally.labelled_truth += 1
            tally.labels_right += int(predicted is not None and predicted.label == gt["label"])
        if gt.get("type"):
            tally.types_total += 1
            tally.types_right += int(predicted is not None and predicted.figure_type == gt["type"])
        expected = subcaptions.get(gt.get("label") or "")
        if expected is not None:
            got = normalize_ws(predicted.subcaption or "") if predicted is not None else ""
            tally.sub_exact.append(float(got == normalize_ws(expected)))
            tally.sub_f1.append(token_f1(got, normalize_ws(expected)))
    targets = [m.target_box for m in result.markers] + [r.box for r in result.regions]
    hits = 0
    markers = truth.get("markers", [])
    points: list[tuple[float, float, float]] = []  # true target points with their margins
    for marker in markers:
        x, y = marker["target_point"]
        panel = next(
            (geometry.from_inclusive(p["box"]) for p in gt_panels if p.get("label") == marker.get("panel")),
            (0.0, 0.0, float(truth["width"]), float(truth["height"])),
        )
        margin = MARKER_MARGIN * float(np.hypot(geometry.width(panel), geometry.height(panel)))
        hits += int(any(geometry.contains_point(box, x + 0.5, y + 0.5, margin) for box in targets))
        points.append((x + 0.5, y + 0.5, margin))
    tally.boxes.append(
        FigureBoxes(
            name=name,
            truth=tuple(
                TruthPanel(
                    box=box,
                    label=p.get("label"),
                    kind=p.get("type"),
                    outer_box=geometry.from_inclusive(p["outer_box"]) if p.get("outer_box") else None,
                )
                for p, box in zip(gt_panels, gt_boxes, strict=True)
            ),
            predicted=tuple(Prediction(box=p.box, label=p.label, score=p.confidence) for p in result.panels),
        )
    )
    tally.found_total += len(result.markers)
    tally.found_right += sum(
        any(geometry.contains_point(m.target_box, x, y, margin) for x, y, margin in points)
        for m in result.markers
    )
    tally.markers_hit += hits
    tally.markers_total += len(markers)
    tally.per_figure.append(
        {
            "figure": name,
            "panels_truth": len(gt_boxes),
            "panels_predicted": len(pred_boxes),
            "matched_at_0.9": len(matches[0.9]),
            "markers": len(markers),
            "markers_hit": hits,
            "seconds": round(seconds, 4),
            "notes": result.notes,
        }
    )


def shrunk(miner: Miner, max_side: int) -> Miner:
    """``miner`` run on a copy of each figure shrunk (area averaging) to ``max_side`` at most,
    its result mapped back to the figure's pixels: how the miner does on small web copies of the
    same figures, scored against the same truth."""
    from p2p.mining.cpu.working_scale import map_back, shrink

    def mine(image: np.ndarray, caption: str) -> MiningResult:
        small = shrink(image, max_side)
        if small is None:
            return miner(image, caption)
        return map_back(miner(small, caption), image.shape[1], image.shape[0])

    return mine


def evaluate_folder(
    folder: Path, miner: Miner, *, limit: int | None = None, split: str | None = None
) -> dict[str, Any]:
    annotations = json.loads((folder / "annotations.json").read_text())
    tally = Tally()
    names = sorted(name for name in annotations if not name.startswith("_"))
    if split is not None:
        wanted = set(split_names(folder, split))
        names = [name for name in names if name in wanted]
    names = names[:limit]
    for name in names:
        truth = annotations[name]
        with Image.open(folder / name) as img:
            image = np.asarray(flatten_on_white(img))
        caption = truth.get("caption") or truth.get("full_caption") or ""
        started = time.perf_counter()
        result = miner(image, caption)
        score_figure(tally, name, truth, result, time.perf_counter() - started)
    return tally.report()


def naive_reference(image: np.ndarray, caption: str) -> MiningResult:
    """The benchmark's reference: a naive recursive XY-cut, panels only."""
    from p2p.mining.lab.xycut import naive_xycut
    from p2p.mining.types import MinedPanel

    started = time.perf_counter()
    panels = [
        MinedPanel(
            box=c.box,
            label=None,
            label_box=None,
            figure_type="image",
            type_confidence=0.0,
            confidence=c.confidence,
        )
        for c in naive_xycut(image)
    ]
    height, width = image.shape[:2]
    return MiningResult(
        width=width,
        height=height,
        panels=panels,
        markers=[],
        regions=[],
        stage_seconds={"segment": time.perf_counter() - started},
        notes=[],
    )


def cpu_miner() -> Miner:
    from p2p.mining.pipeline import CpuMiner

    return CpuMiner().mine
