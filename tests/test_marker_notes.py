"""A shared closing note on markers goes to the panels whose images show such markers."""

from __future__ import annotations

from p2p.mining.pipeline import _marker_notes_to_marked_panels
from p2p.mining.types import MinedPanel

NOTE = "Arrows indicate necrotic foci."
SCALE = "Scale bars, 50 um."


def panel(label: str, text: str) -> MinedPanel:
    return MinedPanel(
        box=(0.0, 0.0, 10.0, 10.0),
        label=label,
        label_box=None,
        figure_type="image",
        type_confidence=1.0,
        confidence=1.0,
        subcaption=text,
    )


def test_an_unnamed_marker_note_stays_only_with_the_panels_showing_such_markers() -> None:
    panels = [panel("A", f"(A) Liver. {NOTE} {SCALE}"), panel("B", f"(B) Kidney. {NOTE} {SCALE}")]
    # the detector calls B's arrow an arrowhead: the same family of marker
    _marker_notes_to_marked_panels(panels, {0: {"asterisk"}, 1: {"arrowhead"}}, [NOTE, SCALE])
    assert panels[0].subcaption == f"(A) Liver. {SCALE}"
    assert panels[1].subcaption == f"(B) Kidney. {NOTE} {SCALE}"


def test_the_note_stays_with_every_panel_when_no_panel_shows_its_markers() -> None:
    panels = [panel("A", f"(A) Liver. {NOTE}"), panel("B", f"(B) Kidney. {NOTE}")]
    _marker_notes_to_marked_panels(panels, {0: set(), 1: {"box"}}, [NOTE])
    assert [p.subcaption for p in panels] == [f"(A) Liver. {NOTE}", f"(B) Kidney. {NOTE}"]
