"""Panel labels: normalisation, reading order, sequence repair, and OCR on rendered labels."""

from __future__ import annotations

from pathlib import Path

import cv2
import matplotlib
import numpy as np
import pytest
from PIL import Image, ImageDraw, ImageFont

from p2p.mining.cpu.labels.read import assign_labels, find_labels, normalize_label, reading_order
from p2p.mining.cpu.segmentation.segment import segment_figure, segment_panels
from p2p.mining.params import load_params
from p2p.mining.types import LabelDetection, PanelCandidate

FONT_DIR = Path(matplotlib.__file__).parent / "mpl-data" / "fonts" / "ttf"


def font(size: int, name: str = "DejaVuSans-Bold.ttf") -> ImageFont.FreeTypeFont:
    return ImageFont.truetype(str(FONT_DIR / name), size)


def texture(rng: np.random.Generator, w: int, h: int, level: int) -> np.ndarray:
    grey = np.clip(rng.normal(level, 10, (h, w)), 0, 215).astype(np.uint8)
    return np.repeat(grey[:, :, None], 3, axis=2)


def panel(box: tuple[float, float, float, float]) -> PanelCandidate:
    return PanelCandidate(box=box, confidence=0.9)


def recogniser_input(pil: Image.Image) -> np.ndarray:
    """The recogniser's input for a label printed black on white in ``pil``: its ink's box,
    prepared as the OCR stage prepares a crop."""
    from p2p.mining.cpu.labels.read import _prepare_crop

    grey = np.asarray(pil)
    ys, xs = np.nonzero(grey < 128)
    box = (int(xs.min()) - 1, int(ys.min()) - 1, int(xs.max()) + 2, int(ys.max()) + 2)
    return _prepare_crop(grey, None, box, invert=False)


def detection(text: str, box: tuple[float, float, float, float], confidence: float = 0.9) -> LabelDetection:
    return LabelDetection(text=text, box=box, confidence=confidence, raw=text)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("(a)", "a"),
        ("a)", "a"),
        ("A.", "A"),
        ("[B]", "B"),
        (" c ", "c"),
        ("1a", "1a"),
        ("(1b)", "1b"),
        ("12", "12"),
        ("ii", "ii"),
        ("(iv)", "iv"),
        ("IV", "IV"),
        ("|", "l"),
        ("", None),
        ("()", None),
        ("Fig", None),
        ("0", None),
        ("abc", None),
        ("2.5", None),
    ],
)
def test_normalize_label(raw: str, expected: str | None) -> None:
    assert normalize_label(raw) == expected


def test_reading_order_rows_then_columns() -> None:
    grid = [
        (300, 0, 400, 100),
        (0, 0, 100, 100),
        (150, 120, 250, 220),
        (0, 120, 100, 220),
        (150, 0, 250, 100),
    ]
    assert reading_order([panel(b) for b in grid]) == [1, 4, 0, 3, 2]
    # a tall panel on the left with two stacked on the right: the left column comes first,
    # and a stacked column is read top to bottom before the next column
    layout = [(200, 0, 300, 90), (0, 0, 180, 200), (200, 110, 300, 200), (320, 0, 400, 200)]
    assert reading_order([panel(b) for b in layout]) == [1, 0, 2, 3]
    assert reading_order([]) == []


def test_column_by_column_labels_choose_the_column_order() -> None:
    # a 2x3 grid labelled down each column: a, b in the first column, c, d, then e, f
    boxes = [(20 + 200 * c, 20 + 200 * r, 200 + 200 * c, 200 + 200 * r) for r in range(2) for c in range(3)]
    panels = [panel(b) for b in boxes]
    text_at = {0: "a", 3: "b", 1: "c", 4: "d", 2: "e"}  # the last panel's label is unread
    dets = [
        detection(t, (boxes[k][0] - 16, boxes[k][1] - 16, boxes[k][0] - 4, boxes[k][1] - 2))
        for k, t in text_at.items()
    ]
    assert assign_labels(panels, dets) == ["a", "c", "e", "b", "d", "f"]
    assert reading_order(panels) == [0, 1, 2, 3, 4, 5]
    assert reading_order(panels, ["a", "c", "e", "b", "d", None]) == [0, 3, 1, 4, 2, 5]


def test_block_then_column_is_no_row_gutter() -> None:
    # a block of two rows (i-iv) with a column of four panels beside it (v-viii): the block's row
    # gutter does not run across the column, whose second panel overlaps both rows a little
    block = [(0, 0, 100, 160), (110, 0, 210, 160), (0, 170, 140, 330), (150, 170, 210, 330)]
    column = [(220, 0, 420, 80), (220, 90, 420, 175), (220, 185, 420, 255), (220, 265, 420, 330)]
    panels = [panel(b) for b in block + column]
    names = ["i", "ii", "iii", "iv", "v", "vi", "vii", "viii"]
    dets = [
        detection(t, (b[0] + 2, b[1] + 2, b[0] + 4 + 5 * len(t), b[1] + 12))
        for t, b in zip(names, block + column, strict=True)
    ]
    assert assign_labels(panels, dets) == names


