"""Panel ownership on figures the tests draw: what each printed label owns."""

from __future__ import annotations

import itertools

import cv2
import numpy as np

from p2p.mining.cpu.labels.series import next_letter, series_labels, unread_labels
from p2p.mining.cpu.ownership import (
    Anchor,
    image_extents,
    label_parts,
    own_panels,
    separate_parts,
    working_ink,
)
from p2p.mining.types import LabelDetection, PanelCandidate

Box = tuple[int, int, int, int]


def _canvas(width: int, height: int) -> np.ndarray:
    return np.full((height, width, 3), 255, dtype=np.uint8)


def _picture(image: np.ndarray, box: Box, seed: int) -> None:
    """A micrograph: dense texture filling its rectangle."""
    x1, y1, x2, y2 = box
    rng = np.random.default_rng(seed)
    image[y1:y2, x1:x2] = rng.integers(20, 160, size=(y2 - y1, x2 - x1, 1), dtype=np.uint8)


def _text(image: np.ndarray, text: str, x: int, y: int, scale: float = 0.5) -> None:
    cv2.putText(image, text, (x, y), cv2.FONT_HERSHEY_SIMPLEX, scale, (0, 0, 0), 1, cv2.LINE_AA)


def _plot(image: np.ndarray, box: Box) -> None:
    """A bar chart: axes, a few bars, tick text."""
    x1, y1, x2, y2 = box
    cv2.line(image, (x1 + 20, y1), (x1 + 20, y2 - 20), (0, 0, 0), 2)
    cv2.line(image, (x1 + 20, y2 - 20), (x2, y2 - 20), (0, 0, 0), 2)
    for k, h in enumerate((0.3, 0.7, 0.5)):
        bx = x1 + 40 + k * 40
        cv2.rectangle(image, (bx, int(y2 - 20 - h * (y2 - y1 - 30))), (bx + 20, y2 - 21), (90, 90, 90), -1)
    _text(image, "10", x1, y1 + 12, 0.35)
    _text(image, "0", x1 + 4, y2 - 22, 0.35)
    _text(image, "dose", (x1 + x2) // 2 - 15, y2 - 4, 0.4)


def _label(image: np.ndarray, text: str, x: int, y: int) -> LabelDetection:
    cv2.putText(image, text, (x, y + 20), cv2.FONT_HERSHEY_SIMPLEX, 0.8, (0, 0, 0), 2, cv2.LINE_AA)
    top, left = max(0, y - 5), max(0, x - 2)
    dark = image[top : y + 28, left : x + 30].min(axis=2) < 128
    cols, rows = np.flatnonzero(dark.any(axis=0)), np.flatnonzero(dark.any(axis=1))
    box = (float(left + cols[0]), float(top + rows[0]), float(left + cols[-1] + 1), float(top + rows[-1] + 1))
    return LabelDetection(text=text, box=box, confidence=0.95, raw=text)


def _grid_and_plots() -> tuple[np.ndarray, list[LabelDetection], list[Box], Box, Box]:
    """A: a 2x2 grid of pictures with column headers; B: two charts one above the other."""
    image = _canvas(620, 420)
    labels = [_label(image, "A", 10, 10), _label(image, "B", 320, 10)]
    tiles = [(40, 60, 150, 170), (160, 60, 270, 170), (40, 180, 150, 290), (160, 180, 270, 290)]
    for k, tile in enumerate(tiles):
        _picture(image, tile, k)
    _text(image, "control", 60, 48)
    _text(image, "drug", 195, 48)
    plots = [(350, 50, 600, 190), (350, 220, 600, 380)]
    for plot in plots:
        _plot(image, plot)
    return image, labels, tiles, (40, 60, 270, 290), (350, 50, 600, 380)


def _near(box: tuple[float, ...], expected: Box, tol: float = 3.0) -> bool:
    return all(abs(a - b) <= tol for a, b in zip(box, expected, strict=True))


def test_a_labelled_grid_and_a_plot_group_each_stay_one_panel() -> None:
    image, labels, tiles, grid, charts = _grid_and_plots()
    # the segmenter's pieces: each tile, the headers, each chart; only two carry a label
    pieces = [*tiles, (60, 38, 230, 50), (350, 50, 600, 190), (350, 220, 600, 380)]
    candidates = [PanelCandidate(box=tuple(float(v) for v in p), confidence=0.9) for p in pieces]
    read: list[str | None] = ["A", None, None, None, None, "B", None]
    panels, owned, notes = own_panels(image, candidates, read, labels, named=["A", "B"])
    assert sorted(owned, key=str) == ["A", "B"]
    by_label = dict(zip(owned, panels, strict=True))
    # the grid's box is the union of its pictures: the column headers stay out, in its outer box
    assert _near(by_label["A"].box, grid)
    outer = by_label["A"].outer_box
    assert (
        outer is not None
        and outer[1] < 45
        and _near((outer[0], outer[2], outer[3]), (grid[0], grid[2], grid[3]))
    )
    # the unlabelled second chart joined the chart under B
    assert _near(by_label["B"].box, charts, tol=6)
    assert notes == []


def test_unread_labels_leave_the_segmenters_pieces() -> None:
    image, labels, tiles, _, _ = _grid_and_plots()
    candidates = [PanelCandidate(box=tuple(float(v) for v in t), confidence=0.9) for t in tiles]
    read: list[str | None] = ["A", None, None, None]
    # the caption names C too, which nothing in the image reads as: panels would be swallowed
    panels, owned, notes = own_panels(image, candidates, read, labels, named=["A", "B", "C", "D", "E"])
    assert panels == candidates and owned == read
    assert notes and "unread" in notes[0]


def test_a_label_owns_content_to_its_right_not_its_neighbours() -> None:
    """A's y-axis title stands apart from A's chart by a wider gutter than the one between A's
    chart and B: cutting there would leave A only its title and give B A's chart."""
    image = _canvas(560, 240)
    labels = [_label(image, "A", 4, 4), _label(image, "B", 272, 4)]
    for k, ch in enumerate("density"):
        _text(image, ch, 8, 60 + 16 * k, 0.45)
    _plot(image, (50, 40, 255, 220))
    _plot(image, (300, 40, 540, 220))
    candidates = [
        PanelCandidate(box=(50.0, 40.0, 255.0, 220.0)),
        PanelCandidate(box=(300.0, 40.0, 540.0, 220.0)),
    ]
    panels, owned, _ = own_panels(image, candidates, ["A", "B"], labels, named=[])
    by_label = dict(zip(owned, panels, strict=True))
    assert by_label["A"].box[0] < 20 and by_label["A"].box[2] >= 250
    assert by_label["B"].box[0] >= 290


def test_a_centred_heading_stays_out_of_a_chart_but_a_legend_stays_in() -> None:
    image = _canvas(600, 260)
    labels = [_label(image, "A", 4, 4), _label(image, "B", 310, 4)]
    _text(image, "Macrophage", 100, 40, 0.5)  # centred over A's chart
    _plot(image, (40, 60, 280, 240))
    _text(image, "o WT", 340, 40, 0.5)  # a legend at the top left of B's chart
    _plot(image, (340, 60, 580, 240))
    candidates = [
        PanelCandidate(box=(40.0, 28.0, 280.0, 240.0)),
        PanelCandidate(box=(340.0, 28.0, 580.0, 240.0)),
    ]
    panels, owned, _ = own_panels(image, candidates, ["A", "B"], labels, named=["A", "B"])
    by_label = dict(zip(owned, panels, strict=True))
    assert by_label["A"].box[1] >= 58
    assert by_label["B"].box[1] <= 32


def test_series_keeps_one_run_of_labels() -> None:
    def det(text: str, confidence: float = 0.9) -> LabelDetection:
        return LabelDetection(text=text, box=(0.0, 0.0, 10.0, 10.0), confidence=confidence)

    found = [
        det("A"),
        det("B", 0.5),
        det("B", 0.8),
        det("12"),
        det("p"),
        det("D"),
        det("W"),
        det("b1"),
        det("C", 0.1),
    ]
    kept = series_labels(found, [])
    assert sorted(d.text for d in kept) == ["A", "B", "D", "b1"]  # "W" is past the run's end
    assert next(d for d in kept if d.text == "B").confidence == 0.8
    assert [d.text for d in series_labels(found, ["a", "b", "c"])] == [
        "A",
        "B",
        "C",
    ]  # the caption's, case aside
    assert series_labels([det("2"), det("7")], []) == []


def test_a_letter_past_a_gap_printed_before_the_last_label_is_no_label() -> None:
    """Labels A-J in a 4-column grid; an "M" read in a heading of the top row is past a gap of
    two letters, but the figure prints it before J: it is text, not the series' next label."""

    def at(text: str, x: float, y: float) -> LabelDetection:
        return LabelDetection(text=text, box=(x, y, x + 20.0, y + 30.0), confidence=0.9)

    grid = [at(letter, 300.0 * (k % 4), 400.0 * (k // 4)) for k, letter in enumerate("ABCDEFGHIJ")]
    heading = at("M", 700.0, 150.0)
    assert [d.text for d in series_labels([*grid, heading], [])] == list("ABCDEFGHIJ")
    after = at("M", 900.0, 800.0)  # printed after J: the series goes on past the gap
    assert [d.text for d in series_labels([*grid, after], [])][-1] == "M"
    # a single missing letter is not checked: "C" above "A" still follows it in the series
    assert [d.text for d in series_labels([at("A", 0, 400), at("C", 300, 0)], [])] == ["A", "C"]


def test_a_reading_smaller_than_the_labels_loses_to_one_of_their_size() -> None:
    """Two readings of C: the label (40 px, read at 0.83) and the C of "Caspase" in a blot's
    lane text (25 px, read at 0.89). The label wins, with a caption naming the letters and
    without."""

    def at(text: str, y: float, height: float, confidence: float) -> LabelDetection:
        return LabelDetection(text=text, box=(10.0, y, 35.0, y + height), confidence=confidence)

    read = [at("A", 0, 40, 0.9), at("B", 300, 41, 0.9), at("C", 600, 40, 0.83), at("C", 500, 25, 0.89)]
    for named in (["A", "B", "C"], []):
        chosen = {d.text: d for d in series_labels(read, named)}
        assert chosen["C"].box[1] == 600.0, named
    # where no reading is of the labels' size, the surest still stands
    short = [at("A", 0, 40, 0.9), at("B", 300, 41, 0.9), at("C", 500, 25, 0.89), at("C", 700, 20, 0.5)]
    assert next(d for d in series_labels(short, ["A", "B", "C"]) if d.text == "C").box[1] == 500.0


def test_without_labels_only_clear_gutters_separate_panels() -> None:
    # one diagram: boxes in a row joined by gaps no wider than the gaps inside them
    diagram = _canvas(500, 200)
    for k in range(4):
        x = 20 + k * 120
        cv2.rectangle(diagram, (x, 60), (x + 90, 140), (0, 0, 0), 2)
        _text(diagram, "step", x + 25, 105)
    cv2.rectangle(diagram, (20, 10), (470, 40), (0, 0, 0), 2)
    ink, _ = working_ink(diagram)
    parts, _ = separate_parts(ink, (0, 0, ink.shape[1], ink.shape[0]))
    assert len(parts) == 1
    # two pictures set far apart: two panels
    pair = _canvas(500, 200)
    _picture(pair, (10, 10, 200, 190), 1)
    _picture(pair, (300, 10, 490, 190), 2)
    ink, _ = working_ink(pair)
    parts, _ = separate_parts(ink, (0, 0, ink.shape[1], ink.shape[0]))
    assert sorted(parts) == [(10, 10, 200, 190), (300, 10, 490, 190)]
    panels, owned, notes = own_panels(
        pair, [PanelCandidate(box=(10.0, 10.0, 490.0, 190.0))], [None], [], named=[]
    )
    assert len(panels) == 2 and owned == [None, None] and notes


def test_without_labels_a_grid_of_alike_panels_stays_as_segmented() -> None:
    """Charts in a grid, gutters no wider than the gaps inside a chart: the pieces are alike in
    size, so they are panels repeated across the figure, not pieces of one diagram."""
    grid = _canvas(520, 400)
    boxes = [(10, 10, 250, 190), (270, 10, 510, 190), (10, 210, 250, 390), (270, 210, 510, 390)]
    for box in boxes:
        _plot(grid, box)
    pieces = [PanelCandidate(box=tuple(float(v) for v in b)) for b in boxes]
    panels, owned, notes = own_panels(grid, pieces, [None] * 4, [], named=[])
    assert panels == pieces and owned == [None] * 4 and notes == []
    # pieces of different sizes are not taken as they are: the gutters decide
    uneven = [PanelCandidate(box=(10.0, 10.0, 250.0, 190.0)), PanelCandidate(box=(270.0, 10.0, 300.0, 40.0))]
    recut, _, _ = own_panels(grid, uneven, [None, None], [], named=[])
    assert recut != uneven


def test_without_labels_a_picture_stands_apart_from_a_chart_beside_it() -> None:
    """A micrograph and a chart of different sizes, closer than the gaps inside the chart: the
    picture is visually separate all the same, so the segmenter's two pieces stand."""
    figure = _canvas(600, 300)
    _picture(figure, (10, 10, 170, 170), 3)
    _plot(figure, (200, 10, 590, 290))
    pieces = [PanelCandidate(box=(10.0, 10.0, 170.0, 170.0)), PanelCandidate(box=(200.0, 10.0, 590.0, 290.0))]
    panels, owned, _ = own_panels(figure, pieces, [None, None], [], named=[])
    assert panels == pieces and owned == [None, None]


def _network(image: np.ndarray, nodes: list[tuple[int, int]], edges: list[tuple[int, int]]) -> None:
    """A node-link diagram: named nodes joined by lines."""
    for a, b in edges:
        cv2.line(image, nodes[a], nodes[b], (60, 90, 160), 2)
    for k, (x, y) in enumerate(nodes):
        cv2.circle(image, (x, y), 7, (30, 30, 30), -1)
        _text(image, f"n{k}", x + 9, y + 4, 0.35)


def _staggered() -> tuple[np.ndarray, list[LabelDetection]]:
    """Three networks no straight gutter divides: A's edges reach past the corners of B and C."""
    image = _canvas(600, 440)
    labels = [_label(image, "A", 8, 8), _label(image, "B", 330, 8), _label(image, "C", 262, 262)]
    a_nodes = [(60, 60), (200, 50), (110, 160), (330, 240), (50, 280)]
    _network(image, a_nodes, [(0, 1), (0, 2), (2, 3), (2, 4), (1, 3)])
    _network(image, [(370, 60), (540, 60), (450, 180)], [(0, 1), (1, 2), (2, 0)])
    _network(image, [(300, 310), (540, 290), (420, 410)], [(0, 1), (1, 2), (2, 0)])
    return image, labels


def test_labels_without_a_gutter_between_them_share_out_the_content() -> None:
    image, labels = _staggered()
    # the segmenter saw one piece: the labels share it out, each piece to the label heading it
    merged = [PanelCandidate(box=(40.0, 40.0, 580.0, 420.0), confidence=0.9)]
    panels, owned, notes = own_panels(image, merged, ["A"], labels, named=[])
    by_label = dict(zip(owned, panels, strict=True))
    assert sorted(by_label) == ["A", "B", "C"]
    assert _near(by_label["A"].box, (43, 43, 350, 288), tol=6)  # its node n3 and its name
    assert _near(by_label["B"].box, (363, 53, 560, 188), tol=6)
    assert _near(by_label["C"].box, (293, 283, 560, 418), tol=6)
    assert all(p.confidence < 0.8 for p in panels) and "went to the label heading it" in notes[0]
    # pieces that already give each label one piece stay as the segmenter found them
    pieces = [
        PanelCandidate(box=(43.0, 43.0, 350.0, 288.0), confidence=0.9),
        PanelCandidate(box=(363.0, 53.0, 560.0, 188.0), confidence=0.9),
        PanelCandidate(box=(293.0, 283.0, 560.0, 418.0), confidence=0.9),
    ]
    kept, kept_labels, _ = own_panels(image, pieces, ["A", "B", "C"], labels, named=[])
    assert kept_labels == ["A", "B", "C"] and [p.box for p in kept] == [p.box for p in pieces]


def test_content_no_label_here_heads_keeps_the_segmenters_pieces() -> None:
    # B and C share a part with a picture left of both that no printed label heads
    image = _canvas(600, 440)
    labels = [_label(image, "B", 330, 8), _label(image, "C", 262, 262)]
    _picture(image, (20, 60, 200, 250), 3)
    _network(image, [(370, 60), (540, 60), (450, 180), (250, 200)], [(0, 1), (1, 2), (2, 0), (2, 3)])
    _network(image, [(300, 310), (540, 290), (420, 410)], [(0, 1), (1, 2), (2, 0)])
    merged = [PanelCandidate(box=(20.0, 53.0, 560.0, 418.0), confidence=0.9)]
    panels, owned, notes = own_panels(image, merged, ["B"], labels, named=[])
    assert owned == ["B"] and [p.box for p in panels] == [p.box for p in merged]
    assert notes == ["labels B, C share a part with no gutter between them"]


def test_letters_read_past_a_gap_in_the_series_are_looked_for_between() -> None:
    from PIL import Image, ImageDraw

    from p2p.mining.cpu.labels.series import past_gap
    from tests.test_labels import font

    picture = Image.new("RGB", (900, 300), "white")
    draw = ImageDraw.Draw(picture)
    read = []
    for k, letter in enumerate("ABCDEF"):
        x = 20 + 140 * k
        draw.text((x, 20), letter, fill="black", font=font(28))
        draw.rectangle((x + 10, 70, x + 120, 260), fill=(90, 90, 90))
        if letter in "ABF":
            box = tuple(float(v) for v in draw.textbbox((x, 20), letter, font=font(28)))
            read.append(LabelDetection(text=letter, box=box, confidence=0.9, raw=letter))  # type: ignore[arg-type]
    image = np.asarray(picture)
    ink, factor = working_ink(image)
    series = series_labels(read, [])
    assert sorted(d.text for d in series) == ["A", "B"]  # F is past the run's end
    assert past_gap(read, series) == "F"
    assert unread_labels(image, ink, factor, series, []) == []  # A to B: nothing missing
    found = unread_labels(image, ink, factor, series, [], past_gap(read, series))
    assert {"D", "E"} <= {d.text for d in found}
    assert {d.text for d in series_labels(read + found, [])} >= {"A", "B", "D", "E", "F"}


def _letters_over_pictures(
    letters: str, read: str, *, face: str = "DejaVuSans.ttf", size: int = 28, printed: str = "{}"
) -> tuple[np.ndarray, list[LabelDetection]]:
    """A row of grey pictures, each with its letter above it (as ``printed`` formats it: "({})"
    for "(a)"); detections for those in ``read``."""
    from PIL import Image, ImageDraw

    from tests.test_labels import font

    picture = Image.new("RGB", (140 * len(letters) + 40, 300), "white")
    draw = ImageDraw.Draw(picture)
    detections = []
    for k, letter in enumerate(letters):
        x = 20 + 140 * k
        text = printed.format(letter)
        draw.text((x, 20), text, fill="black", font=font(size, face))
        draw.rectangle((x + 10, 80, x + 120, 260), fill=(90, 90, 90))
        if letter in read:
            box = tuple(float(v) for v in draw.textbbox((x, 20), text, font=font(size, face)))
            detections.append(LabelDetection(text=letter, box=box, confidence=0.9, raw=text))  # type: ignore[arg-type]
    return np.asarray(picture), detections


def test_a_label_in_parentheses_is_found_as_one_word() -> None:
    # "(b)" is three glyphs, each with a neighbour in its margin: only as a word is it lone
    image, read = _letters_over_pictures("abc", "ac", face="DejaVuSerif-Bold.ttf", size=26, printed="({})")
    ink, factor = working_ink(image)
    found = unread_labels(image, ink, factor, read, ["a", "b", "c"])
    assert [d.text for d in found] == ["b"] and 150 <= found[0].box[0] < 200


def test_a_small_letter_out_of_the_labels_order_is_no_label() -> None:
    def det(text: str, x: float, y: float, height: float) -> LabelDetection:
        return LabelDetection(text=text, box=(x, y, x + 0.7 * height, y + height), confidence=0.9, raw=text)

    row = [det("B", 10, 700, 27), det("C", 550, 700, 27), det("D", 1120, 700, 27)]
    inside_c = det("A", 570, 880, 14)  # a glyph in C's picture, read as the missing first letter
    assert [d.text for d in series_labels([*row, inside_c], list("ABCD"))] == ["B", "C", "D"]
    assert [d.text for d in series_labels([*row, inside_c], [])] == ["B", "C", "D"]
    # where A goes (before B), a small A stays; so does a full-sized one anywhere
    assert "A" in [d.text for d in series_labels([*row, det("A", 10, 20, 14)], list("ABCD"))]
    assert "A" in [d.text for d in series_labels([*row, det("A", 570, 880, 27)], list("ABCD"))]


def test_a_lone_bar_is_the_series_missing_i() -> None:
    # a bold sans-serif I reads at about 0.2, under the bar any reading must clear
    image, read = _letters_over_pictures("GHIJ", "GHJ", face="DejaVuSans-Bold.ttf", size=36)
    ink, factor = working_ink(image)
    found = unread_labels(image, ink, factor, read, [])
    assert [d.text for d in found] == ["I"] and found[0].box[0] >= 300
    # where the series does not lack an I, a bar is nothing
    assert unread_labels(image, ink, factor, read[:2], []) == []


def test_the_letter_after_the_last_read_is_looked_for() -> None:
    image, read = _letters_over_pictures("ABCD", "ABC")
    ink, factor = working_ink(image)
    series = series_labels(read, [])
    assert next_letter(series) == "D"
    assert unread_labels(image, ink, factor, series, []) == []
    assert [d.text for d in unread_labels(image, ink, factor, series, [], next_letter(series))] == ["D"]


def test_a_gutter_a_label_stands_after_is_cut_before_a_wider_blank() -> None:
    ink = np.zeros((200, 600), dtype=bool)
    ink[25:190, 20:200] = True  # A's rendering
    for y in range(40, 180, 20):  # A's key: thin strokes, past a blank wider than the gutter
        ink[y, 260:330] = True
    ink[25:190, 360:590] = True  # B's picture, its label just after a narrow gutter
    anchors = [Anchor("A", (5, 5, 15, 20)), Anchor("B", (346, 5, 356, 20))]
    parts = sorted(label_parts(ink, anchors), key=lambda p: p[0][0])
    assert [[a.text for a in owners] for _, owners in parts] == [["A"], ["B"]]
    assert 330 <= parts[0][0][2] <= 346


def test_the_cuts_are_ordered_so_that_each_label_gets_a_part() -> None:
    ink = np.zeros((400, 500), dtype=bool)
    ink[25:184, 20:180] = True  # A's blot
    for y1, y2 in ((198, 215), (220, 240), (245, 265)):  # A's strips, past a gutter D heads
        ink[y1:y2, 20:180] = True
    ink[25:120, 250:480] = True  # B
    ink[218:300, 250:480] = True  # D, its label just below the gutter under A's blot
    ink[314:325, 40:200] = True  # E's heading, on its label's line: the gutter above E is narrower
    ink[335:390, 20:480] = True  # E
    anchors = [
        Anchor("A", (5, 5, 15, 20)),
        Anchor("B", (240, 5, 250, 20)),
        Anchor("D", (240, 200, 250, 215)),
        Anchor("E", (5, 312, 15, 327)),
    ]
    parts = {owners[0].text: box for box, owners in label_parts(ink, anchors) if len(owners) == 1}
    assert sorted(parts) == ["A", "B", "D", "E"]
    assert parts["A"][3] >= 265 and parts["A"][2] <= 250  # the strips are A's, D's column is not
    assert parts["D"][0] >= 180 and parts["E"][1] >= 300


def test_a_label_hanging_before_a_gutter_goes_with_the_content_after_it() -> None:
    ink = np.zeros((300, 600), dtype=bool)
    ink[30:280, 20:200] = True  # E's blot
    ink[100:110, 200:222] = True  # its size marks, further down, in the columns of F's label
    ink[150:160, 200:222] = True
    ink[30:280, 240:590] = True  # F's picture, past a gutter that starts where F's label ends
    anchors = [Anchor("E", (5, 5, 15, 20)), Anchor("F", (208, 5, 222, 20))]
    parts = sorted(label_parts(ink, anchors), key=lambda p: p[0][0])
    assert [[a.text for a in owners] for _, owners in parts] == [["E"], ["F"]]
    assert 222 <= parts[0][0][2] <= 240


def test_a_hanging_label_is_no_part_of_its_neighbours_panel() -> None:
    image = _canvas(600, 300)
    labels = [_label(image, "A", 4, 4), _label(image, "B", 206, 4)]
    _plot(image, (30, 40, 200, 280))
    for y in (120, 180):  # tick marks beside A's chart, in the columns of B's label
        _text(image, "-55", 200, y, 0.4)
    gutter_start = int(np.flatnonzero((image[40:280, 200:] < 128).any(axis=(0, 2)))[-1]) + 200 + 1
    _picture(image, (gutter_start + 20, 40, 590, 280), 2)
    candidates = [PanelCandidate(box=(30.0, 40.0, 590.0, 280.0), confidence=0.9)]
    panels, owned, _ = own_panels(image, candidates, ["A"], labels, named=[])
    by_label = dict(zip(owned, panels, strict=True))
    assert sorted(by_label) == ["A", "B"]
    assert by_label["A"].box[1] >= 38  # B's glyph, in A's part, is not A's content
    assert by_label["B"].box[0] >= gutter_start + 18


def test_without_labels_steps_joined_by_arrows_are_one_drawing() -> None:
    """A workflow of five alike boxes joined by arrows: the segmenter cut it at the arrows into
    pieces alike in size, which would stand as a row of panels; the arrows make it one."""
    image = _canvas(900, 200)
    steps = [(20 + 180 * k, 50, 140 + 180 * k, 150) for k in range(5)]
    for x1, y1, x2, y2 in steps:
        cv2.rectangle(image, (x1, y1), (x2, y2), (40, 40, 90), 2)
        _text(image, "step", x1 + 35, y1 + 55)
    for (_, _, x2, _), (nx1, _, _, _) in itertools.pairwise(steps):
        cv2.arrowedLine(image, (x2 + 2, 100), (nx1 - 2, 100), (40, 40, 90), 2, tipLength=0.3)
    # the cuts fall mid-arrow: every piece holds a box and half of the arrows beside it
    cuts = [0, 160, 340, 520, 700, 900]
    pieces = [
        PanelCandidate(box=(float(a) + 20, 48.0, float(b) - 2, 152.0)) for a, b in itertools.pairwise(cuts)
    ]
    panels, owned, notes = own_panels(image, pieces, [None] * 5, [], named=[])
    assert len(panels) == 1 and owned == [None]
    assert _near(panels[0].box, (19, 49, 862, 152), tol=6)
    assert "strokes join 5 pieces into 1" in notes[0]


def test_without_labels_an_arrow_across_a_gap_joins_two_pictures_not_a_third() -> None:
    image = _canvas(900, 300)
    _picture(image, (20, 20, 220, 220), 1)
    _picture(image, (460, 20, 660, 220), 2)
    _picture(image, (700, 40, 880, 280), 3)  # no stroke reaches it
    cv2.arrowedLine(image, (250, 120), (430, 120), (0, 0, 0), 3, tipLength=0.1)
    pieces = [
        PanelCandidate(box=(20.0, 20.0, 220.0, 220.0)),
        PanelCandidate(box=(460.0, 20.0, 660.0, 220.0)),
        PanelCandidate(box=(700.0, 40.0, 880.0, 280.0)),
    ]
    panels, _, notes = own_panels(image, pieces, [None] * 3, [], named=[])
    assert sorted(p.box for p in panels) == [(20.0, 20.0, 660.0, 220.0), (700.0, 40.0, 880.0, 280.0)]
    assert notes == ["no panel labels: strokes join 3 pieces into 2"]
    # pictures that touch are one dense block across their seam, not a stroke: they stay apart
    touching = _canvas(420, 220)
    _picture(touching, (10, 10, 210, 210), 4)
    _picture(touching, (210, 10, 410, 210), 5)
    halves = [PanelCandidate(box=(10.0, 10.0, 210.0, 210.0)), PanelCandidate(box=(210.0, 10.0, 410.0, 210.0))]
    kept, _, _ = own_panels(touching, halves, [None, None], [], named=[])
    assert kept == halves


def test_one_label_read_of_several_the_caption_names_looks_for_the_rest() -> None:
    """Rows of pictures with their letters in a margin column; only B is read. The caption names
    A-C, so the lone letters A and C are looked for, and each label owns its row's pictures."""
    from PIL import Image, ImageDraw

    from tests.test_labels import font

    picture = Image.new("RGB", (520, 420), "white")
    draw = ImageDraw.Draw(picture)
    rows = {"A": 20, "B": 150, "C": 280}
    pieces: list[Box] = []
    read = []
    for letter, top in rows.items():
        draw.text((8, top), letter, fill="black", font=font(22))
        row = [(60, top + 4, 270, top + 114), (290, top + 4, 500, top + 114)]
        for k, box in enumerate(row):
            draw.rectangle(box, fill=(70 + 30 * k, 90, 110))
        pieces += row
        if letter == "B":
            box = tuple(float(v) for v in draw.textbbox((8, top), letter, font=font(22)))
            read.append(LabelDetection(text=letter, box=box, confidence=0.9, raw=letter))  # type: ignore[arg-type]
    image = np.asarray(picture)
    candidates = [PanelCandidate(box=tuple(float(v) for v in p), confidence=0.9) for p in pieces]
    labels: list[str | None] = [None, None, "B", None, None, None]
    panels, owned, _ = own_panels(image, candidates, labels, read, named=["A", "B", "C"])
    assert sorted(owned, key=str) == ["A", "B", "C"]
    for panel, label in zip(panels, owned, strict=True):
        top = rows[str(label)]
        assert _near(panel.box, (60, top + 4, 501, top + 115), tol=4)
    # read alone, with no caption naming more, one label is no series: the pieces stand
    assert own_panels(image, candidates, labels, read, named=[])[0] == candidates


def test_a_bar_too_thin_to_read_is_the_series_missing_i() -> None:
    """A small copy's I is a bar two pixels wide that the recogniser reads as nothing. With H and
    J read and I missing, the figure's only solid lone bar is the I (``_solid_bar``); so it is
    where I is the letter looked for after the last read."""
    image, read = _letters_over_pictures("GHIJ", "GHJ", face="DejaVuSans.ttf", size=16)
    image = image.copy()
    image[10:60, 280:330] = 255  # the font's I, replaced by the bar a shrunk copy leaves of it:
    h = round(read[0].box[3] - read[0].box[1])  # two grey columns, as tall as the letters,
    top = round(read[0].box[1])  # lighter at both ends
    image[top : top + h, 300] = 105
    image[top : top + h, 301] = 47
    image[top, 300:302] = ((142,) * 3, (98,) * 3)
    image[top + h - 1, 300:302] = ((201,) * 3, (181,) * 3)
    ink, factor = working_ink(image)
    found = unread_labels(image, ink, factor, read, [])
    assert [(d.text, d.box[0]) for d in found] == [("I", 300.0)]
    # with G and H read, the bar is the I only where the series expects one: the letter after H
    assert unread_labels(image, ink, factor, read[:2], []) == []
    assert [d.text for d in unread_labels(image, ink, factor, read[:2], [], "I")] == ["I"]
    # two such bars: which one is the I is not clear, and neither is taken
    image[top : top + h, 230:232] = image[top : top + h, 300:302]
    ink, factor = working_ink(image)
    assert unread_labels(image, ink, factor, read, []) == []


def test_a_header_tables_frame_along_the_parts_edge_is_no_picture() -> None:
    # a grid of pictures under a framed header row, flush against a framed row label on its
    # left: on a small copy the frame lines are 3 px, and they run along the part's edges
    ink = np.zeros((260, 420), dtype=bool)
    ink[0:3, :] = True  # the header table's top rule, the content's first row
    ink[0:260, 0:3] = True  # the row label's frame, the content's first column
    ink[20:23, :] = True  # the rule under the header row
    for x in (140, 280):
        ink[0:20, x : x + 2] = True  # the header cells' dividers
        ink[8:14, x - 60 : x - 30] = True  # a header's letters
    for top, left in itertools.product((26, 144), (3, 140, 280)):
        ink[top : top + 116, left : left + 130] = True  # the pictures, the first against the frame
    # the header row stays out (the frame line the first picture touches is one block with it)
    assert image_extents(ink, (0, 0, 420, 260)) == (0, 26, 410, 260)


def test_a_glyph_where_the_labels_rows_and_columns_meet_is_the_missing_letter() -> None:
    """A small copy's letter can be a two-pixel bar with a one-pixel hook that the recogniser
    reads nothing in. A to E head the first row; F and G stand under B and C. Such a glyph on
    their row and in D's column is the one letter the series still lacks (H here). Off the
    labels' columns, under A (before F in the labels' order), or beside a second one under E,
    nothing is taken."""
    from PIL import Image, ImageDraw

    from tests.test_labels import font

    places = {"A": (20, 20), "B": (160, 20), "C": (300, 20), "D": (440, 20), "E": (580, 20)}
    places |= {"F": (160, 340), "G": (300, 340)}
    picture = Image.new("RGB", (720, 640), "white")
    draw = ImageDraw.Draw(picture)
    read = []
    for letter, (x, y) in places.items():
        draw.text((x, y), letter, fill="black", font=font(28, "DejaVuSans.ttf"))
        box = tuple(float(v) for v in draw.textbbox((x, y), letter, font=font(28, "DejaVuSans.ttf")))
        read.append(LabelDetection(text=letter, box=box, confidence=0.9, raw=letter))  # type: ignore[arg-type]
        draw.rectangle((x + 10, y + 60, x + 110, y + 280), fill=(90, 90, 90))
    image = np.asarray(picture).copy()
    top, height = round(read[5].box[1]), round(read[5].box[3] - read[5].box[1])
    column = {letter: round(d.box[0]) for letter, d in zip(places, read, strict=True)}

    def hooked_bar(at: int, value: int = 60) -> None:
        image[top : top + height, at + 3 : at + 5] = value
        image[top + height - 1, at + 2] = 140 if value < 255 else 255

    def found() -> list[tuple[str, float]]:
        ink, factor = working_ink(image)
        return [(d.text, d.box[0]) for d in unread_labels(image, ink, factor, read, [], "H")]

    hooked_bar(column["D"] + 60)
    assert found() == []  # off the columns: no label's place
    hooked_bar(column["D"] + 60, 255)
    hooked_bar(column["A"])
    assert found() == []  # under A: before F in the labels' order
    hooked_bar(column["D"])
    assert found() == [("H", float(column["D"] + 2))]
    hooked_bar(column["E"])  # a second glyph on the grid, after G: which is the H is not clear
    assert found() == []
