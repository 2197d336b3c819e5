"""A heading printed flush over a panel goes to the panel's outer box; a plot's legend stays."""

from __future__ import annotations

import cv2
import numpy as np

from p2p.mining.cpu.context import StageContext
from p2p.mining.cpu.headings import without_top_heading
from p2p.mining.params import load_params
from p2p.mining.pipeline import _HeadingStage
from p2p.mining.types import LabelDetection, PanelCandidate

TEXT = 20.0  # the figure's label height, px
PARAMS = load_params().headings


def _panel(heading: str | None, x: int, *, bracket: bool = False, spread: bool = False) -> np.ndarray:
    """A 600 x 400 white figure: a heading at ``x`` over a grey picture from y 80."""
    image = np.full((400, 600, 3), 255, dtype=np.uint8)
    rng = np.random.default_rng(1)
    image[80:380, 20:580] = rng.integers(40, 160, size=(300, 560, 1), dtype=np.uint8)
    if heading is not None:
        cv2.putText(image, heading, (x, 44), cv2.FONT_HERSHEY_SIMPLEX, 0.8, (0, 0, 0), 2, cv2.LINE_AA)
    if spread:  # column headers across the picture, not one heading
        for k, word in enumerate(("WT", "KO", "WT", "KO")):
            cv2.putText(image, word, (60 + 140 * k, 44), cv2.FONT_HERSHEY_SIMPLEX, 0.8, (0, 0, 0), 2)
    if bracket:  # a rule under the header, over the lanes it names
        image[60:63, x - 10 : x + 160] = 0
    return image


BOX = (20.0, 20.0, 580.0, 380.0)


def test_a_flush_left_heading_goes_out_of_the_box() -> None:
    assert without_top_heading(_panel("northern", 24), BOX, TEXT, params=PARAMS) == (20.0, 80.0, 580.0, 380.0)
    # flush right, too
    assert without_top_heading(_panel("HeLa/TO", 460), BOX, TEXT, params=PARAMS) == (20.0, 80.0, 580.0, 380.0)


def test_what_is_no_heading_stays() -> None:
    assert without_top_heading(_panel(None, 0), BOX, TEXT, params=PARAMS) is None
    # a header with a rule under it names a group of lanes: the conventions keep it with the blot
    assert without_top_heading(_panel("Ovary", 200, bracket=True), BOX, TEXT, params=PARAMS) is None
    # a row of column headers spread over the picture
    assert without_top_heading(_panel(None, 0, spread=True), BOX, TEXT, params=PARAMS) is None
    # a line as wide as the panel (a legend, a long title)
    long = _panel("a title that runs on across all of the panel, edge to edge", 4)
    assert without_top_heading(long, BOX, TEXT, params=PARAMS) is None
    # lane labels: short signs far apart, however small against the panel's label
    lanes = _panel(None, 0)
    for k, sign in enumerate("-+-+-+"):
        cv2.putText(lanes, sign, (40 + 90 * k, 44), cv2.FONT_HERSHEY_SIMPLEX, 0.8, (0, 0, 0), 2)
    assert without_top_heading(lanes, BOX, 2 * TEXT, params=PARAMS) is None


def test_an_underlined_heading_goes_out_with_its_underline() -> None:
    image = _panel("western", 24)
    (width, _), _ = cv2.getTextSize("western", cv2.FONT_HERSHEY_SIMPLEX, 0.8, 2)
    image[50:52, 24 : 24 + width] = 0  # under the word, a blank row below its letters
    assert without_top_heading(image, BOX, TEXT, params=PARAMS) == (20.0, 80.0, 580.0, 380.0)


def test_a_heading_wider_than_half_the_panel_goes_out_too() -> None:
    wide = _panel("L929 (Ripk3-/-) / TO-RIPK3 cells", 100)  # about 60 % of the panel
    assert without_top_heading(wide, BOX, TEXT, params=PARAMS) == (20.0, 80.0, 580.0, 380.0)


def _plot(top: str) -> np.ndarray:
    """A 600 x 400 figure: a line over a plot's axes frame (y 80-380)."""
    image = np.full((400, 600, 3), 255, dtype=np.uint8)
    image[80:380, 60:63] = 0
    image[377:380, 60:580] = 0
    cv2.polylines(image, [np.array([[70, 360], [200, 200], [400, 260], [570, 100]])], False, (0, 0, 0), 2)
    if top == "heading":
        cv2.putText(image, "HeLa/TO-RIPK3", (380, 44), cv2.FONT_HERSHEY_SIMPLEX, 0.8, (0, 0, 0), 2)
    elif top == "swatch":  # a legend entry in black: a filled square, then its name
        image[28:46, 380:398] = 60
        cv2.putText(image, "Dox", (406, 44), cv2.FONT_HERSHEY_SIMPLEX, 0.8, (0, 0, 0), 2)
    elif top == "line":  # a legend entry: a line sample, then its name
        image[35:38, 330:380] = 0
        cv2.putText(image, "DMSO", (390, 44), cv2.FONT_HERSHEY_SIMPLEX, 0.8, (0, 0, 0), 2)
    elif top == "colour":  # a legend entry in colour, text only
        cv2.putText(image, "DMSO", (390, 44), cv2.FONT_HERSHEY_SIMPLEX, 0.8, (0, 160, 230), 2)
    return image


