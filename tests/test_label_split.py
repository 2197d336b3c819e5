"""Panels split at a second label printed inside them (``label_split``)."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from p2p.mining.cpu.labels.split import split_at_labels
from p2p.mining.types import LabelDetection, PanelCandidate

W, H = 600, 300  # two touching 300 x 300 fields side by side (or, turned, one above the other)
FONT = cv2.FONT_HERSHEY_SIMPLEX


def _fields(side_by_side: bool, seed: int = 0) -> np.ndarray:
    """Two touching dark fluorescence-like fields of one tone on a white page, 10 px margin."""
    rng = np.random.default_rng(seed)
    h, w = (H, W) if side_by_side else (W, H)
    page = np.full((h + 20, w + 20, 3), 255, np.uint8)
    field = np.clip(rng.normal(30, 8, (h, w, 3)), 0, 255).astype(np.uint8)
    for _ in range(40):
        centre = (int(rng.integers(0, w)), int(rng.integers(0, h)))
        cv2.circle(field, centre, int(rng.integers(4, 9)), (40, 90, 200), -1)
    page[10 : 10 + h, 10 : 10 + w] = cv2.GaussianBlur(field, (5, 5), 0)
    return page


def _label(image: np.ndarray, text: str, x: int, y: int) -> LabelDetection:
    """Print ``text`` white with its glyphs' top-left corner at (x, y); its detection, as read
    (the reader's boxes are the glyphs' boxes)."""
    (_, th), _ = cv2.getTextSize(text, FONT, 0.8, 2)
    before = image.copy()
    cv2.putText(image, text, (x, y + th), FONT, 0.8, (255, 255, 255), 2, cv2.LINE_AA)
    ys, xs = np.nonzero((image != before).any(axis=2))
    dx, dy = x - int(xs.min()), y - int(ys.min())
    image[...] = before
    cv2.putText(image, text, (x + dx, y + th + dy), FONT, 0.8, (255, 255, 255), 2, cv2.LINE_AA)
    ys, xs = np.nonzero((image != before).any(axis=2))
    box = (float(xs.min()), float(ys.min()), float(xs.max() + 1), float(ys.max() + 1))
    return LabelDetection(text=text, box=box, confidence=0.9)


def _merged(image: np.ndarray) -> list[PanelCandidate]:
    height, width = image.shape[:2]
    return [PanelCandidate(box=(10.0, 10.0, float(width - 10), float(height - 10)), confidence=0.9)]


@pytest.mark.parametrize("side_by_side", [True, False], ids=["along-the-top", "down-the-left"])
def test_a_second_label_cuts_the_panel_just_before_it(side_by_side: bool) -> None:
    image = _fields(side_by_side)
    own = _label(image, "A", 16, 16)
    # the second field starts at 310, right of the first or below it
    second = _label(image, "B", *((316, 16) if side_by_side else (16, 316)))
    panels, labels, detections = split_at_labels(image, _merged(image), ["A"], [own], named=["A", "B"])
    assert labels == ["A", "B"]
    first, rest = (p.box for p in panels)
    across = 0 if side_by_side else 1  # the axis the cut is a position on
    assert abs(first[across + 2] - 310) <= 3 and abs(rest[across] - 310) <= 3
    along = 1 - across
    assert first[along] == rest[along] == 10 and first[along + 2] == rest[along + 2] == 310
    assert [d.text for d in detections] == ["A", "B"]
    assert detections[1].box == pytest.approx(second.box, abs=2)  # its glyphs' strong core


def test_the_new_label_takes_the_captions_spelling() -> None:
    image = _fields(side_by_side=True)
    own = _label(image, "a", 16, 16)
    _label(image, "b", 316, 16)
    _, labels, _ = split_at_labels(image, _merged(image), ["a"], [own], named=["a", "b"])
    assert labels == ["a", "b"]


def test_nothing_missing_or_a_label_the_caption_does_not_name_changes_nothing() -> None:
    image = _fields(side_by_side=True)
    own = _label(image, "A", 16, 16)
    _label(image, "B", 316, 16)
    for named in (["A"], ["A", "C"], []):
        panels, labels, _ = split_at_labels(image, _merged(image), ["A"], [own], named=named)
        assert labels == ["A"] and len(panels) == 1


def test_a_letter_off_the_labels_line_is_content() -> None:
    image = _fields(side_by_side=True)
    own = _label(image, "A", 16, 16)
    _label(image, "B", 316, 120)  # far below the line of the panel's own label
    panels, labels, _ = split_at_labels(image, _merged(image), ["A"], [own], named=["A", "B"])
    assert labels == ["A"] and len(panels) == 1


def test_an_unlabelled_panel_is_not_searched() -> None:
    # a table or plot without a label of its own: its letters and digits only look like labels
    image = _fields(side_by_side=True)
    _label(image, "B", 316, 16)
    other = _label(image, "A", 16, 16)
    panels = [*_merged(image), PanelCandidate(box=(700.0, 10.0, 800.0, 100.0), confidence=0.9)]
    out, labels, _ = split_at_labels(image, panels, [None, "A"], [other], named=["A", "B"])
    assert labels == [None, "A"] and len(out) == 2


def test_labels_printed_outside_the_panels_say_nothing() -> None:
    image = _fields(side_by_side=True)
    _label(image, "B", 316, 16)
    outside = LabelDetection(text="A", box=(0.0, 0.0, 9.0, 9.0), confidence=0.9)  # above-left of it
    panels, labels, _ = split_at_labels(image, _merged(image), ["A"], [outside], named=["A", "B"])
    assert labels == ["A"] and len(panels) == 1


def test_the_miner_returns_touching_panels_of_one_tone_apart() -> None:
    from p2p.mining.cpu.segmentation.segment import segment_panels
    from p2p.mining.pipeline import CpuMiner

    image = _fields(side_by_side=True)
    _label(image, "A", 16, 16)
    _label(image, "B", 316, 16)
    assert len(segment_panels(image, named=2)) == 1  # the segmenter alone keeps them together
    result = CpuMiner(load_text_encoder=False).mine(image, "(A) Cells at rest. (B) Cells after stimulation.")
    assert [p.label for p in result.panels] == ["A", "B"]
    assert [p.subcaption for p in result.panels] == ["(A) Cells at rest.", "(B) Cells after stimulation."]
    assert abs(result.panels[0].box[2] - 310) <= 3


def test_a_neighbours_label_inside_a_panel_moves_their_shared_side_back_to_it() -> None:
    # the boundary between two fields of one tone was placed 30 px too far right: B's label, read
    # for the right panel, is printed inside the left one
    image = _fields(side_by_side=True)
    own = _label(image, "A", 16, 16)
    _label(image, "B", 316, 16)
    too_far = [
        PanelCandidate(box=(10.0, 10.0, 340.0, 310.0), confidence=0.9),
        PanelCandidate(box=(340.0, 10.0, 610.0, 310.0), confidence=0.9),
    ]
    panels, labels, _ = split_at_labels(image, too_far, ["A", "B"], [own], named=["A", "B"])
    assert labels == ["A", "B"]
    left, right = (p.box for p in panels)
    assert abs(left[2] - 310) <= 3 and abs(right[0] - 310) <= 3 and right[2] == 610


def test_a_neighbour_with_its_own_label_in_its_corner_keeps_its_side() -> None:
    image = _fields(side_by_side=True)
    own = _label(image, "A", 16, 16)
    _label(image, "B", 316, 16)
    theirs = _label(image, "B", 346, 16)  # the right panel's own label, in its own corner
    panels = [
        PanelCandidate(box=(10.0, 10.0, 340.0, 310.0), confidence=0.9),
        PanelCandidate(box=(340.0, 10.0, 610.0, 310.0), confidence=0.9),
    ]
    out, labels, _ = split_at_labels(image, panels, ["A", "B"], [own, theirs], named=["A", "B"])
    assert [p.box for p in out] == [p.box for p in panels] and labels == ["A", "B"]
