"""Panel segmentation on figures drawn here with numpy and Pillow (no development data)."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import matplotlib
import numpy as np
import pytest
from PIL import Image, ImageDraw, ImageFont

from p2p.mining.cpu import imaging
from p2p.mining.cpu.segmentation import segment
from p2p.mining.cpu.segmentation.segment import corner_glyphs, ink_mask, rejected_guesses, segment_panels
from p2p.mining.lab.eval_panels import error_kind, evaluate
from p2p.mining.lab.xycut import naive_xycut
from p2p.mining.types import LabelDetection
from p2p.shared import geometry

FONT_DIR = Path(matplotlib.__file__).parent / "mpl-data" / "fonts" / "ttf"


def font(size: int, bold: bool = True) -> ImageFont.FreeTypeFont:
    return ImageFont.truetype(str(FONT_DIR / ("DejaVuSans-Bold.ttf" if bold else "DejaVuSans.ttf")), size)


def texture(rng: np.random.Generator, w: int, h: int, level: int) -> np.ndarray:
    """A noisy grey 'micrograph' with some blobs, mean grey ``level`` (never near-white)."""
    base = rng.normal(level, 12, (h, w))
    yy, xx = np.mgrid[0:h, 0:w]
    for _ in range(6):
        cx, cy, r = rng.uniform(0, w), rng.uniform(0, h), rng.uniform(4, 14)
        base[(xx - cx) ** 2 + (yy - cy) ** 2 < r * r] -= 60
    grey = np.clip(base, 0, 200).astype(np.uint8)
    return np.repeat(grey[:, :, None], 3, axis=2)


def canvas(w: int, h: int) -> np.ndarray:
    return np.full((h, w, 3), 255, dtype=np.uint8)


def labelled_canvas(w: int, h: int, labels: list[tuple[int, int, str]], size: int) -> np.ndarray:
    """A blank figure with black bold labels drawn at (x, y)."""
    pil = Image.fromarray(canvas(w, h))
    draw = ImageDraw.Draw(pil)
    for x, y, text in labels:
        draw.text((x, y), text, fill=(0, 0, 0), font=font(size))
    return np.asarray(pil).copy()


def ink_box(image: np.ndarray, box: tuple[int, int, int, int]) -> tuple[float, float, float, float]:
    """Tight box (exclusive) of near-white-excluded ink inside ``box``."""
    x1, y1, x2, y2 = box
    crop = image[y1:y2, x1:x2].min(axis=2) < 225
    rows, cols = np.flatnonzero(crop.any(axis=1)), np.flatnonzero(crop.any(axis=0))
    return (float(x1 + cols[0]), float(y1 + rows[0]), float(x1 + cols[-1] + 1), float(y1 + rows[-1] + 1))


def assert_matches(predicted: list, truth: list, threshold: float = 0.9) -> None:
    boxes = [p.box for p in predicted]
    matches = geometry.match_greedy(boxes, truth, threshold)
    assert len(matches) == len(truth), f"predicted {boxes}, truth {truth}"
    assert len(boxes) == len(truth), f"extra boxes: predicted {boxes}, truth {truth}"


def draw_plot(
    image: np.ndarray, x0: int, y0: int, *, legend_right: bool = False
) -> tuple[int, int, int, int]:
    """Axes frame with ticks, tick labels, axis titles and a legend; returns the drawing's extent."""
    pil = Image.fromarray(image)
    draw = ImageDraw.Draw(pil)
    small = font(11, bold=False)
    ax1, ay1, ax2, ay2 = x0 + 50, y0 + 10, x0 + 250, y0 + 170
    draw.rectangle([ax1, ay1, ax2, ay2], outline=(0, 0, 0), width=2)
    for k in range(5):
        ty = ay2 - k * 38
        draw.line([ax1 - 5, ty, ax1, ty], fill=(0, 0, 0), width=2)
        draw.text((ax1 - 28, ty - 7), f"{k * 10}", fill=(0, 0, 0), font=small)
        tx = ax1 + k * 48
        draw.line([tx, ay2, tx, ay2 + 5], fill=(0, 0, 0), width=2)
        draw.text((tx - 8, ay2 + 8), f"{k * 2}", fill=(0, 0, 0), font=small)
    xs = np.linspace(ax1 + 5, ax2 - 5, 40)
    ys = ay2 - 20 - 100 * np.exp(-(((xs - (ax1 + ax2) / 2) / 40) ** 2))
    draw.line(list(zip(xs.tolist(), ys.tolist(), strict=True)), fill=(200, 30, 30), width=2)
    draw.text((ax1 + 60, ay2 + 24), "Time (s)", fill=(0, 0, 0), font=small)
    title = Image.new("RGB", (90, 14), (255, 255, 255))
    ImageDraw.Draw(title).text((0, 0), "Signal (a.u.)", fill=(0, 0, 0), font=small)
    pil.paste(title.rotate(90, expand=True), (x0 + 2, ay1 + 30))
    if legend_right:
        draw.rectangle([ax2 + 12, ay1 + 10, ax2 + 82, ay1 + 40], outline=(0, 0, 0))
        draw.line([ax2 + 16, ay1 + 25, ax2 + 30, ay1 + 25], fill=(200, 30, 30), width=2)
        draw.text((ax2 + 34, ay1 + 18), "data", fill=(0, 0, 0), font=small)
    image[:] = np.asarray(pil)
    return (x0, y0, ax2 + (84 if legend_right else 2), ay2 + 40)


def test_grid_with_wide_gutters_and_outside_labels() -> None:
    rng = np.random.default_rng(0)
    image = canvas(760, 520)
    truth = []
    pil = Image.fromarray(image)
    draw = ImageDraw.Draw(pil)
    for r in range(2):
        for c in range(3):
            x, y = 30 + c * 245, 30 + r * 250
            draw.text((x - 24, y - 26), "abcdef"[r * 3 + c], fill=(0, 0, 0), font=font(20))
            truth.append((float(x), float(y), float(x + 210), float(y + 210)))
    image[:] = np.asarray(pil)
    for x1, y1, x2, y2 in truth:
        image[int(y1) : int(y2), int(x1) : int(x2)] = texture(rng, int(x2 - x1), int(y2 - y1), 120)
    assert_matches(segment_panels(image), truth, 0.97)


def test_touching_panels_split_at_intensity_edge() -> None:
    rng = np.random.default_rng(1)
    image = canvas(820, 620)
    levels = [[60, 140], [150, 80]]
    truth = []
    for r in range(2):
        for c in range(2):
            x1, y1 = 10 + c * 400, 10 + r * 300
            image[y1 : y1 + 300, x1 : x1 + 400] = texture(rng, 400, 300, levels[r][c])
            truth.append((float(x1), float(y1), float(x1 + 400), float(y1 + 300)))
    predicted = segment_panels(image)
    assert_matches(predicted, truth, 0.9)


