"""Sub-panel labels printed on the pictures of a grid ("c1", "c2" ...): each picture is a panel.

The figures are drawn here (pictures with light gutters, labels printed white on dark or black on
light) and by the generator's realistic profile (its ``sub_grid`` block)."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from p2p.mining.cpu.imaging import full_size_analysis
from p2p.mining.cpu.labels.series import series_labels
from p2p.mining.cpu.labels.sub import (
    as_sub_label,
    picture_tiles,
    split_sub_labelled,
)
from p2p.mining.lab.synth import generate_figure
from p2p.mining.pipeline import CpuMiner
from p2p.mining.types import LabelDetection, PanelCandidate

Box = tuple[int, int, int, int]


def _grid(labels: list[str | None], *, dark: bool = True, cols: int = 3) -> tuple[np.ndarray, list[Box]]:
    """Pictures 150 px square in rows of ``cols``, 6 px white gutters, each with its label."""
    rows = (len(labels) + cols - 1) // cols
    image = np.full((20 + rows * 156, 20 + cols * 156, 3), 255, dtype=np.uint8)
    tiles: list[Box] = []
    rng = np.random.default_rng(3)
    for k, text in enumerate(labels):
        x, y = 10 + (k % cols) * 156, 10 + (k // cols) * 156
        lo, hi = (10, 90) if dark else (150, 225)
        image[y : y + 150, x : x + 150] = rng.integers(lo, hi, size=(150, 150, 1), dtype=np.uint8)
        tiles.append((x, y, x + 150, y + 150))
        if text is not None:
            colour = (255, 255, 255) if dark else (0, 0, 0)
            cv2.putText(image, text, (x + 6, y + 26), cv2.FONT_HERSHEY_SIMPLEX, 0.85, colour, 2, cv2.LINE_AA)
    return image, tiles


def _whole(tiles: list[Box]) -> list[PanelCandidate]:
    box = (
        min(t[0] for t in tiles),
        min(t[1] for t in tiles),
        max(t[2] for t in tiles),
        max(t[3] for t in tiles),
    )
    return [PanelCandidate(box=tuple(float(v) for v in box), confidence=0.9)]  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("read", "expected"),
    [
        ("c1", "c1"),
        ("B2", "B2"),
        ("CI", "C1"),
        ("Cl", "C1"),
        ("c", None),
        ("c10", None),
        ("12", None),
        ("AB", None),
    ],
)
def test_numbered_labels_are_recognised_with_thin_ones_read_as_one(read: str, expected: str | None) -> None:
    sub = as_sub_label(read)
    assert (sub.text if sub else None) == expected


def test_a_grid_of_pictures_is_cut_at_its_gutters_and_a_chart_is_not() -> None:
    image, tiles = _grid(["c1", "c2", "c3", "c4", "c5", "c6"])
    gray = cv2.cvtColor(image, cv2.COLOR_RGB2GRAY)
    found = picture_tiles(gray, (10, 10, 10 + 3 * 156 - 6, 10 + 2 * 156 - 6))
    assert sorted(found) == sorted(tiles)
    chart = np.full((300, 400), 255, dtype=np.uint8)
    cv2.line(chart, (20, 10), (20, 280), 0, 2)
    cv2.line(chart, (20, 280), (390, 280), 0, 2)
    chart[150:279, 60:100] = 90
    chart[100:279, 200:240] = 90
    assert picture_tiles(chart, (0, 0, 400, 300)) == []


@pytest.mark.parametrize("dark", [True, False])
def test_each_picture_of_a_numbered_grid_becomes_its_own_panel(dark: bool) -> None:
    names = ["c1", "c2", "c3", "c4", "c5", "c6"]
    image, tiles = _grid(names, dark=dark)
    look = full_size_analysis(image)
    gray, u = look.gray, look.u
    candidates, labels, detections = split_sub_labelled(gray, _whole(tiles), [None], [], u=u, named=[])
    assert labels == names
    assert [tuple(round(v) for v in c.box) for c in candidates] == tiles
    assert {d.text for d in detections} == set(names)


def test_an_unread_picture_takes_the_number_of_its_place_and_a_lone_reading_needs_the_caption() -> None:
    image, tiles = _grid(["b1", None, "b3", "b4"], cols=2)
    look = full_size_analysis(image)
    gray, u = look.gray, look.u
    _, labels, detections = split_sub_labelled(gray, _whole(tiles), ["b"], [], u=u, named=[])
    assert labels == ["b1", "b2", "b3", "b4"]
    inferred = [d for d in detections if d.text == "b2"]
    assert len(inferred) == 1 and inferred[0].raw == "" and inferred[0].confidence < 0.5
    # one picture read alone: the grid is cut only when the caption names the whole series
    image, tiles = _grid(["a1", None], cols=2)
    look = full_size_analysis(image)
    gray, u = look.gray, look.u
    candidates, labels, _ = split_sub_labelled(gray, _whole(tiles), [None], [], u=u, named=[])
    assert len(candidates) == 1 and labels == [None]
    candidates, labels, _ = split_sub_labelled(gray, _whole(tiles), [None], [], u=u, named=["a1", "a2"])
    assert labels == ["a1", "a2"]


def test_numbers_out_of_place_leave_the_grid_whole() -> None:
    image, tiles = _grid(["c2", "c1", "c3"])
    look = full_size_analysis(image)
    gray, u = look.gray, look.u
    candidates, labels, _ = split_sub_labelled(gray, _whole(tiles), [None], [], u=u, named=[])
    assert len(candidates) == 1 and labels == [None]


def test_sub_labels_of_a_letter_the_series_lacks_are_panel_labels() -> None:
    def det(text: str, x: float) -> LabelDetection:
        return LabelDetection(text=text, box=(x, 0.0, x + 10, 12.0), confidence=0.9, raw=text)

    read = [det("A", 0), det("B", 50), det("C1", 100), det("C2", 150), det("D", 200), det("F2", 250)]
    kept = {d.text for d in series_labels(read, [])}
    # c is missing between B and D: its pictures' labels count; f is two letters past the series
    assert kept == {"A", "B", "C1", "C2", "D"}


def test_the_miner_mines_a_generated_sub_labelled_grid_picture_by_picture() -> None:
    image, truth = generate_figure(
        3,
        profile="realistic",
        kinds=("plot", "sub_grid", "images"),
        labelled=True,
        size_class="medium",
        long_side=1300,
        jpeg=False,
        transparent=False,
    )
    subs = [p for p in truth["panels"] if len(p["label"]) == 2]
    assert len(subs) >= 2
    result = CpuMiner(load_text_encoder=False).mine(np.asarray(image.convert("RGB")), truth["caption"])
    mined = {p.label: p.box for p in result.panels}
    for panel in subs:
        assert panel["label"] in mined
        x1, y1, x2, y2 = mined[panel["label"]]
        tx1, ty1, tx2, ty2 = panel["box"]
        inter = max(0, min(x2, tx2 + 1) - max(x1, tx1)) * max(0, min(y2, ty2 + 1) - max(y1, ty1))
        union = (x2 - x1) * (y2 - y1) + (tx2 + 1 - tx1) * (ty2 + 1 - ty1) - inter
        assert inter / union >= 0.9
