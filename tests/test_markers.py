"""Marker detection on drawn panels: a synthetic micrograph-like texture with glyphs drawn by
Pillow on top (arrows in eight directions and several colours, arrowheads, asterisks, stars,
rectangles, circles, an inset), and the things that must not become markers (plain texture, a
scale bar)."""

from __future__ import annotations

import math

import cv2
import numpy as np
import pytest
from PIL import Image, ImageDraw
from scipy.ndimage import gaussian_filter

from p2p.mining.cpu.markers import rules as markers_rules
from p2p.mining.cpu.markers.rules import detect_markers
from p2p.mining.params import load_params
from p2p.mining.types import Marker
from p2p.shared.geometry import contains_point


def texture(h: int = 240, w: int = 320, seed: int = 0, lo: float = 70.0, hi: float = 160.0) -> np.ndarray:
    """Grey micrograph-like background: smooth blobs plus fine grain, within [lo, hi]."""
    rng = np.random.default_rng(seed)
    coarse = gaussian_filter(rng.normal(size=(h, w)), 6.0)
    fine = gaussian_filter(rng.normal(size=(h, w)), 1.0)
    img = coarse / (np.abs(coarse).max() + 1e-9) + 0.35 * fine / (np.abs(fine).max() + 1e-9)
    img = (img - img.min()) / (img.max() - img.min() + 1e-9)
    grey = (lo + (hi - lo) * img).astype(np.uint8)
    return np.stack([grey] * 3, axis=-1)


def draw_arrow(
    draw: ImageDraw.ImageDraw,
    tip: tuple[float, float],
    angle: float,
    length: float,
    colour: tuple[int, int, int],
    shaft: int = 2,
    head: float = 9.0,
) -> None:
    """Arrow travelling at ``angle`` degrees (image coordinates) and ending at ``tip``."""
    ux, uy = math.cos(math.radians(angle)), math.sin(math.radians(angle))
    px, py = -uy, ux
    base = (tip[0] - ux * head * 1.3, tip[1] - uy * head * 1.3)
    tail = (tip[0] - ux * length, tip[1] - uy * length)
    draw.line([tail, (base[0] + ux, base[1] + uy)], fill=colour, width=shaft)
    draw.polygon(
        [
            tip,
            (base[0] + px * head * 0.6, base[1] + py * head * 0.6),
            (base[0] - px * head * 0.6, base[1] - py * head * 0.6),
        ],
        fill=colour,
    )


def draw_head(
    draw: ImageDraw.ImageDraw,
    tip: tuple[float, float],
    angle: float,
    size: float,
    colour: tuple[int, int, int],
) -> None:
    ux, uy = math.cos(math.radians(angle)), math.sin(math.radians(angle))
    px, py = -uy, ux
    base = (tip[0] - ux * size, tip[1] - uy * size)
    draw.polygon(
        [
            tip,
            (base[0] + px * size * 0.4, base[1] + py * size * 0.4),
            (base[0] - px * size * 0.4, base[1] - py * size * 0.4),
        ],
        fill=colour,
    )


def draw_asterisk(
    draw: ImageDraw.ImageDraw,
    centre: tuple[float, float],
    r: float,
    colour: tuple[int, int, int],
    arms: int = 3,
    width: int = 2,
) -> None:
    for i in range(arms):
        a = math.radians(90 + i * 180 / arms)
        dx, dy = r * math.cos(a), r * math.sin(a)
        draw.line(
            [(centre[0] - dx, centre[1] - dy), (centre[0] + dx, centre[1] + dy)], fill=colour, width=width
        )


def draw_star(
    draw: ImageDraw.ImageDraw, centre: tuple[float, float], r: float, colour: tuple[int, int, int]
) -> None:
    pts = []
    for i in range(10):
        rad = r if i % 2 == 0 else r * 0.42
        a = math.radians(i * 36 - 90)
        pts.append((centre[0] + rad * math.cos(a), centre[1] + rad * math.sin(a)))
    draw.polygon(pts, fill=colour)


