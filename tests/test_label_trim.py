"""Read labels leave the panel boxes: a label printed above a plot is not the plot's content, a
label printed on an image is the image's pixels, and a label the content runs round stays."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from p2p.mining.cpu.labels.trim import trim_labels
from p2p.mining.cpu.segmentation.segment import Analysis, segment_figure
from p2p.mining.lab.synth.figure import generate_figure
from p2p.mining.pipeline import CpuMiner
from p2p.mining.types import LabelDetection, PanelCandidate
from p2p.shared import geometry


def _page() -> np.ndarray:
    return np.full((300, 400, 3), 255, np.uint8)


def _label(rgb: np.ndarray, text: str, x: int, y: int, color: tuple[int, int, int] = (0, 0, 0)) -> None:
    cv2.putText(rgb, text, (x, y), cv2.FONT_HERSHEY_SIMPLEX, 0.8, color, 2, cv2.LINE_AA)


def _plot(rgb: np.ndarray, box: tuple[int, int, int, int]) -> None:
    x1, y1, x2, y2 = box
    cv2.rectangle(rgb, (x1, y1), (x2 - 1, y2 - 1), (0, 0, 0), 2)
    cv2.line(rgb, (x1 + 10, y2 - 20), (x2 - 20, y1 + 15), (30, 90, 200), 2)


def _ink_box(rgb: np.ndarray, box: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
    x1, y1, x2, y2 = box
    ys, xs = np.nonzero(rgb[y1:y2, x1:x2].min(axis=2) < 225)
    return (x1 + int(xs.min()), y1 + int(ys.min()), x1 + int(xs.max()) + 1, y1 + int(ys.max()) + 1)


def _float(box: tuple[int, int, int, int]) -> tuple[float, float, float, float]:
    return (float(box[0]), float(box[1]), float(box[2]), float(box[3]))


def _candidate(box: tuple[int, int, int, int]) -> PanelCandidate:
    return PanelCandidate(box=_float(box))


def _plot_alone(box: tuple[int, int, int, int]) -> tuple[float, float, float, float]:
    rgb = _page()
    _plot(rgb, box)
    return _float(_ink_box(rgb, (0, 0, 400, 300)))


def _label_over_plot(text: str) -> tuple[np.ndarray, PanelCandidate, tuple[int, int, int, int]]:
    """A page with ``text`` printed above a plot, the box the segmenter would give (label
    included) and the label's ink box."""
    rgb = _page()
    _label(rgb, text, 40, 50)
    _plot(rgb, (40, 70, 300, 260))
    return rgb, _candidate(_ink_box(rgb, (0, 0, 400, 300))), _ink_box(rgb, (0, 0, 400, 65))


def test_a_label_above_a_plot_leaves_the_box_even_when_ocr_missed_its_parenthesis() -> None:
    rgb, panel, glyph = _label_over_plot("(b)")
    read = (glyph[0] + 12, glyph[1], glyph[2], glyph[3])  # the "(" left out, as OCR often does
    out = trim_labels(rgb, [panel], ["b"], [LabelDetection("b", _float(read), 0.9)])
    assert out[0].box == _plot_alone((40, 70, 300, 260))
    assert panel.box[1] < 40  # the segmenter's box held the label


def test_a_label_read_in_the_other_case_is_still_the_panels_label() -> None:
    rgb, panel, glyph = _label_over_plot("vii")
    out = trim_labels(rgb, [panel], ["vii"], [LabelDetection("VII", _float(glyph), 0.9)])
    assert out[0].box == _plot_alone((40, 70, 300, 260))


def test_a_label_printed_on_an_image_stays_in_the_image() -> None:
    rgb = _page()
    rgb[40:260, 40:300] = np.random.default_rng(0).integers(20, 120, (220, 260, 3), dtype=np.uint8)
    _label(rgb, "B", 50, 75, (255, 255, 255))
    box = (40.0, 40.0, 300.0, 260.0)
    read = (50.0, 57.0, 68.0, 76.0)
    out = trim_labels(rgb, [PanelCandidate(box=box)], ["B"], [LabelDetection("B", read, 0.9)])
    assert out[0].box == box


def test_a_label_the_drawing_runs_round_stays() -> None:
    rgb = _page()
    _plot(rgb, (40, 40, 300, 260))
    _label(rgb, "C", 150, 150)
    box = (40.0, 40.0, 300.0, 260.0)
    read = _float(_ink_box(rgb, (140, 120, 180, 160)))
    out = trim_labels(rgb, [PanelCandidate(box=box)], ["C"], [LabelDetection("C", read, 0.9)])
    assert out[0].box == box


def test_panels_without_a_read_label_keep_their_ink() -> None:
    rgb, panel, _ = _label_over_plot("(a)")
    panels = [panel]
    assert trim_labels(rgb, panels, [None], []) == panels
    assert trim_labels(rgb, panels, ["a"], [LabelDetection("c", (0.0, 0.0, 10.0, 10.0), 0.9)]) == panels


def _read_elsewhere(rgb: np.ndarray, glyph: tuple[int, int, int, int]) -> LabelDetection:
    """Another panel's label, read, as tall as ``glyph``: the figure's label size."""
    return LabelDetection("a", (330.0, 10.0, 360.0, float(10 + glyph[3] - glyph[1])), 0.9)