def test_assign_labels_pairs_each_label_with_the_panel_it_heads() -> None:
    panels = [panel((20, 20, 200, 200)), panel((240, 20, 420, 200)), panel((20, 240, 200, 420))]
    labels = [
        detection("b", (222, 2, 234, 16)),
        detection("a", (2, 2, 14, 16)),
        detection("c", (2, 222, 14, 236)),
        detection("x", (120, 120, 132, 134)),  # text in the middle of a panel: not a label
    ]
    assert assign_labels(panels, labels) == ["a", "b", "c"]


def test_unlabelled_panels_get_none_and_reading_order_is_the_fallback() -> None:
    panels = [panel((240, 20, 420, 200)), panel((20, 20, 200, 200))]
    assert assign_labels(panels, []) == [None, None]
    assert reading_order(panels) == [1, 0]


def test_sequence_repairs_confusable_readings() -> None:
    boxes = [(20 + 120 * k, 20, 120 + 120 * k, 120) for k in range(6)]
    panels = [panel(b) for b in boxes]

    def at(k: int, text: str, confidence: float = 0.9) -> LabelDetection:
        x = boxes[k][0]
        return detection(text, (x - 14, 2, x - 2, 16), confidence)

    # OCR reads "C" for a lowercase c and "1" for l, in a lowercase series
    got = assign_labels(panels, [at(0, "g"), at(1, "h"), at(2, "I"), at(3, "j"), at(4, "K"), at(5, "1")])
    assert got == ["g", "h", "i", "j", "k", "l"]
    got = assign_labels(panels, [at(0, "a"), at(1, "b"), at(2, "C"), at(3, "d"), at(4, "e"), at(5, "f")])
    assert got == ["a", "b", "c", "d", "e", "f"]
    series = [panel(b) for b in boxes[:4]]
    got = assign_labels(series, [at(0, "i"), at(1, "j"), at(2, "k"), at(3, "1")])
    assert got == ["i", "j", "k", "l"]
    got = assign_labels(series, [at(0, "m"), at(1, "n"), at(2, "0"), at(3, "p")])
    assert got == ["m", "n", "o", "p"]
    got = assign_labels(series, [at(0, "p"), at(1, "q"), at(2, "r"), at(3, "5")])
    assert got == ["p", "q", "r", "s"]
    # a weak reading survives only where the series confirms it
    got = assign_labels(series, [at(0, "a"), at(1, "b"), at(2, "x", 0.2), at(3, "d")])
    assert got == ["a", "b", "c", "d"]


def test_sequence_repairs_roman_numerals_and_missing_tail_labels() -> None:
    boxes = [(20 + 120 * k, 20, 120 + 120 * k, 120) for k in range(6)]
    panels = [panel(b) for b in boxes]

    def at(k: int, text: str, confidence: float = 0.9) -> LabelDetection:
        x = boxes[k][0]
        return detection(text, (x - 14, 2, x - 2, 16), confidence)

    # repeated i's merged or dropped by the recogniser ("ii" -> "u", "iii" -> "i"); a lone "v" and
    # "i" vote for the roman series as well as for letters
    readings = [at(0, "i"), at(1, "u", 0.3), at(2, "i", 0.3), at(3, "iv"), at(4, "v"), at(5, "vi")]
    assert assign_labels(panels, readings) == ["i", "ii", "iii", "iv", "v", "vi"]
    # the last two labels unread: the series that the others confirm names them
    readings = [at(0, "A"), at(1, "B"), at(2, "C"), at(3, "D")]
    assert assign_labels(panels, readings) == ["A", "B", "C", "D", "E", "F"]
    # ... but not a long unread run, nor when too few panels confirm the series
    assert assign_labels(panels, readings[:2]) == ["A", "B", None, None, None, None]


def test_sequence_repairs_figure_number_labels() -> None:
    boxes = [(20 + 120 * k, 20, 120 + 120 * k, 120) for k in range(4)]
    panels = [panel(b) for b in boxes]

    def at(k: int, text: str) -> LabelDetection:
        x = boxes[k][0]
        return detection(text, (x - 24, 2, x - 2, 16))

    # "6l" read as "61", "4a" with its figure number misread
    assert assign_labels(panels, [at(0, "6i"), at(1, "6j"), at(2, "6k"), at(3, "61")]) == [
        "6i",
        "6j",
        "6k",
        "6l",
    ]
    assert assign_labels(panels, [at(0, "1a"), at(1, "4b"), at(2, "4c"), at(3, "4d")]) == [
        "4a",
        "4b",
        "4c",
        "4d",
    ]
    # an order that explains few clear readings does not turn them into their neighbours'
    got = assign_labels(panels[:3], [at(0, "6j"), at(1, "6i"), at(2, "6k")])
    assert got == ["6j", "6i", "6k"]