def dashed_rectangle(
    draw: ImageDraw.ImageDraw,
    box: tuple[int, int, int, int],
    colour: tuple[int, int, int],
    dash: int = 6,
    gap: int = 4,
    width: int = 2,
) -> None:
    x1, y1, x2, y2 = box
    for a, b in (((x1, y1), (x2, y1)), ((x2, y1), (x2, y2)), ((x2, y2), (x1, y2)), ((x1, y2), (x1, y1))):
        length = math.dist(a, b)
        ux, uy = (b[0] - a[0]) / length, (b[1] - a[1]) / length
        t = 0.0
        while t < length:
            e = min(t + dash, length)
            draw.line(
                [(a[0] + ux * t, a[1] + uy * t), (a[0] + ux * e, a[1] + uy * e)], fill=colour, width=width
            )
            t += dash + gap


def panel_image(draw_fn, seed: int = 0, h: int = 240, w: int = 320) -> np.ndarray:
    img = Image.fromarray(texture(h, w, seed))
    draw_fn(ImageDraw.Draw(img))
    return np.asarray(img)


def embed(panel: np.ndarray, pad: int = 20) -> tuple[np.ndarray, tuple[float, float, float, float]]:
    """The panel inside a white figure, and its box in figure pixels."""
    h, w = panel.shape[:2]
    fig = np.full((h + 2 * pad, w + 2 * pad, 3), 255, np.uint8)
    fig[pad : pad + h, pad : pad + w] = panel
    return fig, (float(pad), float(pad), float(pad + w), float(pad + h))


def near(
    markers: list[Marker], point: tuple[float, float], radius: float = 6.0, kind: str | None = None
) -> list[Marker]:
    return [
        m for m in markers if (kind is None or m.kind == kind) and math.dist(m.target_point, point) <= radius
    ]


def angle_diff(a: float, b: float) -> float:
    return abs((a - b + 180.0) % 360.0 - 180.0)


COLOURS = {
    "white": (255, 255, 255),
    "black": (0, 0, 0),
    "yellow": (255, 230, 0),
    "red": (235, 30, 30),
    "green": (30, 220, 30),
    "cyan": (0, 220, 235),
}


