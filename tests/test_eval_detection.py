from __future__ import annotations

import pytest

from p2p.mining.lab.eval_detection import (
    FigureBoxes,
    Prediction,
    TruthPanel,
    average_precision,
    coco_summary,
    count_table,
    miss_buckets,
)

LEFT = (0.0, 0.0, 100.0, 100.0)
RIGHT = (120.0, 0.0, 220.0, 100.0)


def _figure(name: str, predicted: list[Prediction], truth: list[TruthPanel] | None = None) -> FigureBoxes:
    truth = truth or [TruthPanel(LEFT, "a", "image"), TruthPanel(RIGHT, "b", "plot")]
    return FigureBoxes(name=name, truth=tuple(truth), predicted=tuple(predicted))


def test_perfect_predictions_score_ap_one_and_an_exact_count() -> None:
    fig = _figure("f", [Prediction(LEFT, "a", 0.9), Prediction(RIGHT, "b", 0.8)])
    summary = coco_summary([fig])
    assert summary == {"panels_ap50": 1.0, "panels_ap50_95": 1.0, "labels_ap50": 1.0, "labels_ap50_95": 1.0}
    table = count_table([fig])
    assert (table["exact"], table["too_many"], table["too_few"]) == (1, 0, 0)


def test_ap_ranks_by_confidence_and_labels_count_as_classes() -> None:
    # a confident false box ranked first costs precision at every recall; ranked last it costs nothing
    wrong_first = _figure(
        "f",
        [
            Prediction((300, 300, 320, 320), None, 0.99),
            Prediction(LEFT, "a", 0.5),
            Prediction(RIGHT, "x", 0.4),
        ],
    )
    wrong_last = _figure(
        "f",
        [
            Prediction((300, 300, 320, 320), None, 0.01),
            Prediction(LEFT, "a", 0.5),
            Prediction(RIGHT, "x", 0.4),
        ],
    )
    assert average_precision([wrong_last], 0.5) == pytest.approx(1.0)
    assert average_precision([wrong_first], 0.5) < 0.7
    # with labels as classes, the right box labelled "x" finds no truth "b": half the recall at most
    assert average_precision([wrong_last], 0.5, labelled=True) == pytest.approx(51 / 101)


def test_loose_box_at_iou_between_thresholds_counts_for_ap50_only() -> None:
    loose = (0.0, 0.0, 100.0, 130.0)  # IoU 0.77 with LEFT
    fig = _figure("f", [Prediction(loose, "a", 0.9), Prediction(RIGHT, "b", 0.9)])
    summary = coco_summary([fig])
    assert summary["panels_ap50"] == pytest.approx(1.0)
    assert summary["panels_ap50_95"] < 0.9


def test_misses_are_sorted_into_buckets() -> None:
    heading_truth = TruthPanel(RIGHT, "b", "plot", outer_box=(120.0, -20.0, 220.0, 100.0))
    figures = [
        # a grid of four images under "a" split in four; the plot "b" with its heading glued on
        _figure(
            "grid",
            [
                Prediction((0, 0, 50, 50), None, 0.6),
                Prediction((50, 0, 100, 50), None, 0.6),
                Prediction((0, 50, 50, 100), "a", 0.6),
                Prediction((50, 50, 100, 100), None, 0.6),
                Prediction((120, -20, 220, 100), "b", 0.9),
            ],
            [TruthPanel(LEFT, "a", "image"), heading_truth],
        ),
        # both panels in one box; a stray box outside both
        _figure(
            "merged", [Prediction((0, 0, 220, 100), "a", 0.9), Prediction((400, 400, 420, 420), None, 0.3)]
        ),
        # a schematic in two; the right panel found but with the wrong label
        _figure(
            "schematic",
            [
                Prediction((0, 0, 100, 40), "a", 0.9),
                Prediction((0, 60, 100, 100), None, 0.9),
                Prediction(RIGHT, "c", 1),
            ],
            [TruthPanel(LEFT, "a", "schematic"), TruthPanel(RIGHT, "b", "plot")],
        ),
    ]
    counts = miss_buckets(figures)["counts"]
    assert counts["split grid"] == 1
    assert counts["heading glued"] == 1
    assert counts["merged neighbours"] == 2
    assert counts["loose box"] == 1
    assert counts["split schematic"] == 1
    assert counts["missed label"] == 1
    table = count_table(figures)
    assert (table["exact"], table["too_many"], table["too_few"]) == (1, 2, 0)