def test_separator_line_between_touching_images() -> None:
    rng = np.random.default_rng(2)
    image = canvas(600, 300)
    image[10:290, 10:295] = texture(rng, 285, 280, 90)
    image[10:290, 297:590] = texture(rng, 293, 280, 95)  # a 2-px white line between two images
    truth = [(10.0, 10.0, 295.0, 290.0), (297.0, 10.0, 590.0, 290.0)]
    assert_matches(segment_panels(image), truth, 0.95)


def test_plot_box_includes_axes_ticks_titles_and_legend() -> None:
    image = canvas(420, 260)
    extent = draw_plot(image, 20, 20, legend_right=True)
    expected = ink_box(image, (0, 0, image.shape[1], image.shape[0]))
    predicted = segment_panels(image)
    assert len(predicted) == 1
    assert geometry.iou(predicted[0].box, expected) > 0.97
    assert predicted[0].box[2] >= extent[2] - 4  # the legend is inside the box


def test_side_by_side_plots_with_labels_keep_their_own_text() -> None:
    image = canvas(760, 270)
    pil = Image.fromarray(image)
    draw = ImageDraw.Draw(pil)
    draw.text((2, 0), "a", fill=(0, 0, 0), font=font(22))
    draw.text((382, 0), "b", fill=(0, 0, 0), font=font(22))
    image[:] = np.asarray(pil)
    left = draw_plot(image, 20, 30)
    right = draw_plot(image, 400, 30)
    truth = [ink_box(image, (left[0], left[1], left[2] + 6, left[3] + 6))]
    truth.append(ink_box(image, (right[0], right[1], right[2] + 6, right[3] + 6)))
    predicted = segment_panels(image)
    assert_matches(predicted, truth, 0.95)


def test_label_outside_the_image_is_not_swallowed() -> None:
    rng = np.random.default_rng(3)
    image = canvas(400, 300)
    pil = Image.fromarray(image)
    ImageDraw.Draw(pil).text((4, 2), "A", fill=(0, 0, 0), font=font(24))
    image[:] = np.asarray(pil)
    image[20:290, 40:390] = texture(rng, 350, 270, 100)
    (panel,) = segment_panels(image)
    assert panel.box == (40.0, 20.0, 390.0, 290.0)


def test_known_labels_are_kept_out_of_the_boxes() -> None:
    rng = np.random.default_rng(4)
    image = canvas(300, 200)
    image[30:190, 30:290] = texture(rng, 260, 160, 100)
    image[8:26, 10:24] = 0  # a blob touching nothing, as a label would be
    detections = [LabelDetection(text="a", box=(10.0, 8.0, 24.0, 26.0), confidence=0.9)]
    (panel,) = segment_panels(image, labels=detections)
    assert panel.box == (30.0, 30.0, 290.0, 190.0)


def test_single_panel_figures_give_one_box() -> None:
    rng = np.random.default_rng(5)
    image = canvas(500, 400)
    image[40:360, 50:450] = texture(rng, 400, 320, 110)
    assert [p.box for p in segment_panels(image)] == [(50.0, 40.0, 450.0, 360.0)]
    plot = canvas(360, 260)
    draw_plot(plot, 10, 10)
    predicted = segment_panels(plot)
    assert len(predicted) == 1
    assert geometry.iou(predicted[0].box, ink_box(plot, (0, 0, 360, 260))) > 0.97


def test_degenerate_inputs() -> None:
    assert segment_panels(canvas(300, 200)) == []
    assert segment_panels(np.zeros((0, 0, 3), dtype=np.uint8)) == []
    assert segment_panels(np.full((1, 1, 3), 255, dtype=np.uint8)) == []
    one = segment_panels(np.zeros((1, 1, 3), dtype=np.uint8))
    assert [p.box for p in one] == [(0.0, 0.0, 1.0, 1.0)]
    grey = segment_panels(np.full((50, 60), 100, dtype=np.uint8))  # 2-D input
    assert [p.box for p in grey] == [(0.0, 0.0, 60.0, 50.0)]
    rgba = np.full((40, 40, 4), 255, dtype=np.uint8)
    rgba[5:35, 5:35, :3] = 50
    assert [p.box for p in segment_panels(rgba)] == [(5.0, 5.0, 35.0, 35.0)]


def test_long_strip_and_huge_single_panel() -> None:
    strip = canvas(20000, 50)
    strip[5:45, 100:19900] = 90
    boxes = [p.box for p in segment_panels(strip)]
    assert boxes and all(0 <= b[0] < b[2] <= 20000 and 0 <= b[1] < b[3] <= 50 for b in boxes)
    assert geometry.iou(boxes[0], (100.0, 5.0, 19900.0, 45.0)) > 0.9
    rng = np.random.default_rng(6)
    huge = texture(rng, 3000, 2400, 120)
    (panel,) = segment_panels(huge)
    assert geometry.iou(panel.box, (0.0, 0.0, 3000.0, 2400.0)) > 0.99


def test_confidences_are_probabilities() -> None:
    rng = np.random.default_rng(7)
    image = canvas(500, 250)
    image[10:240, 10:240] = texture(rng, 230, 230, 80)
    image[10:240, 260:490] = texture(rng, 230, 230, 140)
    predicted = segment_panels(image)
    assert len(predicted) == 2
    assert all(0.0 < p.confidence <= 1.0 for p in predicted)


def test_naive_xycut_cuts_gutters_and_keeps_labels() -> None:
    rng = np.random.default_rng(8)
    image = canvas(500, 260)
    image[20:240, 20:230] = texture(rng, 210, 220, 100)
    image[20:240, 270:480] = texture(rng, 210, 220, 100)
    image[14:28, 258:268] = 0  # a label glyph 2 px left of the second panel's top-left corner
    boxes = sorted(p.box for p in naive_xycut(image))
    assert boxes == [(20.0, 20.0, 230.0, 240.0), (258.0, 14.0, 480.0, 240.0)]  # naive: label swallowed
    refined = sorted(p.box for p in segment_panels(image))
    assert refined == [(20.0, 20.0, 230.0, 240.0), (270.0, 20.0, 480.0, 240.0)]
    assert naive_xycut(canvas(50, 50)) == []