@pytest.mark.parametrize("angle", [0, 45, 90, 135, 180, 225, 270, 315])
def test_arrow_in_eight_directions(angle):
    colour = list(COLOURS.values())[angle // 45 % len(COLOURS)]
    tip = (160.0, 120.0)
    panel = panel_image(lambda d: draw_arrow(d, tip, angle, 42, colour), seed=angle)
    fig, box = embed(panel)
    markers = detect_markers(fig, box)
    tip_fig = (tip[0] + box[0], tip[1] + box[1])
    found = near(markers, tip_fig, 4.0, "arrow")
    assert found, f"no arrow at {tip_fig}: {markers}"
    arrow = found[0]
    assert arrow.direction_deg is not None and angle_diff(arrow.direction_deg, angle) <= 12
    # The target lies beyond the tip, in the direction of travel, and includes the tip.
    tx1, ty1, tx2, ty2 = arrow.target_box
    assert contains_point(arrow.target_box, *arrow.target_point)
    centre = ((tx1 + tx2) / 2 - arrow.target_point[0], (ty1 + ty2) / 2 - arrow.target_point[1])
    ux, uy = math.cos(math.radians(angle)), math.sin(math.radians(angle))
    assert centre[0] * ux + centre[1] * uy > 5.0
    # The glyph is not the target.
    gx1, gy1, gx2, gy2 = arrow.glyph_box
    assert not contains_point(arrow.target_box, (gx1 + gx2) / 2, (gy1 + gy2) / 2)
    assert len(markers) <= 2


@pytest.mark.parametrize("name", ["white", "black", "yellow", "red", "green"])
def test_several_arrows_of_one_colour(name):
    colour = COLOURS[name]
    arrows = [((80.0, 70.0), 30.0), ((250.0, 90.0), 160.0), ((120.0, 190.0), 290.0)]
    panel = panel_image(lambda d: [draw_arrow(d, tip, ang, 36, colour) for tip, ang in arrows], seed=7)
    markers = detect_markers(panel, (0.0, 0.0, 320.0, 240.0))
    for tip, ang in arrows:
        found = near(markers, tip, 4.0, "arrow")
        assert found, f"{name} arrow at {tip} missed: {markers}"
        assert angle_diff(found[0].direction_deg or 0.0, ang) <= 12
        assert found[0].color is None or name in ("white", "black") or found[0].color != (0, 0, 0)


def test_arrowheads():
    heads = [
        ((90.0, 80.0), 45.0, "white"),
        ((230.0, 160.0), 200.0, "yellow"),
        ((240.0, 60.0), 110.0, "black"),
    ]
    panel = panel_image(lambda d: [draw_head(d, tip, ang, 13, COLOURS[c]) for tip, ang, c in heads], seed=3)
    markers = detect_markers(panel, (0.0, 0.0, 320.0, 240.0))
    for tip, ang, c in heads:
        found = [m for m in near(markers, tip, 4.0) if m.kind in ("arrowhead", "arrow")]
        assert found, f"{c} arrowhead at {tip} missed: {markers}"
        assert found[0].kind == "arrowhead"
        assert angle_diff(found[0].direction_deg or 0.0, ang) <= 20
        assert contains_point(found[0].target_box, *found[0].target_point)


def test_asterisks_and_stars():
    def draw(d):
        draw_asterisk(d, (80, 80), 9, COLOURS["white"])
        draw_asterisk(d, (240, 170), 10, COLOURS["black"], arms=4)
        draw_star(d, (240, 70), 10, COLOURS["yellow"])

    panel = panel_image(draw, seed=5)
    markers = detect_markers(panel, (0.0, 0.0, 320.0, 240.0))
    assert near(markers, (80, 80), 3.0, "asterisk"), markers
    assert near(markers, (240, 170), 3.0, "asterisk"), markers
    assert near(markers, (240, 70), 3.0, "star"), markers
    # The marked structure lies next to the glyph: the target is a neighbourhood around it.
    star = near(markers, (240, 70), 3.0, "star")[0]
    tx1, ty1, tx2, ty2 = star.target_box
    gx1, gy1, gx2, gy2 = star.glyph_box
    assert tx1 < gx1 and ty1 < gy1 and tx2 > gx2 and ty2 > gy2


def test_rectangles_and_circles_target_their_inside():
    def draw(d):
        d.rectangle((30, 30, 110, 90), outline=COLOURS["yellow"], width=2)
        dashed_rectangle(d, (180, 40, 290, 110), COLOURS["white"])
        d.ellipse((60, 140, 150, 215), outline=COLOURS["red"], width=2)
        d.ellipse((200, 150, 250, 200), outline=COLOURS["black"], width=2)

    panel = panel_image(draw, seed=11)
    markers = detect_markers(panel, (0.0, 0.0, 320.0, 240.0))
    expected = [
        ("box", (30, 30, 111, 91)),
        ("box", (180, 40, 291, 111)),
        ("circle", (60, 140, 151, 216)),
        ("circle", (200, 150, 251, 201)),
    ]
    for kind, drawn in expected:
        centre = ((drawn[0] + drawn[2] - 1) / 2, (drawn[1] + drawn[3] - 1) / 2)
        found = near(markers, centre, 4.0, kind)
        assert found, f"{kind} {drawn} missed: {markers}"
        target = found[0].target_box
        # Target = the enclosed region (the outline itself, give or take the stroke).
        assert all(abs(a - b) <= 3 for a, b in zip(target, drawn, strict=True)), (target, drawn)


def test_inset_in_a_corner():
    rng = np.random.default_rng(2)
    base = texture(240, 320, 9)
    # A zoomed patch pasted into the top-right corner, framed by a white line.
    patch = np.asarray(Image.fromarray(base[150:190, 40:90]).resize((110, 90), Image.BICUBIC))
    base[4:94, 206:316] = patch
    img = Image.fromarray(base)
    ImageDraw.Draw(img).rectangle((205, 3, 316, 94), outline=(255, 255, 255), width=2)
    _ = rng
    markers = detect_markers(np.asarray(img), (0.0, 0.0, 320.0, 240.0))
    insets = [m for m in markers if m.kind == "inset"]
    assert insets, markers
    x1, y1, x2, y2 = insets[0].target_box
    assert abs(x1 - 205) <= 4 and y1 <= 6 and x2 >= 314 and abs(y2 - 95) <= 4


def test_no_false_marker_on_plain_texture_or_scale_bar():
    img = Image.fromarray(texture(240, 320, 21))
    d = ImageDraw.Draw(img)
    d.rectangle((240, 222, 300, 226), fill=(255, 255, 255))  # scale bar, bottom right
    d.text((252, 206), "50 um", fill=(255, 255, 255))
    assert detect_markers(np.asarray(img), (0.0, 0.0, 320.0, 240.0)) == []
    for seed in (1, 2, 3):
        assert detect_markers(texture(240, 320, seed), (0.0, 0.0, 320.0, 240.0)) == []


def test_degenerate_inputs():
    assert detect_markers(texture(10, 10), (0.0, 0.0, 10.0, 10.0)) == []
    grey = texture(120, 160)[..., 0]
    assert detect_markers(grey, (0.0, 0.0, 160.0, 120.0)) == []
    # A panel box partly outside the image is clipped, not an error.
    assert isinstance(detect_markers(texture(120, 160), (-10.0, -10.0, 400.0, 300.0)), list)


def test_inset_connecting_lines_give_the_source_region():
    base = texture(240, 320, 9)
    base[4:94, 206:316] = np.asarray(Image.fromarray(base[150:190, 40:90]).resize((110, 90), Image.BICUBIC))
    img = Image.fromarray(base)
    d = ImageDraw.Draw(img)
    d.rectangle((205, 3, 316, 94), outline=(255, 255, 255), width=2)
    # The source region (40, 150)-(90, 190) is not outlined; two lines lead to it.
    d.line([(40, 150), (205, 3)], fill=(255, 255, 255), width=1)
    d.line([(90, 190), (316, 94)], fill=(255, 255, 255), width=1)
    markers = detect_markers(np.asarray(img), (0.0, 0.0, 320.0, 240.0))
    assert any(m.kind == "inset" for m in markers), markers
    sources = [m for m in markers if m.kind == "box"]
    assert sources, markers
    x1, y1, x2, y2 = sources[0].target_box
    assert abs(x1 - 40) <= 4 and abs(y1 - 150) <= 4 and abs(x2 - 91) <= 4 and abs(y2 - 191) <= 4


def test_tiny_coloured_symbols_are_found():
    """Glyphs of a few pixels (a figure scaled down after drawing) have no resolvable spokes: a
    lone compact blob of marker colour is still reported, with a target around it."""
    img = Image.fromarray(texture(480, 640, 4))
    d = ImageDraw.Draw(img)
    draw_star(d, (200, 200), 9, COLOURS["red"])
    draw_asterisk(d, (500, 360), 9, (255, 140, 0))
    small = cv2.resize(np.asarray(img), (192, 144), interpolation=cv2.INTER_AREA)  # 0.3 x
    markers = detect_markers(small, (0.0, 0.0, 192.0, 144.0))
    for cx, cy in ((60, 60), (150, 108)):
        assert any(contains_point(m.target_box, cx, cy) for m in markers), markers
        assert near(markers, (cx, cy), 3.0), markers


def test_tiny_blobs_of_a_dotted_colour_field_are_not_markers():
    """Many small same-colour dots (fluorescent puncta) are texture, not a field of markers."""
    rng = np.random.default_rng(3)

    def draw(d):
        for _ in range(40):
            x, y = rng.uniform(10, 310), rng.uniform(10, 230)
            r = rng.uniform(2.0, 4.0)
            d.ellipse((x - r, y - r, x + r, y + r), fill=COLOURS["green"])

    markers = detect_markers(panel_image(draw, seed=6), (0.0, 0.0, 320.0, 240.0))
    assert [m for m in markers if m.kind in ("star", "asterisk")] == []


def test_star_of_a_far_hue_on_a_colourful_panel():
    """On a stained (colourful) section, a glyph of a hue far from the tissue's is a marker; the
    rules do not trust one of a nearby hue (red on brown-red), the network finds it."""
    grey = texture(240, 320, 8)[..., 0].astype(np.float64) / 255.0
    tissue = np.stack([120 + 120 * grey, 40 + 40 * grey, 25 + 25 * grey], axis=-1).astype(np.uint8)
    img = Image.fromarray(tissue)
    d = ImageDraw.Draw(img)
    draw_star(d, (90, 80), 10, COLOURS["green"])
    draw_star(d, (230, 160), 10, (235, 30, 30))
    markers = detect_markers(np.asarray(img), (0.0, 0.0, 320.0, 240.0), use_net=False)
    assert near(markers, (90, 80), 4.0), markers
    assert not near(markers, (230, 160), 6.0), markers
    # The learned detector has seen glyphs in the panel's own hue: with it the second star is found.
    markers = detect_markers(np.asarray(img), (0.0, 0.0, 320.0, 240.0))
    assert near(markers, (90, 80), 4.0), markers
    assert near(markers, (230, 160), 6.0), markers


def test_rectangle_in_the_colour_of_the_stain():
    """A magenta box drawn on magenta-stained nuclei: its hue is common in the panel (so no
    colour glyph), but two long straight parallel sides joined at both ends are a drawn box."""
    rng = np.random.default_rng(7)
    h, w = 260, 340
    field = np.zeros((h, w, 3), np.float32)
    field[...] = (25, 5, 30)
    yy, xx = np.mgrid[0:h, 0:w]
    for _ in range(14):  # blurred magenta nuclei
        cx, cy, r = rng.uniform(0, w), rng.uniform(0, h), rng.uniform(8, 16)
        blob = np.exp(-((xx - cx) ** 2 + (yy - cy) ** 2) / (2 * r * r))[..., None]
        field += blob * np.array([200, 40, 220], np.float32)
    img = Image.fromarray(np.clip(field, 0, 255).astype(np.uint8))
    ImageDraw.Draw(img).rectangle([180, 90, 290, 200], outline=(240, 20, 240), width=2)
    found = detect_markers(np.asarray(img), (0.0, 0.0, float(w), float(h)))
    boxes = [m for m in found if m.kind in ("box", "inset")]
    assert any(
        contains_point(m.target_box, 235, 145) and m.target_box[2] - m.target_box[0] < 140 for m in boxes
    )


def test_black_ovals_on_downscaled_lattice_fringes():
    """A generated figure (lattice fringes, two black ovals, downscaled and saved as JPEG at
    quality 45): the ring merges with the dark fringes in the wide mask, the near-pure black
    mask holds the bolder one alone."""
    import io

    from p2p.mining.lab.synth import generate_figure
    from p2p.shared.geometry import from_inclusive

    image, truth = generate_figure(1283475995, width=1000, height=800, scale=0.7441)
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=45)
    pixels = np.asarray(Image.open(io.BytesIO(buffer.getvalue())).convert("RGB"))
    panel = truth["panels"][5]
    circles = [m for m in truth["markers"] if m["panel_index"] == 5 and m["kind"] == "circle"]
    assert len(circles) == 2  # the figure is still the one this test was written for
    found = detect_markers(pixels, from_inclusive(panel["box"]))
    x, y = circles[1]["target_point"]
    assert any(
        m.kind in ("circle", "box") and contains_point(m.target_box, x + 0.5, y + 0.5, 8) for m in found
    )


