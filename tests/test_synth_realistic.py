"""The generator's realistic profile (truth in the real set's conventions, sizes, transparency),
the classic profile left as it was, and transparent figures mined as on white paper."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import typer
from PIL import Image
from typer.testing import CliRunner

from p2p.mining.lab.synth import generate_figure, load_annotations, write_dataset
from p2p.mining.lab.synth.cli import synth_command
from p2p.mining.lab.synth.realistic import SIZE_CLASSES
from p2p.shared.images import flatten_on_white

MEDIUM = {"size_class": "medium", "long_side": 900, "jpeg": False, "transparent": False}


def _contains(outer: list[int], inner: list[int]) -> bool:
    return outer[0] <= inner[0] and outer[1] <= inner[1] and inner[2] <= outer[2] and inner[3] <= outer[3]


def _overlaps(a: list[int], b: list[int]) -> bool:
    return a[0] <= b[2] and b[0] <= a[2] and a[1] <= b[3] and b[1] <= a[3]


def _one(kind: str, seed: int, **options: Any) -> tuple[Image.Image, dict[str, Any], dict[str, Any]]:
    image, truth = generate_figure(
        seed, profile="realistic", kinds=(kind,), labelled=True, **MEDIUM, **options
    )
    assert len(truth["panels"]) == 1
    return image, truth["panels"][0], truth["synth"]["blocks"][0]


def _ink(image: Image.Image, box: list[int]) -> bool:
    x0, y0, x1, y1 = box
    return bool((np.asarray(image.convert("RGB"))[y0 : y1 + 1, x0 : x1 + 1].min(axis=2) < 200).any())


# -- each layout's truth follows the real set's conventions ---------------------------------------


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_grid_under_one_letter_is_one_panel_with_its_headers_outside_the_box(seed: int) -> None:
    image, panel, block = _one("grid", seed)
    tiles, headers = block["parts"]["subimages"], block["parts"]["headers"]
    assert panel["label"] in ("A", "a") and panel["type"] == "image"
    assert len(tiles) >= 2 and headers
    assert all(_contains(panel["box"], t) for t in tiles)
    xs0, ys0 = min(t[0] for t in tiles), min(t[1] for t in tiles)
    xs1, ys1 = max(t[2] for t in tiles), max(t[3] for t in tiles)
    assert panel["box"] == [xs0, ys0, xs1, ys1]  # the union of the image extents, nothing more
    assert all(_contains(panel["outer_box"], h) for h in headers)
    assert all(not _contains(panel["box"], h) for h in headers)
    assert all(_ink(image, h) for h in headers)


def test_several_plots_under_one_letter_are_one_plot_panel() -> None:
    for seed in range(4):
        _, panel, block = _one("plots", seed)
        plots = block["parts"]["subplots"]
        assert panel["type"] == "plot" and len(plots) >= 2
        assert all(_contains(panel["box"], p) for p in plots)
        for title in block["parts"]["titles"]:  # subplot titles: outer_box only
            assert _contains(panel["outer_box"], title) and not _contains(panel["box"], title)


def test_a_blot_with_a_chart_is_one_mixed_panel_holding_both() -> None:
    _, panel, block = _one("blot_chart", 5)
    assert panel["subtypes"] == ["plot", "image"]
    assert _contains(panel["box"], block["parts"]["chart"][0])
    assert _contains(panel["box"], block["parts"]["blot"][0])
    assert "outer_box" not in panel  # the blot rule: everything under the letter is in box


def test_a_colour_bar_is_in_the_outer_box_only() -> None:
    image, panel, block = _one("colour_bar", 6)
    bar = block["parts"]["colour_bar"][0]
    assert _contains(panel["outer_box"], bar) and not _overlaps(panel["box"], bar)
    assert _ink(image, bar)


def test_a_heading_is_above_the_box_and_inside_the_outer_box() -> None:
    headed = []
    for seed in range(40):
        _, truth = generate_figure(seed, profile="realistic", kinds=("plot", "schematic"), **MEDIUM)
        headed += [
            (p, b["heading"])
            for p, b in zip(truth["panels"], truth["synth"]["blocks"], strict=True)
            if b["heading"]
        ]
    assert headed
    for panel, heading in headed:
        assert heading[3] < panel["box"][1]
        assert _contains(panel["outer_box"], heading)
        assert panel["box"][0] <= heading[0] and heading[2] <= panel["box"][2]


def test_an_unlabelled_single_diagram_is_one_schematic_panel() -> None:
    image, truth = generate_figure(4, profile="realistic", kinds=("schematic",), labelled=False, **MEDIUM)
    assert [(p["label"], p["type"]) for p in truth["panels"]] == [(None, "schematic")]
    assert truth["label_boxes"] == []
    assert _ink(image, truth["panels"][0]["box"])


def test_label_boxes_hold_ink_outside_their_panels() -> None:
    image, truth = generate_figure(9, profile="realistic", **MEDIUM, labelled=True)
    assert [lb["label"] for lb in truth["label_boxes"]] == [p["label"] for p in truth["panels"]]
    for lb, panel in zip(truth["label_boxes"], truth["panels"], strict=True):
        assert _ink(image, lb["box"])
        assert not _overlaps(lb["box"], panel.get("outer_box", panel["box"]))


# -- sizes, JPEG web copies, transparency ------------------------------------------------------------


@pytest.mark.parametrize("size_class", sorted(SIZE_CLASSES))
def test_sizes_are_in_their_class(size_class: str) -> None:
    lo, hi = SIZE_CLASSES[size_class]
    for seed in (11, 12):
        image, truth = generate_figure(
            seed, profile="realistic", size_class=size_class, kinds=("plot", "image")
        )
        assert lo <= max(image.size) <= hi
        assert (truth["width"], truth["height"]) == image.size
        for panel in truth["panels"]:
            assert 0 <= panel["box"][0] <= panel["box"][2] < image.width
            assert 0 <= panel["box"][1] <= panel["box"][3] < image.height
        if size_class == "web":
            assert truth["synth"]["jpeg_quality"] is not None  # web copies are JPEG


def test_a_transparent_figure_has_a_clear_background_and_opaque_content() -> None:
    image, truth = generate_figure(
        13, profile="realistic", kinds=("images", "plot"), **{**MEDIUM, "transparent": True}
    )
    assert image.mode == "RGBA" and truth["synth"]["transparent"]
    pixels = np.asarray(image)
    assert pixels[0, 0, 3] == 0 and (pixels[..., 3] == 0).mean() > 0.2
    x0, y0, x1, y1 = truth["panels"][0]["box"]  # an image panel: opaque throughout
    assert (pixels[y0 : y1 + 1, x0 : x1 + 1, 3] == 255).all()
    assert (pixels[pixels[..., 3] == 0][:, :3] == 0).all()  # stored black, as exporters do


def test_realistic_figures_are_determined_by_their_seed() -> None:
    a, ta = generate_figure(21, profile="realistic")
    b, tb = generate_figure(21, profile="realistic")
    assert a.tobytes() == b.tobytes() and ta == tb
    c, _ = generate_figure(22, profile="realistic")
    assert c.tobytes() != a.tobytes()


def test_bad_profile_and_options_are_refused() -> None:
    with pytest.raises(ValueError, match="profile"):
        generate_figure(1, profile="photoreal")
    with pytest.raises(TypeError, match="realistic"):
        generate_figure(1, profile="realistic", width=500)
    with pytest.raises(ValueError, match="kinds"):
        generate_figure(1, profile="realistic", kinds=("pie",))
    with pytest.raises(ValueError, match="size_class"):
        generate_figure(1, profile="realistic", size_class="huge")


# -- the classic profile is unchanged ------------------------------------------------------------------

# Recorded at the commit before the realistic profile existed (bc7220d).
CLASSIC_DIGESTS = {
    "fig3": "78ae6fbc0c3fc0cae8de80afacc8f4d86fc6c1614487587d4a8960f737c5dd90",
    "fig11": "08b0967132d8f89d0bc3e7065409db77ba8352408942f1fb9d1e3b8f2307241b",
    "fig2024": "cc1830fd6362510330952a5c9859b95e44da6bc35176c3587acb95105cfc2c1c",
    "dataset77": "16dc4501e52b2b4e2b92d4c7d023681771868c290f02a3e722688f5bcc6f5322",
}


def test_the_classic_profile_draws_what_it_drew(tmp_path: Path) -> None:
    got = {}
    for seed, options in [
        (3, {}),
        (11, {"width": 700, "height": 500}),
        (2024, {"width": 900, "height": 640, "n_panels": 6, "jpeg_quality": 70}),
    ]:
        image, truth = generate_figure(seed, **options)
        pixels = np.asarray(image)
        text = json.dumps(truth, sort_keys=True, ensure_ascii=False)
        got[f"fig{seed}"] = hashlib.sha256(
            pixels.tobytes() + repr(pixels.shape).encode() + text.encode()
        ).hexdigest()
    write_dataset(tmp_path, 3, 77, size=(640, 480))
    files = hashlib.sha256()
    for path in sorted(tmp_path.iterdir()):
        files.update(path.name.encode() + path.read_bytes())
    got["dataset77"] = files.hexdigest()
    assert got == CLASSIC_DIGESTS
    _, explicit = generate_figure(3, profile="classic")
    _, default = generate_figure(3)
    assert explicit == default


# -- the dataset writer and CLI --------------------------------------------------------------------------


def test_cli_writes_a_realistic_set(tmp_path: Path) -> None:
    app = typer.Typer()
    app.command()(synth_command)
    runner = CliRunner()
    out = tmp_path / "real-like"
    result = runner.invoke(app, [str(out), "--profile", "realistic", "--count", "3", "--seed", "8"])
    assert result.exit_code == 0, result.output
    entries = load_annotations(out)
    assert len(entries) == 3
    for name, entry in entries.items():
        assert entry["synth"]["profile"] == "realistic"
        assert name.endswith(".jpg") == (entry["synth"]["jpeg_quality"] is not None)
        with Image.open(out / name) as image:
            assert image.size == (entry["width"], entry["height"])
            assert (image.mode == "RGBA") == entry["synth"]["transparent"]
    again = write_dataset(tmp_path / "again", 3, 8, profile="realistic")
    assert [p.read_bytes() for p in again] == [(out / p.name).read_bytes() for p in again]
    bad = runner.invoke(app, [str(tmp_path / "x"), "--profile", "fancy"])
    assert bad.exit_code != 0 and "profile" in bad.output


# -- transparency at every decode that feeds the miner ----------------------------------------------


@pytest.fixture(scope="module")
def transparent_figure() -> tuple[bytes, np.ndarray, str]:
    """A small realistic figure as a transparent PNG, and the RGB it was drawn as."""
    from p2p.mining.lab.synth.realistic import generate_realistic

    drawn, truth = generate_realistic(
        17, kinds=("plot", "images", "schematic"), labelled=True, size_class="medium", long_side=720
    )
    assert drawn.mode == "RGB"
    from p2p.mining.lab.synth.realistic import with_transparent_background

    buffer = io.BytesIO()
    with_transparent_background(drawn).save(buffer, format="PNG")
    return buffer.getvalue(), np.asarray(drawn), truth["caption"]


def test_flatten_on_white_restores_the_figure(transparent_figure: tuple[bytes, np.ndarray, str]) -> None:
    data, drawn, _ = transparent_figure
    with Image.open(io.BytesIO(data)) as image:
        assert image.mode == "RGBA"
        assert (np.asarray(flatten_on_white(image)) == drawn).all()
        dropped = np.asarray(image.convert("RGB"))
    assert (dropped[0, 0] == 0).all()  # what dropping alpha shows: a black page


def test_flatten_on_white_reads_palette_and_grey_transparency() -> None:
    grey = Image.new("LA", (4, 3), (0, 0))
    assert (np.asarray(flatten_on_white(grey)) == 255).all()
    palette = Image.new("P", (4, 3), 0)
    palette.putpalette([0, 0, 0, 200, 10, 10] + [0] * 762)
    palette.putpixel((1, 1), 1)
    palette.info["transparency"] = 0
    flat = np.asarray(flatten_on_white(palette))
    assert (flat[0, 0] == 255).all() and tuple(flat[1, 1]) == (200, 10, 10)
    rgb = Image.new("RGB", (2, 2), (1, 2, 3))
    assert (np.asarray(flatten_on_white(rgb)) == 1 + np.arange(3)).all()


def test_a_transparent_figure_mines_like_its_flattened_copy(
    tmp_path: Path, transparent_figure: tuple[bytes, np.ndarray, str]
) -> None:
    from p2p.cli.mine_local import load_rgb
    from p2p.mining.jobs import _decode
    from p2p.mining.lab.eval_panels import load_image
    from p2p.mining.pipeline import CpuMiner

    data, drawn, caption = transparent_figure
    path = tmp_path / "figure.png"
    path.write_bytes(data)
    for decoded in (_decode(data), load_rgb(path), load_image(path)):
        assert (decoded == drawn).all()
    miner = CpuMiner()
    flat = miner.mine(load_rgb(path), caption)
    reference = miner.mine(drawn, caption)
    assert [(p.box, p.label) for p in flat.panels] == [(p.box, p.label) for p in reference.panels]
    assert reference.panels


def test_the_evaluator_reads_transparent_figures_on_white(
    tmp_path: Path, transparent_figure: tuple[bytes, np.ndarray, str]
) -> None:
    from p2p.mining.lab.evaluate import evaluate_folder
    from p2p.mining.types import MiningResult

    data, drawn, caption = transparent_figure
    (tmp_path / "figure.png").write_bytes(data)
    truth = {"width": drawn.shape[1], "height": drawn.shape[0], "panels": [], "caption": caption}
    (tmp_path / "annotations.json").write_text(json.dumps({"figure.png": truth}))
    seen: list[np.ndarray] = []

    def miner(image: np.ndarray, text: str) -> MiningResult:
        seen.append(image)
        return MiningResult(
            width=image.shape[1],
            height=image.shape[0],
            panels=[],
            markers=[],
            regions=[],
            stage_seconds={},
            notes=[],
        )

    evaluate_folder(tmp_path, miner)
    assert len(seen) == 1 and (seen[0] == drawn).all()


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_a_sub_labelled_grid_is_one_panel_per_picture_with_its_own_label(seed: int) -> None:
    image, truth = generate_figure(
        seed, profile="realistic", kinds=("plot", "sub_grid"), labelled=True, **MEDIUM
    )
    block = truth["synth"]["blocks"][1]
    tiles = block["parts"]["subimages"]
    subs = truth["panels"][1:]
    letter = truth["panels"][0]["label"]
    group = chr(ord(letter) + 1)
    assert [p["label"] for p in subs] == [f"{group}{k + 1}" for k in range(len(tiles))]
    assert [p["box"] for p in subs] == tiles and all(p["type"] == "image" for p in subs)
    boxes = {lb["label"]: lb["box"] for lb in truth["label_boxes"]}
    for panel in subs:
        assert _ink(image, boxes[panel["label"]])
        inside = _contains(panel["box"], boxes[panel["label"]])
        assert inside == block["words"]["inside"]
    assert f"({group}1" in truth["caption"]
    assert all(truth["subcaptions"][p["label"]] in truth["caption"] for p in subs)
