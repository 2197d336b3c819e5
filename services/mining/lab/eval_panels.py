"""Score panel segmenters (and the label reader) on figures with ground truth.

``python -m p2p.mining.lab.eval_panels --dir /work/shared/data/real-figures`` prints the naive
XY-cut reference next to ``segment_panels`` (``--buckets``: its misses at IoU 0.9 by kind). The
folder holds the images and an ``annotations.json`` (file name -> entry with ``panels``:
``label``, inclusive ``box``); keys that start with ``_`` are notes. Matching is one-to-one and
greedy (``geometry.match_greedy``).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from p2p.mining.types import PanelCandidate
from p2p.shared import geometry
from p2p.shared.images import flatten_on_white

IOU_LEVELS = (0.5, 0.75, 0.9)

Segmenter = Callable[[np.ndarray], list[PanelCandidate]]
# (image, panels) -> one label (or None) per panel
Labeler = Callable[[np.ndarray, list[PanelCandidate]], list[str | None]]


def ocr_labeler(image: np.ndarray, panels: list[PanelCandidate]) -> list[str | None]:
    """The CPU label reader: OCR around the panels, then one label per panel."""
    from p2p.mining.cpu.labels.read import assign_labels, find_labels

    return assign_labels(panels, find_labels(image, panels))


def error_kind(truth: geometry.Box, predicted: list[geometry.Box]) -> str:
    """Why a ground-truth panel found no match at IoU 0.9, judged from the predicted boxes over it:
    ``missed`` (none covers a tenth of it), ``split`` (two or more lie mostly inside it),
    ``merged`` (one covers it but is much bigger: joined with a neighbour or outside text),
    ``cut`` (one lies inside it but covers too little) or ``off`` (edges off otherwise)."""
    area = max(1e-9, (truth[2] - truth[0]) * (truth[3] - truth[1]))
    over: list[tuple[float, float]] = []  # (share of the truth covered, share of the box inside)
    for box in predicted:
        inter = max(0.0, min(box[2], truth[2]) - max(box[0], truth[0])) * max(
            0.0, min(box[3], truth[3]) - max(box[1], truth[1])
        )
        if inter > 0.1 * area:
            over.append((inter / area, inter / max(1e-9, (box[2] - box[0]) * (box[3] - box[1]))))
    if not over:
        return "missed"
    if sum(1 for _, inside in over if inside > 0.5) >= 2:
        return "split"
    covered, inside = max(over)
    if covered > 0.8 and inside < 0.8:
        return "merged"
    if inside > 0.8 and covered < 0.8:
        return "cut"
    return "off"


def load_image(path: Path) -> np.ndarray:
    with Image.open(path) as img:
        return np.asarray(flatten_on_white(img))


def _prf(true_pos: int, predicted: int, truth: int) -> dict[str, float]:
    precision = true_pos / predicted if predicted else 0.0
    recall = true_pos / truth if truth else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1}


def evaluate(
    figures_dir: Path,
    annotations: dict[str, Any],
    segmenter: Segmenter,
    *,
    labeler: Labeler | None = ocr_labeler,
    limit: int | None = None,
) -> dict[str, Any]:
    """Panel P/R/F1 at IoU 0.5/0.75/0.9, mean IoU of matches at 0.5, label accuracy, timings.

    Label accuracy is the fraction of labelled GT panels whose matched (IoU >= 0.5) predicted panel
    carries exactly the printed label. ``ms_segment``/``ms_labels`` are mean per-figure wall times,
    ``cpu_ms_*`` the process CPU time (steadier on a busy machine).
    """
    figures_dir = Path(figures_dir)
    names = sorted(name for name in annotations if not name.startswith("_"))[:limit]
    true_pos = dict.fromkeys(IOU_LEVELS, 0)
    n_pred = n_truth = labelled = labels_right = 0
    matched_ious: list[float] = []
    seg_seconds: list[float] = []
    label_seconds: list[float] = []
    seg_cpu: list[float] = []
    label_cpu: list[float] = []
    per_figure: list[dict[str, Any]] = []
    buckets: dict[str, int] = {}
    for name in names:
        entry = annotations[name]
        image = load_image(figures_dir / name)
        started, cpu = time.perf_counter(), time.process_time()
        panels = segmenter(image)
        seg_seconds.append(time.perf_counter() - started)
        seg_cpu.append(time.process_time() - cpu)
        predicted_labels: list[str | None] = [None] * len(panels)
        if labeler is not None:
            started, cpu = time.perf_counter(), time.process_time()
            predicted_labels = labeler(image, panels)
            label_seconds.append(time.perf_counter() - started)
            label_cpu.append(time.process_time() - cpu)
        truth = entry.get("panels", [])
        gt_boxes = [geometry.from_inclusive(p["box"]) for p in truth]
        pred_boxes = [p.box for p in panels]
        n_pred += len(pred_boxes)
        n_truth += len(gt_boxes)
        matches = {level: geometry.match_greedy(pred_boxes, gt_boxes, level) for level in IOU_LEVELS}
        for level in IOU_LEVELS:
            true_pos[level] += len(matches[level])
        matched_ious.extend(value for _, _, value in matches[0.5])
        found = {j for _, j, _ in matches[0.9]}
        errors = [
            f"{error_kind(box, pred_boxes)}:{truth[j].get('type', 'panel')}"
            for j, box in enumerate(gt_boxes)
            if j not in found
        ]
        for error in errors:
            buckets[error] = buckets.get(error, 0) + 1
        by_truth = {j: i for i, j, _ in matches[0.5]}
        wrong_labels: list[str] = []
        for j, gt in enumerate(truth):
            if gt.get("label") is None:
                continue
            labelled += 1
            got = predicted_labels[by_truth[j]] if j in by_truth else None
            if got == gt["label"]:
                labels_right += 1
            else:
                wrong_labels.append(f"{gt['label']}->{got}")
        per_figure.append(
            {
                "figure": name,
                "truth": len(gt_boxes),
                "predicted": len(pred_boxes),
                **{f"tp@{level}": len(matches[level]) for level in IOU_LEVELS},
                "ious": sorted(round(v, 3) for _, _, v in matches[0.5]),
                "wrong_labels": wrong_labels,
                "errors": errors,
                "ms_segment": round(1000 * seg_seconds[-1], 1),
                "ms_labels": round(1000 * label_seconds[-1], 1) if labeler is not None else None,
            }
        )
    return {
        "figures": len(names),
        "panels_truth": n_truth,
        "panels_predicted": n_pred,
        "panels": {str(level): _prf(true_pos[level], n_pred, n_truth) for level in IOU_LEVELS},
        "mean_iou": float(np.mean(matched_ious)) if matched_ious else 0.0,
        "label_accuracy": labels_right / labelled if labelled and labeler is not None else None,
        "ms_segment": 1000 * float(np.mean(seg_seconds)) if seg_seconds else 0.0,
        "ms_labels": 1000 * float(np.mean(label_seconds)) if label_seconds else None,
        "cpu_ms_segment": 1000 * float(np.mean(seg_cpu)) if seg_cpu else 0.0,
        "cpu_ms_labels": 1000 * float(np.mean(label_cpu)) if label_cpu else None,
        "error_buckets": dict(sorted(buckets.items(), key=lambda item: -item[1])),
        "per_figure": per_figure,
    }


def _row(name: str, report: dict[str, Any]) -> str:
    f1 = [report["panels"][str(level)]["f1"] for level in IOU_LEVELS]
    acc = report["label_accuracy"]
    labels_ms, labels_cpu = report["ms_labels"], report["cpu_ms_labels"]
    return (
        f"{name:<16} {f1[0]:>7.3f} {f1[1]:>8.3f} {f1[2]:>7.3f} {report['mean_iou']:>8.3f} "
        f"{'-' if acc is None else f'{acc:.3f}':>9} {report['ms_segment']:>8.1f} "
        f"{'-' if labels_ms is None else f'{labels_ms:.1f}':>8} {report['cpu_ms_segment']:>8.1f} "
        f"{'-' if labels_cpu is None else f'{labels_cpu:.1f}':>8}"
    )


def main(argv: list[str] | None = None) -> int:
    from p2p.mining.cpu.segmentation.segment import segment_panels
    from p2p.mining.lab.xycut import naive_xycut

    parser = argparse.ArgumentParser(description="Compare naive XY-cut with segment_panels.")
    parser.add_argument("--dir", type=Path, required=True, help="folder with images and annotations.json")
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--no-labels", action="store_true", help="skip OCR label accuracy")
    parser.add_argument("--verbose", action="store_true", help="per-figure rows")
    parser.add_argument(
        "--buckets",
        action="store_true",
        help="count segment_panels' misses at IoU 0.9 by kind and panel type",
    )
    parser.add_argument("--json", type=Path, default=None, help="write both reports here")
    parser.add_argument("--threads", type=int, default=1, help="OpenCV threads (the miner runs one)")
    args = parser.parse_args(argv)
    import cv2

    cv2.setNumThreads(args.threads)
    annotations = json.loads((args.dir / "annotations.json").read_text())
    labeler = None if args.no_labels else ocr_labeler
    if labeler is not None:  # load the OCR engine before timing
        from p2p.mining.cpu.labels.read import warm_up

        warm_up()
    reports = {
        "naive_xycut": evaluate(args.dir, annotations, naive_xycut, labeler=labeler, limit=args.limit),
        "segment_panels": evaluate(args.dir, annotations, segment_panels, labeler=labeler, limit=args.limit),
    }
    print(
        f"{reports['segment_panels']['figures']} figures, {reports['segment_panels']['panels_truth']} panels"
    )
    header = ("F1@0.5", "F1@0.75", "F1@0.9", "meanIoU", "label_acc", "ms_seg", "ms_lab", "cpu_seg", "cpu_lab")
    widths = (7, 8, 7, 8, 9, 8, 8, 8, 8)
    print(f"{'':<16} " + " ".join(f"{h:>{w}}" for h, w in zip(header, widths, strict=True)))
    for name, report in reports.items():
        print(_row(name, report))
    if args.buckets:
        print("\nsegment_panels misses at IoU 0.9 (kind:panel type)")
        for bucket, count in reports["segment_panels"]["error_buckets"].items():
            print(f"  {count:>5} {bucket}")
    if args.verbose:
        for name, report in reports.items():
            print(f"\n{name}")
            for row in report["per_figure"]:
                print(
                    f"  {row['figure']:<32} gt={row['truth']:>2} pred={row['predicted']:>2} "
                    f"tp@.5/.75/.9={row['tp@0.5']}/{row['tp@0.75']}/{row['tp@0.9']} "
                    f"labels_wrong={row['wrong_labels']} errors={row['errors']} "
                    f"seg={row['ms_segment']}ms lab={row['ms_labels']}ms"
                )
    if args.json is not None:
        args.json.write_text(json.dumps(reports, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