def test_clear_reading_off_the_series_rank_takes_the_series_case() -> None:
    # an over-segmented panel shifts the ranks: "c" is no confusion of the D expected there, but
    # in an upper-case series it is C
    boxes = [(20 + 120 * k, 20, 120 + 120 * k, 120) for k in range(4)]
    panels = [panel(b) for b in boxes]
    dets = [
        detection(t, (boxes[k][0] - 14, 2, boxes[k][0] - 2, 16)) for k, t in ((0, "A"), (1, "B"), (3, "c"))
    ]
    assert assign_labels(panels, dets) == ["A", "B", None, "C"]


def test_second_look_reads_other_preparations_in_the_figures_style() -> None:
    import p2p.mining.cpu.labels.read as labels_module

    class Recogniser:
        """Reads "1" (a "1d" whose "d" the opened gaps split) unless the crop is prepared
        without them."""

        def __init__(self) -> None:
            self.calls = 0

        def read(self, crops: list[np.ndarray]) -> list[tuple[str, float]]:
            self.calls += 1
            return [("1d", 0.7) if k in (0, 1) else ("1", 0.9) for k in range(len(crops))]

    gray = np.full((60, 200), 255, dtype=np.uint8)
    gray[10:22, 150:170] = 0
    box = (150, 10, 170, 22)
    source = (gray[8:24, 148:172] < 128, (148, 8, 172, 24), False, False)
    cand = labels_module._Candidate(box=box, crop=gray[:32, :48], panel=3, prior=0.9, source=source)
    clear = [
        (k, detection(t, (10.0 + 30 * k, 2.0, 30.0 + 30 * k, 14.0))) for k, t in enumerate(["1a", "1b", "1c"])
    ]
    first = [*clear, (3, detection("1", (150.0, 10.0, 170.0, 22.0), 0.9))]
    engine = Recogniser()
    got = labels_module._second_look(engine, gray, [cand], first, load_params().labels)  # type: ignore[arg-type]
    assert engine.calls == 1
    assert sorted(d.text for _, d in got) == ["1a", "1b", "1c", "1d"]
    # a figure without two clear readings to tell its style is not read again
    engine = Recogniser()
    assert labels_module._second_look(engine, gray, [cand], first[3:], load_params().labels) == first[3:]  # type: ignore[arg-type]
    assert engine.calls == 0


def test_no_repair_without_a_clear_series() -> None:
    boxes = [(20 + 120 * k, 20, 120 + 120 * k, 120) for k in range(3)]
    panels = [panel(b) for b in boxes]
    labels = [detection(t, (b[0] - 14, 2, b[0] - 2, 16)) for t, b in zip(["A", "Q", "7"], boxes, strict=True)]
    assert assign_labels(panels, labels) == ["A", "Q", "7"]


def rendered_figure() -> tuple[np.ndarray, list[tuple[int, int, int, int]]]:
    """Three image panels labelled "A", "(b)", "C." printed outside, above-left of each."""
    rng = np.random.default_rng(0)
    image = np.full((300, 780, 3), 255, dtype=np.uint8)
    boxes = [(40, 40, 260, 280), (300, 40, 520, 280), (560, 40, 770, 280)]
    pil = Image.fromarray(image)
    draw = ImageDraw.Draw(pil)
    for text, (x1, y1, _, _) in zip(["A", "(b)", "C."], boxes, strict=True):
        draw.text((x1 - 34, y1 - 38), text, fill=(0, 0, 0), font=font(24))
    image = np.asarray(pil).copy()
    for x1, y1, x2, y2 in boxes:
        image[y1:y2, x1:x2] = texture(rng, x2 - x1, y2 - y1, 110)
    return image, boxes


def test_ocr_reads_rendered_labels() -> None:
    image, boxes = rendered_figure()
    panels = segment_panels(image)
    assert sorted(p.box for p in panels) == sorted(tuple(float(v) for v in b) for b in boxes)
    detections = find_labels(image, panels)
    assert {d.text for d in detections} >= {"A", "b", "C"}
    assert {d.raw.lower() for d in detections} >= {"a", "(b)", "c."}  # what OCR read, punctuation kept
    assigned = dict(zip((p.box for p in panels), assign_labels(panels, detections), strict=True))
    assert [assigned[tuple(float(v) for v in b)] for b in boxes] == ["A", "b", "C"]
    for det in detections:
        assert 0.0 < det.confidence <= 1.0
        x1, y1, x2, y2 = det.box
        assert 0 <= x1 < x2 <= image.shape[1] and 0 <= y1 < y2 <= image.shape[0]


def textured_figure(
    size: tuple[int, int], boxes: list[tuple[int, int, int, int]], level: int, seed: int
) -> tuple[Image.Image, ImageDraw.ImageDraw]:
    """A white figure of ``size`` (w, h) with a grey texture of mean ``level`` in each box."""
    rng = np.random.default_rng(seed)
    image = np.full((size[1], size[0], 3), 255, dtype=np.uint8)
    for x1, y1, x2, y2 in boxes:
        image[y1:y2, x1:x2] = texture(rng, x2 - x1, y2 - y1, level)
    pil = Image.fromarray(image)
    return pil, ImageDraw.Draw(pil)


