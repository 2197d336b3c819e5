from __future__ import annotations

import pytest

from p2p.mining.lab.evaluate import Tally, score_figure
from p2p.mining.types import Marker, MinedPanel, MiningResult

TRUTH = {
    "width": 200,
    "height": 100,
    "caption": "(a) Left. (b) Right.",
    "panels": [
        {"label": "a", "box": [0, 0, 99, 99], "type": "image"},
        {"label": "b", "box": [100, 0, 199, 99], "type": "plot"},
    ],
    "subcaptions": {"preamble": "", "a": "(a) Left.", "b": "(b) Right."},
    "markers": [{"kind": "arrow", "target_point": [50, 50], "panel": "a"}],
}


def _panel(
    box: tuple[float, float, float, float], label: str | None, kind: str, sub: str | None
) -> MinedPanel:
    return MinedPanel(
        box=box,
        label=label,
        label_box=None,
        figure_type=kind,
        type_confidence=1.0,
        confidence=1.0,
        subcaption=sub,
    )


def test_scores_a_perfect_and_a_partial_prediction() -> None:
    perfect = MiningResult(
        width=200,
        height=100,
        panels=[
            _panel((0, 0, 100, 100), "a", "image", "(a) Left."),
            _panel((100, 0, 200, 100), "b", "plot", "(b) Right."),
        ],
        markers=[
            Marker(
                kind="arrow",
                glyph_box=(60, 60, 70, 70),
                target_point=(50, 50),
                target_box=(40, 40, 60, 60),
                confidence=1.0,
            )
        ],
        regions=[],
        stage_seconds={"segment": 0.01},
        notes=[],
    )
    tally = Tally()
    score_figure(tally, "perfect", TRUTH, perfect, 0.02)
    report = tally.report()
    assert report["panels"]["0.9"]["f1"] == 1.0 and report["mean_iou"] == 1.0
    assert report["label_accuracy"] == 1.0 and report["figure_type_accuracy"] == 1.0
    assert report["subcaption_exact"] == 1.0 and report["marker_target_recall"] == 1.0
    assert report["marker_precision"] == 1.0

    # One panel 20 % too wide (IoU 0.83), the other missing; wrong label; a marker pointing
    # at the wrong place.
    partial = MiningResult(
        width=200,
        height=100,
        panels=[_panel((0, 0, 120, 100), "b", "plot", "(a) Left")],
        markers=[
            Marker(
                kind="arrow",
                glyph_box=(10, 10, 20, 20),
                target_point=(85, 85),
                target_box=(80, 80, 95, 95),
                confidence=1.0,
            )
        ],
        regions=[],
        stage_seconds={},
        notes=[],
    )
    tally = Tally()
    score_figure(tally, "partial", TRUTH, partial, 0.02)
    report = tally.report()
    assert report["panels"]["0.5"] == pytest.approx({"precision": 1.0, "recall": 0.5, "f1": 2 / 3})
    assert report["panels"]["0.9"]["f1"] == 0.0
    assert report["mean_iou"] == pytest.approx(100 / 120)
    assert report["label_accuracy"] == 0.0 and report["figure_type_accuracy"] == 0.0
    assert report["subcaption_exact"] == 0.0
    assert report["subcaption_token_f1"] == pytest.approx((2 * 0.5 * 0.5 / 1.0 + 0.0) / 2)
    assert report["marker_target_recall"] == 0.0 and report["marker_precision"] == 0.0