def test_evaluate_scores_a_small_folder(tmp_path: Path) -> None:
    rng = np.random.default_rng(9)
    annotations: dict = {"_notes": {"coordinates": "inclusive"}}
    for k in range(2):
        image = canvas(420, 220)
        image[10:210, 10:200] = texture(rng, 190, 200, 90)
        image[10:210, 220:410] = texture(rng, 190, 200, 150)
        Image.fromarray(image).save(tmp_path / f"f{k}.png")
        annotations[f"f{k}.png"] = {
            "panels": [
                {"label": "a", "box": [10, 10, 199, 209]},
                {"label": "b", "box": [220, 10, 409, 209]},
            ]
        }
    (tmp_path / "annotations.json").write_text(json.dumps(annotations))
    report = evaluate(
        tmp_path, annotations, segment_panels, labeler=lambda image, panels: ["a", "b"][: len(panels)]
    )
    assert report["figures"] == 2
    assert report["panels"]["0.9"]["f1"] == pytest.approx(1.0)
    assert report["mean_iou"] == pytest.approx(1.0)
    assert report["label_accuracy"] == pytest.approx(1.0)
    naive = evaluate(tmp_path, annotations, naive_xycut, labeler=None)
    assert naive["label_accuracy"] is None
    assert naive["panels"]["0.5"]["f1"] == pytest.approx(1.0)


def test_narrow_gutter_between_plot_and_images_is_split() -> None:
    """A 2-px gutter is bridged when blobs are formed; a line with no ink across the whole blob (or,
    between two image edges, only a few JPEG specks) still separates the panels."""
    rng = np.random.default_rng(5)
    image = canvas(640, 520)
    plot = draw_plot(image, 10, 10)
    bottom = plot[3] + 2  # two blank rows under the plot's tick labels
    image[plot[1] : plot[3], 330:630] = texture(rng, 300, plot[3] - plot[1], 90)
    image[bottom : bottom + 150, 10:630] = texture(rng, 620, 150, 110)
    second = bottom + 150 + 1  # one light row with a few specks between two images
    image[second : second + 140, 10:630] = texture(rng, 620, 140, 70)
    image[second - 1, [40, 41, 300, 301, 500]] = 150
    truth = [
        ink_box(image, (0, 0, 320, plot[3])),
        (330.0, float(plot[1]), 630.0, float(plot[3])),
        (10.0, float(bottom), 630.0, float(bottom + 150)),
        (10.0, float(second), 630.0, float(second + 140)),
    ]
    assert_matches(segment_panels(image), truth, 0.9)


def test_touching_images_split_where_only_the_texture_changes() -> None:
    """A calm grey image above a striped one, no gutter: the seam's colour step is no stronger
    than the stripes' own, but the texture changes along the whole line."""
    rng = np.random.default_rng(11)
    image = canvas(600, 480)
    calm = np.linspace(115, 135, 560)[None, :] + rng.normal(0, 2, (220, 560))
    yy, xx = np.mgrid[0:220, 0:560]
    stripes = 125 + 45 * np.sin((xx + yy) / 3.0) + rng.normal(0, 2, (220, 560))
    image[20:240, 20:580] = np.clip(calm, 0, 255).astype(np.uint8)[:, :, None]
    image[240:460, 20:580] = np.clip(stripes, 0, 200).astype(np.uint8)[:, :, None]
    boxes = sorted(p.box for p in segment_panels(image))
    assert len(boxes) == 2
    assert all(abs(a - b) <= 3 for a, b in zip(boxes[0], (20, 20, 580, 240), strict=True))
    assert all(abs(a - b) <= 3 for a, b in zip(boxes[1], (20, 240, 580, 460), strict=True))


def test_one_striped_image_is_not_split_by_texture() -> None:
    rng = np.random.default_rng(12)
    image = canvas(600, 480)
    yy, xx = np.mgrid[0:440, 0:560]
    stripes = 125 + 45 * np.sin((xx + yy) / 3.0) + 10 * np.sin(yy / 40.0) + rng.normal(0, 2, (440, 560))
    image[20:460, 20:580] = np.clip(stripes, 0, 200).astype(np.uint8)[:, :, None]
    assert len(segment_panels(image)) == 1


def test_sideways_axis_title_joins_its_plot_not_the_picture_beside_it() -> None:
    """A y-axis title set well clear of its tick labels, nearer the image on its left: it is the
    plot's (the text of a y axis stands left of the axis), never the image's."""
    rng = np.random.default_rng(13)
    image = canvas(620, 260)
    image[30:230, 20:240] = texture(rng, 220, 200, 120)
    pil = Image.fromarray(image)
    draw = ImageDraw.Draw(pil)
    small = font(11, bold=False)
    ax1, ay1, ax2, ay2 = 330, 30, 590, 200
    draw.rectangle([ax1, ay1, ax2, ay2], outline=(0, 0, 0), width=2)
    for k in range(5):
        ty = ay2 - k * 40
        draw.line([ax1 - 5, ty, ax1, ty], fill=(0, 0, 0), width=2)
        draw.text((ax1 - 24, ty - 7), f"{k * 10}", fill=(0, 0, 0), font=small)
        draw.text((ax1 + k * 60 - 6, ay2 + 8), f"{k}", fill=(0, 0, 0), font=small)
    draw.line([(ax1 + 5, ay2 - 20), (ax2 - 5, ay1 + 30)], fill=(30, 30, 200), width=2)
    title = Image.new("RGB", (100, 14), (255, 255, 255))
    ImageDraw.Draw(title).text((0, 0), "Expression (a.u.)", fill=(0, 0, 0), font=small)
    pil.paste(title.rotate(90, expand=True), (262, 70))
    image[:] = np.asarray(pil)
    picture = (20.0, 30.0, 240.0, 230.0)
    plot = ink_box(image, (258, 20, 610, 240))
    assert_matches(segment_panels(image), [picture, plot], 0.95)


def test_touching_dark_fluorescence_images_split_by_their_hue() -> None:
    """Two dark fluorescence fields with their faint background glow, magenta beside blue, no
    gutter: grey level and texture barely change across the seam, the colour does."""
    rng = np.random.default_rng(14)
    image = canvas(560, 660)
    yy, xx = np.mgrid[0:300, 0:520]
    for y0, colour, glow in ((20, (200, 60, 200), (24, 8, 24)), (320, (60, 110, 250), (8, 10, 26))):
        field = np.zeros((300, 520, 3), np.float32) + np.array(glow, np.float32)
        for _ in range(60):
            cx, cy, r = rng.uniform(0, 520), rng.uniform(0, 300), rng.uniform(3, 7)
            blob = np.exp(-((xx - cx) ** 2 + (yy - cy) ** 2) / (2 * r * r))[..., None]
            field += blob * np.array(colour, np.float32)
        image[y0 : y0 + 300, 20:540] = np.clip(field + rng.normal(0, 2, field.shape), 0, 255).astype(np.uint8)
    boxes = sorted(p.box for p in segment_panels(image))
    assert len(boxes) == 2
    assert abs(boxes[0][3] - 320) <= 3 and abs(boxes[1][1] - 320) <= 3


