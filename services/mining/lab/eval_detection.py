"""Panel detection scored the way the field compares detectors, and the misses sorted by cause.

- ``average_precision``: COCO-style AP (101-point interpolated precision, predictions ranked by
  their confidence across all figures, each matched to the unmatched truth box it overlaps most
  at IoU >= t), at IoU 0.5 and averaged over 0.5:0.05:0.95. With ``labelled=True`` a prediction
  counts only when it also carries the truth's printed label (panel labels as the class).
- ``count_table``: figures with too many, too few and exactly the true number of panels.
- ``miss_buckets``: why a true panel found no prediction at IoU 0.9, and what the predictions
  that match nothing are. The buckets:
    split grid        two or more predictions lie mostly inside a picture panel (a grid of images)
    split schematic   the same inside a drawn panel (schematic, plot, table)
    merged neighbours the best prediction covers this panel and much of another
    heading glued     the best prediction covers the panel and reaches only into its outer_box
                      (headings, titles, row/column text the conventions leave out)
    off               the best prediction overlaps but its edges are off otherwise
    missed            nothing covers a tenth of it
    loose box         a prediction that matches no true panel at IoU 0.5, is not a piece of a
                      split panel and does not hold a merged one (a stray piece left on its own)
    missed label      a true labelled panel matched at IoU 0.5 with the wrong label or none
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from p2p.shared import geometry

COCO_IOUS = tuple(round(0.5 + 0.05 * k, 2) for k in range(10))
RECALL_POINTS = np.linspace(0.0, 1.0, 101)
BUCKETS = (
    "split grid",
    "split schematic",
    "merged neighbours",
    "heading glued",
    "off",
    "missed",
    "loose box",
    "missed label",
)
PICTURE_TYPES = frozenset({"image"})


@dataclass(frozen=True)
class TruthPanel:
    box: geometry.Box
    label: str | None
    kind: str | None = None
    outer_box: geometry.Box | None = None


@dataclass(frozen=True)
class Prediction:
    box: geometry.Box
    label: str | None
    score: float


@dataclass(frozen=True)
class FigureBoxes:
    name: str
    truth: tuple[TruthPanel, ...]
    predicted: tuple[Prediction, ...]


def average_precision(figures: Sequence[FigureBoxes], iou: float, *, labelled: bool = False) -> float:
    """COCO-style AP at one IoU threshold over all figures (0.0 when there is no truth)."""
    total = sum(len(f.truth) for f in figures)
    if total == 0:
        return 0.0
    ranked = sorted(
        ((p.score, k, i) for k, f in enumerate(figures) for i, p in enumerate(f.predicted)),
        key=lambda item: -item[0],
    )
    used: set[tuple[int, int]] = set()
    hits: list[int] = []
    for _, k, i in ranked:
        figure = figures[k]
        pred = figure.predicted[i]
        best, best_j = iou, -1
        for j, truth in enumerate(figure.truth):
            if (k, j) in used or (labelled and pred.label != truth.label):
                continue
            value = geometry.iou(pred.box, truth.box)
            if value >= best:
                best, best_j = value, j
        if best_j >= 0:
            used.add((k, best_j))
        hits.append(int(best_j >= 0))
    if not hits:
        return 0.0
    tp = np.cumsum(hits)
    precision = tp / np.arange(1, len(hits) + 1)
    recall = tp / total
    # precision made monotone from the right, then read at each recall point
    envelope = np.maximum.accumulate(precision[::-1])[::-1]
    sampled = [
        float(envelope[idx[0]]) if (idx := np.flatnonzero(recall >= r)).size else 0.0 for r in RECALL_POINTS
    ]
    return float(np.mean(sampled))


def coco_summary(figures: Sequence[FigureBoxes]) -> dict[str, float]:
    """AP@0.5 and AP@0.5:0.95 for panels and for labelled panels."""
    out: dict[str, float] = {}
    for name, labelled in (("panels", False), ("labels", True)):
        per_iou = [average_precision(figures, t, labelled=labelled) for t in COCO_IOUS]
        out[f"{name}_ap50"] = per_iou[0]
        out[f"{name}_ap50_95"] = float(np.mean(per_iou))
    return out


def count_table(figures: Sequence[FigureBoxes]) -> dict[str, object]:
    """Figures with too many, too few and exactly the true number of panels, and which."""
    rows = [{"figure": f.name, "truth": len(f.truth), "predicted": len(f.predicted)} for f in figures]
    too_many = [r for r in rows if int(str(r["predicted"])) > int(str(r["truth"]))]
    too_few = [r for r in rows if int(str(r["predicted"])) < int(str(r["truth"]))]
    return {
        "exact": len(rows) - len(too_many) - len(too_few),
        "too_many": len(too_many),
        "too_few": len(too_few),
        "wrong_share": (len(too_many) + len(too_few)) / len(rows) if rows else 0.0,
        "figures": rows,
    }


def _share(inner: geometry.Box, outer: geometry.Box) -> float:
    """How much of ``inner`` lies inside ``outer``."""
    return geometry.intersection(inner, outer) / max(1e-9, geometry.area(inner))


def miss_kind(truth: TruthPanel, others: Sequence[TruthPanel], predicted: Sequence[geometry.Box]) -> str:
    """The bucket of a true panel that no prediction matched at IoU 0.9."""
    over = [p for p in predicted if geometry.intersection(p, truth.box) > 0.1 * geometry.area(truth.box)]
    if not over:
        return "missed"
    if sum(1 for p in over if _share(p, truth.box) > 0.5) >= 2:
        return "split grid" if truth.kind in PICTURE_TYPES else "split schematic"
    best = max(over, key=lambda p: geometry.iou(p, truth.box))
    covers = _share(truth.box, best)
    if covers > 0.8 and any(_share(o.box, best) > 0.3 for o in others):
        return "merged neighbours"
    if covers > 0.8 and truth.outer_box is not None:
        grown = geometry.union_box(truth.outer_box, truth.box)
        if _share(best, grown) > 0.97 and geometry.area(best) > geometry.area(truth.box):
            return "heading glued"
    return "off"


def miss_buckets(figures: Sequence[FigureBoxes]) -> dict[str, object]:
    """Counts per bucket and, per figure, each miss with its bucket."""
    counts = dict.fromkeys(BUCKETS, 0)
    listed: list[dict[str, object]] = []
    for f in figures:
        boxes = [p.box for p in f.predicted]
        truth_boxes = [t.box for t in f.truth]
        at90 = {j for _, j, _ in geometry.match_greedy(boxes, truth_boxes, 0.9)}
        at50 = geometry.match_greedy(boxes, truth_boxes, 0.5)
        matched_pred = {i for i, _, _ in at50}
        for j, truth in enumerate(f.truth):
            if j in at90:
                continue
            kind = miss_kind(truth, [t for k, t in enumerate(f.truth) if k != j], boxes)
            counts[kind] += 1
            listed.append({"figure": f.name, "label": truth.label, "bucket": kind})
        for i, pred in enumerate(f.predicted):
            if i in matched_pred or any(
                _share(pred.box, t.box) > 0.5 or _share(t.box, pred.box) > 0.5 for t in f.truth
            ):
                continue
            counts["loose box"] += 1
            listed.append({"figure": f.name, "label": pred.label, "bucket": "loose box"})
        for i, j, _ in at50:
            truth = f.truth[j]
            if truth.label is not None and f.predicted[i].label != truth.label:
                counts["missed label"] += 1
                listed.append({"figure": f.name, "label": truth.label, "bucket": "missed label"})
    return {"counts": counts, "misses": listed}
