"""Marker-guided fusion: the tau gate on caption boxes, marker expansion, fragment grounding."""

from __future__ import annotations

import math

from p2p.mining.regions import expand_box, fragment_for, fuse_regions, mentions_of
from p2p.mining.types import CaptionFragment, Marker

PANEL = (100.0, 50.0, 500.0, 350.0)  # 400 x 300: diagonal 500
DIAG = 500.0


def _arrow(tip=(300.0, 200.0), target=(300.0, 180.0, 340.0, 220.0), conf=0.9, kind="arrow"):
    return Marker(
        kind=kind,
        glyph_box=(260.0, 190.0, 300.0, 210.0),
        target_point=tip,
        target_box=target,
        confidence=conf,
        direction_deg=0.0,
    )


def _circle(box=(150.0, 80.0, 210.0, 140.0), conf=0.8):
    centre = ((box[0] + box[2]) / 2, (box[1] + box[3]) / 2)
    return Marker(kind="circle", glyph_box=box, target_point=centre, target_box=box, confidence=conf)


def test_tau_keeps_near_caption_box_and_drops_hallucinated_one():
    marker = _arrow()
    centre = (320.0, 200.0)  # centre of the marker's target box
    near = (330.0, 190.0, 370.0, 230.0)  # centre (350, 210): 0.063 of the diagonal away
    far = (420.0, 280.0, 480.0, 340.0)  # centre (450, 310): 0.34 away
    assert math.dist((350, 210), centre) / DIAG < 0.15 < math.dist((450, 310), centre) / DIAG
    regions = fuse_regions(
        [marker], [(near, "infiltrating cells"), (far, "necrosis")], panel_box=PANEL, tau=0.15
    )
    boxes = [r.box for r in regions]
    assert near in boxes
    assert far not in boxes
    caption = next(r for r in regions if r.box == near)
    assert caption.kind == "caption"
    assert caption.caption_text == "infiltrating cells"
    assert caption.marker_type == "arrow"
    # The marker that got a caption box is not expanded on its own as well.
    assert all(r.kind == "caption" for r in regions)


def test_tau_is_a_normalised_distance():
    marker = _arrow()
    box = (380.0, 180.0, 420.0, 220.0)  # centre (400, 200): 80 px = 0.16 of the diagonal
    assert fuse_regions([marker], [(box, "x")], panel_box=PANEL, tau=0.15)[0].kind != "caption"
    assert fuse_regions([marker], [(box, "x")], panel_box=PANEL, tau=0.2)[0].kind == "caption"


def test_no_markers_means_no_caption_boxes():
    assert fuse_regions([], [((200.0, 100.0, 260.0, 160.0), "cells")], panel_box=PANEL) == []


def test_markers_without_caption_box_are_expanded_around_their_target():
    arrow = _arrow(target=(300.0, 180.0, 340.0, 220.0))
    circle = _circle()
    regions = fuse_regions([arrow, circle], [], panel_box=PANEL, expand=0.25)
    by_type = {r.marker_type: r for r in regions}
    assert by_type["arrow"].box == (290.0, 170.0, 350.0, 230.0)
    assert by_type["arrow"].kind == "inferred"
    assert by_type["circle"].box == (135.0, 65.0, 225.0, 155.0)
    assert by_type["circle"].kind == "marker"
    assert regions[0].confidence >= regions[1].confidence


def test_expansion_is_clipped_to_the_panel():
    assert expand_box((100.0, 50.0, 140.0, 90.0), 0.5, PANEL) == (100.0, 50.0, 160.0, 110.0)


def test_union_is_deduplicated():
    a = _arrow(conf=0.9)
    b = _arrow(conf=0.5, kind="arrowhead")  # same target: the weaker duplicate goes
    regions = fuse_regions([a, b], [], panel_box=PANEL)
    assert len(regions) == 1 and regions[0].marker_type == "arrow"


def test_fragments_attach_by_marker_kind():
    fragments = [
        CaptionFragment("Arrows indicate infiltrating cells.", ("arrow",)),
        CaptionFragment("The asterisk marks necrosis.", ("asterisk",)),
        CaptionFragment("Boxed area is magnified in the inset.", ("box", "inset")),
    ]
    star = Marker(
        kind="asterisk",
        glyph_box=(400.0, 100.0, 410.0, 110.0),
        target_point=(405.0, 105.0),
        target_box=(390.0, 90.0, 420.0, 120.0),
        confidence=0.7,
    )
    head = _arrow(kind="arrowhead", target=(200.0, 250.0, 240.0, 290.0), tip=(200.0, 270.0))
    regions = fuse_regions([_arrow(), star, _circle(), head], [], panel_box=PANEL, fragments=fragments)
    text = {r.marker_type: r.caption_text for r in regions}
    assert text["arrow"] == "Arrows indicate infiltrating cells."
    assert text["arrowhead"] == "Arrows indicate infiltrating cells."  # "arrows" covers arrowheads
    assert text["asterisk"] == "The asterisk marks necrosis."
    assert text["circle"] is None  # nothing in the caption speaks about circles


def test_exact_kind_beats_related_kind_and_plain_strings_work():
    fragments = ["White arrows show vessels.", "Arrowheads point to nuclei."]
    assert mentions_of(fragments[1]) == ("arrowhead",)
    assert fragment_for("arrowhead", fragments) == "Arrowheads point to nuclei."
    assert fragment_for("arrow", fragments) == "White arrows show vessels."
    assert fragment_for("inset", fragments) is None
    assert mentions_of("the boxed region; dashed lines outline the lesion") == (
        "box",
        "dashed line",
        "outlined",
    )


def test_caption_region_keeps_phrase_and_records_fragment():
    fragments = [CaptionFragment("Arrows indicate infiltrating cells.", ("arrow",))]
    box = (310.0, 185.0, 350.0, 225.0)
    (region,) = fuse_regions([_arrow()], [(box, "infiltrating cells")], panel_box=PANEL, fragments=fragments)
    assert region.caption_text == "infiltrating cells"
    assert region.description == "Arrows indicate infiltrating cells."
    assert region.panel_index == 0
