"""Caption-guided splitting: the caption's panel count cuts touching panels the segmenter left
together, and never more than that."""

from __future__ import annotations

import numpy as np
import pytest

from p2p.mining.cpu.segmentation import count_guided, seam_net
from p2p.mining.cpu.segmentation.count_guided import merge_to_count, split_to_count
from p2p.mining.cpu.segmentation.segment import ink_mask, segment_panels
from p2p.mining.lab.synth.figure import generate_figure
from p2p.mining.params import load_params
from p2p.mining.pipeline import CpuMiner
from p2p.shared import geometry

# four touching photographs (0-px gutters): the rules and the seam splitter find three boxes
TOUCHING = {
    "gutter": 0,
    "n_panels": 4,
    "panel_types": {"image": 1.0},
    "width": 640,
    "height": 480,
    "marker_rate": 0.0,
}


@pytest.fixture(scope="module")
def touching() -> tuple[np.ndarray, list[geometry.Box]]:
    image, truth = generate_figure(0, **TOUCHING)
    return np.asarray(image.convert("RGB")), [geometry.from_inclusive(p["box"]) for p in truth["panels"]]


def _matched(boxes: list[geometry.Box], truth: list[geometry.Box]) -> int:
    return len(geometry.match_greedy(boxes, truth, 0.9))


def test_the_caption_count_cuts_the_panels_left_together(
    touching: tuple[np.ndarray, list[geometry.Box]],
) -> None:
    rgb, truth = touching
    alone = [p.box for p in segment_panels(rgb)]
    assert len(alone) < len(truth)  # the case this is for
    guided = segment_panels(rgb, named=len(truth))
    assert len(guided) == len(truth)
    assert _matched([p.box for p in guided], truth) == len(truth) > _matched(alone, truth)
    # the parts found this way say they are less sure than the rules' panels
    assert min(p.confidence for p in guided) == load_params().count_guided.split_confidence


def test_a_box_of_two_panels_is_cut_into_those_two(touching: tuple[np.ndarray, list[geometry.Box]]) -> None:
    rgb, truth = touching
    a, b, *others = sorted(truth, key=lambda t: (t[1], t[0]))  # the top row's first two panels
    both = (int(min(a[0], b[0])), int(min(a[1], b[1])), int(max(a[2], b[2])), int(max(a[3], b[3])))
    rest = [(int(t[0]), int(t[1]), int(t[2]), int(t[3])) for t in others]
    boxes, confidence = split_to_count(rgb, ink_mask(rgb), [both, *rest], [0.9] * len(truth[1:]), len(truth))
    assert len(boxes) == len(truth)
    assert boxes[1 : len(rest) + 1] == rest  # the other panels are left alone
    split = load_params().count_guided.split_confidence
    assert confidence == [split, *[0.9] * len(rest), split]
    cut = [boxes[0], boxes[-1]]
    assert _matched([(float(x[0]), float(x[1]), float(x[2]), float(x[3])) for x in cut], [a, b]) == 2


def test_no_cut_when_the_caption_names_no_more_panels_than_were_found(
    touching: tuple[np.ndarray, list[geometry.Box]],
) -> None:
    rgb, _ = touching
    boxes = [(0, 0, 320, 480), (320, 0, 640, 480)]
    assert split_to_count(rgb, ink_mask(rgb), boxes, [0.9, 0.9], 2) == (boxes, [0.9, 0.9])
    assert split_to_count(rgb, ink_mask(rgb), boxes, [0.9, 0.9], 1) == (boxes, [0.9, 0.9])
    # a "count" beyond any figure's is no count (a caption listing fifty numbered items)
    too_many = load_params().count_guided.max_named + 1
    assert split_to_count(rgb, ink_mask(rgb), boxes, [0.9, 0.9], too_many) == (boxes, [0.9, 0.9])


def test_a_blank_box_is_left_whole_whatever_the_count() -> None:
    rgb = np.full((300, 400, 3), 255, np.uint8)
    rgb[50:250, 50:350] = 120  # one flat grey image: no line in it looks like a seam
    boxes, _ = split_to_count(rgb, ink_mask(rgb), [(50, 50, 350, 250)], [0.9], 6)
    assert boxes == [(50, 50, 350, 250)]


