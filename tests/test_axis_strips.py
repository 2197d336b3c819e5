"""A plot's y-axis text handed back from the panel on its left (``axis_strips``)."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from p2p.mining.cpu.segmentation.axis_strips import return_axis_strips
from p2p.mining.types import LabelDetection, PanelCandidate

IMAGE = (10, 10, 250, 300)  # a picture
PLOT = (300, 20, 500, 290)  # a plot's frame: its y axis at x = 300
STRIP = (262, 30, 293, 280)  # its tick labels and axis title, in the gutter left of the axis


def _figure(
    *, strip_rows: tuple[int, int] = (STRIP[1], STRIP[3]), axis: bool = True, spine: int = 0
) -> np.ndarray:
    rng = np.random.default_rng(0)
    image = np.full((320, 520, 3), 255, np.uint8)
    x1, y1, x2, y2 = IMAGE
    image[y1:y2, x1:x2] = np.clip(rng.normal(90, 20, (y2 - y1, x2 - x1, 3)), 0, 200).astype(np.uint8)
    x1, y1, x2, y2 = PLOT
    cv2.rectangle(image, (x1 if axis else x1 + 40, y1), (x2 - 1, y2 - 1), (spine, spine, spine), 2)
    cv2.rectangle(image, (x1 + 40, y1 + 60), (x1 + 80, y2 - 2), (30, 90, 200), -1)  # a bar
    top, bottom = strip_rows
    for y in range(top, bottom - 10, 40):  # tick numbers, right-aligned to the axis
        cv2.putText(image, "1.5", (STRIP[0] + 6, y + 10), cv2.FONT_HERSHEY_SIMPLEX, 0.35, (0, 0, 0), 1)
    image[top + 60 : bottom - 60, STRIP[0] : STRIP[0] + 4] = 0  # the rotated axis title, drawn as a bar
    return image


def _as_found(strip_end: int = 295) -> list[PanelCandidate]:
    """The segmenter's boxes: the picture's reaching over the gutter to the plot's ticks."""
    return [
        PanelCandidate(box=(10.0, 10.0, float(strip_end), 300.0), confidence=0.9),
        PanelCandidate(box=(float(PLOT[0]), float(PLOT[1]), float(PLOT[2]), float(PLOT[3])), confidence=0.9),
    ]


@pytest.mark.parametrize("spine", [0, 150], ids=["black-axis", "grey-axis"])
def test_the_plots_axis_text_goes_from_the_picture_to_the_plot(spine: int) -> None:
    out = return_axis_strips(_figure(spine=spine), _as_found(), [])
    picture, plot = (p.box for p in out)
    assert picture == (10.0, 10.0, 250.0, 300.0)
    assert plot[0] == pytest.approx(STRIP[0], abs=1) and plot[1:] == (20.0, 500.0, 290.0)


def test_a_label_bridging_the_gutter_above_the_text_does_not_hide_it() -> None:
    image = _figure()
    image[0:12, 240:275] = 0  # the plot's label, printed above the gutter
    label = LabelDetection(text="b", box=(240.0, 0.0, 275.0, 12.0), confidence=0.9)
    found = [PanelCandidate(box=(10.0, 0.0, 295.0, 300.0), confidence=0.9), _as_found()[1]]
    assert return_axis_strips(image, found, []) == found  # the label joins the text to the picture
    assert return_axis_strips(image, found, [label])[0].box[2] == 250.0


@pytest.mark.parametrize(
    ("strip_rows", "axis"),
    [((5, 310), True), ((30, 280), False)],
    ids=["ink-beyond-the-plots-rows", "no-axis-line"],
)
def test_the_picture_keeps_text_that_is_not_the_plots(strip_rows: tuple[int, int], axis: bool) -> None:
    # a strip reaching above and below the plot is the picture's own (a colour bar, a legend);
    # beside a panel without an axis line at its left there is no y-axis text to give back
    found = _as_found()
    assert return_axis_strips(_figure(strip_rows=strip_rows, axis=axis), found, []) == found


def test_no_blank_columns_before_the_strip_no_move() -> None:
    image = _figure()
    image[100:110, 245:272] = 0  # the picture's own content runs on into the numbers
    found = _as_found()
    assert return_axis_strips(image, found, []) == found


def test_the_miner_hands_the_axis_text_back(monkeypatch: pytest.MonkeyPatch) -> None:
    from p2p.mining.cpu.segmentation.segment import Segmentation
    from p2p.mining.pipeline import CpuMiner

    monkeypatch.setattr("p2p.mining.pipeline.segment_figure", lambda image, **_: Segmentation(_as_found()))
    result = CpuMiner(load_text_encoder=False).mine(_figure(), "A picture and a plot.")
    assert [p.box[0] for p in result.panels] == [10.0, pytest.approx(STRIP[0], abs=1)]
    assert result.panels[0].box[2] == 250.0