def test_small_arrows_of_a_small_jpeg_panel():
    """On a panel of 200 x 150 px (glyphs drawn at half size, then JPEG) the rules also examine a
    copy enlarged to about 300 px: arrows of 8-20 px the native scale misses are found there."""
    from p2p.mining.lab.synth.markers import Painter

    found = total = 0
    for seed in (3, 5, 14, 18, 19):
        img = texture(150, 200, seed).copy()
        painter = Painter(np.random.default_rng(seed), img, [])
        arrows = [painter.arrow(style=style) for style in ("thin", "line", "open", "block")]
        _, jpeg = cv2.imencode(".jpg", img[..., ::-1], [cv2.IMWRITE_JPEG_QUALITY, 75])
        decoded = cv2.imdecode(jpeg, cv2.IMREAD_COLOR)
        assert decoded is not None
        fig, box = embed(np.ascontiguousarray(decoded[..., ::-1]))
        markers = detect_markers(fig, box)
        margin = 0.03 * math.hypot(200, 150)
        for arrow in arrows:
            assert arrow is not None
            x, y = arrow.target_point[0] + box[0], arrow.target_point[1] + box[1]
            total += 1
            found += any(contains_point(m.target_box, x, y, margin) for m in markers)
    assert total == 20
    assert found >= 17  # 12 without the enlarged copy