def _fused_label_figure() -> tuple[np.ndarray, list[tuple[float, float, float, float]]]:
    """A wide image above two touching images of one stain; the lower images' labels sit in a
    narrow gutter, fused to the bottom edge of the image above."""
    rng = np.random.default_rng(11)
    image = canvas(520, 470)
    pil = Image.fromarray(image)
    draw = ImageDraw.Draw(pil)
    draw.text((10, 2), "A", fill=(0, 0, 0), font=font(16))
    for x, text in ((10, "B"), (262, "C")):
        # the capitals' tops touch the image above: they start on its last row
        top_offset = draw.textbbox((0, 0), text, font=font(16))[1]
        draw.text((x, 221 - top_offset), text, fill=(0, 0, 0), font=font(16))
    image[:] = np.asarray(pil)
    image[22:222, 10:510] = texture(rng, 500, 200, 110)
    truth = [(10.0, 22.0, 510.0, 222.0)]
    for x1, x2 in ((10, 262), (262, 510)):
        image[242:462, x1:x2] = texture(rng, x2 - x1, 220, 112)
        truth.append((float(x1), 242.0, float(x2), 462.0))
    return image, truth


def test_labels_fused_to_an_image_edge_still_head_their_panels() -> None:
    image, truth = _fused_label_figure()
    assert_matches(segment_panels(image), truth, 0.9)


def _speckled_label_figure() -> tuple[np.ndarray, list[tuple[float, float, float, float]]]:
    """Two images, each under a "(x)" label a few pixels above it, with JPEG-like specks in and
    under the label's line."""
    rng = np.random.default_rng(12)
    image = canvas(640, 300)
    pil = Image.fromarray(image)
    draw = ImageDraw.Draw(pil)
    truth = []
    for x, text in ((10, "(a)"), (330, "(b)")):
        draw.text((x, 8), text, fill=(0, 0, 0), font=font(22))
        truth.append((float(x), 40.0, float(x + 300), 290.0))
    image[:] = np.asarray(pil)
    for left, _, _, _ in truth:
        # single-pixel specks just under the line, from the last column of the "(" on
        ink = image[:40, int(left) : int(left) + 60].min(axis=2) < 225
        cols, rows = np.flatnonzero(ink.any(axis=0)), np.flatnonzero(ink.any(axis=1))
        paren_end = int(left) + int(cols[np.flatnonzero(np.diff(cols) > 1)[0]])
        for dx in range(0, 24, 4):
            image[int(rows[-1]) + 2 + dx % 3, paren_end + dx] = 150
    for x1, y1, x2, y2 in truth:
        image[int(y1) : int(y2), int(x1) : int(x2)] = texture(rng, int(x2 - x1), int(y2 - y1), 120)
    return image, truth


def test_specks_beside_a_label_do_not_hide_it() -> None:
    image, truth = _speckled_label_figure()
    assert_matches(segment_panels(image), truth, 0.97)


def test_seam_along_the_whole_figure_is_cut_before_one_along_a_row() -> None:
    """Four touching images whose columns do not line up: the seam between the rows runs along
    (nearly) the whole width, the seam inside the taller lower row along most of the height only;
    cutting that one first would split the upper images too."""
    rng = np.random.default_rng(13)
    image = canvas(620, 480)
    cells = [((10, 10, 410, 170), 60), ((410, 10, 610, 170), 150), ((10, 170, 310, 470), 150)]
    cells.append(((310, 170, 610, 470), 60))
    truth = []
    for (x1, y1, x2, y2), level in cells:
        image[y1:y2, x1:x2] = texture(rng, x2 - x1, y2 - y1, level)
        truth.append((float(x1), float(y1), float(x2), float(y2)))
    assert_matches(segment_panels(image), truth, 0.9)


def _label_touching_image_above() -> tuple[np.ndarray, list[tuple[float, float, float, float]]]:
    """A 2x2 grid of touching images, labels over each; the "C" touches a light streak running
    out of the image above, so its glyph component reaches up into that image."""
    rng = np.random.default_rng(14)
    image = canvas(620, 500)
    pil = Image.fromarray(image)
    draw = ImageDraw.Draw(pil)
    truth = []
    for row, y in enumerate((26, 266)):
        for col, x in enumerate((10, 310)):
            text = "ABCD"[2 * row + col]
            top_offset = draw.textbbox((0, 0), text, font=font(16))[1]
            draw.text((x, y - 18 - top_offset), text, fill=(0, 0, 0), font=font(16))
            truth.append((float(x), float(y), float(x + 300), float(y + 220)))
    image[:] = np.asarray(pil)
    for k, (x1, y1, x2, y2) in enumerate(truth):
        image[int(y1) : int(y2), int(x1) : int(x2)] = texture(
            rng, int(x2 - x1), int(y2 - y1), (70, 140)[k % 2]
        )
    # the upper image's corner is light (background colour) but for a streak down to the "C"
    image[232:246, 10:30] = 255
    image[236:251, 13:15] = 150
    return image, truth


def test_label_touching_a_streak_of_the_image_above_still_heads_its_panel() -> None:
    image, truth = _label_touching_image_above()
    assert_matches(segment_panels(image), truth, 0.9)


def test_small_image_off_a_panels_corner_stays_apart() -> None:
    """A much smaller image (a strip) next to a big one, overlapping its side only at the corner:
    a colour bar or legend sits beside its panel, this is a panel of its own."""
    rng = np.random.default_rng(15)
    image = canvas(610, 400)
    image[10:200, 10:300] = texture(rng, 290, 190, 90)
    image[190:216, 312:600] = texture(rng, 288, 26, 120)
    truth = [(10.0, 10.0, 300.0, 200.0), (312.0, 190.0, 600.0, 216.0)]
    assert_matches(segment_panels(image), truth, 0.9)


def _table_under_label() -> tuple[np.ndarray, list[tuple[float, float, float, float]]]:
    """Two labelled images and a ruleless table of text under its own label "(c)"."""
    rng = np.random.default_rng(16)
    image = canvas(760, 300)
    pil = Image.fromarray(image)
    draw = ImageDraw.Draw(pil)
    for x, text in ((10, "(a)"), (260, "(b)"), (510, "(c)")):
        draw.text((x, 6), text, fill=(0, 0, 0), font=font(20))
    rows = [("Variable", "Low", "High"), ("BMI", "21.3", "25.0"), ("Smoker", "12", "40")]
    rows += [("Age", "55.1", "61.0"), ("eGFR", "89", "75"), ("CRP", "3.1", "5.6")]
    for r, row in enumerate(rows):
        for c, cell in enumerate(row):
            draw.text((512 + (0, 80, 130)[c], 44 + 24 * r), cell, fill=(0, 0, 0), font=font(14, bold=r == 0))
    image[:] = np.asarray(pil)
    truth = []
    for x in (10, 260):
        image[40:280, x : x + 230] = texture(rng, 230, 240, 110)
        truth.append((float(x), 40.0, float(x + 230), 280.0))
    truth.append(ink_box(image, (505, 40, 760, 300)))
    return image, truth


