"""Set-of-mark multi-view voting: views, clustering per identifier, median fusion, agreement."""

from __future__ import annotations

import numpy as np
import pytest

from p2p.mining.lvlm.voting import (
    PanelVote,
    ViewSpec,
    aggregate_boxes,
    aggregate_panels,
    make_views,
    normalize_id,
    reading_order,
)
from p2p.shared.geometry import Box, iou

W, H = 1000, 800
TRUTH: dict[str, Box] = {
    "a": (20.0, 20.0, 480.0, 380.0),
    "b": (520.0, 20.0, 980.0, 380.0),
    "c": (20.0, 420.0, 480.0, 780.0),
    "d": (520.0, 420.0, 980.0, 780.0),
}
# Five views whose crops all contain every panel, as the multi-view prompt would see them.
VIEWS = [
    ViewSpec((0.0, 0.0, 1000.0, 800.0), 1_000_000),
    ViewSpec((10.0, 10.0, 990.0, 790.0), 800_000),
    ViewSpec((0.0, 5.0, 995.0, 800.0), 700_000),
    ViewSpec((15.0, 0.0, 1000.0, 795.0), 650_000),
    ViewSpec((5.0, 15.0, 985.0, 790.0), 900_000),
]


def _jitter(box: Box, rng: np.random.Generator, fraction: float) -> Box:
    w, h = box[2] - box[0], box[3] - box[1]
    dx = rng.uniform(-fraction, fraction, size=2) * w
    dy = rng.uniform(-fraction, fraction, size=2) * h
    return (box[0] + dx[0], box[1] + dy[0], box[2] + dx[1], box[3] + dy[1])


def _votes(rng: np.random.Generator, *, noise: float = 0.0) -> list[PanelVote]:
    labels = ["(a)", "a", " a ", "[a]", "a."]
    votes: list[PanelVote] = []
    for view in range(5):
        for k, (pid, box) in enumerate(TRUTH.items()):
            if pid == "c" and view == 3:
                continue  # missed in one view
            jittered = _jitter(box, rng, 0.08) if view == (k + 1) % 5 else _jitter(box, rng, noise)
            label = labels[view].replace("a", pid)
            votes.append(PanelVote(view, label, jittered, subcaption=f"panel {pid}"))
        if view == 2:  # hallucinated in one view
            votes.append(PanelVote(view, "e", (300.0, 300.0, 700.0, 500.0), subcaption="invented"))
    return votes


def test_fused_panels_match_truth_drop_the_hallucination_and_keep_the_missed_one():
    rng = np.random.default_rng(7)
    panels = aggregate_panels(_votes(rng, noise=0.02), VIEWS)
    assert [p.panel_id for p in panels] == ["a", "b", "c", "d"]
    for panel in panels:
        assert iou(panel.box, TRUTH[panel.panel_id or ""]) >= 0.9
        assert panel.subcaption == f"panel {panel.panel_id}"
        assert panel.views_seen == 5
    by_id = {p.panel_id: p for p in panels}
    assert by_id["c"].confidence == pytest.approx(0.8)
    assert by_id["c"].support == 4
    assert by_id["a"].confidence == 1.0 and by_id["a"].support == 5


def test_median_fusion_cancels_the_one_jittered_view_exactly():
    panels = aggregate_panels(_votes(np.random.default_rng(8)), VIEWS)
    for panel in panels:
        # A mean would be pulled by the view jittered by up to 8 %; the median is not moved at all.
        assert panel.box == pytest.approx(TRUTH[panel.panel_id or ""], abs=1e-9)


def test_min_support_decides_whether_a_single_view_panel_survives():
    panels = aggregate_panels(_votes(np.random.default_rng(9)), VIEWS, min_support=0.2, nms_iou=0.9)
    assert "e" in [p.panel_id for p in panels]
    assert next(p for p in panels if p.panel_id == "e").confidence == pytest.approx(0.2)


def test_a_view_whose_crop_cuts_a_panel_does_not_count_against_it():
    views = [*VIEWS[:4], ViewSpec((0.0, 0.0, 700.0, 800.0), 500_000)]  # cuts b and d
    votes = [PanelVote(v, pid, box) for v in range(5) for pid, box in TRUTH.items() if v < 4 or pid in "ac"]
    panels = {p.panel_id: p for p in aggregate_panels(votes, views)}
    assert panels["d"].views_seen == 4 and panels["d"].confidence == 1.0
    assert panels["a"].views_seen == 5 and panels["a"].confidence == 1.0


def test_one_vote_per_view_in_a_cluster():
    votes = [PanelVote(v, "a", TRUTH["a"]) for v in range(5)]
    votes.append(PanelVote(0, "a", (25.0, 25.0, 470.0, 385.0)))  # view 0 answers twice
    panels = aggregate_panels(votes, VIEWS)
    assert len(panels) == 1
    assert panels[0].support == 5 and panels[0].confidence == 1.0
    assert panels[0].box == TRUTH["a"]


