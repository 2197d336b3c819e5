"""A heading printed flush over a picture or blot panel goes to the panel's outer box."""

from __future__ import annotations

import cv2
import numpy as np

from p2p.mining.cpu.headings import without_top_heading

TEXT = 20.0  # the figure's label height, px


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
    assert without_top_heading(_panel("northern", 24), BOX, TEXT) == (20.0, 80.0, 580.0, 380.0)
    # flush right, too
    assert without_top_heading(_panel("HeLa/TO", 460), BOX, TEXT) == (20.0, 80.0, 580.0, 380.0)


def test_what_is_no_heading_stays() -> None:
    assert without_top_heading(_panel(None, 0), BOX, TEXT) is None
    # a header with a rule under it names a group of lanes: the conventions keep it with the blot
    assert without_top_heading(_panel("Ovary", 200, bracket=True), BOX, TEXT) is None
    # a row of column headers spread over the picture
    assert without_top_heading(_panel(None, 0, spread=True), BOX, TEXT) is None
    # a line as wide as the panel (a legend, a long title)
    long = _panel("a title that runs on across most of the panel", 24)
    assert without_top_heading(long, BOX, TEXT) is None
