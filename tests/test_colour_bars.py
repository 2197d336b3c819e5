"""Image panels as the segmenter cut them: a colour bar beside one, and the headers and row
labels round a grid of pictures, go to the outer box; a picture strip and grey pictures stay."""

from __future__ import annotations

import cv2
import numpy as np

from p2p.mining.cpu.colour_bars import without_colour_bar
from p2p.mining.cpu.context import StageContext
from p2p.mining.cpu.ownership import picture_boxes
from p2p.mining.pipeline import _colour_bars
from p2p.mining.types import PanelCandidate

BOX = (20.0, 20.0, 380.0, 320.0)


def _panel(strip: str) -> np.ndarray:
    """A 400 x 340 white figure: a grainy picture (x 20-320, y 20-320), then at x 334-348 a
    ``strip``: "bar" (a colour map from yellow to purple, with tick labels to its right),
    "grain" (a narrow picture), or "none"."""
    rng = np.random.default_rng(3)
    image = np.full((340, 400, 3), 255, dtype=np.uint8)
    image[20:320, 20:320] = rng.integers(30, 200, size=(300, 300, 3), dtype=np.uint8)
    if strip == "bar":
        ramp = np.linspace(0.0, 1.0, 260)[:, None]
        top, bottom = np.array([250, 230, 40]), np.array([70, 10, 90])
        image[40:300, 334:348] = (top + (bottom - top) * ramp).astype(np.uint8)[:, None, :]
        for k, y in enumerate((46, 170, 296)):
            cv2.putText(image, str(3 - k), (354, y), cv2.FONT_HERSHEY_SIMPLEX, 0.5, (0, 0, 0), 1, cv2.LINE_AA)
    elif strip == "grain":
        image[40:300, 334:348] = rng.integers(30, 200, size=(260, 14, 3), dtype=np.uint8)
    return image


def test_a_colour_bar_beside_an_image_goes_out_of_its_box() -> None:
    assert without_colour_bar(_panel("bar"), BOX) == (20.0, 20.0, 320.0, 320.0)


def test_what_is_no_colour_bar_stays() -> None:
    assert without_colour_bar(_panel("grain"), BOX) is None  # a narrow picture: grain in its rows
    assert without_colour_bar(_panel("none"), BOX) is None
    touching = _panel("bar")
    touching[20:320, 320:334] = touching[20:320, 306:320]  # no gutter: the strip is the picture's
    assert without_colour_bar(touching, BOX) is None


def test_the_stage_trims_image_panels_only() -> None:
    ctx = StageContext(image=_panel("bar"), caption="")
    ctx.candidates = [PanelCandidate(box=BOX), PanelCandidate(box=BOX)]
    ctx.panel_types = [("image", 0.9), ("plot", 0.9)]  # a plot's colour bar is its own
    _colour_bars(ctx)
    assert ctx.candidates == [
        PanelCandidate(box=(20.0, 20.0, 320.0, 320.0), outer_box=BOX),
        PanelCandidate(box=BOX),
    ]


def _grid(colour: bool) -> np.ndarray:
    """A 420 x 330 white figure: a 2 x 2 grid of grainy pictures (x 80-400, y 50-310), column
    headers above it and row labels to its left, the pictures in colour or grey."""
    rng = np.random.default_rng(5)
    image = np.full((330, 420, 3), 255, dtype=np.uint8)
    for top in (50, 184):
        for left in (80, 244):
            grain = rng.integers(40, 200, size=(126, 156, 3 if colour else 1), dtype=np.uint8)
            image[top : top + 126, left : left + 156] = grain
    for x, word in ((120, "DAPI"), (290, "Merge")):
        cv2.putText(image, word, (x, 38), cv2.FONT_HERSHEY_SIMPLEX, 0.5, (0, 0, 0), 1, cv2.LINE_AA)
    for y, word in ((120, "WT"), (250, "KO")):
        cv2.putText(image, word, (30, y), cv2.FONT_HERSHEY_SIMPLEX, 0.5, (0, 0, 0), 1, cv2.LINE_AA)
    return image


def test_a_grid_of_pictures_as_cut_loses_its_headers_and_row_labels() -> None:
    # the segmenter's piece holds the headers and row labels; the conventions keep them out
    box = (25.0, 25.0, 400.0, 310.0)
    assert picture_boxes(_grid(colour=True), [box]) == [(80.0, 50.0, 400.0, 310.0)]
    # grey pictures are left as they are: a blot's strips close up into such a block, and its
    # lane and band labels are its own
    assert picture_boxes(_grid(colour=False), [box]) == [None]
    ctx = StageContext(image=_grid(colour=True), caption="")
    ctx.candidates = [PanelCandidate(box=box)]
    ctx.panel_types = [("image", 0.9)]
    _colour_bars(ctx)
    assert ctx.candidates == [PanelCandidate(box=(80.0, 50.0, 400.0, 310.0), outer_box=box)]