def test_label_over_a_table_is_not_part_of_it() -> None:
    image, truth = _table_under_label()
    assert_matches(segment_panels(image), truth, 0.9)


def _pair_with_labels_inside() -> tuple[np.ndarray, list[tuple[float, float, float, float]]]:
    """Two touching images of one stain, each with a white label inside its top-left corner; the
    right one is brighter over its upper half only, so their seam shows along half its length."""
    rng = np.random.default_rng(17)
    image = canvas(620, 280)
    image[10:270, 10:310] = texture(rng, 300, 260, 100)
    right = texture(rng, 300, 260, 100).astype(np.int16)
    right[:130] += 40
    image[10:270, 310:610] = np.clip(right, 0, 255).astype(np.uint8)
    pil = Image.fromarray(image)
    draw = ImageDraw.Draw(pil)
    for x, text in ((15, "E"), (315, "F")):
        draw.text((x, 13), text, fill=(255, 255, 255), font=font(18))
    image[:] = np.asarray(pil)
    return image, [(10.0, 10.0, 310.0, 270.0), (310.0, 10.0, 610.0, 270.0)]


def test_labels_inside_touching_images_split_them_where_a_seam_runs() -> None:
    image, truth = _pair_with_labels_inside()
    assert_matches(segment_panels(image), truth, 0.9)


def test_touching_images_without_a_label_stay_together_in_a_labelled_figure() -> None:
    """Two labelled images and a group of two touching images whose label is not there to read:
    the group is one panel, as it would be under its label."""
    rng = np.random.default_rng(18)
    image = labelled_canvas(780, 300, [(10, 4, "a"), (270, 4, "b")], 20)
    truth = []
    for x in (10, 270):
        image[34:284, x : x + 240] = texture(rng, 240, 250, 110)
        truth.append((float(x), 34.0, float(x + 240), 284.0))
    image[34:284, 530:650] = texture(rng, 120, 250, 70)
    image[34:284, 651:770] = texture(rng, 119, 250, 150)
    truth.append((530.0, 34.0, 770.0, 284.0))
    assert_matches(segment_panels(image), truth, 0.9)


def test_unlabelled_image_left_of_a_labelled_one_is_not_its_sub_image() -> None:
    """Three images 2 px apart with labels inside their top-left corners, the first one's label
    unreadable: a panel's label marks its top-left image, so the first is no sub-image of the
    second."""
    rng = np.random.default_rng(19)
    image = canvas(640, 260)
    truth = []
    for k, x in enumerate((10, 218, 426)):
        image[10:250, x : x + 206] = texture(rng, 206, 240, (150, 100, 125)[k])
        truth.append((float(x), 10.0, float(x + 206), 250.0))
    pil = Image.fromarray(image)
    draw = ImageDraw.Draw(pil)
    for x, text in ((223, "B"), (431, "C")):
        draw.text((x, 12), text, fill=(255, 255, 255), font=font(18))
    image[:] = np.asarray(pil)
    assert_matches(segment_panels(image), truth, 0.9)


def test_small_unlabelled_image_before_a_labelled_one_joins_the_panel_it_follows() -> None:
    """A labelled image, a small unlabelled image after it (its sub-image) and a labelled image
    after that (3 px and 1 px apart): the small one is not the next panel's colour bar or inset."""
    rng = np.random.default_rng(20)
    image = labelled_canvas(640, 280, [(10, 2, "a"), (322, 2, "b")], 18)
    image[30:270, 10:250] = texture(rng, 240, 240, 150)
    image[30:130, 253:321] = texture(rng, 68, 100, 100)
    image[30:270, 322:630] = texture(rng, 308, 240, 125)
    truth = [(10.0, 30.0, 321.0, 270.0), (322.0, 30.0, 630.0, 270.0)]
    assert_matches(segment_panels(image), truth, 0.9)


def test_error_kind_names_why_a_panel_was_not_matched() -> None:
    truth = (100.0, 100.0, 300.0, 300.0)
    assert error_kind(truth, []) == "missed"
    assert error_kind(truth, [(500.0, 500.0, 600.0, 600.0)]) == "missed"
    assert error_kind(truth, [(100.0, 100.0, 200.0, 300.0), (200.0, 100.0, 300.0, 300.0)]) == "split"
    assert error_kind(truth, [(100.0, 100.0, 600.0, 300.0)]) == "merged"
    assert error_kind(truth, [(100.0, 100.0, 300.0, 220.0)]) == "cut"
    assert error_kind(truth, [(130.0, 130.0, 330.0, 330.0)]) == "off"


def test_evaluate_buckets_the_misses(tmp_path: Path) -> None:
    """Two touching images of one level are one box: two merged misses, counted by type."""
    rng = np.random.default_rng(21)
    image = canvas(420, 220)
    image[10:210, 10:410] = texture(rng, 400, 200, 120)
    Image.fromarray(image).save(tmp_path / "f.png")
    annotations = {
        "f.png": {
            "panels": [
                {"label": "a", "box": [10, 10, 209, 209], "type": "image"},
                {"label": "b", "box": [210, 10, 409, 209], "type": "image"},
            ]
        }
    }
    report = evaluate(tmp_path, annotations, segment_panels, labeler=None)
    assert report["error_buckets"] == {"merged:image": 2}
    assert report["per_figure"][0]["errors"] == ["merged:image", "merged:image"]


def test_a_piece_of_an_accepted_label_is_not_restored_as_content() -> None:
    """The dot of an "i" guessed as a label of its own stays out of the panels with its "i"."""
    i_label, dot, word = (711, 377, 722, 393), (712, 377, 716, 381), (400, 50, 420, 62)
    assert rejected_guesses([i_label, dot, word], [i_label]) == [word]


@pytest.mark.parametrize("corner", ["bl", "tr"])
def test_unlabelled_image_on_the_label_side_is_not_a_sub_image_for_any_label_corner(corner: str) -> None:
    """Three images 2 px apart with labels inside their bottom-left (or top-right) corners, the
    label of the first (or last) unreadable: with labels at the bottom left a panel's label marks
    its left side, so the image left of a labelled one is a panel of its own (right of it, with
    labels at the top right)."""
    rng = np.random.default_rng(23)
    image = canvas(640, 260)
    truth = []
    xs = (10, 218, 426)
    for k, x in enumerate(xs):
        image[10:250, x : x + 206] = texture(rng, 206, 240, (150, 100, 125)[k])
        truth.append((float(x), 10.0, float(x + 206), 250.0))
    pil = Image.fromarray(image)
    draw = ImageDraw.Draw(pil)
    if corner == "bl":
        spots = ((xs[1] + 5, 226, "B"), (xs[2] + 5, 226, "C"))
    else:
        spots = ((xs[0] + 190, 12, "A"), (xs[1] + 190, 12, "B"))
    for x, y, text in spots:
        draw.text((x, y), text, fill=(255, 255, 255), font=font(18))
    image[:] = np.asarray(pil)
    assert_matches(segment_panels(image), truth, 0.9)