def test_ocr_reads_white_labels_inside_dark_images() -> None:
    boxes = [(10, 10, 260, 250), (280, 10, 530, 250)]
    pil, draw = textured_figure((540, 260), boxes, 45, seed=1)
    for text, (x1, y1, _, _) in zip(["a", "b"], boxes, strict=True):
        draw.text((x1 + 8, y1 + 2), text, fill=(255, 255, 255), font=font(26))
    image = np.asarray(pil).copy()
    panels = segment_panels(image)
    assert len(panels) == 2
    order = reading_order(panels)
    labels = assign_labels(panels, find_labels(image, panels))
    assert [labels[i] for i in order] == ["a", "b"]


def test_find_labels_without_panels_or_text() -> None:
    blank = np.full((100, 100, 3), 255, dtype=np.uint8)
    assert find_labels(blank, []) == []
    rng = np.random.default_rng(2)
    plain = np.full((200, 200, 3), 255, dtype=np.uint8)
    plain[20:180, 20:180] = texture(rng, 160, 160, 120)
    panels = segment_panels(plain)
    assert assign_labels(panels, find_labels(plain, panels)) == [None]


def test_text_detector_looks_at_every_panel_without_a_reading(monkeypatch: pytest.MonkeyPatch) -> None:
    # segmentation may swallow the labels' strip into the panels: then most panels have no
    # reading from the glyph searches, and each of them still gets the detector's look
    import p2p.mining.cpu.labels.read as labels_module

    boxes = [(10 + 130 * c, 10 + 130 * r, 130 + 130 * c, 130 + 130 * r) for r in range(2) for c in range(3)]
    pil, _ = textured_figure((410, 280), boxes, 120, seed=3)
    image = np.asarray(pil).copy()
    looked: list[int] = []
    original = labels_module._detector_candidates

    def spy(engine, rgb, gray, box, index, u):  # type: ignore[no-untyped-def]
        looked.append(index)
        return original(engine, rgb, gray, box, index, u)

    monkeypatch.setattr(labels_module, "_detector_candidates", spy)
    panels = [panel(tuple(float(v) for v in b)) for b in boxes]
    find_labels(image, panels)
    assert sorted(looked) == list(range(6))


def labels_in_reading_order(image: np.ndarray, count: int) -> list[str | None]:
    """Segment ``image`` (expecting ``count`` panels), read and assign its labels, in reading order."""
    panels = segment_panels(image)
    assert len(panels) == count
    order = reading_order(panels)
    labels = assign_labels(panels, find_labels(image, panels))
    return [labels[i] for i in order]


def test_ocr_reads_white_labels_on_dark_discs() -> None:
    """Circled labels printed white on a filled dark disc are read from the disc's holes."""
    rng = np.random.default_rng(3)
    image = np.full((300, 620, 3), 255, dtype=np.uint8)
    boxes = [(50, 50, 290, 280), (340, 50, 600, 280)]
    for x1, y1, x2, y2 in boxes:
        image[y1:y2, x1:x2] = texture(rng, x2 - x1, y2 - y1, 120)
    pil = Image.fromarray(image)
    draw = ImageDraw.Draw(pil)
    for text, (x1, y1, _, _) in zip(["(a)", "(b)"], boxes, strict=True):
        draw.ellipse([x1 - 46, y1 - 46, x1 - 6, y1 - 6], fill=(0, 0, 0))
        draw.text((x1 - 26, y1 - 26), text, fill=(255, 255, 255), font=font(16), anchor="mm")
    image = np.asarray(pil).copy()
    panels = segment_panels(image)
    assert len(panels) == 2
    order = reading_order(panels)
    labels = assign_labels(panels, find_labels(image, panels))
    assert [labels[i] for i in order] == ["a", "b"]


def test_ocr_reads_circled_labels_whose_ring_touches_the_letter() -> None:
    """A thin circle drawn tight round a bold capital touches it: one ink shape, ring cut off."""
    rng = np.random.default_rng(4)
    image = np.full((300, 900, 3), 255, dtype=np.uint8)
    boxes = [(40, 40, 280, 280), (330, 40, 580, 280), (630, 40, 880, 280)]
    for x1, y1, x2, y2 in boxes:
        image[y1:y2, x1:x2] = texture(rng, x2 - x1, y2 - y1, 120)
    pil = Image.fromarray(image)
    draw = ImageDraw.Draw(pil)
    for text, (x1, y1, _, _) in zip(["B", "C", "D"], boxes, strict=True):
        cx, cy = x1 - 18, y1 - 18
        draw.ellipse([cx - 10, cy - 10, cx + 10, cy + 10], outline=(0, 0, 0), width=2)
        draw.text((cx, cy), text, fill=(0, 0, 0), font=font(17), anchor="mm")
        draw.line([(cx + 5, cy), (cx + 9, cy)], fill=(0, 0, 0), width=2)  # touching for sure
    image = np.asarray(pil).copy()
    assert labels_in_reading_order(image, 3) == ["B", "C", "D"]