def test_enlarged_copy_adds_small_glyphs_only_in_figure_pixels(monkeypatch):
    """The enlarged copy of a small panel is searched for small glyphs only; its markers are
    mapped back to figure pixels and not added where the native scale already has a marker on
    the same glyph."""
    from p2p.mining.cpu.markers import rules as rules_module
    from p2p.mining.cpu.markers.rules import _Cand

    native_star = _Cand("star", (10, 10, 20, 20), (14.5, 14.5), 0.9, size=10.0)

    def fake_rules(panel, params, glyphs_only=False):
        if panel.w == 150:  # native scale
            assert not glyphs_only
            return [native_star]
        assert (panel.w, panel.h) == (300, 200)  # 150 x 100 enlarged twice
        assert glyphs_only
        return [
            _Cand("arrow", (100, 60, 140, 80), (139.5, 69.5), 0.9, direction=0.0, size=40.0),
            _Cand("asterisk", (20, 20, 40, 40), (29.5, 29.5), 0.9, size=20.0),  # the native star again
        ]

    monkeypatch.setattr(rules_module, "_rule_cands", fake_rules)
    figure = np.full((140, 190, 3), 128, np.uint8)
    found = detect_markers(figure, (20.0, 20.0, 170.0, 120.0), use_net=False)
    assert sorted(m.kind for m in found) == ["arrow", "star"]
    arrow = next(m for m in found if m.kind == "arrow")
    assert arrow.glyph_box == pytest.approx((70.0, 50.0, 90.0, 60.0))
    assert arrow.target_point == pytest.approx((89.5, 54.5))
    star = next(m for m in found if m.kind == "star")
    assert star.target_point == pytest.approx((34.5, 34.5))


