"""Coordinate frames for Qwen2.5-VL views: smart_resize, view preparation, reading boxes back."""

from __future__ import annotations

import numpy as np
import pytest

from p2p.mining.lvlm.coords import (
    FACTOR,
    MAX_PIXELS,
    MIN_PIXELS,
    ViewFrame,
    interpret_boxes,
    prepare_view,
    sent_size,
    smart_resize,
)

# A 1000 x 800 crop at (100, 50) of a 1200 x 900 figure, sent at half size.
FRAME = ViewFrame(
    crop=(100.0, 50.0, 1100.0, 850.0),
    sent_width=500,
    sent_height=400,
    original_width=1200,
    original_height=900,
)


def test_smart_resize_rounds_each_side_to_the_nearest_multiple_of_28():
    # 1000 / 28 = 35.7 -> 36 * 28; 800 / 28 = 28.6 -> 29 * 28; 1008 * 812 is within the default budget.
    assert smart_resize(1000, 800) == (1008, 812)
    assert smart_resize(800, 1000) == (812, 1008)
    assert smart_resize(560, 280) == (560, 280)


def test_smart_resize_bounds_a_huge_image_by_max_pixels_and_keeps_its_aspect():
    h, w = smart_resize(8000, 10000)
    assert h % FACTOR == 0 and w % FACTOR == 0
    assert h * w <= MAX_PIXELS
    assert h * w > 0.9 * MAX_PIXELS
    assert w / h == pytest.approx(10000 / 8000, rel=0.05)


def test_smart_resize_grows_a_tiny_image_to_min_pixels():
    # beta = sqrt(3136 / 600) = 2.29: 20 -> 45.7 -> 56, 30 -> 68.6 -> 84.
    assert smart_resize(20, 30) == (56, 84)
    h, w = smart_resize(3, 5)
    assert h * w >= MIN_PIXELS and h % FACTOR == 0 and w % FACTOR == 0


def test_smart_resize_rejects_extreme_aspect_and_empty_images():
    with pytest.raises(ValueError, match="aspect"):
        smart_resize(10, 2100)
    with pytest.raises(ValueError, match="positive"):
        smart_resize(0, 100)


def test_smart_resize_of_its_own_result_is_identity_for_figure_shapes():
    rng = np.random.default_rng(0)
    for _ in range(500):
        h, w = (int(v) for v in rng.integers(8, 5000, size=2))
        if max(h, w) / min(h, w) > 20:
            continue
        budget = int(rng.integers(MIN_PIXELS * 4, MAX_PIXELS * 2))
        size = smart_resize(h, w, max_pixels=budget)
        assert smart_resize(*size, max_pixels=budget) == size


def test_sent_size_is_a_fixed_point_even_for_strips_where_smart_resize_is_not():
    # A 1:62 strip under a small budget: the 28-px floor on the short side overshoots the budget.
    first = smart_resize(34, 2117, max_pixels=40_520)
    assert first == (28, 1568) and smart_resize(*first, max_pixels=40_520) == (28, 1484)
    size = sent_size(34, 2117, max_pixels=40_520)
    assert smart_resize(*size, max_pixels=40_520) == size
    rng = np.random.default_rng(3)
    for _ in range(300):
        h, w = (int(v) for v in rng.integers(8, 5000, size=2))
        if max(h, w) / min(h, w) > 150:
            continue
        budget = int(rng.integers(MIN_PIXELS * 4, MAX_PIXELS * 2))
        size = sent_size(h, w, max_pixels=budget)
        assert smart_resize(*size, max_pixels=budget) == size


def test_prepare_view_output_is_left_alone_by_the_processor():
    rng = np.random.default_rng(1)
    image = rng.integers(0, 255, size=(900, 1300, 3), dtype=np.uint8)
    for crop, budget in [
        (None, MAX_PIXELS),
        ((13.4, 20.6, 500.2, 430.7), 200_000),
        ((0, 0, 40, 30), MAX_PIXELS),
        ((0, 0, 1300, 20), 40_000),
    ]:
        view, frame = prepare_view(image, crop, max_pixels=budget, min_pixels=MIN_PIXELS)
        assert view.shape == (frame.sent_height, frame.sent_width, 3)
        assert smart_resize(frame.sent_height, frame.sent_width, max_pixels=budget) == view.shape[:2]


def test_prepare_view_rounds_the_crop_into_the_frame_and_keeps_pixels_when_no_resize_is_needed():
    rng = np.random.default_rng(2)
    image = rng.integers(0, 255, size=(300, 400), dtype=np.uint8)
    view, frame = prepare_view(image, (10.4, 19.6, 122.2, 75.5), max_pixels=MAX_PIXELS, min_pixels=MIN_PIXELS)
    assert frame.crop == (10.0, 20.0, 122.0, 76.0)  # 112 x 56: multiples of 28 already
    assert (frame.original_width, frame.original_height) == (400, 300)
    np.testing.assert_array_equal(view, image[20:76, 10:122])