def _two_rows_labelled_bottom_right(first_label_size: int) -> np.ndarray:
    """Two touching images over one wide image, no gutters, white labels inside each image's
    bottom-right corner. Each seam shows along about half of the figure's side only (the top
    row's two images differ, the wide image matches the right one), too little to cut without
    the labels."""
    rng = np.random.default_rng(24)
    image = canvas(620, 420)
    image[10:170, 10:310] = texture(rng, 300, 160, 70)
    image[10:170, 310:610] = texture(rng, 300, 160, 130)
    image[170:410, 10:610] = texture(rng, 600, 240, 130)
    pil = Image.fromarray(image)
    draw = ImageDraw.Draw(pil)
    for x, y, text, size in ((296, 154, "a", first_label_size), (590, 146, "b", 18), (590, 386, "c", 18)):
        draw.text((x, y), text, fill=(255, 255, 255), font=font(size))
    image[:] = np.asarray(pil)
    return image


TWO_ROWS_TRUTH = [(10.0, 10.0, 310.0, 170.0), (310.0, 10.0, 610.0, 170.0), (10.0, 170.0, 610.0, 410.0)]


def test_labels_inside_bottom_right_corners_cut_touching_images() -> None:
    assert_matches(segment_panels(_two_rows_labelled_bottom_right(18)), TWO_ROWS_TRUTH, 0.9)


def test_a_row_cut_off_at_labels_is_split_again_along_its_own_seam() -> None:
    """The first label is smaller than the others, so only the labels down the right side cut the
    figure (into two rows); the seam between the top row's images, half the figure's height,
    runs the whole height of that row and splits it."""
    assert_matches(segment_panels(_two_rows_labelled_bottom_right(12)), TWO_ROWS_TRUTH, 0.9)


def test_a_label_glyph_touching_the_image_below_joins_the_rest_of_its_label() -> None:
    """ "(g)" above an image whose top the g's descender touches: the g is trimmed off the image
    and joins the parentheses guessed on their own, so the whole label stays out of the box."""
    rng = np.random.default_rng(25)
    pil = Image.fromarray(canvas(580, 300))
    draw = ImageDraw.Draw(pil)
    draw.text((10, 4), "(f)", fill=(0, 0, 0), font=font(20))
    # the g sits a little low, so that only its descender meets the image
    draw.text((300, 4), "(", fill=(0, 0, 0), font=font(20))
    draw.text((308, 7), "g", fill=(0, 0, 0), font=font(20))
    draw.text((322, 4), ")", fill=(0, 0, 0), font=font(20))
    image = np.asarray(pil).copy()
    top = int(np.flatnonzero((image[:, 306:321].min(axis=2) < 225).any(axis=1))[-1]) + 1
    image[40:290, 10:280] = texture(rng, 270, 250, 120)
    image[top:290, 300:570] = texture(rng, 270, 290 - top, 120)
    truth = [(10.0, 40.0, 280.0, 290.0), (300.0, float(top), 570.0, 290.0)]
    assert_matches(segment_panels(image), truth, 0.9)


def _four_images_labelled_top_left() -> tuple[np.ndarray, list[tuple[int, int, int, int]]]:
    """Four touching grey images with white labels inside their top-left corners; a bright streak
    runs down beside the last label (a crowd of bright dots in a fluorescence field)."""
    rng = np.random.default_rng(26)
    image = canvas(630, 260)
    parts = []
    for k, x in enumerate((10, 160, 310, 460)):
        image[10:250, x : x + 150] = texture(rng, 150, 240, (150, 100, 125, 80)[k])
        parts.append((x, 10, x + 150, 250))
    image[22:62, 481:483] = 255
    pil = Image.fromarray(image)
    draw = ImageDraw.Draw(pil)
    for k, (x, _, _, _) in enumerate(parts):
        draw.text((x + 5, 12), "ABCD"[k], fill=(255, 255, 255), font=font(18))
    return np.asarray(pil).copy(), parts


def test_a_label_missed_by_the_corner_search_is_found_where_the_others_sit() -> None:
    image, parts = _four_images_labelled_top_left()
    gray = np.asarray(Image.fromarray(image).convert("L"))
    found = [corner_glyphs(gray, part, 8.0, ("tl",), otsu=False) for part in parts]
    assert all(found[:3]) and not found[3]  # the streak beside "D" hides it from the search
    labelled = [(part, glyphs[0]) for part, glyphs in zip(parts[:3], found[:3], strict=True)]
    assert segment._label_at_spot(gray, parts[3], labelled, "tl")
    # the same image with its label printed elsewhere, or a figure whose labels sit elsewhere
    shifted = [(part[0] + 40, part[1], part[2], part[3]) for part in parts]
    assert not segment._label_at_spot(gray, shifted[3], labelled, "tl")
    assert not segment._label_at_spot(gray, parts[3], labelled, "bl")
    # two labels are too few to say where labels sit
    assert not segment._label_at_spot(gray, parts[3], labelled[:1], "tl")


def test_dark_images_along_the_figure_edges_do_not_make_a_dark_canvas() -> None:
    """Black images reach the figure's edges on every side (the border is one dark tone, with
    dark rows inside the images), but a white gutter runs right across the figure: the
    background is light, and the gutter is no ink."""
    rng = np.random.default_rng(27)
    image = np.zeros((300, 400, 3), dtype=np.uint8)
    for _ in range(40):
        x, y = int(rng.integers(10, 390)), int(rng.integers(10, 290))
        image[y : y + 4, x : x + 4] = (60, 200, 60)
    image[140:152] = 255  # the gutter between the two rows of images
    mask = ink_mask(image)
    assert not mask[140:152].any()
    assert mask[:140].mean() < 0.2 or mask[:140].mean() > 0.8  # either way a clear reading
    assert mask[0, 0]
    assert_matches(segment_panels(image), [(0.0, 0.0, 400.0, 140.0), (0.0, 152.0, 400.0, 300.0)], 0.9)