@pytest.mark.parametrize("misread", [False, True], ids=["unread", "read-as-another"])
def test_an_unread_label_heading_the_box_leaves_it(misread: bool) -> None:
    # "(b)" assigned from the caption's sequence, its glyphs never read as "b": a label-sized
    # group at the box's top left, blank rows under it, is still its label
    rgb, panel, glyph = _label_over_plot("(b)")
    detections = [_read_elsewhere(rgb, glyph)]
    if misread:  # what OCR made of part of it ("(b" -> "6")
        detections.append(LabelDetection("6", _float((glyph[0] + 8, glyph[1], glyph[2] - 8, glyph[3])), 0.5))
    out = trim_labels(rgb, [panel], ["b"], detections)
    assert out[0].box == _plot_alone((40, 70, 300, 260))


def test_an_unread_label_with_dotted_letters_one_row_above_a_table() -> None:
    # "viii": the i's dots stand apart above their stems, and the table's frame starts one
    # blank row under the label
    rgb = _page()
    _label(rgb, "viii", 40, 50)
    glyph = _ink_box(rgb, (0, 0, 400, 65))
    _plot(rgb, (40, glyph[3] + 2, 300, 260))  # its 2 px frame from the second row down
    panel = _candidate(_ink_box(rgb, (0, 0, 400, 300)))
    out = trim_labels(rgb, [panel], ["viii"], [_read_elsewhere(rgb, glyph)])
    assert out[0].box == _float(_ink_box(rgb, (0, glyph[3], 400, 300)))


def test_a_title_heading_the_box_is_the_panels_own() -> None:
    rgb = _page()
    cv2.putText(rgb, "Weight over time", (40, 50), cv2.FONT_HERSHEY_SIMPLEX, 0.8, (0, 0, 0), 2, cv2.LINE_AA)
    _plot(rgb, (40, 70, 300, 260))
    panel = _candidate(_ink_box(rgb, (0, 0, 400, 300)))
    glyph = _ink_box(rgb, (0, 0, 400, 65))
    assert trim_labels(rgb, [panel], ["b"], [_read_elsewhere(rgb, glyph)]) == [panel]


@pytest.mark.parametrize("seed", [14, 21])
def test_the_miner_takes_read_labels_out_of_plot_and_diagram_boxes(seed: int) -> None:
    # figures where the segmenter's label guess keeps one outside label inside its panel's box
    image, truth = generate_figure(
        seed,
        n_panels=4,
        panel_types={"plot": 0.5, "schematic": 0.5},
        label_position="outside",
        marker_rate=0.0,
        width=640,
        height=480,
    )
    result = CpuMiner().mine(np.asarray(image.convert("RGB")), truth["caption"])
    expected = [geometry.from_inclusive(p["box"]) for p in truth["panels"]]
    assert len(geometry.match_greedy([p.box for p in result.panels], expected, 0.9)) == len(expected)


def test_the_next_panels_label_in_the_gutter_leaves_the_box_above() -> None:
    rgb = _page()
    _plot(rgb, (40, 20, 300, 140))
    _label(rgb, "b", 40, 170)
    _plot(rgb, (40, 185, 300, 290))
    above = _candidate(_ink_box(rgb, (0, 0, 400, 175)))  # reached over the next panel's label
    below = _candidate(_ink_box(rgb, (0, 180, 400, 300)))
    glyph = _float(_ink_box(rgb, (0, 145, 400, 175)))
    out = trim_labels(rgb, [above, below], [None, "b"], [LabelDetection("b", glyph, 0.9)])
    assert out == [PanelCandidate(box=_plot_alone((40, 20, 300, 140))), below]
    assert above.box[3] > glyph[1]


def test_a_misread_label_at_the_edge_still_leaves_the_box() -> None:
    rgb, panel, glyph = _label_over_plot("(iii)")
    out = trim_labels(rgb, [panel], ["iii"], [LabelDetection("m", _float(glyph), 0.9)])
    assert out[0].box == _plot_alone((40, 70, 300, 260))


def _plot_over_image(joined: bool) -> tuple[np.ndarray, PanelCandidate, Analysis | None]:
    """A plot above an image whose blurred top edge the plot's box reaches into (the seam
    placed in the blur): specks along the box's bottom, joined to the image, and to the plot's
    frame when ``joined``."""
    rgb = _page()
    _plot(rgb, (40, 40, 300, 200) if joined else (40, 40, 300, 160))
    rgb[203:290, 20:380] = np.random.default_rng(1).integers(30, 150, (87, 360, 3), dtype=np.uint8)
    rgb[201, 20:380:9] = 200
    rgb[202, 20:380] = 200
    analysis = segment_figure(rgb).analysis  # the segmenter's analysis holds the ink's components
    return rgb, _candidate(_ink_box(rgb, (0, 0, 400, 202))), analysis


def test_a_neighbouring_image_blurred_into_the_box_is_not_the_panels_ink() -> None:
    rgb, box, analysis = _plot_over_image(joined=False)
    assert box.box[3] == 202 and box.box[0] == 20
    assert trim_labels(rgb, [box], [None], [], analysis=analysis) == [
        PanelCandidate(box=_plot_alone((40, 40, 300, 160)))
    ]


def test_a_frame_the_blur_joins_to_the_neighbour_stays() -> None:
    rgb, box, analysis = _plot_over_image(joined=True)
    out = trim_labels(rgb, [box], [None], [], analysis=analysis)
    assert out[0].box[1] == _plot_alone((40, 40, 300, 200))[1]
    assert out[0].box[3] >= 201


def test_a_sliver_of_the_neighbouring_image_at_the_edge_goes_with_the_label() -> None:
    rgb, _, glyph = _label_over_plot("(d)")
    rgb[10:12, 40:300] = 90  # the last rows of the image above, left in by a seam a pixel off
    box = _candidate(_ink_box(rgb, (0, 0, 400, 300)))
    out = trim_labels(rgb, [box], ["d"], [LabelDetection("d", _float(glyph), 0.9)])
    assert out[0].box == _plot_alone((40, 70, 300, 260))