def test_round_trip_original_to_sent_to_original_is_exact_for_crops():
    image = np.zeros((777, 1234, 3), dtype=np.uint8)
    _, frame = prepare_view(image, (101.3, 57.8, 1003.1, 700.2), max_pixels=300_000, min_pixels=MIN_PIXELS)
    assert frame.scale_x != 1.0 and frame.scale_y != 1.0
    for box in [(120.0, 60.0, 400.5, 333.3), (101.0, 58.0, 1003.0, 700.0), (500.25, 600.75, 700.5, 690.0)]:
        back = frame.to_original(frame.from_original(box))
        assert back == pytest.approx(box, abs=1e-9)
    assert frame.from_original(frame.crop) == pytest.approx((0, 0, frame.sent_width, frame.sent_height))


def test_a_drawn_rectangle_maps_back_to_where_it_was_drawn():
    image = np.zeros((800, 1200), dtype=np.uint8)
    image[300:500, 400:700] = 255
    view, frame = prepare_view(image, (200, 100, 1100, 780), max_pixels=150_000, min_pixels=MIN_PIXELS)
    ys, xs = np.nonzero(view > 127)
    found = frame.to_original((float(xs.min()), float(ys.min()), float(xs.max() + 1), float(ys.max() + 1)))
    assert found == pytest.approx((400, 300, 700, 500), abs=3)


def test_absolute_boxes_are_scaled_and_shifted_into_the_original_frame():
    boxes, notes = interpret_boxes([[50, 25, 250, 225]], FRAME)
    assert boxes == [(200.0, 100.0, 600.0, 500.0)]
    assert notes == []


def test_normalized_boxes_are_read_as_fractions_of_the_sent_image():
    boxes, notes = interpret_boxes([[0.1, 0.0625, 0.5, 0.5625], [0.5, 0.5, 1.0, 1.0]], FRAME)
    assert boxes == [(200.0, 100.0, 600.0, 500.0), (600.0, 450.0, 1100.0, 850.0)]
    assert notes == ["coordinates read as normalized"]


def test_answers_for_the_original_image_size_are_detected():
    # 900 > 500 sent pixels, but within the 1000 x 800 crop: the model answered in crop pixels.
    boxes, notes = interpret_boxes([[100, 50, 900, 700], [0, 0, 300, 200]], FRAME)
    assert boxes == [(200.0, 100.0, 1000.0, 750.0), (100.0, 50.0, 400.0, 250.0)]
    assert "original" in notes[0]


def test_boxes_within_the_sent_frame_stay_absolute_and_overshoot_past_both_frames_is_clipped():
    boxes, _ = interpret_boxes([[100, 50, 400, 300]], FRAME)
    assert boxes == [(300.0, 150.0, 900.0, 650.0)]
    boxes, notes = interpret_boxes([[100, 50, 1200, 300]], FRAME)
    assert boxes == [(300.0, 150.0, 1100.0, 650.0)]
    assert notes == ["1 box clipped to the image"]


def test_explicit_mode_overrides_detection():
    boxes, _ = interpret_boxes([[0.1, 0.1, 0.5, 0.5]], FRAME, mode="original")
    assert boxes == [None]  # a fraction of a pixel wide
    boxes, _ = interpret_boxes([[100, 50, 900, 700]], FRAME, mode="absolute")
    assert boxes == [(300.0, 150.0, 1100.0, 850.0)]
    with pytest.raises(ValueError):
        interpret_boxes([[1, 2, 3, 4]], FRAME, mode="pixels")


def test_inverted_boxes_are_fixed():
    boxes, notes = interpret_boxes([[250, 225, 50, 25], [50, 225, 250, 25], [10, 10, 20, 20]], FRAME)
    assert boxes[:2] == [(200.0, 100.0, 600.0, 500.0)] * 2
    assert notes == ["2 inverted boxes fixed"]


def test_outside_tiny_and_malformed_boxes_are_dropped():
    raw = [[2000, 10, 2100, 100], [50, 25, 50.5, 200], [1, 2, 3], [50, 25, 250, 225]]
    boxes, notes = interpret_boxes(raw, FRAME)
    assert boxes == [None, None, None, (200.0, 100.0, 600.0, 500.0)]
    assert "1 box outside the image dropped" in notes
    assert "1 malformed box dropped" in notes
    assert any("smaller than 2 px" in n for n in notes)


def test_negative_coordinates_are_clipped_not_read_as_normalized():
    boxes, notes = interpret_boxes([[-10, -5, 0.5, 0.5], [-20, -10, 100, 100]], FRAME)
    assert boxes[1] == (100.0, 50.0, 300.0, 250.0)
    assert not any("normalized" in n for n in notes)