def test_the_same_label_used_twice_forms_two_panels():
    votes = [PanelVote(v, "a", box) for v in range(5) for box in (TRUTH["a"], TRUTH["d"])]
    panels = aggregate_panels(votes, VIEWS)
    assert [(p.panel_id, p.box) for p in panels] == [("a", TRUTH["a"]), ("a", TRUTH["d"])]


def test_unlabeled_votes_pool_together_and_case_is_kept():
    votes = [PanelVote(v, None, TRUTH["a"]) for v in range(4)]
    votes += [PanelVote(v, "A", TRUTH["b"]) for v in range(3)] + [
        PanelVote(v, "a", TRUTH["c"]) for v in range(3)
    ]
    panels = aggregate_panels(votes, VIEWS)
    assert [(p.panel_id, p.support) for p in panels] == [(None, 4), ("A", 3), ("a", 3)]


def test_nms_across_labels_keeps_the_better_supported_reading():
    box = TRUTH["b"]
    votes = [PanelVote(v, "b", box) for v in range(3)] + [PanelVote(v, "c", box) for v in (3, 4)]
    panels = aggregate_panels(votes, VIEWS, min_support=0.3)
    assert [(p.panel_id, p.support) for p in panels] == [("b", 3)]
    # Equal confidence: support breaks the tie. Only view 0 holds the corner box whole, so one vote
    # from it is as confident as five from views that all cut it; the five must win.
    corner = (840.0, 690.0, 1000.0, 800.0)
    votes = [PanelVote(0, "x", corner)] + [PanelVote(v, "b", corner) for v in range(5)]
    panels = aggregate_panels(votes, VIEWS)
    assert [(p.panel_id, p.support, p.confidence) for p in panels] == [("b", 5, 1.0)]


def test_text_fields_take_the_most_frequent_non_empty_value_longest_on_ties():
    texts = ["Western blot", "", "WB", "Western blot", "WB"]
    descs = ["bands", "bands of protein", "", "", ""]
    votes = [PanelVote(v, "a", TRUTH["a"], texts[v], descs[v]) for v in range(5)]
    panel = aggregate_panels(votes, VIEWS)[0]
    assert panel.subcaption == "Western blot"
    assert panel.description == "bands of protein"


def test_normalize_id():
    assert [normalize_id(x) for x in ["(a)", " A ", "[b]", "c.", "()", None, "1 a"]] == [
        "a",
        "A",
        "b",
        "c",
        None,
        None,
        "1a",
    ]


def test_reading_order_rows_then_columns():
    grid = [TRUTH["d"], TRUTH["b"], TRUTH["c"], TRUTH["a"]]
    assert reading_order(grid) == [3, 1, 2, 0]
    # A tall panel on the left spans both rows on the right: it comes first, then top, then bottom.
    tall, top, bottom = (0.0, 0.0, 300.0, 600.0), (320.0, 0.0, 600.0, 290.0), (320.0, 310.0, 600.0, 600.0)
    assert reading_order([bottom, top, tall]) == [2, 1, 0]
    # Slightly misaligned tops still form one row.
    assert reading_order([(500.0, 12.0, 900.0, 300.0), (0.0, 0.0, 450.0, 290.0)]) == [1, 0]


def test_make_views_is_deterministic_and_respects_its_bounds():
    views = make_views(1200, 900, count=6, max_pixels=1_000_000, rng=np.random.default_rng(3))
    again = make_views(1200, 900, count=6, max_pixels=1_000_000, rng=np.random.default_rng(3))
    other = make_views(1200, 900, count=6, max_pixels=1_000_000, rng=np.random.default_rng(4))
    assert views == again and views != other
    assert views[0] == ViewSpec((0.0, 0.0, 1200.0, 900.0), 1_000_000)
    # Three whole-figure views (every panel in them), then crops and rescales alternate.
    whole = (0.0, 0.0, 1200.0, 900.0)
    assert [v.crop == whole for v in views] == [True, True, True, False, True, False]
    assert len({v.max_pixels for v in views}) == 6
    assert len({views[3].crop, views[5].crop}) == 2
    for view in views[1:]:
        x1, y1, x2, y2 = view.crop
        assert x1 >= 0 and y1 >= 0 and x2 <= 1200 and y2 <= 900
        assert x2 - x1 >= 0.8 * 1200 - 1 and y2 - y1 >= 0.8 * 900 - 1
        assert 600_000 <= view.max_pixels <= 1_000_000
    with pytest.raises(ValueError):
        make_views(10, 10, count=0, max_pixels=100, rng=np.random.default_rng(0))


def test_aggregate_boxes_votes_on_unlabeled_boxes():
    rng = np.random.default_rng(5)
    marks = [(100.0, 100.0, 160.0, 150.0), (600.0, 500.0, 700.0, 580.0)]
    votes = [(v, _jitter(box, rng, 0.03)) for v in range(5) for box in marks]
    votes.append((1, (800.0, 100.0, 850.0, 140.0)))  # seen once
    fused = aggregate_boxes(votes, VIEWS)
    assert len(fused) == 2
    for result, truth in zip(fused, marks, strict=True):
        assert iou(result.box, truth) >= 0.9
        assert result.support == 5 and result.confidence == 1.0
        assert len(result.members) == 5