def test_ocr_reads_jpeg_blurred_white_labels_inside_images() -> None:
    """Heavy JPEG dims and breaks the strokes of white "(a)" labels on dark images; the corner
    search thresholds relative to the ground, so the glyphs stay whole."""
    import io

    rng = np.random.default_rng(4)
    image = np.full((260, 540, 3), 255, dtype=np.uint8)
    boxes = [(10, 10, 260, 250), (280, 10, 530, 250)]
    for x1, y1, x2, y2 in boxes:
        image[y1:y2, x1:x2] = texture(rng, x2 - x1, y2 - y1, 25)
    pil = Image.fromarray(image)
    draw = ImageDraw.Draw(pil)
    for text, (x1, y1, _, _) in zip(["(a)", "(b)"], boxes, strict=True):
        draw.text((x1 + 3, y1 + 1), text, fill=(255, 255, 255), font=font(17))
    buffer = io.BytesIO()
    pil.save(buffer, format="JPEG", quality=25)
    image = np.asarray(Image.open(io.BytesIO(buffer.getvalue())).convert("RGB")).copy()
    panels = segment_panels(image)
    assert len(panels) == 2
    order = reading_order(panels)
    labels = assign_labels(panels, find_labels(image, panels))
    assert [labels[i] for i in order] == ["a", "b"]


def small_grey_labels_figure() -> tuple[np.ndarray, list[PanelCandidate]]:
    """Black "(c)", "(d)", "(e)" inside calm grey images, downscaled and JPEG-compressed."""
    import io

    rng = np.random.default_rng(5)
    image = np.full((330, 960, 3), 255, dtype=np.uint8)
    boxes = [(6, 6, 316, 324), (326, 6, 636, 324), (646, 6, 954, 324)]
    for x1, y1, x2, y2 in boxes:
        # a calm grey ground (electron micrograph, CT) with a gentle gradient
        ramp = np.linspace(110, 140, x2 - x1)[None, :] + rng.normal(0, 3, (y2 - y1, x2 - x1))
        image[y1:y2, x1:x2] = np.clip(ramp, 0, 255).astype(np.uint8)[:, :, None]
    pil = Image.fromarray(image)
    draw = ImageDraw.Draw(pil)
    for text, (x1, y1, _, _) in zip(["(c)", "(d)", "(e)"], boxes, strict=True):
        draw.text((x1 + 4, y1 + 2), text, fill=(0, 0, 0), font=font(24, "DejaVuSerif.ttf"))
    pil = pil.resize((576, 198), Image.Resampling.LANCZOS)
    buffer = io.BytesIO()
    pil.save(buffer, format="JPEG", quality=70)
    image = np.asarray(Image.open(io.BytesIO(buffer.getvalue())).convert("RGB")).copy()
    return image, [panel(tuple(float(round(v * 0.6)) for v in b)) for b in boxes]  # type: ignore[misc]


def test_ocr_reads_small_downscaled_parenthesised_labels_on_grey_images() -> None:
    """The thresholded cores of such glyphs are broken strokes: the corner search grows the group
    across both parentheses and the crop keeps the glyphs' grey edges."""
    image, panels = small_grey_labels_figure()
    analysis = segment_figure(image).analysis  # the label search reuses it, as in the miner
    assert assign_labels(panels, find_labels(image, panels, analysis=analysis)) == ["c", "d", "e"]


def test_repeated_thin_strokes_of_roman_numerals_are_counted() -> None:
    """The recogniser merges repeated i's ("iii" -> "i"); the glyph shapes in the crop give the
    count back."""
    from p2p.mining.cpu.labels.read import _count_strokes

    def crop_of(text: str, face: str = "DejaVuSerif.ttf") -> np.ndarray:
        """The recogniser's input for a printed label: glyphs scaled to one height, gaps opened."""
        pil = Image.new("L", (90, 32), 255)
        ImageDraw.Draw(pil).text((4, 4), text, fill=0, font=font(20, face))
        return recogniser_input(pil)

    assert _count_strokes(crop_of("iii"), "i", "i") == "iii"
    assert _count_strokes(crop_of("v i i i"), "vi", "vi") == "viii"
    assert _count_strokes(crop_of("viii"), "vi", "vi") == "vi"  # v and i touch: no count
    assert _count_strokes(crop_of("(ii)"), "(i)", "i") == "ii"
    assert _count_strokes(crop_of("iv"), "iv", "iv") == "iv"  # nothing to add
    assert _count_strokes(crop_of("b"), "b", "b") == "b"  # not a numeral
    # bold serif stems with their serifs are wider, still narrow beside a v
    assert _count_strokes(crop_of("iii", "DejaVuSerif-Bold.ttf"), "i", "i") == "iii"
    assert _count_strokes(crop_of("ii", "STIXGeneralBol.ttf"), "i", "i") == "ii"