def test_the_miner_splits_towards_the_panels_its_caption_names(
    touching: tuple[np.ndarray, list[geometry.Box]],
) -> None:
    rgb, truth = touching
    caption = "Four fields. (A) Control. (B) Treated. (C) Knock-down. (D) Rescue."
    mined = CpuMiner().mine(rgb, caption)
    assert len(mined.panels) == 4
    assert _matched([p.box for p in mined.panels], truth) == 4
    assert len(CpuMiner().mine(rgb, "Four fields of one culture.").panels) < 4


def _maps(
    width: int,
    height: int,
    vertical: dict[int, float] | None = None,
    horizontal: dict[int, float] | None = None,
) -> seam_net.BoundaryMaps:
    """Boundary maps of a ``width`` x ``height`` figure, weak everywhere but on the given lines
    (figure x of a vertical boundary, y of a horizontal one: probability)."""
    cells = (height // seam_net.STRIDE, width // seam_net.STRIDE)
    vmap, hmap = np.full(cells, 0.05, np.float32), np.full(cells, 0.05, np.float32)
    for x, p in (vertical or {}).items():
        vmap[:, x // seam_net.STRIDE] = p
    for y, p in (horizontal or {}).items():
        hmap[y // seam_net.STRIDE, :] = p
    return seam_net.BoundaryMaps(
        vertical=vmap, horizontal=hmap, interior=np.zeros(cells, np.float32), scale=1.0
    )


WEAK = _maps(400, 400)


def test_the_halves_of_one_panel_are_joined_when_the_caption_names_fewer() -> None:
    halves = [(10, 10, 110, 200), (110, 10, 300, 200)]  # one image cut along a false seam
    other = (10, 220, 300, 400)
    boxes, confidence = merge_to_count([halves[0], other, halves[1]], [0.9, 0.9, 0.7], 2, maps=WEAK)
    assert boxes == [(10, 10, 300, 200), other]
    assert confidence == [load_params().count_guided.split_confidence, 0.9]


def test_boxes_that_do_not_fill_their_joint_box_stay_apart() -> None:
    apart = [(10, 10, 100, 100), (140, 10, 230, 100)]  # a gutter between: two panels
    offset = [(10, 10, 100, 100), (100, 60, 190, 150)]  # side by side, shifted: two panels
    assert merge_to_count(apart, [0.9, 0.9], 1, maps=WEAK) == (apart, [0.9, 0.9])
    assert merge_to_count(offset, [0.9, 0.9], 1, maps=WEAK) == (offset, [0.9, 0.9])


def test_the_pair_whose_junction_looks_least_like_a_boundary_is_joined_first() -> None:
    # three stacked boxes: the first two touch along a line the network is sure of, the last two
    # leave a 2 px gap the network sees nothing in (one image the segmenter cut at a blank row)
    boxes = [(10, 10, 300, 100), (10, 100, 300, 200), (10, 202, 300, 300)]
    maps = _maps(400, 400, horizontal={100: 0.9})
    assert merge_to_count(boxes, [0.9] * 3, 2, maps=maps)[0] == [boxes[0], (10, 100, 300, 300)]
    assert merge_to_count(boxes, [0.9] * 3, 2, maps=WEAK)[0] == [(10, 10, 300, 200), boxes[2]]


def test_a_sure_boundary_across_a_gutter_is_never_joined() -> None:
    boxes = [(10, 10, 300, 100), (10, 106, 300, 200)]  # fills 0.97 of the joint box
    maps = _maps(400, 400, horizontal={103: 0.9})
    assert merge_to_count(boxes, [0.9, 0.9], 1, maps=maps) == (boxes, [0.9, 0.9])
    assert len(merge_to_count(boxes, [0.9, 0.9], 1, maps=WEAK)[0]) == 1


def test_a_join_that_would_swallow_another_box_is_not_made() -> None:
    # two halves of a rectangle, but a third box (an inset panel) lies across their seam
    boxes = [(0, 0, 100, 50), (0, 50, 100, 100), (40, 40, 60, 60)]
    assert merge_to_count(boxes, [0.9] * 3, 2, maps=WEAK) == (boxes, [0.9] * 3)


def test_segmentation_joins_towards_a_smaller_count(touching: tuple[np.ndarray, list[geometry.Box]]) -> None:
    rgb, _ = touching
    found = segment_panels(rgb)
    joined = segment_panels(rgb, named=len(found) - 1)
    assert len(joined) == len(found) - 1
    assert sum(1 for p in joined if p.confidence == load_params().count_guided.split_confidence) == 1


# Pieces without a label (join_unlabelled): every label the caption names is on a box already.
PLOT, AXIS = (120, 20, 400, 300), (60, 20, 118, 300)  # a plot cut at its axis: the tick labels apart


def test_a_piece_without_a_label_joins_the_labelled_panel_beside_it() -> None:
    boxes, labels = count_guided.join_unlabelled(
        [(10, 10, 50, 300), AXIS, PLOT], ["A", None, "B"], ["A", "B"]
    )
    assert boxes == [(10, 10, 50, 300), (60, 20, 400, 300)] and labels == ["A", "B"]


def test_pieces_stay_when_a_named_label_is_missing_or_the_count_is_met() -> None:
    # a box without a label while the caption's "C" is on none: it may be panel C, unread
    boxes = [(10, 10, 50, 300), AXIS, PLOT]
    assert count_guided.join_unlabelled(boxes, ["A", None, "B"], ["A", "B", "C"]) == (boxes, ["A", None, "B"])
    assert count_guided.join_unlabelled(boxes[1:], [None, "B"], ["B"]) == (boxes[1:], [None, "B"])
    assert count_guided.join_unlabelled(boxes, ["A", None, "B"], []) == (boxes, ["A", None, "B"])


def test_a_piece_far_from_or_askew_to_every_labelled_panel_stays() -> None:
    far = (120, 330, 400, 360)  # below the plot, across a wide gutter
    askew = (402, 250, 500, 400)  # beside the plot but sharing little of its own side with it
    for piece in (far, askew):
        boxes = [(10, 10, 50, 300), piece, PLOT]
        assert count_guided.join_unlabelled(boxes, ["A", None, "B"], ["A", "B"])[0] == boxes


def test_a_join_reaching_into_another_panel_is_not_made() -> None:
    boxes = [(0, 0, 100, 100), (100, 0, 200, 40), (100, 45, 200, 100)]  # C sits under the piece
    assert count_guided.join_unlabelled(boxes, ["A", None, "C"], ["A", "C"])[0] == boxes


def test_the_miner_joins_a_plot_cut_at_its_axis(monkeypatch: pytest.MonkeyPatch) -> None:
    import p2p.mining.cpu.segmentation.segment as segment

    image = np.full((320, 420, 3), 255, np.uint8)
    image[20:300, 120:400] = 90  # the plot's area
    for y in range(30, 300, 50):  # its ticks and their numbers, left of it
        image[y : y + 2, 110:120] = 0
        image[y - 6 : y + 8, 62:100] = 0
    image[10:300, 10:50] = 40  # panel A
    found = [
        segment.PanelCandidate(box=(10.0, 10.0, 50.0, 300.0), confidence=0.9),
        segment.PanelCandidate(box=(60.0, 20.0, 118.0, 300.0), confidence=0.9),
        segment.PanelCandidate(box=(120.0, 20.0, 400.0, 300.0), confidence=0.9),
    ]
    monkeypatch.setattr(
        "p2p.mining.pipeline.segment_figure", lambda image, **_: segment.Segmentation(list(found))
    )
    reads = ["A", None, "B"]
    monkeypatch.setattr("p2p.mining.pipeline.find_labels", lambda image, panels, **_: [])
    monkeypatch.setattr("p2p.mining.pipeline.assign_labels", lambda panels, detections, **_: list(reads))
    result = CpuMiner(load_text_encoder=False).mine(image, "(A) Scheme. (B) Plot.")
    assert [(p.box, p.label) for p in result.panels] == [
        ((10.0, 10.0, 50.0, 300.0), "A"),
        ((62.0, 20.0, 400.0, 300.0), "B"),  # tightened to the numbers
    ]
