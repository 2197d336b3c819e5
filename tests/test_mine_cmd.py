"""`p2p mine` (local mining without a server), `p2p eval mining --split`, and mining large
figures at a bounded working resolution."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from p2p.cli import app
from p2p.cli.mine_local import load_rgb
from p2p.ingest.samples import make_figure
from p2p.mining.cpu.working_scale import map_back, shrink
from p2p.mining.types import Marker, MinedPanel, MiningResult, Region

runner = CliRunner()


def _sample(folder: Path, seed: int, caption_kind: str) -> Path:
    sample = make_figure(seed)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"figure{seed}.png"
    path.write_bytes(sample.image)
    if caption_kind == "txt":
        path.with_suffix(".txt").write_text(sample.caption)
    elif caption_kind == "json":
        path.with_suffix(".json").write_text(json.dumps({"caption": sample.caption}))
    return path


def test_mine_prints_json_per_figure_and_draws_boxes(tmp_path: Path) -> None:
    folder = tmp_path / "figures"
    first = _sample(folder, 3, "txt")
    _sample(folder, 4, "json")
    drawn = tmp_path / "drawn"
    result = runner.invoke(app, ["mine", str(folder), "--json", "--draw", str(drawn)])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert [Path(line["file"]).name for line in lines] == ["figure3.png", "figure4.png"]
    for line in lines:
        assert line["miner"]["backend"] == "cpu" and line["miner"]["version"]
        assert line["caption"]  # read from NAME.txt / NAME.json beside the image
        assert len(line["panels"]) >= 2
        panel = line["panels"][0]
        assert set(panel) >= {"label", "box", "subcaption", "figure_type", "confidence", "regions"}
        assert 0 <= panel["box"][0] < panel["box"][2] <= line["width"]
    assert first.read_bytes() and (drawn / "figure3.png").is_file() and (drawn / "figure4.png").is_file()
    with Image.open(drawn / "figure3.png") as img:
        assert np.asarray(img.convert("RGB"))[..., 0].max() == 255  # the red boxes are there
    # the table view, with the caption given on the command line
    table = runner.invoke(app, ["mine", str(first), "--caption", "(A) One. (B) Two."])
    assert table.exit_code == 0, table.output
    assert "figure3.png" in table.stdout and "label" in table.stdout


def test_mine_reports_bad_input(tmp_path: Path) -> None:
    assert runner.invoke(app, ["mine", str(tmp_path / "missing.png")]).exit_code == 2
    (tmp_path / "notes.csv").write_text("a,b\n")
    assert runner.invoke(app, ["mine", str(tmp_path / "notes.csv")]).exit_code == 2
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"not a png")
    outcome = runner.invoke(app, ["mine", str(broken)])
    assert outcome.exit_code == 1 and "cannot be read" in " ".join(outcome.output.split())


def test_transparent_png_is_read_on_white(tmp_path: Path) -> None:
    rgba = np.zeros((20, 30, 4), dtype=np.uint8)  # fully transparent black
    rgba[5:10, 5:10] = (200, 0, 0, 255)
    path = tmp_path / "clear.png"
    Image.fromarray(rgba, "RGBA").save(path)
    rgb = load_rgb(path)
    assert rgb.shape == (20, 30, 3)
    assert (rgb[0, 0] == 255).all() and tuple(rgb[7, 7]) == (200, 0, 0)


def test_eval_mining_scores_one_split_with_ap_counts_and_buckets(tmp_path: Path) -> None:
    out = tmp_path / "synthetic"
    assert runner.invoke(app, ["synth", str(out), "--count", "3", "--seed", "99"]).exit_code == 0
    names = sorted(k for k in json.loads((out / "annotations.json").read_text()) if not k.startswith("_"))
    (out / "splits.json").write_text(json.dumps({"_notes": "x", "tune": names[:2], "check": names[2:]}))
    report_path = tmp_path / "report.json"
    result = runner.invoke(
        app,
        ["eval", "mining", "--dir", str(out), "--split", "tune", "--out", str(report_path), "--no-reference"],
    )
    assert result.exit_code == 0, result.output
    cpu = json.loads(report_path.read_text())["cpu"]
    assert cpu["figures"] == 2
    assert 0.0 <= cpu["coco"]["panels_ap50_95"] <= cpu["coco"]["panels_ap50"] <= 1.0
    assert cpu["counts"]["exact"] + cpu["counts"]["too_many"] + cpu["counts"]["too_few"] == 2
    assert set(cpu["buckets"]["counts"]) >= {"split grid", "heading glued", "loose box", "missed label"}
    assert "AP" in result.output or "ap50" in result.output
    bad = runner.invoke(app, ["eval", "mining", "--dir", str(out), "--split", "holdout", "--no-reference"])
    assert bad.exit_code == 2 and "holdout" in bad.output


def test_large_figures_are_mapped_back_exactly() -> None:
    assert shrink(np.zeros((300, 200, 3), np.uint8), 400) is None
    small = shrink(np.zeros((1000, 3000, 3), np.uint8), 1200)
    assert small is not None and small.shape[:2] == (400, 1200)
    found = MiningResult(
        width=1200,
        height=400,
        panels=[MinedPanel((0, 0, 600, 400), "A", (2, 2, 12, 14), "image", 0.9, 0.9)],
        markers=[Marker("arrow", (10, 10, 20, 20), (30.0, 40.0), (25, 35, 35, 45), 0.8)],
        regions=[Region(0, (600, 100, 1200, 400), "marker", "arrow", None, 0.7)],
        stage_seconds={},
        notes=[],
    )
    back = map_back(found, 3000, 1000)
    assert (back.width, back.height) == (3000, 1000)
    assert back.panels[0].box == (0.0, 0.0, 1500.0, 1000.0)
    assert back.panels[0].label_box == (5.0, 5.0, 30.0, 35.0)
    assert back.markers[0].target_point == (75.0, 100.0)
    assert back.regions[0].box == (1500.0, 250.0, 3000.0, 1000.0)
    assert back.notes and "1200x400" in back.notes[-1]


@pytest.mark.parametrize("max_side", [500])
def test_the_miner_shrinks_a_large_figure_and_answers_in_its_pixels(
    max_side: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    from p2p.mining.pipeline import CpuMiner

    monkeypatch.setattr("p2p.mining.pipeline.MAX_SIDE", max_side)

    sample = make_figure(5, panel_size=(640, 520))
    image = np.asarray(Image.open(io.BytesIO(sample.image)).convert("RGB"))
    assert max(image.shape[:2]) > max_side
    result = CpuMiner(load_text_encoder=False).mine(image, sample.caption)
    assert (result.width, result.height) == (image.shape[1], image.shape[0])
    assert any("mapped back" in note for note in result.notes)
    assert len(result.panels) >= 2
    for panel in result.panels:
        assert 0 <= panel.box[0] < panel.box[2] <= image.shape[1]
        assert 0 <= panel.box[1] < panel.box[3] <= image.shape[0]


def test_eval_mining_scores_shrunk_copies_against_the_full_size_truth(tmp_path: Path) -> None:
    from p2p.mining.lab.evaluate import shrunk

    seen: list[tuple[int, int]] = []

    def whole(image: np.ndarray, caption: str) -> MiningResult:
        seen.append(image.shape[:2])
        height, width = image.shape[:2]
        panel = MinedPanel((0.0, 0.0, float(width), float(height)), None, None, "image", 0.9, 0.9)
        return MiningResult(width, height, [panel], [], [], {}, [])

    result = shrunk(whole, 300)(np.zeros((600, 900, 3), np.uint8), "")
    assert seen == [(200, 300)] and result.panels[0].box == (0.0, 0.0, 900.0, 600.0)
    assert shrunk(whole, 300)(np.zeros((100, 120, 3), np.uint8), "").width == 120  # small: as is
    out = tmp_path / "synthetic"
    assert runner.invoke(app, ["synth", str(out), "--count", "2", "--seed", "5"]).exit_code == 0
    report_path = tmp_path / "report.json"
    args = ["eval", "mining", "--dir", str(out), "--out", str(report_path), "--shrink-to", "240"]
    result_cli = runner.invoke(app, args)
    assert result_cli.exit_code == 0, result_cli.output
    report = json.loads(report_path.read_text())
    assert report["cpu"]["shrink_to"] == 240 and report["naive_xycut"]["shrink_to"] == 240
    assert report["cpu"]["figures"] == 2
    assert any("boxes mapped back" in " ".join(f["notes"]) for f in report["cpu"]["per_figure"])
    assert runner.invoke(app, [*args[:-1], "4"]).exit_code == 2  # no copy smaller than 8 px