def test_labels_in_one_corner_beside_overlay_text_in_another() -> None:
    """Labels at the bottom left of each image, a magnification overlay ("x20") at the top right
    of each: both corners hold a glyph group on every panel, the reading tells the labels."""
    boxes = [(10, 10, 300, 290), (320, 10, 610, 290)]
    pil, draw = textured_figure((620, 300), boxes, 40, seed=6)
    for text, (x1, _, x2, y2) in zip(["a", "b"], boxes, strict=True):
        draw.text((x1 + 6, y2 - 30), text, fill=(255, 255, 255), font=font(24))
        draw.text((x2 - 40, 14), "x20", fill=(255, 255, 255), font=font(14))
    image = np.asarray(pil).copy()
    panels = [panel(tuple(float(v) for v in b)) for b in boxes]  # type: ignore[arg-type]
    analysis = segment_figure(image).analysis
    assert assign_labels(panels, find_labels(image, panels, analysis=analysis)) == ["a", "b"]


def test_ocr_reads_small_jpeg_labels_on_dark_discs() -> None:
    """Serif capitals white on 15 px discs, downscaled and JPEG-compressed: the ink mask fills
    most of each letter, so the letter is read from the plate's grey levels."""
    import io

    boxes = [(60, 30, 320, 380), (370, 30, 630, 380), (680, 30, 940, 380)]
    pil, draw = textured_figure((1000, 400), boxes, 150, seed=6)
    for text, (x1, y1, _, _) in zip(["D", "E", "F"], boxes, strict=True):
        cx, cy = x1 - 24, y1 + 22
        draw.ellipse([cx - 19, cy - 19, cx + 19, cy + 19], fill=(0, 0, 0))
        draw.text((cx, cy), text, fill=(255, 255, 255), font=font(25, "DejaVuSerif-Bold.ttf"), anchor="mm")
    pil = pil.resize((400, 160), Image.Resampling.LANCZOS)
    buffer = io.BytesIO()
    pil.save(buffer, format="JPEG", quality=75)
    image = np.asarray(Image.open(io.BytesIO(buffer.getvalue())).convert("RGB")).copy()
    assert labels_in_reading_order(image, 3) == ["D", "E", "F"]


def test_clear_reading_of_another_kind_is_no_label() -> None:
    """A clear "40" (a tick value beside the corner) among letters, or "R" among roman numerals,
    is not the panel's label: with a series it is filled as if unread, without one dropped."""
    boxes = [(20 + 120 * k, 20, 120 + 120 * k, 120) for k in range(5)]
    panels = [panel(b) for b in boxes]

    def at(k: int, text: str) -> LabelDetection:
        return detection(text, (boxes[k][0] - 14, 2, boxes[k][0] - 2, 16))

    got = assign_labels(panels, [at(0, "A"), at(1, "40"), at(2, "C"), at(3, "D")])
    assert got == ["A", "B", "C", "D", "E"]
    got = assign_labels(panels, [at(0, "i"), at(1, "ii"), at(2, "R"), at(3, "iv")])
    assert got == ["i", "ii", "iii", "iv", "v"]
    # readings that form no series (ranks all off): the letters stay, the number goes
    dets = [at(0, "C"), at(1, "30"), at(2, "A"), at(4, "B")]
    assert assign_labels(panels, dets) == ["C", None, "A", None, "B"]


def test_roman_series_among_specks_read_inside_panels() -> None:
    """Small numerals: a lone "i" and "v" read clearly (letters or numerals: a tie), "ii" and
    "iii" read weakly (they settle the tie), clear specks "4" and "3" inside panels outnumbering
    nothing but the misses: the readings exactly at their ranks confirm the series."""
    boxes = [(20 + 120 * k, 20, 120 + 120 * k, 120) for k in range(7)]
    panels = [panel(b) for b in boxes]

    def at(k: int, text: str, confidence: float = 0.9) -> LabelDetection:
        return detection(text, (boxes[k][0] - 14, 2, boxes[k][0] - 2, 16), confidence)

    dets = [at(0, "i"), at(1, "ii", 0.3), at(2, "iii", 0.3), at(4, "v"), at(5, "4"), at(6, "3")]
    assert assign_labels(panels, dets) == ["i", "ii", "iii", "iv", "v", "vi", "vii"]
    # upper-case V and X vote for numerals as well
    dets[3] = at(4, "V")
    assert assign_labels(panels, dets) == ["i", "ii", "iii", "iv", "v", "vi", "vii"]