def test_glyph_only_pass_reports_no_outlines():
    """The enlarged copy's pass looks for small glyphs only: a drawn rectangle next to an arrow
    is found by the full rules, not by that pass."""
    from p2p.mining.cpu.markers.rules import _Panel, _rule_cands

    def draw(d):
        draw_arrow(d, (100.0, 120.0), 0.0, 40, COLOURS["yellow"])
        d.rectangle([180, 60, 280, 160], outline=COLOURS["yellow"], width=2)

    panel = _Panel(panel_image(draw, seed=11))
    assert {c.kind for c in _rule_cands(panel, load_params().markers)} >= {"arrow", "box"}
    assert {c.kind for c in _rule_cands(panel, load_params().markers, glyphs_only=True)} == {"arrow"}


def test_a_network_arrow_facing_its_tail_is_turned_round():
    """The network's peak on the flat end of an arrow points its target behind the arrow; the
    glyph's widest cross-section (the head) says which end is the tip."""
    from p2p.mining.cpu.markers.rules import _Cand, _orient, _Panel, _target

    img = Image.fromarray(texture(seed=5))
    draw_arrow(ImageDraw.Draw(img), (200.0, 120.0), 0.0, 60.0, (255, 220, 0), shaft=3, head=10.0)
    panel = _Panel(np.asarray(img))
    glyph = (139, 112, 202, 129)
    behind = (110.0, 105.0, 140.0, 135.0)
    backwards = _Cand("arrow", glyph, (140.0, 120.0), 0.5, region=behind, direction=180.0)
    turned = _orient(panel, backwards)
    assert turned.direction == 0.0
    assert math.dist(turned.point, (200.0, 120.0)) <= 3.0
    assert contains_point(_target(turned, panel.w, panel.h), 215.0, 120.0)
    forwards = _Cand("arrow", glyph, (200.0, 120.0), 0.5, region=(200.0, 105.0, 230.0, 135.0), direction=0.0)
    assert _orient(panel, forwards) is forwards


