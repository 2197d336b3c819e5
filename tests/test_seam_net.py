"""The panel-boundary network: target encoding, line strengths read from the maps, the shipped
weights (loading, errors, what they see on a two-panel figure made here) and the training entry
point (a CPU smoke run on tiny generated figures)."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from p2p.mining.cpu.segmentation import seam_net
from p2p.mining.cpu.segmentation.seam_net import (
    MAPS,
    STRIDE,
    BoundaryMaps,
    SeamNet,
    SeamNetError,
    boundary_maps,
    encode_targets,
    load_weights,
    save_weights,
)
from tests.helpers import run_module


def _maps_of_truth(boxes: list[tuple[int, int, int, int]], h: int, w: int, scale: float) -> BoundaryMaps:
    """A perfect network output for panels ``boxes`` of an ``h`` x ``w`` figure seen at ``scale``."""
    ch, cw = -(-round(h * scale) // STRIDE) * STRIDE, -(-round(w * scale) // STRIDE) * STRIDE
    t = encode_targets(boxes, ch, cw, scale)
    return BoundaryMaps(vertical=t[0], horizontal=t[1], interior=t[2], scale=scale)


def test_targets_put_thin_lines_on_the_panel_edges():
    # Two panels touching at x = 200 (left one 0..199 inclusive), 400 x 160 px, copy at half size.
    boxes = [(0, 0, 200, 160), (200, 0, 400, 160)]
    t = encode_targets(boxes, 80, 200, 0.5)
    assert t.shape == (len(MAPS), 20, 50)
    # x = 200 px -> 100 copy px -> the grid line between cells 24 and 25: both near 1, one line.
    vertical = t[0].mean(axis=0)
    assert vertical[24] == pytest.approx(vertical[25]) and vertical[24] > 0.7
    assert vertical[10:22].max() < 0.01 and vertical[28:47].max() < 0.01
    assert t[1][:, 10].argmax() in (0, 19) and t[1][5:15].max() < 0.01
    assert t[2][5:15, 5:45].min() == 1.0


def test_line_strength_is_high_on_the_seam_and_low_inside_a_panel():
    boxes = [(0, 0, 200, 160), (200, 0, 400, 160)]
    maps = _maps_of_truth(boxes, 160, 400, 0.5)
    union = (0, 0, 400, 160)
    strength = maps.line_strength(union, 0, np.arange(20, 380))
    assert strength.shape == (360,)
    assert strength[200 - 20] > 0.7 and strength[197 - 20] > 0.7  # forgiven: a cell either side
    assert strength[100 - 20] < 0.01 and strength[300 - 20] < 0.01
    # the plateau of the strongest lines is the seam's cells and one either side (8 px each)
    assert int(np.argmax(strength)) + 20 in range(176, 225)
    # Horizontal lines through the same box: none is a boundary.
    assert maps.line_strength(union, 1, np.arange(40, 120)).max() < 0.01
    share = maps.line_share(union, 0, np.array([100, 200]))
    assert share.tolist() == [0.0, 1.0]
    # A line counted only within the box: the right panel alone has no line at its middle.
    assert maps.line_strength((200, 0, 400, 160), 0, np.array([100]))[0] < 0.01


def test_boundary_maps_cover_the_figure_at_stride_four(tmp_path):
    net = SeamNet()
    net.eval()
    rgb = np.full((300, 700, 3), 255, np.uint8)
    maps = boundary_maps(rgb, net)
    scale = seam_net.SIDE / 700
    assert maps.scale == pytest.approx(scale)
    assert maps.vertical.shape == (-(-round(300 * scale) // STRIDE), seam_net.SIDE // STRIDE)
    assert maps.horizontal.shape == maps.vertical.shape == maps.interior.shape
    assert maps.vertical.min() >= 0.0 and maps.vertical.max() <= 1.0


def test_missing_bad_or_foreign_weights_name_the_file_and_the_rebuild(tmp_path):
    missing = tmp_path / "none.pt"
    with pytest.raises(SeamNetError, match=r"none\.pt.*train_seam_net"):
        load_weights(missing)
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a torch file")
    with pytest.raises(SeamNetError, match=r"garbage\.pt.*train_seam_net"):
        load_weights(garbage)
    foreign = tmp_path / "foreign.pt"
    torch.save({"arch": "something-else", "state_dict": {}}, foreign)
    with pytest.raises(SeamNetError, match=r"foreign\.pt"):
        load_weights(foreign)


def test_weights_are_written_by_the_shared_atomic_writer(tmp_path, monkeypatch):
    """``nets.save_atomic`` (tested there: a write cut short leaves the old file whole)."""
    written: list[Path] = []
    real = seam_net.save_atomic

    def recording(blob: dict, path: Path) -> None:
        written.append(path)
        real(blob, path)

    monkeypatch.setattr(seam_net, "save_atomic", recording)
    path = tmp_path / "w.pt"
    save_weights(SeamNet(), path, {"steps": 1})
    assert written == [path]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.pt"]
    assert torch.load(path, weights_only=True)["meta"] == {"steps": 1}


def test_batchnorm_folding_keeps_the_output(tmp_path):
    torch.manual_seed(0)
    net = SeamNet()
    net.eval()
    x = torch.randn(1, 3, 64, 96)
    with torch.no_grad():
        expected = net(x)
    path = tmp_path / "w.pt"
    save_weights(net, path, {"note": "test"})
    with torch.no_grad():
        got = load_weights(path)(x)
    assert torch.allclose(got, expected, atol=1e-4)


def test_sampler_mirrors_the_targets_with_the_image():
    from p2p.mining.lab.train_seam_net import Figure, Sampler

    rgb = np.full((96, 128, 3), 255, np.uint8)
    rgb[:, :40] = 30  # a dark panel on the left, a white one on the right
    figure = Figure(rgb, [(0.0, 0.0, 40.0, 96.0), (40.0, 0.0, 128.0, 96.0)])
    sampler = Sampler([figure], 128, seed=3, jitter=0.0)
    for _ in range(6):
        image, target = sampler.sample()
        dark_columns = np.flatnonzero(image[48, :, 0] < 100)
        edge = dark_columns.max() + 1 if dark_columns.min() == 0 else dark_columns.min()
        assert target[0].mean(axis=0)[[edge // STRIDE - 1, edge // STRIDE]].max() > 0.5


def _two_panel_figure() -> tuple[np.ndarray, int]:
    """A grey micrograph-like panel touching a dark one at x = 400; the grey one holds a bright
    tall cell whose sides (x = 200 and 320) are strong colour steps inside the panel."""
    rng = np.random.default_rng(0)
    rgb = np.empty((480, 640, 3), np.uint8)
    left = rng.normal(120, 20, (480, 400, 1)).repeat(3, axis=2)
    cell = np.zeros((480, 400), np.uint8)
    cv2.ellipse(cell, (260, 240), (60, 200), 0, 0, 360, 1, -1)
    left[cell > 0] += 90
    rgb[:, :400] = np.clip(left, 0, 255)
    rgb[:, 400:] = np.clip(rng.normal(40, 20, (480, 240, 3)), 0, 255).astype(np.uint8)
    return rgb, 400


def test_shipped_weights_see_a_seam_between_touching_panels_not_inside_one():
    rgb, seam = _two_panel_figure()
    maps = boundary_maps(rgb)
    strength = maps.line_strength((0, 0, 640, 480), 0, np.array([seam, 200, 320, 100]))
    assert strength[0] > max(strength[1:]), strength


def test_shipped_net_is_loaded_once():
    assert seam_net.shipped_net() is seam_net.shipped_net()


def test_training_command_makes_figures_and_writes_loadable_weights(tmp_path):
    """The real command on two tiny generated figures (seed of the training range only)."""
    data, weights = tmp_path / "figs", tmp_path / "w.pt"
    args = ["--data", str(data), "--figures", "2", "--data-seed", "140001", "--steps", "2", "--batch", "2",
            "--patch", "64", "--report-every", "1"]  # fmt: skip
    done = run_module("p2p.mining.lab.train_seam_net", *args, "--out", str(weights))
    assert done.returncode == 0, done.stderr
    assert "2 figures" in done.stdout and "step 2/2" in done.stdout
    assert torch.load(weights, weights_only=True)["meta"]["steps"] == 2
    load_weights(weights)
    from p2p.mining.lab.train_seam_net import main

    with pytest.raises(SystemExit):
        main([*args[:4], "--data-seed", "1001", "--out", str(tmp_path / "dev.pt")])


def test_training_is_deterministic_given_the_seed():
    from p2p.mining.lab.train_seam_net import Figure, Settings, train

    rgb, seam = _two_panel_figure()
    figure = Figure(rgb[::4, ::4].copy(), [(0.0, 0.0, seam / 4, 120.0), (seam / 4, 0.0, 160.0, 120.0)])
    settings = Settings(steps=3, batch=2, patch=64, seed=7)
    a = train([figure], settings, report_every=100).state_dict()
    b = train([figure], settings, report_every=100).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_the_miner_loads_the_network_at_start():
    from p2p.mining.pipeline import CpuMiner

    seam_net.shipped_net.cache_clear()
    CpuMiner(load_text_encoder=False)
    assert seam_net.shipped_net.cache_info().currsize == 1