def test_readings_exactly_at_their_ranks_outweigh_confusions_in_choosing_the_order() -> None:
    """Numerals labelled column by column: "i", "ii", "iii" down the first column are exactly the
    column order's labels; the row order explains as many readings only as confusions ("1" for
    "iii", "V" for "vi"), which count half."""
    from p2p.mining.cpu.labels.read import _repair_sequence

    orders = [[0, 1, 2, 3, 4, 5, 6, 7, 8], [0, 1, 6, 2, 3, 7, 4, 5, 8]]
    texts = {0: "i", 6: "iii", 3: "V", 2: "1", 1: "ii", 8: "X", 5: "V", 7: "I", 4: "i"}
    confidence = {0: 0.85, 6: 0.45, 3: 0.85, 2: 0.09, 1: 0.4, 8: 0.7, 5: 0.19, 7: 0.25, 4: 0.53}
    got = _repair_sequence(orders, texts, confidence, load_params().labels.strong_score)
    assert got == {0: "i", 1: "ii", 6: "iii", 2: "iv", 3: "v", 8: "ix"}


def test_numeral_readings_only_gain_dropped_strokes() -> None:
    """OCR drops the i's of numerals but hardly adds any: a clear "iv" after a sliver panel
    that shifts the ranks stays "iv" (it is no "v" with an i added)."""
    boxes = [
        (40, 20, 140, 120),
        (200, 20, 300, 120),
        (360, 20, 460, 120),
        (470, 20, 480, 120),
        (520, 20, 620, 120),
    ]
    panels = [panel(b) for b in boxes]
    dets = [
        detection(t, (boxes[k][0] - 14, 2, boxes[k][0] - 2, 16)) for k, t in ((0, "i"), (2, "iii"), (4, "iv"))
    ]
    got = assign_labels(panels, dets)
    assert got[0] == "i" and got[2] == "iii" and got[4] == "iv"


def test_a_reading_of_the_figures_kind_wins_its_panel_over_a_speck_of_another() -> None:
    """A clear "7" (a speck of texture right in the panel's corner) and a clear "C" beside the
    panel, after a sliver panel that shifts the ranks: among letters, the letter is the label."""
    boxes = [(40, 20, 140, 120), (200, 20, 300, 120), (310, 20, 320, 120), (360, 20, 460, 120)]
    panels = [panel(b) for b in boxes]

    def beside(k: int, text: str) -> LabelDetection:
        x, y = boxes[k][0], boxes[k][1]
        return detection(text, (x - 14, y, x - 2, y + 14), 0.6)

    x, y = boxes[3][0], boxes[3][1]
    speck = detection("7", (x + 1, y + 1, x + 6, y + 8), 0.9)
    dets = [beside(0, "A"), beside(1, "B"), beside(3, "C"), speck]
    assert assign_labels(panels, dets) == ["A", "B", None, "C"]


def test_figure_number_labels_and_digits_are_one_kind() -> None:
    """OCR reads "3c" as "30": a digit reading is of the kind of "1a" labels, no speck."""
    from p2p.mining.cpu.labels.read import _in_style

    assert _in_style("30", "3+lower") and _in_style("3a", "digit")
    assert not _in_style("40", "upper") and not _in_style("R", "roman")


def test_numeral_i_s_joined_by_their_serifs_are_counted_from_the_dots() -> None:
    """Bold serif "iii" set tight: the serifs join the stems into one shape; the dots still
    stand apart and give the count."""
    from p2p.mining.cpu.labels.read import _count_strokes

    def tight(text: str) -> np.ndarray:
        pil = Image.new("L", (120, 32), 255)
        draw, face, x = ImageDraw.Draw(pil), font(20, "DejaVuSerif-Bold.ttf"), 4.0
        for ch in text:
            draw.text((x, 4), ch, fill=0, font=face)
            x += 6 if ch == "i" else face.getlength(ch) - 1
        return recogniser_input(pil)

    assert _count_strokes(tight("(iii)"), "(ii)", "ii") == "iii"
    assert _count_strokes(tight("iii"), "i", "i") == "iii"
    assert _count_strokes(tight("iii"), "I", "I") == "I"  # capitals have no dots


def test_a_label_in_the_top_left_corner_beats_one_in_another_corner() -> None:
    """The next panel's label swallowed into a panel's top-right corner, read as clearly as the
    panel's own label in its top-left corner: the top-left one names the panel."""
    panels = [
        panel(b) for b in [(3, 3, 457, 342), (472, 26, 829, 311), (29, 352, 402, 660), (438, 352, 841, 651)]
    ]
    dets = [
        detection("ii", (439, 3, 457, 22), 0.84),
        detection("iii", (29, 352, 56, 371), 0.64),
        detection("iv", (438, 352, 463, 371), 0.97),
        detection("i", (8, 8, 14, 26), 0.85),
    ]
    assert assign_labels(panels, dets) == ["i", "ii", "iii", "iv"]