def _unlabelled_strip_figure(sub_gap: int) -> tuple[np.ndarray, list[tuple[float, float, float, float]]]:
    """No labels: three images 12 px apart in a row, the last a strip of two sub-images
    ``sub_gap`` px apart, and two images below."""
    rng = np.random.default_rng(28)
    image = canvas(700, 430)
    truth = []
    for k, x in enumerate((10, 242)):
        image[10:210, x : x + 220] = texture(rng, 220, 200, (150, 100)[k])
        truth.append((float(x), 10.0, float(x + 220), 210.0))
    half = (220 - sub_gap) // 2
    image[10:210, 474 : 474 + half] = texture(rng, half, 200, 120)
    image[10:210, 694 - half : 694] = texture(rng, half, 200, 80)
    truth.append((474.0, 10.0, 694.0, 210.0))
    for k, x in enumerate((10, 357)):
        image[222:420, x : x + 335] = texture(rng, 335, 198, (90, 140)[k])
        truth.append((float(x), 222.0, float(x + 335), 420.0))
    return image, truth


def test_sub_images_closer_than_the_gutters_are_one_panel_in_an_unlabelled_figure() -> None:
    image, truth = _unlabelled_strip_figure(3)
    assert_matches(segment_panels(image), truth, 0.9)


def test_images_as_far_apart_as_the_gutters_stay_apart_in_an_unlabelled_figure() -> None:
    image, truth = _unlabelled_strip_figure(12)
    half = (220 - 12) // 2
    truth = [*truth[:2], (474.0, 10.0, 474.0 + half, 210.0), (694.0 - half, 10.0, 694.0, 210.0), *truth[3:]]
    assert_matches(segment_panels(image), truth, 0.9)


def test_dots_trimmed_off_an_image_are_no_labels_and_do_not_set_the_label_size() -> None:
    """The dots of "iii" printed under an image touch it and are trimmed off as label guesses;
    3 px tall, they head no panel, so the labels "iv" and "v" (20 px) keep their panels."""
    parts = [(0, 0, 400, 180), (30, 230, 400, 400), (450, 230, 800, 400)]
    candidates = [
        (1, 181, 5, 184),
        (11, 181, 14, 184),
        (21, 181, 24, 184),
        (0, 205, 25, 225),
        (450, 205, 470, 225),
    ]
    stats = np.zeros((1, 5), dtype=np.int32)
    accepted, anchors = segment._anchor_labels(candidates, parts, [True, True, True], stats, 8.0, trust=False)
    assert accepted == [(0, 205, 25, 225), (450, 205, 470, 225)]
    assert anchors == [-1, 0, 1]


def test_a_sliver_of_the_image_beyond_a_seam_is_left_off_the_piece() -> None:
    """Cut off beside an image along a seam, a piece of plots (mostly background) that kept the
    image's last column of blurred edge loses it; an image piece (ink everywhere) keeps its
    edge, and so does a piece whose ink starts with a solid block (a bar, an image of its own)."""
    mask = np.zeros((100, 200), dtype=bool)
    mask[:, :60] = True  # the image left of the seam, its edge at column 59
    mask[10:40, 80:150] = True  # a plot
    assert segment.without_sliver(mask, (59, 0, 200, 100), 0, False) == (60, 0, 200, 100)
    assert segment.without_sliver(mask, (0, 0, 59, 100), 0, True) == (0, 0, 59, 100)
    mask[:, 60:64] = True  # a solid block right after the cut: content, not a sliver
    assert segment.without_sliver(mask, (59, 0, 200, 100), 0, False) == (59, 0, 200, 100)
    # the same across a horizontal cut, for the piece before it
    rows = np.zeros((200, 100), dtype=bool)
    rows[20:60, 10:90] = True  # a plot
    rows[141:] = True  # the image below the seam, its edge at row 141
    assert segment.without_sliver(rows, (0, 0, 100, 142), 1, True) == (0, 0, 100, 141)


def text_rows(image: np.ndarray, x: int, y: int, lines: list[str]) -> np.ndarray:
    """``image`` with the lines of a ruleless table (13 px regular text, 18 px apart) at (x, y)."""
    pil = Image.fromarray(image)
    draw = ImageDraw.Draw(pil)
    for row, text in enumerate(lines):
        draw.text((x, y + 18 * row), text, fill=(0, 0, 0), font=font(13, False))
    return np.asarray(pil).copy()


def _table_beside_an_image() -> tuple[np.ndarray, list[tuple[float, float, float, float]]]:
    """Label "C" over a table of text rows, 8 px left of an image labelled "D": no row of the
    table is panel-sized, yet the label heads them all, so the rows do not join the image."""
    rng = np.random.default_rng(29)
    image = labelled_canvas(560, 300, [(10, 4, "C"), (220, 4, "D")], 20)
    lines = [f"Follow-up of group {row + 1} (mo) {12.5 + 3 * row:.1f}" for row in range(12)]
    image = text_rows(image, 12, 36, lines)
    image[34:290, 220:550] = texture(rng, 330, 256, 120)
    table = ink_box(image, (10, 34, 218, 292))
    return image, [table, (220.0, 34.0, 550.0, 290.0)]


def test_a_label_over_a_table_heads_all_its_rows() -> None:
    image, truth = _table_beside_an_image()
    assert_matches(segment_panels(image), truth, 0.9)


def _number_table(rows: int = 50, cols: int = 10) -> np.ndarray:
    """A text-heavy figure: a 1000x800 table of numbers (hundreds of glyph components)."""
    rng = np.random.default_rng(5)
    pil = Image.fromarray(canvas(1000, 800))
    draw = ImageDraw.Draw(pil)
    for r in range(rows):
        for c in range(cols):
            draw.text(
                (20 + c * 97, 10 + r * 15.5),
                f"{rng.uniform(0, 1000):.2f}",
                fill=(0, 0, 0),
                font=font(11, False),
            )
    return np.asarray(pil).copy()


def test_a_large_table_is_clustered_with_linear_work_per_merge(monkeypatch: pytest.MonkeyPatch) -> None:
    # the closest mergeable pair used to be found by a scan of the whole n x n matrix after
    # every merge (n^3 work, seconds for a table's ~1000 glyphs); rows are now searched again
    # only where a merge changed them
    scanned = {"elements": 0, "parts": 0}
    inside = {"on": False}
    real_argmin, real_cluster = np.argmin, segment._cluster

    def counting_argmin(a: np.ndarray, axis: int | None = None) -> object:
        if inside["on"]:
            scanned["elements"] += np.asarray(a).size
        return real_argmin(a, axis=axis)

    def counting_cluster(parts: list, *args: object, **kwargs: object) -> object:
        scanned["parts"] = max(scanned["parts"], len(parts))
        inside["on"] = True
        try:
            return real_cluster(parts, *args, **kwargs)
        finally:
            inside["on"] = False

    monkeypatch.setattr(np, "argmin", counting_argmin)
    monkeypatch.setattr(segment, "_cluster", counting_cluster)
    assert segment_panels(_number_table())
    n = scanned["parts"]
    assert n >= 300  # the table is many parts
    assert scanned["elements"] <= 12 * n * n