@pytest.mark.parametrize("seed", [0, 2, 3])
def test_letters_of_printed_words_are_not_markers(seed):
    """Words printed on a dark picture (a coloured channel name, a heading): their letters pass
    the shape tests for rings and asterisks ("C"), but they lie in a line of text; the arrow
    beside them is still a marker."""
    from PIL import ImageFont

    font = ImageFont.load_default(size=28)
    img = Image.fromarray(texture(240, 320, seed, lo=10, hi=60))
    d = ImageDraw.Draw(img)
    words = [((20, 20), "CA1 Merge", (230, 40, 230)), ((20, 90), "DAPI 37", (40, 230, 40))]
    words.append(((20, 160), "Lamina fragments", (255, 255, 255)))
    boxes = []
    for at, text, colour in words:
        d.text(at, text, fill=colour, font=font)
        boxes.append(d.textbbox(at, text, font=font))
    draw_arrow(d, (260, 150), 45, 40, (255, 255, 0))
    found = detect_markers(np.asarray(img), (0.0, 0.0, 320.0, 240.0))
    assert near(found, (260, 150), radius=8, kind="arrow")
    pointing_or_symbol = ("arrow", "arrowhead", "asterisk", "star", "circle")
    on_words = [
        m
        for m in found
        if m.kind in pointing_or_symbol
        and any(
            contains_point(b, *((m.glyph_box[0] + m.glyph_box[2]) / 2, (m.glyph_box[1] + m.glyph_box[3]) / 2))
            for b in boxes
        )
    ]
    assert on_words == []


def test_a_letter_of_a_rotated_label_is_in_a_word():
    """A label printed up the picture ("DAPI" turned a quarter) is a line of text too: an arrow-
    like glyph on one of its letters lies in a word; a glyph on a two-letter word across ("CA")
    as well; the same glyph box on bare texture does not."""
    from PIL import ImageFont

    from p2p.mining.cpu.markers.rules import _Cand, _find, _in_word

    font = ImageFont.load_default(size=28)
    img = Image.fromarray(texture(320, 320, 3, lo=10, hi=60))
    word = Image.new("RGBA", (200, 40), (0, 0, 0, 0))
    draw = ImageDraw.Draw(word)
    draw.text((0, 0), "DAPI", fill=(230, 230, 230, 255), font=font)
    _, top, right, bottom = draw.textbbox((0, 0), "DAPI", font=font)
    turned = word.rotate(90, expand=True)  # reads bottom to top, at x 30 + top .. 30 + bottom
    img.paste(turned, (30, 40), turned)
    d = ImageDraw.Draw(img)
    d.text((150, 60), "CA", fill=(230, 40, 230), font=font)
    ca = d.textbbox((150, 60), "CA", font=font)
    c_only = d.textbbox((150, 60), "C", font=font)
    found = _find(np.asarray(img), load_params().markers, use_net=False)

    def in_word(box: tuple[int, int, int, int]) -> bool:
        return _in_word(found, _Cand("arrow", box, (0.0, 0.0), 0.9))

    x1, x2 = 30 + top, 30 + bottom
    y1 = 40 + 200 - right  # the top of the turned word
    assert in_word((x1, y1 + 8, x2, y1 + 25))  # a letter in the middle of it
    assert in_word((c_only[2], ca[1], ca[2], ca[3]))  # the "A" of "CA"
    assert not in_word((220, 200, 240, 220))


def test_a_panel_longer_than_the_working_side_is_examined_shrunk_in_figure_pixels(monkeypatch):
    # a 1400 x 1000 panel (over the 1000 px working side) with an arrow drawn at its scale
    seen: list[tuple[int, ...]] = []
    find = markers_rules._find
    monkeypatch.setattr(
        markers_rules, "_find", lambda native, *a, **k: seen.append(native.shape) or find(native, *a, **k)
    )
    tip, angle = (900.0, 600.0), 45
    panel = panel_image(
        lambda d: draw_arrow(d, tip, angle, 60, COLOURS["yellow"], shaft=3, head=13.0), seed=3, h=1000, w=1400
    )
    fig, box = embed(panel, pad=30)
    p = load_params().markers
    assert max(panel.shape[:2]) > p.max_side
    markers = detect_markers(fig, box, params=p)
    tip_fig = (tip[0] + box[0], tip[1] + box[1])
    found = near(markers, tip_fig, 8.0, "arrow")
    assert found, f"no arrow at {tip_fig}: {markers}"
    assert angle_diff(found[0].direction_deg or 0.0, angle) <= 12
    gx1, gy1, gx2, gy2 = found[0].glyph_box
    # the glyph box is in figure pixels: about the arrow's 60 px run (42 px a side), not shrunk
    assert 36 <= max(gx2 - gx1, gy2 - gy1) <= 56
    assert contains_point(found[0].target_box, *found[0].target_point)
    assert seen == [(714, 1000, 3)]  # examined at the working side, found in figure pixels
