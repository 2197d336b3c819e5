"""Caption-driven label repair: gaps between trusted readings filled from the caption's sequence."""

from __future__ import annotations

from p2p.mining.label_repair import repair_with_caption, repair_with_series

SEQ = list("abcdefgh")


def test_unread_labels_between_readings_are_filled() -> None:
    got = repair_with_caption(["a", None, "c", None, None, "f", "g", None], SEQ)
    assert got == SEQ


def test_misreadings_and_case_errors_are_replaced_when_the_gap_fits() -> None:
    # "3" for g, "C" for c, and a duplicated "b" out of order
    assert repair_with_caption(["a", "b", "C", "d", "e", "f", "3", "h"], SEQ) == SEQ
    assert repair_with_caption(["a", "b", "c", "d", "e", "b", "g", "h"], SEQ) == SEQ


def test_roman_numeral_misread_as_a_label_of_the_sequence() -> None:
    roman = ["i", "ii", "iii", "iv", "v", "vi", "vii", "viii"]
    read = ["i", None, "iii", "iv", "v", "vi", "ii", "viii"]
    assert repair_with_caption(read, roman) == roman


def test_nothing_is_filled_when_the_counts_disagree() -> None:
    # Column-major reading order: the readings are right, the gaps do not fit the caption.
    read = ["a", "c", "b", "d", None, None]
    assert repair_with_caption(read, list("abcde")) == read
    # one panel more than the caption names before "c": which one is unlabelled is unknown
    assert repair_with_caption([None, None, None, "c", "d"], list("abcd")) == [None, None, None, "c", "d"]


def test_trusted_readings_outside_the_order_are_kept() -> None:
    read = ["a", "e", "h", "b", "c", "d", "f", "g", "i", None, "k"]
    assert repair_with_caption(read, list("abcdefghijk")) == [*read[:9], "j", "k"]


def test_no_sequence_or_no_readings_changes_nothing() -> None:
    assert repair_with_caption(["a", None], []) == ["a", None]
    assert repair_with_caption([None, None], ["a", "b"]) == [None, None]


def repair_labels(caption: str, labels: list[str | None]) -> list[str | None]:
    """The miner's own stages on ``labels`` (one per panel, in reading order): the caption's
    labels (``caption_names``, a split without hints), then the ``captions`` stage."""
    import numpy as np

    from p2p.mining.cpu.context import StageContext
    from p2p.mining.params import load_params
    from p2p.mining.pipeline import _CaptionLabelStage, _named
    from p2p.mining.types import PanelCandidate

    ctx = StageContext(image=np.zeros((10, 10, 3), np.uint8), caption=caption)
    ctx.candidates = [PanelCandidate(box=(10.0 * k, 0.0, 10.0 * k + 9, 9.0)) for k in range(len(labels))]
    ctx.labels = list(labels)
    _named(ctx)
    _CaptionLabelStage(load_params().labels)(ctx)
    return ctx.labels


def test_miner_takes_the_sequence_from_the_caption_not_from_the_readings() -> None:
    caption = "(a) Blot. (b) Plot. (c) CT image. (d) MRI scan."
    assert repair_labels(caption, ["a", None, "3", "d"]) == ["a", "b", "c", "d"]


def test_a_reading_in_the_other_case_is_the_captions_label() -> None:
    # "c" read for C, in a gap whose counts do not settle it (a panel more than labels)
    read = ["A", "B", None, "c"]
    assert repair_with_caption(read, ["A", "B", "C"]) == ["A", "B", None, "C"]


def test_only_misreadings_and_as_many_panels_as_labels() -> None:
    assert repair_with_caption(["e", "f", "g"], ["a", "b", "c"]) == ["a", "b", "c"]
    assert repair_with_caption(["D", None], ["A", "B"]) == ["A", "B"]
    # counts that differ, or a caption read as position words: nothing to go by
    assert repair_with_caption(["e", "f"], ["a", "b", "c"]) == ["e", "f"]
    assert repair_with_caption(["e", "f"], ["left", "right"]) == ["e", "f"]


def test_only_letters_whose_cases_look_alike_are_taken_for_the_other_case() -> None:
    # "e" is a misread "C", not a lower-case "E": taken for E it would push the E and D read
    # after it out of the order
    read = ["A", "B", None, None, "e", "D", "E", "F"]
    assert repair_with_caption(read, list("ABCDEFG")) == read


def test_panels_labelled_column_by_column_are_repaired_down_the_columns() -> None:
    from p2p.mining.pipeline import in_reading_order
    from p2p.mining.types import PanelCandidate

    # a 2x3 grid (row-major boxes) labelled down the columns: A B | C D | E F; C was not read
    boxes = [(x, y, x + 90.0, y + 90.0) for y in (0.0, 100.0) for x in (0.0, 100.0, 200.0)]
    read = ["A", None, "E", "B", "D", "F"]
    panels, labels = in_reading_order([PanelCandidate(box=b, confidence=0.9) for b in boxes], read)
    assert [p.box[:2] for p in panels] == [(0, 0), (0, 100), (100, 0), (100, 100), (200, 0), (200, 100)]
    caption = "(A) a. (B) b. (C) c. (D) d. (E) e. (F) f."
    assert repair_labels(caption, labels) == ["A", "B", "C", "D", "E", "F"]
    # in row-first order the same readings do not run as the caption's series: nothing is filled
    assert repair_labels(caption, read) == read


def test_a_grid_without_caption_labels_takes_its_printed_series_in_reading_order() -> None:
    # twelve alike pictures, A and D read (white letters on busy pictures read badly)
    read = ["A", None, None, "D", *[None] * 8]
    assert repair_with_series(read, [100.0] * 12, grid_ratio=1.5) == list("ABCDEFGHIJKL")
    # lower case stays lower case; gaps between readings are filled whatever the layout
    areas = [100.0, 400.0, 90.0, 100.0]
    assert repair_with_series(["a", None, "c", None], areas, grid_ratio=1.5) == ["a", "b", "c", None]


def test_the_printed_series_runs_on_only_where_it_is_sure() -> None:
    grid = [100.0] * 6
    # panels of unlike sizes: what follows D is not known to be E, F
    assert repair_with_series(
        ["A", None, None, "D", None, None], [100.0, 100.0, 100.0, 100.0, 300.0, 100.0], grid_ratio=1.5
    ) == ["A", "B", "C", "D", None, None]
    # a reading out of its place (an unlabelled piece before B): nothing past the last reading
    assert repair_with_series(["A", None, "B", None, None, None], grid, grid_ratio=1.5) == [
        "A",
        None,
        "B",
        None,
        None,
        None,
    ]
    # one reading, mixed cases, or words are no series
    assert repair_with_series(["A", *[None] * 5], grid, grid_ratio=1.5) == ["A", *[None] * 5]
    assert repair_with_series(["A", None, "c", *[None] * 3], grid, grid_ratio=1.5) == [
        "A",
        None,
        "c",
        *[None] * 3,
    ]
    assert repair_with_series(["top", None, "B", *[None] * 3], grid, grid_ratio=1.5) == [
        "top",
        None,
        "B",
        *[None] * 3,
    ]
