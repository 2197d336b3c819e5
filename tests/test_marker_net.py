"""The learned marker detector: decoding of its outputs, the shipped weights (loading, errors,
what they find on a generated figure of a seed not used in training), the fusion with the
rule-based detector and the training entry point (a CPU smoke run on tiny generated figures)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from p2p.mining.cpu import marker_net
from p2p.mining.cpu.marker_net import (
    KINDS,
    N_OUT,
    STRIDE,
    MarkerNet,
    MarkerNetError,
    decode,
    encode_targets,
    load_weights,
    save_weights,
)
from p2p.mining.cpu.markers import detect_markers

MARKERS = [
    {
        "kind": "arrow",
        "point": (41.0, 30.0),
        "target": (38.0, 27.0, 70.0, 52.0),
        "glyph": (10.0, 5.0, 42.0, 31.0),
        "direction": 35.0,
    },
    {
        "kind": "asterisk",
        "point": (102.5, 90.25),
        "target": (80.0, 95.0, 120.0, 126.0),
        "glyph": (96.0, 84.0, 109.0, 97.0),
        "direction": None,
    },
    {
        "kind": "box",
        "point": (64.0, 100.0),
        "target": (30.0, 70.0, 98.0, 130.0),
        "glyph": (29.0, 69.0, 99.0, 131.0),
        "direction": None,
    },
]


def _as_output(markers: list[dict], h: int, w: int) -> np.ndarray:
    """A perfect network output for ``markers``: the encoded targets themselves."""
    heat, reg, _, _ = encode_targets(markers, h, w)
    return np.concatenate([heat, reg], axis=0)


def test_decode_inverts_the_targets():
    out = _as_output(MARKERS, 128, 160)
    assert out.shape == (N_OUT, 128 // STRIDE, 160 // STRIDE)
    found = decode(out, threshold=0.5)
    assert sorted(m.kind for m in found) == sorted(m["kind"] for m in MARKERS)
    for truth in MARKERS:
        got = next(m for m in found if m.kind == truth["kind"])
        assert got.point == pytest.approx(truth["point"], abs=1e-4)
        # A target box beside its point (the asterisk's) is stretched to reach the point.
        px, py = truth["point"]
        t = truth["target"]
        stretched = (min(t[0], px), min(t[1], py), max(t[2], px), max(t[3], py))
        assert got.target == pytest.approx(stretched, abs=1e-3)
        assert got.glyph == pytest.approx(truth["glyph"], abs=1e-3)
        if truth["direction"] is None:
            assert got.direction is None
        else:
            assert got.direction == pytest.approx(truth["direction"], abs=1e-3)


def test_decode_keeps_peaks_above_the_threshold_best_first():
    out = _as_output(MARKERS, 128, 160)
    out[KINDS.index("box")] *= 0.4  # a weak box peak
    found = decode(out, threshold=0.5)
    assert [m.kind for m in found] == ["arrow", "asterisk"] or [m.kind for m in found] == [
        "asterisk",
        "arrow",
    ]
    found = decode(out, threshold=0.3)
    assert found[-1].kind == "box" and found[-1].score == pytest.approx(0.4)
    assert len(decode(out, threshold=0.3, top_k=1)) == 1
    # The Gaussian around a peak is not read as more markers.
    assert len(decode(out, threshold=0.01)) == 3


def test_network_markers_come_back_in_figure_pixels(monkeypatch):
    """A marker the rules do not see, on a panel at (100, 50) of the figure: the network's crop
    coordinates are shifted to figure pixels and its target box is the reported one."""
    panel = np.full((128, 160, 3), 120, np.uint8)
    figure = np.full((300, 400, 3), 255, np.uint8)
    figure[50:178, 100:260] = panel
    star = {
        "kind": "star",
        "point": (80.0, 60.0),
        "target": (70.0, 50.0, 95.0, 75.0),
        "glyph": (76.0, 56.0, 85.0, 65.0),
        "direction": None,
    }

    def fake_run(net, rgb):
        assert rgb.shape == (128, 160, 3)
        return _as_output([star], 128, 160)

    monkeypatch.setattr(marker_net, "run_net", fake_run)
    monkeypatch.setattr(marker_net, "shipped_net", lambda: None)
    found = detect_markers(figure, (100.0, 50.0, 260.0, 178.0))
    assert len(found) == 1
    m = found[0]
    assert m.kind == "star"
    assert m.target_point == pytest.approx((180.0, 110.0), abs=1e-3)
    assert m.target_box == pytest.approx((170.0, 100.0, 195.0, 125.0), abs=1e-3)
    assert m.glyph_box == pytest.approx((176.0, 106.0, 185.0, 115.0), abs=1e-3)
    assert detect_markers(figure, (100.0, 50.0, 260.0, 178.0), use_net=False) == []


def test_shipped_weights_fit_and_are_small():
    path = marker_net.weights_path()
    assert path.is_file(), path
    assert path.stat().st_size < 2_000_000
    net = load_weights(path)
    out = marker_net.run_net(net, np.full((70, 90, 3), 128, np.uint8))
    assert out.shape == (N_OUT, 96 // STRIDE, 96 // STRIDE)


def test_missing_or_foreign_weights_name_the_file(tmp_path, monkeypatch):
    missing = tmp_path / "marker_net.pt"
    with pytest.raises(MarkerNetError, match=str(missing)):
        load_weights(missing)
    foreign = tmp_path / "foreign.pt"
    torch.save({"arch": marker_net.ARCH, "kinds": list(KINDS), "state_dict": {"w": torch.zeros(3)}}, foreign)
    with pytest.raises(MarkerNetError, match=r"foreign\.pt"):
        load_weights(foreign)
    other = tmp_path / "other.pt"
    save_weights(MarkerNet(), other, {})
    blob = torch.load(other, weights_only=True)
    blob["kinds"] = ["arrow"]
    torch.save(blob, other)
    with pytest.raises(MarkerNetError, match=r"other\.pt"):
        load_weights(other)
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a torch file")
    with pytest.raises(MarkerNetError, match=r"garbage\.pt"):
        load_weights(garbage)
    # The miner itself stops with that error rather than silently running without the network.
    monkeypatch.setattr(marker_net, "weights_path", lambda: missing)
    marker_net.shipped_net.cache_clear()
    try:
        with pytest.raises(MarkerNetError, match=r"marker_net\.pt"):
            detect_markers(np.full((64, 64, 3), 128, np.uint8), (0.0, 0.0, 64.0, 64.0))
        # ... and a miner being built stops there, before it takes a figure
        from p2p.mining.pipeline import CpuMiner

        with pytest.raises(MarkerNetError, match=r"marker_net\.pt"):
            CpuMiner(load_text_encoder=False)
    finally:
        marker_net.shipped_net.cache_clear()


def test_shipped_net_is_loaded_once():
    marker_net.shipped_net.cache_clear()
    assert marker_net.shipped_net() is marker_net.shipped_net()


def test_flips_keep_markers_on_their_pixels():
    from p2p.mining.cpu.train_marker_net import _flip

    arrow = MARKERS[0]
    (once,) = _flip([arrow], 160, 128, True, False)
    assert once["point"] == (160 - 1 - 41.0, 30.0)
    assert once["direction"] == pytest.approx(145.0)
    assert once["glyph"] == (160 - 42.0, 5.0, 160 - 10.0, 31.0)
    (both,) = _flip([arrow], 160, 128, True, True)
    assert both["direction"] == pytest.approx((180.0 + 35.0) % 360.0)
    (back,) = _flip(_flip([arrow], 160, 128, True, True), 160, 128, True, True)
    assert back["point"] == arrow["point"] and back["target"] == arrow["target"]
    assert back["direction"] == pytest.approx(arrow["direction"])


def test_training_entry_point_smoke_and_deterministic(tmp_path):
    """The real command on three tiny generated figures, twice with one seed: identical weights."""
    data, first, second = tmp_path / "figs", tmp_path / "a.pt", tmp_path / "b.pt"
    common = ["--data", str(data), "--figures", "3", "--data-seed", "100001", "--steps", "3", "--batch", "2",
              "--patch", "64", "--threads", "1", "--seed", "5"]  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "p2p.mining.cpu.train_marker_net", *common, "--out", str(first)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "step 3/3" in done.stdout
    from p2p.mining.cpu.train_marker_net import main

    assert main([*common, "--out", str(second)]) == 0
    a, b = load_weights(first).state_dict(), load_weights(second).state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(SystemExit):
        main([*common[:4], "--data-seed", "1001", "--out", str(tmp_path / "c.pt")])
    # A second folder is generated with the next seed and trained on together with the first.
    more = tmp_path / "more"
    assert main([*common, "--data", str(more), "--out", str(tmp_path / "d.pt")]) == 0
    made = json.loads((more / "annotations.json").read_text())["_source"]
    assert "seed=100002" in made


def _recall(folder: Path, use_net: bool) -> tuple[float, float]:
    from p2p.mining.cpu.eval_markers import evaluate

    report = evaluate(folder, use_net=use_net)
    return report.recall_lenient, report.precision


def test_shipped_network_finds_what_the_rules_miss(tmp_path):
    """Figures of a development seed (the network was trained on seeds 100000+): the fused
    detector finds markers the rule-based one alone does not."""
    from p2p.mining.synth.dataset import write_dataset

    write_dataset(tmp_path, 8, 7007)
    rules, rules_precision = _recall(tmp_path, use_net=False)
    fused, precision = _recall(tmp_path, use_net=True)
    assert fused >= BOUND > rules, (fused, rules)
    assert precision >= rules_precision, (precision, rules_precision)  # not bought with false regions


# Of the 24 markers the shipped weights find 21 (precision 0.55), the rules alone 17 (0.49).
BOUND = 0.75


def test_batchnorm_folding_keeps_the_output():
    torch.manual_seed(3)
    net = MarkerNet()
    for module in net.modules():  # running statistics a trained network would have
        if isinstance(module, torch.nn.BatchNorm2d):
            module.running_mean.uniform_(-0.5, 0.5)
            module.running_var.uniform_(0.5, 2.0)
    net.eval()
    x = torch.randn(1, 3, 64, 96)
    with torch.no_grad():
        before = net(x)
        marker_net.fuse_batchnorm(net)
        after = net(x)
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in net.modules())
    assert torch.allclose(before, after, atol=1e-4)


def test_fusion_keeps_confirmed_rule_markers_and_adds_unexplained_network_ones(monkeypatch):
    from p2p.mining.cpu import markers as rules_module
    from p2p.mining.cpu.markers import _Cand, _fuse_net, _Panel

    panel = _Panel(np.full((200, 300, 3), 128, np.uint8))
    confirmed = _Cand("star", (40, 40, 50, 50), (45.0, 45.0), 0.5)
    unconfirmed = _Cand("star", (200, 150, 210, 160), (205.0, 155.0), 0.5)
    sure = _Cand("box", (100, 20, 160, 60), (130.0, 40.0), 0.95, region=(100.0, 20.0, 160.0, 60.0))
    inset = _Cand("inset", (220, 0, 300, 60), (260.0, 30.0), 0.5, region=(220.0, 0.0, 300.0, 60.0))
    net = [
        _Cand("star", (41, 41, 49, 49), (45.0, 46.0), 0.15, region=(35.0, 35.0, 55.0, 55.0)),
        _Cand(
            "arrow", (20, 150, 40, 170), (40.0, 170.0), 0.6, region=(40.0, 165.0, 60.0, 190.0), direction=45.0
        ),
        _Cand("arrow", (240, 150, 260, 170), (260.0, 170.0), 0.3, region=(260.0, 165.0, 280.0, 190.0)),
        _Cand("box", (101, 21, 159, 59), (131.0, 41.0), 0.9, region=(101.0, 21.0, 159.0, 59.0)),
    ]
    monkeypatch.setattr(rules_module, "_net_cands", lambda panel, threshold, native=None: net)
    ring = _Cand("circle", (150, 150, 170, 170), (160.0, 160.0), 0.75, region=(150.0, 150.0, 170.0, 170.0))
    fused = _fuse_net(panel, [confirmed, unconfirmed, sure, inset, ring], rules_module.NET_THRESHOLDS)
    # The unsupported star is gone; a ring of that score is trusted without the network.
    assert fused[:4] == [confirmed, sure, inset, ring]
    assert fused[4:] == [net[1]]  # the weak arrow stays out; the box is the rules' own


def test_two_network_peaks_on_one_glyph_make_one_marker(monkeypatch):
    from p2p.mining.cpu import markers as rules_module
    from p2p.mining.cpu.markers import _Cand, _fuse_net, _Panel

    panel = _Panel(np.full((200, 300, 3), 128, np.uint8))
    first = _Cand("arrowhead", (80, 60, 92, 74), (90.0, 72.0), 0.5, region=(85.0, 68.0, 110.0, 95.0))
    second = _Cand("arrowhead", (81, 66, 93, 78), (91.0, 77.0), 0.4, region=(86.0, 73.0, 111.0, 100.0))
    monkeypatch.setattr(rules_module, "_net_cands", lambda panel, threshold, native=None: [first, second])
    assert _fuse_net(panel, [], rules_module.NET_THRESHOLDS) == [first]


def test_the_network_runs_on_one_thread_and_leaves_the_setting_as_it_was():
    seen: list[int] = []

    class Probe(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            seen.append(torch.get_num_threads())
            return torch.zeros(1, N_OUT, x.shape[2] // STRIDE, x.shape[3] // STRIDE)

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        marker_net.run_net(Probe(), np.zeros((40, 40, 3), np.uint8))  # type: ignore[arg-type]
        assert seen == [1]
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_a_crowd_of_network_peaks_of_one_kind_is_texture(monkeypatch):
    from p2p.mining.cpu import markers as rules_module
    from p2p.mining.cpu.markers import _Cand, _fuse_net, _Panel

    panel = _Panel(np.full((200, 400, 3), 128, np.uint8))

    def star(i: int) -> _Cand:
        x = 20.0 + 90.0 * i
        return _Cand(
            "star", (int(x) - 4, 96, int(x) + 4, 104), (x, 100.0), 0.6, region=(x - 8, 92.0, x + 8, 108.0)
        )

    few = [star(i) for i in range(rules_module._NET_CROWD)]
    monkeypatch.setattr(rules_module, "_net_cands", lambda panel, threshold, native=None: few)
    assert _fuse_net(panel, [], rules_module.NET_THRESHOLDS) == few
    many = [star(i) for i in range(rules_module._NET_CROWD + 1)]
    monkeypatch.setattr(rules_module, "_net_cands", lambda panel, threshold, native=None: many)
    assert _fuse_net(panel, [], rules_module.NET_THRESHOLDS) == []


def test_a_marker_only_the_enlarged_copy_shows_needs_the_network(monkeypatch):
    """A small panel's enlarged copy makes texture look like small arrows: a rule-based marker
    found only there is kept when the network sees something at it, however high its score."""
    from dataclasses import replace

    from p2p.mining.cpu import markers as rules_module
    from p2p.mining.cpu.markers import _Cand, _fuse_net, _Panel

    panel = _Panel(np.full((200, 300, 3), 128, np.uint8))
    arrow = _Cand("arrow", (40, 40, 60, 50), (60.0, 45.0), 0.95, direction=0.0, size=20.0)
    enlarged = replace(arrow, enlarged=True)
    peak = _Cand("arrow", (42, 40, 60, 50), (59.0, 46.0), 0.2, region=(59.0, 40.0, 80.0, 55.0))
    monkeypatch.setattr(rules_module, "_net_cands", lambda panel, threshold, native=None: [])
    assert _fuse_net(panel, [arrow, enlarged], rules_module.NET_THRESHOLDS) == [arrow]
    monkeypatch.setattr(rules_module, "_net_cands", lambda panel, threshold, native=None: [peak])
    assert _fuse_net(panel, [enlarged], rules_module.NET_THRESHOLDS) == [enlarged]


def test_four_network_arrows_in_a_panel_are_markers_four_stars_are_texture(monkeypatch):
    """Arrows tolerate a larger crowd than dots: four arrow peaks of 0.45 (above the arrow level)
    are all kept, four star peaks are texture."""
    from p2p.mining.cpu import markers as rules_module
    from p2p.mining.cpu.markers import _Cand, _fuse_net, _Panel

    panel = _Panel(np.full((200, 400, 3), 128, np.uint8))

    def peak(kind: str, i: int) -> _Cand:
        x = 20.0 + 90.0 * i
        return _Cand(
            kind, (int(x) - 4, 96, int(x) + 4, 104), (x, 100.0), 0.45, region=(x - 8, 92.0, x + 8, 108.0)
        )

    arrows = [peak("arrow", i) for i in range(4)]
    monkeypatch.setattr(rules_module, "_net_cands", lambda panel, threshold, native=None: arrows)
    assert _fuse_net(panel, [], rules_module.NET_THRESHOLDS) == arrows
    stars = [peak("star", i) for i in range(4)]
    monkeypatch.setattr(rules_module, "_net_cands", lambda panel, threshold, native=None: stars)
    assert _fuse_net(panel, [], rules_module.NET_THRESHOLDS) == []


def test_a_network_box_of_middling_score_is_a_marker(monkeypatch):
    """A box the rules miss (a washed-out outline) that the network scores 0.45 is reported;
    a box peak of 0.35 (sharp texture edges) is not."""
    from p2p.mining.cpu import markers as rules_module
    from p2p.mining.cpu.markers import _Cand, _fuse_net, _Panel

    panel = _Panel(np.full((200, 300, 3), 128, np.uint8))
    box = _Cand("box", (100, 50, 160, 110), (130.0, 80.0), 0.45, region=(103.0, 53.0, 157.0, 107.0))
    weak = _Cand("box", (200, 50, 260, 110), (230.0, 80.0), 0.35, region=(203.0, 53.0, 257.0, 107.0))
    monkeypatch.setattr(rules_module, "_net_cands", lambda panel, threshold, native=None: [box, weak])
    assert _fuse_net(panel, [], rules_module.NET_THRESHOLDS) == [box]