def test_row_minima_give_the_first_smallest_entry_as_a_full_scan() -> None:
    rng = np.random.default_rng(3)
    n = 40
    m = rng.integers(0, 6, (n, n)).astype(np.float64)  # many ties
    m[rng.random((n, n)) < 0.5] = np.inf
    m = np.minimum(m, m.T)
    alive = np.ones(n, dtype=bool)
    best = segment._RowMinima(m.copy())
    for _ in range(30):
        i, j = best.closest()
        flat = int(np.argmin(m))
        if not np.isfinite(m.flat[flat]):
            assert i < 0
            break
        assert (i, j) == divmod(flat, n)
        keep, gone = i, [j, *rng.choice(np.flatnonzero(alive), 1)]
        gone = [int(k) for k in gone if k != keep]
        for k in gone:
            alive[k] = False
            m[k, :] = m[:, k] = np.inf
        row = np.where(alive, rng.integers(0, 6, n).astype(np.float64), np.inf)
        row[keep] = np.inf
        m[keep, :] = m[:, keep] = row
        best.update(sorted({keep, *gone}), keep, m[:, keep].copy(), lambda r: m[r].copy())


def _table_right_of_its_label() -> tuple[np.ndarray, list[tuple[float, float, float, float]]]:
    """An image labelled "A" and, in the gutter right of it, a label "C" level with the top row
    of a table that starts just right of the label (nothing under the label)."""
    rng = np.random.default_rng(31)
    image = labelled_canvas(640, 320, [(2, 2, "A"), (335, 2, "C")], 18)
    image = text_rows(image, 354, 4, [f"Stage {row + 1} (mo)   {12.5 + 3 * row:.2f}" for row in range(8)])
    image[2:300, 24:330] = texture(rng, 306, 298, 120)
    table = ink_box(image, (360, 0, 640, 160))
    return image, [(24.0, 2.0, 330.0, 300.0), table]


def test_a_label_left_of_a_tables_top_row_heads_the_table() -> None:
    image, truth = _table_right_of_its_label()
    assert_matches(segment_panels(image), truth, 0.9)


def test_an_image_beside_a_table_does_not_stop_its_label_heading_it() -> None:
    # label "C" over eight text rows; an image (panel-sized) starts 8 px right of the rows, its
    # top level with the label: it is no cell on the label's line (a word in a table's row)
    label = (10, 4, 24, 22)
    rows = [(12, 36 + 18 * r, 190, 48 + 18 * r) for r in range(8)]
    image = (198, 4, 520, 290)
    parts = [*rows, image]
    major = [False] * len(rows) + [True]
    assert segment._text_block_under(label, parts, major, 8.0) == list(range(len(rows)))
    # a small word there is a cell of the label's row
    assert segment._text_block_under(label, [*rows, (198, 4, 240, 20)], [False] * (len(rows) + 1), 8.0) == []


def test_a_rule_ending_left_of_a_label_does_not_hide_it() -> None:
    # a table's top rule ends 3 px left of the next panel's label "c": a straight line is no
    # word that the label would continue
    image = labelled_canvas(400, 120, [(203, 2, "c")], 20)
    image[14:16, 20:200] = 0  # the rule, level with the label
    mask = ink_mask(image).astype(np.uint8)
    _, labels, stats, _ = cv2.connectedComponentsWithStats(mask, connectivity=8)
    words = imaging.label_candidates(mask, labels, stats, 8.0).words
    assert any(box[0] >= 200 for box, _ in words)
    image[10:18, 196:200] = 0  # a blob there (the end of a word) still hides it
    mask = ink_mask(image).astype(np.uint8)
    _, labels, stats, _ = cv2.connectedComponentsWithStats(mask, connectivity=8)
    assert not any(box[0] >= 200 for box, _ in imaging.label_candidates(mask, labels, stats, 8.0).words)


def test_a_speck_over_a_label_does_not_hide_it_in_the_full_size_look() -> None:
    # the label reader's own look at a figure the segmenter downscaled: one pixel of JPEG
    # ringing just above a label is noise, as it is to the segmenter, not ink over the label
    image = labelled_canvas(400, 120, [(203, 20, "c")], 20)
    rows = np.flatnonzero((image[:, 195:240] < 128).any(axis=(1, 2)))
    image[rows[0] - 3, 212] = 0
    look = imaging.full_size_analysis(image)
    assert any(box[0] >= 200 and box[1] >= rows[0] for box, _ in look.glyphs.words)
    assert look.mask[rows[0] - 3, 212] == 0


def test_seam_splitter_runs_after_the_rules(monkeypatch: pytest.MonkeyPatch) -> None:

    rng = np.random.default_rng(11)
    image = canvas(300, 200)
    image[20:180, 20:280] = texture(rng, 260, 160, 120)
    calls: list[list[tuple[int, int, int, int]]] = []

    def halve(rgb: np.ndarray, boxes: list[tuple[int, int, int, int]], **kwargs: object) -> list:
        calls.append(boxes)
        x1, y1, x2, y2 = boxes[0]
        return [(x1, y1, (x1 + x2) // 2, y2), *boxes[1:], ((x1 + x2) // 2, y1, x2, y2)]

    monkeypatch.setattr(segment, "split_boxes", halve)
    rules = segment_panels(image, seams=False)
    assert [p.box for p in rules] == [(20.0, 20.0, 280.0, 180.0)] and not calls
    split = segment_panels(image)
    assert calls == [[(20, 20, 280, 180)]]
    assert [p.box for p in split] == [(20.0, 20.0, 150.0, 180.0), (150.0, 20.0, 280.0, 180.0)]
    assert split[0].confidence == rules[0].confidence


def test_a_line_thin_part_is_no_panel_and_the_count_cuts_again(monkeypatch: pytest.MonkeyPatch) -> None:
    # the seam splitter cutting beside a panel's outline can leave one line of it as a part; it
    # must not count as a panel, or the caption's count looks met while two panels stay joined
    rng = np.random.default_rng(3)
    image = canvas(820, 320)
    image[10:310, 10:410] = texture(rng, 400, 300, 60)
    image[10:310, 410:810] = texture(rng, 400, 300, 150)

    def joined_plus_line(*args: object) -> list:
        whole = segment.PanelCandidate(box=(10.0, 10.0, 810.0, 310.0), confidence=0.9)
        line = segment.PanelCandidate(box=(410.0, 310.0, 810.0, 311.0), confidence=0.7)
        return [whole, line]

    monkeypatch.setattr(segment, "_split_seams", joined_plus_line)
    predicted = segment_panels(image, named=2)
    assert all(min(p.box[2] - p.box[0], p.box[3] - p.box[1]) >= segment.MIN_SIDE for p in predicted)
    assert_matches(predicted, [(10.0, 10.0, 410.0, 310.0), (410.0, 10.0, 810.0, 310.0)], 0.95)