@pytest.mark.parametrize(
    ("text", "name"),
    [("(I)", "DejaVuSans-Bold.ttf"), ("(J)", "STIXGeneralBol.ttf"), ("(J)", "DejaVuSans.ttf")],
)
def test_a_thin_letter_between_parentheses_is_read_alone(text: str, name: str) -> None:
    """The recogniser swallows a thin letter between parentheses ("(I)" -> "()", "(J)" -> "(D"):
    the letter is read again without them (its parentheses kept in the raw reading)."""
    from p2p.mining.cpu.labels.read import _Candidate, _engine, _read

    pil = Image.new("L", (140, 60), 255)
    ImageDraw.Draw(pil).text((5, 3), text, font=font(28, name), fill=0)
    crop = recogniser_input(pil)
    candidate = _Candidate(box=(5, 3, 50, 35), crop=crop, panel=0, prior=0.9)
    [(_, det)] = _read(_engine(), [candidate], load_params().labels.min_score)
    assert (det.text, det.raw) == (text[1], text)


def test_thin_letters_are_no_parentheses() -> None:
    from p2p.mining.cpu.labels.read import _without_parentheses

    for text in ("II", "(A"):
        pil = Image.new("L", (140, 60), 255)
        ImageDraw.Draw(pil).text((5, 3), text, font=font(28, "DejaVuSerif-Bold.ttf"), fill=0)
        assert _without_parentheses(recogniser_input(pil)) is None


@pytest.mark.parametrize("size", [20, 28])
def test_a_lone_capital_i_scores_as_a_thin_stroke(size: int) -> None:
    """The recogniser splits a lone stroke's probability among "I", "l", "1" and "|": the score
    of the reading is that of the shape, which the series settles."""
    from p2p.mining.cpu.labels.read import _engine

    pil = Image.new("L", (80, 60), 255)
    ImageDraw.Draw(pil).text((5, 3), "I", font=font(size), fill=0)
    [(text, score)] = _engine().read([recogniser_input(pil)])
    assert text == "I" and score >= load_params().labels.strong_score


def test_a_lone_stroke_where_the_series_expects_another_letter_gives_way() -> None:
    """A blurred "F" decays into a bar the recogniser reads "I": between confirmed labels of a
    series the readings' order follows, the series' label stands; the stroke does not count
    against that order."""
    panels = [panel((10.0 + 130 * k, 30.0, 130.0 * (k + 1), 160.0)) for k in range(3)]
    dets = [
        detection("D", (2, 13, 19, 29), 0.97),
        detection("E", (126, 13, 143, 29), 0.70),
        detection("I", (250, 13, 267, 29), 0.64),
    ]
    assert assign_labels(panels, dets) == ["D", "E", "F"]


def test_a_reading_of_another_style_between_confirmed_labels_takes_the_series_label() -> None:
    """ "(f)" read "6" among lower-case letters: its look-alike "b" names another panel, the series
    settles it."""
    panels = [panel((10.0 + 130 * k, 30.0, 130.0 * (k + 1), 160.0)) for k in range(5)]
    dets = [
        detection(text, (10 + 130 * k, 13, 27 + 130 * k, 29), 0.8 if text == "6" else 0.9)
        for k, text in enumerate(["a", "b", "c", "6", "e"])
    ]
    assert assign_labels(panels, dets) == ["a", "b", "c", "d", "e"]


def test_labels_sized_to_their_panels_are_read_where_the_figures_text_is_small() -> None:
    """Large white letters on translucent dark plates in micrographs, in a figure whose text
    unit (10 px: scale-bar text, texture) is a fifth of their height: the corner search sizes its
    window and its glyphs to the panel, so each panel's letter is a candidate and reads."""
    from p2p.mining.cpu.labels.read import _engine, _inside_candidates, _read

    rng = np.random.default_rng(3)
    boxes = [(0, 0, 420, 420), (436, 0, 856, 420), (0, 436, 420, 856), (436, 436, 856, 856)]
    image = np.full((856, 856, 3), 255, dtype=np.uint8)
    for x1, y1, x2, y2 in boxes:
        image[y1:y2, x1:x2] = texture(rng, x2 - x1, y2 - y1, 150)
    pil = Image.fromarray(image)
    draw = ImageDraw.Draw(pil)
    for text, (x1, y1, _, _) in zip("ABCD", boxes, strict=True):
        plate = np.asarray(pil)[y1 + 6 : y1 + 80, x1 + 6 : x1 + 66].astype(float) * 0.35
        pil.paste(Image.fromarray(plate.astype(np.uint8)), (x1 + 6, y1 + 6))
        draw.text((x1 + 12, y1 + 4), text, fill=(255, 255, 255), font=font(64, "DejaVuSans.ttf"))
    gray = cv2.cvtColor(np.asarray(pil), cv2.COLOR_RGB2GRAY)
    panels = [tuple(float(v) for v in b) for b in boxes]
    candidates = _inside_candidates(gray, panels, [0, 1, 2, 3], 10.0)  # type: ignore[arg-type]
    read = {k: d.text.upper() for k, d in _read(_engine(), candidates, 0.3)}
    assert read == {0: "A", 1: "B", 2: "C", 3: "D"}