def test_a_plain_heading_over_a_plot_goes_out_but_its_legend_stays() -> None:
    box = (20.0, 20.0, 580.0, 380.0)
    assert without_top_heading(_plot("heading"), box, TEXT, params=PARAMS, plot=True) == (
        60.0,
        80.0,
        580.0,
        380.0,
    )
    for legend in ("swatch", "line", "colour"):
        assert without_top_heading(_plot(legend), box, TEXT, params=PARAMS, plot=True) is None, legend
        # the same band over a picture is a heading: only plots keep a legend on top
        assert without_top_heading(_plot(legend), box, TEXT, params=PARAMS) is not None, legend


def test_the_stage_trims_a_box_that_ownership_gave_an_outer_box() -> None:
    image = _panel("northern", 24)
    outer = (0.0, 0.0, 600.0, 400.0)  # ownership's: the headers round a part of pictures
    ctx = StageContext(image=image, caption="")
    ctx.candidates = [PanelCandidate(box=BOX, outer_box=outer)]
    ctx.panel_types = [("image", 0.9)]
    ctx.detections = [LabelDetection(text="A", box=(0.0, 0.0, 14.0, TEXT), confidence=0.9)]
    _HeadingStage(PARAMS)(ctx)
    assert ctx.candidates == [PanelCandidate(box=(20.0, 80.0, 580.0, 380.0), outer_box=outer)]
    ctx.candidates = [PanelCandidate(box=BOX)]
    _HeadingStage(PARAMS)(ctx)
    assert ctx.candidates == [PanelCandidate(box=(20.0, 80.0, 580.0, 380.0), outer_box=BOX)]


def test_the_panel_label_beside_a_heading_is_no_part_of_its_line() -> None:
    image = _panel("northern", 120)
    image[26:46, 24:38] = 0  # the panel's label, far left on the heading's line
    label = (24.0, 26.0, 37.0, 45.0)
    assert without_top_heading(image, BOX, TEXT, params=PARAMS) is None  # two phrases, apart
    assert without_top_heading(image, BOX, TEXT, params=PARAMS, labels=[label]) == (20.0, 80.0, 580.0, 380.0)


def test_the_first_line_of_a_block_of_text_is_no_heading() -> None:
    note = _panel("Silver nanoplate", 24)
    note[60:100] = 255  # the picture starts lower, under a second line of the same note
    note[100:380, 20:580] = 90
    cv2.putText(note, "- high stability", (24, 80), cv2.FONT_HERSHEY_SIMPLEX, 0.8, (0, 0, 0), 2, cv2.LINE_AA)
    assert without_top_heading(note, BOX, TEXT, params=PARAMS) is None
    # the same line with a wide blank under it, over the picture, is a heading
    apart = _panel("Silver nanoplate", 24)
    assert without_top_heading(apart, BOX, TEXT, params=PARAMS) == (20.0, 80.0, 580.0, 380.0)


def test_a_label_left_alone_over_the_content_goes_out_as_a_heading_would() -> None:
    image = _panel(None, 0)
    image[26:46, 24:38] = 0  # the panel's label, the only ink over the picture
    label = (24.0, 26.0, 37.0, 45.0)
    assert without_top_heading(image, BOX, TEXT, params=PARAMS, labels=[label]) == (20.0, 80.0, 580.0, 380.0)


def test_a_heading_over_a_legend_lined_up_under_it_goes_out_and_the_legend_stays() -> None:
    # on a small copy a heading and the legend entry under it blur to one height, and both
    # start at the same column: the entry's swatch says it is no second line of the heading
    image = _plot("none")
    cv2.putText(image, "HeLa/TO-RIPK3", (380, 40), cv2.FONT_HERSHEY_SIMPLEX, 0.6, (0, 0, 0), 2)
    image[50:64, 380:394] = 60  # the legend entry's swatch, under the heading's first letter
    cv2.putText(image, "DMSO", (400, 64), cv2.FONT_HERSHEY_SIMPLEX, 0.6, (0, 0, 0), 2)
    trimmed = without_top_heading(image, (20.0, 20.0, 580.0, 380.0), TEXT, params=PARAMS, plot=True)
    assert trimmed is not None and trimmed[1] == 50.0
    # the same two lines over a picture read as two lines of one text, and stay
    picture = _panel(None, 0)
    picture[20:80] = image[20:80]
    assert without_top_heading(picture, BOX, TEXT, params=PARAMS) is None
