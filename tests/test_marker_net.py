"""The learned marker detector: decoding of its outputs, the shipped weights (loading, errors,
what they find on a generated figure of a seed not used in training), the learned fusion with
the rule-based detector (features, trees, choice) and the training entry points (CPU smoke runs
on tiny generated figures)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from p2p.mining.cpu.markers import net as marker_net
from p2p.mining.cpu.markers import rules as markers_module
from p2p.mining.cpu.markers.net import (
    KINDS,
    N_OUT,
    STRIDE,
    MarkerNet,
    MarkerNetError,
    TreeEnsemble,
    decode,
    encode_targets,
    load_fusion,
    load_weights,
    save_fusion,
    save_weights,
)
from p2p.mining.cpu.markers.rules import FUSION_FEATURES, detect_markers
from p2p.mining.params import load_params
from tests.helpers import run_module

MP = load_params().markers  # the shipped fusion levels

MARKERS: list[dict[str, Any]] = [
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


def _stump(name: str, at: float) -> TreeEnsemble:
    """A fusion model of one split: probability ~1 where feature ``name`` exceeds ``at``, ~0
    elsewhere."""
    return TreeEnsemble(
        feature=np.array([[FUSION_FEATURES.index(name), 0, 0]]),
        threshold=np.array([[at, np.inf, np.inf]]),
        left=np.array([[1, 1, 2]]),
        right=np.array([[2, 1, 2]]),
        value=np.array([[0.0, -20.0, 20.0]]),
        baseline=0.0,
        depth=1,
        names=FUSION_FEATURES,
    )


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
    monkeypatch.setattr(marker_net, "shipped_fusion", lambda: _stump("score", 0.5))
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
    from p2p.mining.lab.train_marker_net import _flip

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
    done = run_module("p2p.mining.lab.train_marker_net", *common, "--out", str(first))
    assert done.returncode == 0, done.stderr
    assert "step 3/3" in done.stdout
    from p2p.mining.lab.train_marker_net import main

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
    from p2p.mining.lab.eval_markers import evaluate

    report = evaluate(folder, use_net=use_net)
    return report.recall_lenient, report.precision


def test_shipped_network_finds_what_the_rules_miss(tmp_path):
    """Figures of a development seed (the network was trained on seeds 100000+): the fused
    detector finds markers the rule-based one alone does not."""
    from p2p.mining.lab.synth.dataset import write_dataset

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
            assert module.running_mean is not None and module.running_var is not None
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


def test_the_network_runs_on_one_thread_and_leaves_the_setting_as_it_was():
    seen: list[int] = []

    class Probe(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            seen.append(torch.get_num_threads())
            return torch.zeros(1, N_OUT, x.shape[2] // STRIDE, x.shape[3] // STRIDE)

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        marker_net.run_net(Probe(), np.zeros((40, 40, 3), np.uint8))
        assert seen == [1]
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_fusion_trees_give_scikit_learns_probabilities():
    """The trees exported from scikit-learn, walked with numpy, give its probabilities."""
    from sklearn.ensemble import HistGradientBoostingClassifier

    from p2p.mining.lab import train_marker_net as tm

    rng = np.random.default_rng(4)
    x = rng.normal(size=(300, len(FUSION_FEATURES)))
    y = (x[:, 1] + 0.5 * x[:, 3] * x[:, 5] + 0.3 * rng.normal(size=300)) > 0.2
    model = tm.fit_fusion(x, y)
    reference = HistGradientBoostingClassifier(**tm.FUSION_TREES, random_state=0).fit(x, y)
    test = rng.normal(size=(50, len(FUSION_FEATURES)))
    assert model.probability(test) == pytest.approx(reference.predict_proba(test)[:, 1], abs=1e-9)
    assert model.names == FUSION_FEATURES
    assert model.probability(np.zeros((0, len(FUSION_FEATURES)))).shape == (0,)
    with pytest.raises(ValueError):
        model.probability(np.zeros((2, 3)))


def test_fusion_model_is_stored_beside_the_network(tmp_path):
    path = tmp_path / "w.pt"
    net = MarkerNet()
    save_weights(net, path, {"note": 1})
    with pytest.raises(MarkerNetError, match=r"w\.pt"):
        load_fusion(path)  # network weights without a fusion model
    with pytest.raises(MarkerNetError, match=r"nothing\.pt"):
        load_fusion(tmp_path / "nothing.pt")
    stump = _stump("heat_own", 0.25)
    save_fusion(stump, path)
    back = load_fusion(path)
    x = np.zeros((3, len(FUSION_FEATURES)))
    x[:, FUSION_FEATURES.index("heat_own")] = [0.1, 0.25, 0.5]
    assert back.probability(x) == pytest.approx(stump.probability(x))
    assert back.probability(x) == pytest.approx([0.0, 0.0, 1.0], abs=1e-6)
    assert back.names == FUSION_FEATURES
    loaded = load_weights(path).state_dict()  # the network is still there, unchanged
    fused = MarkerNet()
    fused.load_state_dict(net.state_dict())
    fused.eval()
    marker_net.fuse_batchnorm(fused)
    assert all(torch.equal(loaded[k], v) for k, v in fused.state_dict().items())
    assert marker_net.shipped_fusion().names == FUSION_FEATURES


def test_a_write_cut_short_leaves_the_weights_file_whole(tmp_path, monkeypatch):
    path = tmp_path / "w.pt"
    save_weights(MarkerNet(), path, {})
    before = path.read_bytes()
    real_save = torch.save

    def cut_short(blob: Any, target: Any) -> None:
        real_save(blob, target)
        Path(target).write_bytes(Path(target).read_bytes()[:100])
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", cut_short)
    with pytest.raises(OSError, match="disk full"):
        save_fusion(_stump("heat_own", 0.25), path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.pt"]  # no temporary file left


def test_the_miner_loads_the_fusion_model_at_start():
    from p2p.mining.pipeline import CpuMiner

    marker_net.shipped_fusion.cache_clear()
    CpuMiner(load_text_encoder=False)
    assert marker_net.shipped_fusion.cache_info().currsize == 1


def test_the_model_vetoes_what_only_the_network_vouched_for_and_rescues_what_the_levels_drop():
    """The hand-set fusion's choice stands but where the fusion model is sure: a marker kept on
    the network's word goes below ``veto``, one the levels drop comes back at ``rescue``; a
    rule-based marker the rules are sure of stays. One marker per glyph, the levels' first."""
    from dataclasses import replace

    from p2p.mining.cpu.markers.rules import _Cand, _choose, _Found, _Panel

    panel = _Panel(np.full((200, 300, 3), 128, np.uint8))
    sure = _Cand("arrow", (40, 40, 60, 50), (60.0, 45.0), 0.95, direction=0.0, size=20.0)
    middling = _Cand("star", (100, 100, 110, 110), (105.0, 105.0), 0.6)  # kept: a peak is on it
    peak = _Cand("star", (101, 101, 109, 109), (105.0, 106.0), 0.15, region=(95.0, 95.0, 115.0, 115.0))
    strong = _Cand("box", (150, 20, 210, 80), (180.0, 50.0), 0.5, region=(150.0, 20.0, 210.0, 80.0))
    weak = _Cand("arrowhead", (240, 150, 252, 162), (250.0, 160.0), 0.2, region=(250.0, 155.0, 270.0, 175.0))
    rules, net = [sure, middling], [peak, strong, weak]
    found = _Found(panel, panel, rules, net, None)
    cands = rules + net
    assert _hand([sure, middling], net, (200, 300)) == [sure, middling, strong]

    def chosen(*p: float) -> list:
        return _choose(found, cands, np.array(p), MP)

    assert chosen(0.5, 0.5, 0.5, 0.5, 0.5) == [sure, middling, strong]
    low = MP.veto - 0.01
    assert chosen(low, low, 0.3, low, 0.3) == [sure]  # vetoed: the middling star and the network's box
    assert chosen(low, low, 0.3, low, MP.rescue) == [sure, weak]  # rescued: the weak peak
    # Rescued, but on the glyph of a kept marker: one marker.
    assert chosen(0.5, 0.5, MP.rescue, 0.5, 0.5) == [sure, middling, strong]
    # A marker only the enlarged copy shows is the network's word too.
    found.rules[0] = enlarged = replace(sure, enlarged=True)
    assert _choose(found, [enlarged, middling, *net], np.array([low, 0.5, 0.5, 0.5, 0.5]), MP) == [
        middling,
        strong,
    ]


def test_a_rescued_candidate_needs_room_and_no_crowd_of_its_kind():
    """The model's rescue adds a candidate as the levels add the network's: not where a chosen
    marker explains it (ahead of an arrow's tip) and not among a crowd of peaks of its kind."""
    from p2p.mining.cpu.markers.rules import _Cand, _choose, _Found, _Panel

    panel = _Panel(np.full((200, 400, 3), 128, np.uint8))
    arrow = _Cand("arrow", (40, 40, 60, 50), (60.0, 45.0), 0.95, direction=0.0, size=20.0)
    ahead = _Cand("arrowhead", (66, 40, 76, 50), (71.0, 45.0), 0.2, region=(71.0, 40.0, 90.0, 55.0))
    alone = _Cand("arrowhead", (300, 150, 310, 160), (305.0, 155.0), 0.2, region=(305.0, 150.0, 325.0, 170.0))
    found = _Found(panel, panel, [arrow], [ahead, alone], None)
    chosen = _choose(found, [arrow, ahead, alone], np.array([0.9, MP.rescue, MP.rescue]), MP)
    assert chosen == [arrow, alone]

    def star(i: int, score: float) -> _Cand:
        x = 20.0 + 40.0 * i
        return _Cand(
            "star", (int(x) - 4, 96, int(x) + 4, 104), (x, 100.0), score, region=(x - 8, 92.0, x + 8, 108.0)
        )

    weak = star(0, 0.2)
    for n, expected in ((MP.net_crowd, [weak]), (MP.net_crowd + 1, [])):
        net = [weak] + [star(i + 1, 0.6) for i in range(n)]
        found = _Found(panel, panel, [], net, None)
        probability = np.array([MP.rescue] + [0.0] * n)  # the strong stars vetoed, the weak one rescued
        assert _choose(found, net, probability, MP) == expected


def test_fusion_features_measure_the_candidates_against_the_network(monkeypatch):
    from p2p.mining.cpu.markers.rules import _Cand, _Found, _Panel, fusion_features

    panel = _Panel(np.full((128, 160, 3), 128, np.uint8))
    heat = np.zeros((len(KINDS), 32, 40), np.float32)
    heat[KINDS.index("star"), 10, 12] = 0.7  # on the rule's star (pixels 48-51, 40-43)
    heat[KINDS.index("arrow"), 30, 38] = 0.2  # far from it
    rule = _Cand("star", (44, 36, 54, 46), (49.0, 41.0), 0.9)
    other = _Cand("star", (120, 100, 126, 106), (123.0, 103.0), 0.8)
    peak = _Cand("star", (45, 37, 53, 45), (49.0, 42.0), 0.7, region=(40.0, 30.0, 60.0, 50.0))
    found = _Found(panel, panel, [rule, other], [peak], heat)
    cands, rows = fusion_features(found)
    assert cands == [rule, other, peak]
    assert rows.shape == (3, len(FUSION_FEATURES))
    col = {name: rows[:, i] for i, name in enumerate(FUSION_FEATURES)}
    assert list(col["rule"]) == [1.0, 1.0, 0.0]
    assert col["heat_star"][0] == pytest.approx(0.7) and col["heat_own"][0] == pytest.approx(0.7)
    assert col["heat_star"][1] == 0.0 and col["heat_arrow"].max() == 0.0
    assert col["other_net"][0] == pytest.approx(0.7) and col["other_net"][1] == 0.0
    assert col["other_rule"][2] == pytest.approx(0.9) and col["other_rule"][0] == 0.0
    assert list(col["crowd"]) == [2.0, 2.0, 1.0]  # two rule stars alike, one network star
    assert list(col["is_star"]) == [1.0, 1.0, 1.0]
    assert col["log_side"][0] == pytest.approx(np.log(128))


def test_detection_asks_the_fusion_model(monkeypatch):
    """An asterisk the network sees and a rule-based arrow the rules are sure of: the model can
    veto the network's asterisk, not the arrow."""
    from p2p.mining.cpu.markers.rules import _Cand

    asterisk: dict[str, Any] = {
        "kind": "asterisk",
        "point": (60.0, 60.0),
        "target": (50.0, 50.0, 70.0, 70.0),
        "glyph": (56.0, 56.0, 65.0, 65.0),
        "direction": None,
    }
    arrow = _Cand("arrow", (100, 90, 130, 100), (130.0, 95.0), 0.95, direction=0.0, size=30.0)
    monkeypatch.setattr(marker_net, "run_net", lambda net, rgb: _as_output([asterisk], 128, 160))
    monkeypatch.setattr(marker_net, "shipped_net", lambda: None)
    monkeypatch.setattr(
        markers_module, "_rule_cands", lambda panel, params, glyphs_only=False: [] if glyphs_only else [arrow]
    )
    figure = np.full((128, 160, 3), 128, np.uint8)
    monkeypatch.setattr(marker_net, "shipped_fusion", lambda: _stump("heat_own", 0.5))
    assert sorted(m.kind for m in detect_markers(figure, (0.0, 0.0, 160.0, 128.0))) == ["arrow", "asterisk"]
    monkeypatch.setattr(marker_net, "shipped_fusion", lambda: _stump("rule", 0.5))
    assert [m.kind for m in detect_markers(figure, (0.0, 0.0, 160.0, 128.0))] == ["arrow"]
    assert [m.kind for m in detect_markers(figure, (0.0, 0.0, 160.0, 128.0), use_net=False)] == ["arrow"]


def test_fusion_training_entry_point_smoke(tmp_path):
    """``--fusion`` on three tiny generated figures writes a fusion model beside the network."""
    import shutil

    from p2p.mining.lab.train_marker_net import main

    weights = tmp_path / "w.pt"
    shutil.copy(marker_net.weights_path(), weights)
    args = ["--fusion", "--data", str(tmp_path / "figs"), "--figures", "3", "--data-seed", "120299"]
    assert main([*args, "--out", str(weights)]) == 0
    model = load_fusion(weights)
    assert model.names == FUSION_FEATURES and model.feature.shape[0] > 0
    shipped = marker_net.shipped_net().state_dict()
    assert all(torch.equal(v, shipped[k]) for k, v in load_weights(weights).state_dict().items())


def test_fusion_training_measures_the_candidates_with_the_network_in_out(tmp_path, monkeypatch):
    """The fusion model sits beside the network of ``--out``: its training candidates are that
    network's, not the shipped one's (a retrained network's file gets a model of its own)."""
    from p2p.mining.lab.train_marker_net import main

    torch.manual_seed(5)
    weights = tmp_path / "w.pt"
    save_weights(MarkerNet(), weights, {})
    used: list = []
    real = markers_module.panel_candidates

    def spy(image, box, net=None):
        used.append(net)
        return real(image, box, net)

    monkeypatch.setattr(markers_module, "panel_candidates", spy)
    args = ["--fusion", "--data", str(tmp_path / "figs"), "--figures", "2", "--data-seed", "120299"]
    assert main([*args, "--out", str(weights)]) == 0
    expected = load_weights(weights).state_dict()
    assert used and all(n is not None for n in used)
    assert all(torch.equal(v, expected[k]) for k, v in used[0].state_dict().items())


def _hand(rules: list, net: list, size: tuple[int, int]) -> list:
    """The hand-set fusion's markers among ``rules`` and ``net`` on a flat panel of ``size``."""
    from p2p.mining.cpu.markers.rules import _Found, _hand_fusion, _Panel

    panel = _Panel(np.full((*size, 3), 128, np.uint8))
    found = _Found(panel, panel, rules, net, None)
    return [(rules + net)[i] for i in _hand_fusion(found, MP)]


def test_fusion_keeps_confirmed_rule_markers_and_adds_unexplained_network_ones():
    from p2p.mining.cpu.markers.rules import _Cand

    size = (200, 300)
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
    ring = _Cand("circle", (150, 150, 170, 170), (160.0, 160.0), 0.75, region=(150.0, 150.0, 170.0, 170.0))
    fused = _hand([confirmed, unconfirmed, sure, inset, ring], net, size)
    # The unsupported star is gone; a ring of that score is trusted without the network.
    assert fused[:4] == [confirmed, sure, inset, ring]
    assert fused[4:] == [net[1]]  # the weak arrow stays out; the box is the rules' own


def test_two_network_peaks_on_one_glyph_make_one_marker():
    from p2p.mining.cpu.markers.rules import _Cand

    size = (200, 300)
    first = _Cand("arrowhead", (80, 60, 92, 74), (90.0, 72.0), 0.5, region=(85.0, 68.0, 110.0, 95.0))
    second = _Cand("arrowhead", (81, 66, 93, 78), (91.0, 77.0), 0.4, region=(86.0, 73.0, 111.0, 100.0))
    net = [first, second]
    assert _hand([], net, size) == [first]


def test_a_crowd_of_network_peaks_of_one_kind_is_texture():
    from p2p.mining.cpu.markers.rules import _Cand

    size = (200, 400)

    def star(i: int) -> _Cand:
        x = 20.0 + 90.0 * i
        return _Cand(
            "star", (int(x) - 4, 96, int(x) + 4, 104), (x, 100.0), 0.6, region=(x - 8, 92.0, x + 8, 108.0)
        )

    few = [star(i) for i in range(MP.net_crowd)]
    net = few
    assert _hand([], net, size) == few
    many = [star(i) for i in range(MP.net_crowd + 1)]
    net = many
    assert _hand([], net, size) == []


def test_a_marker_only_the_enlarged_copy_shows_needs_the_network():
    """A small panel's enlarged copy makes texture look like small arrows: a rule-based marker
    found only there is kept when the network sees something at it, however high its score."""
    from dataclasses import replace

    from p2p.mining.cpu.markers.rules import _Cand

    size = (200, 300)
    arrow = _Cand("arrow", (40, 40, 60, 50), (60.0, 45.0), 0.95, direction=0.0, size=20.0)
    enlarged = replace(arrow, enlarged=True)
    peak = _Cand("arrow", (42, 40, 60, 50), (59.0, 46.0), 0.2, region=(59.0, 40.0, 80.0, 55.0))
    net: list[_Cand] = []
    assert _hand([arrow, enlarged], net, size) == [arrow]
    net = [peak]
    assert _hand([enlarged], net, size) == [enlarged]


def test_four_network_arrows_in_a_panel_are_markers_four_stars_are_texture():
    """Arrows tolerate a larger crowd than dots: four arrow peaks of 0.45 (above the arrow level)
    are all kept, four star peaks are texture."""
    from p2p.mining.cpu.markers.rules import _Cand

    size = (200, 400)

    def peak(kind: str, i: int) -> _Cand:
        x = 20.0 + 90.0 * i
        return _Cand(
            kind, (int(x) - 4, 96, int(x) + 4, 104), (x, 100.0), 0.45, region=(x - 8, 92.0, x + 8, 108.0)
        )

    arrows = [peak("arrow", i) for i in range(4)]
    net = arrows
    assert _hand([], net, size) == arrows
    stars = [peak("star", i) for i in range(4)]
    net = stars
    assert _hand([], net, size) == []


def test_a_network_box_of_middling_score_is_a_marker():
    """A box the rules miss (a washed-out outline) that the network scores 0.45 is reported, and
    so is a small thin rectangle (an inset's source) it sees only faintly, at 0.3; a box peak of
    0.25 (sharp texture edges) is not."""
    from p2p.mining.cpu.markers.rules import _Cand

    size = (200, 300)
    box = _Cand("box", (100, 50, 160, 110), (130.0, 80.0), 0.45, region=(103.0, 53.0, 157.0, 107.0))
    faint = _Cand("box", (20, 150, 40, 170), (30.0, 160.0), 0.3, region=(20.0, 150.0, 40.0, 170.0))
    weak = _Cand("box", (200, 50, 260, 110), (230.0, 80.0), 0.25, region=(203.0, 53.0, 257.0, 107.0))
    net = [box, faint, weak]
    assert _hand([], net, size) == [box, faint]


def test_two_peaks_on_one_glyph_count_once_towards_a_crowd():
    """The network often peaks at both ends of an arrow: three arrows with two peaks each are
    three markers, not a crowd of six."""
    from p2p.mining.cpu.markers.rules import _Cand

    size = (200, 600)

    def peak(i: int, end: float) -> _Cand:
        x = 20.0 + 150.0 * i
        return _Cand(
            "arrow",
            (int(x), 96, int(x) + 30, 104),
            (x + end, 100.0),
            0.49 + 0.01 * end / 30,  # the peak at the tip is the stronger
            region=(x + end, 92.0, x + end + 16, 108.0),
            direction=0.0,
        )

    arrows = [peak(i, 30.0) for i in range(3)]
    tails = [peak(i, 0.0) for i in range(3)]
    assert len(arrows + tails) > MP.net_crowd_kind["arrow"]
    net = arrows + tails
    assert _hand([], net, size) == arrows


def test_a_panel_with_an_inset_but_no_box_gets_its_likeliest_weak_box_as_the_source():
    """A zoom-in has a source region: when the panel's chosen markers have an inset and no box,
    the most probable weak box peak outside the inset is reported; without an inset it is not,
    nor is a box peak on the inset itself."""
    from p2p.mining.cpu.markers.rules import _SOURCE_BOX, _Cand, _choose, _Found, _Panel

    panel = _Panel(np.full((200, 300, 3), 128, np.uint8))
    inset = _Cand("inset", (200, 0, 300, 80), (250.0, 40.0), 0.9, region=(200.0, 0.0, 300.0, 80.0))

    def box(x: int, y: int, score: float) -> _Cand:
        return _Cand(
            "box", (x, y, x + 16, y + 16), (x + 8.0, y + 8.0), score, region=(x, y, x + 16.0, y + 16.0)
        )

    likely, unlikely, faint = (
        box(40, 120, _SOURCE_BOX + 0.05),
        box(120, 150, 0.28),
        box(60, 40, _SOURCE_BOX - 0.05),
    )
    on_inset = box(240, 30, 0.28)
    net = [likely, unlikely, faint, on_inset]
    # All below the boxes' rescue level; the faint one and the one on the inset likelier.
    level = MP.rescue_kind["box"]
    probability = np.array([0.9, level - 0.1, level - 0.25, level - 0.02, level - 0.05])
    assert _choose(_Found(panel, panel, [inset], net, None), [inset, *net], probability, MP) == [
        inset,
        likely,
    ]
    assert _choose(_Found(panel, panel, [], net, None), net, probability[1:], MP) == []


def test_symbols_are_rescued_at_a_lower_probability_than_pointing_markers():
    from p2p.mining.cpu.markers.rules import _Cand, _choose, _Found, _Panel

    panel = _Panel(np.full((200, 300, 3), 128, np.uint8))
    star = _Cand("star", (40, 40, 48, 48), (44.0, 44.0), 0.2, region=(34.0, 34.0, 54.0, 54.0))
    head = _Cand("arrowhead", (200, 150, 210, 160), (208.0, 158.0), 0.2, region=(208.0, 150.0, 228.0, 170.0))
    middling = MP.rescue_kind["star"] + 0.05
    assert middling < MP.rescue
    net = [star, head]
    assert _choose(_Found(panel, panel, [], net, None), net, np.array([middling, middling]), MP) == [star]


def test_stars_and_boxes_are_rescued_below_the_symbols_level_and_arrows_are_not():
    """A star or a box the model gives a middling probability comes back (small glyphs of the
    panel's own hue, thin inset-source rectangles), an arrowhead of that probability does not."""
    from p2p.mining.cpu.markers.rules import _Cand, _choose, _Found, _Panel

    panel = _Panel(np.full((200, 300, 3), 128, np.uint8))
    star = _Cand("star", (40, 40, 48, 48), (44.0, 44.0), 0.2, region=(34.0, 34.0, 54.0, 54.0))
    box = _Cand("box", (120, 20, 180, 70), (150.0, 45.0), 0.2, region=(120.0, 20.0, 180.0, 70.0))
    head = _Cand("arrowhead", (200, 150, 210, 160), (208.0, 158.0), 0.2, region=(208.0, 150.0, 228.0, 170.0))
    net = [star, box, head]
    found = _Found(panel, panel, [], net, None)
    assert _choose(found, net, np.array([0.45, 0.55, 0.55]), MP) == [box, star]
    assert _choose(found, net, np.array([0.35, 0.25, 0.75]), MP) == []


def test_a_blend_averages_the_log_odds_of_a_model_fitted_before_features_were_appended():
    """``train_marker_net --blend w``: one tree ensemble whose log-odds are w of the new model's
    and 1 - w of the old one's, the old one reading only the columns it was fitted on."""
    from scipy.special import logit

    from p2p.mining.lab import train_marker_net as tm

    rng = np.random.default_rng(7)
    n_old = 5
    x = rng.normal(size=(400, len(FUSION_FEATURES)))
    y_old = (x[:, 0] + 0.3 * rng.normal(size=400)) > 0.0
    y_new = (x[:, 0] + x[:, -1] + 0.3 * rng.normal(size=400)) > 0.0
    old = tm.fit_fusion(x[:, :n_old], y_old)
    old = replace(old, names=FUSION_FEATURES[:n_old])
    new = tm.fit_fusion(x, y_new)
    test = rng.normal(size=(60, len(FUSION_FEATURES)))
    both = tm.blend(old, new, 0.3)
    expected = 0.7 * logit(old.probability(test[:, :n_old])) + 0.3 * logit(new.probability(test))
    assert logit(both.probability(test)) == pytest.approx(expected, abs=1e-6)
    assert both.names == FUSION_FEATURES
    assert tm.blend(old, new, 1.0).probability(test) == pytest.approx(new.probability(test), abs=1e-9)
    with pytest.raises(ValueError):
        tm.blend(replace(old, names=("other", *FUSION_FEATURES[1:n_old])), new, 0.5)


def test_fusion_features_tell_a_drawn_glyph_from_a_faint_blob_of_the_panels_hue():
    """A solid yellow star on a reddish panel against a faint red blob: more contrast, more ink,
    a hue the panel has little of; candidates on one glyph count each other."""
    from p2p.mining.cpu.markers.rules import _Cand, _Found, _Panel, fusion_features

    rgb = np.zeros((160, 200, 3), np.uint8)
    rgb[:] = (150, 60, 60)
    rgb[40:52, 40:52] = (250, 230, 0)  # the drawn glyph
    rgb[104:108, 144:148] = (200, 40, 40)  # a small faint blob of the panel's own hue
    panel = _Panel(rgb)
    star = _Cand("star", (40, 40, 52, 52), (46.0, 46.0), 0.9)
    peak = _Cand("arrowhead", (41, 41, 51, 51), (46.0, 47.0), 0.3, region=(40.0, 40.0, 60.0, 60.0))
    blob = _Cand("star", (140, 100, 152, 112), (146.0, 106.0), 0.5)
    cands, rows = fusion_features(_Found(panel, panel, [star, blob], [peak], None))
    col = {name: rows[:, i] for i, name in enumerate(FUSION_FEATURES)}
    assert cands == [star, blob, peak]
    assert col["contrast"][0] > 0.5 > col["contrast"][1]
    assert col["ink_share"][0] > 0.9 and col["ink_share"][1] < 0.5
    assert col["hue_share"][0] < 0.05 < col["hue_share"][1]
    assert col["glyph_sat"][0] > 0.9
    assert list(col["on_glyph"]) == [1.0, 0.0, 1.0]
    assert col["other_kind"][0] == pytest.approx(0.3) and col["other_kind"][2] == pytest.approx(0.9)
    assert list(col["rank"]) == [0.0, 1.0, 0.0]  # one star scores higher than the blob


def test_a_faint_network_asterisk_is_kept_only_where_the_model_is_fairly_sure():
    """The levels keep asterisk peaks from 0.2; those under ``MP.weak_peak`` need the model's
    ``weak_veto``, where a stronger peak needs only ``veto``."""
    from p2p.mining.cpu.markers.rules import _Cand, _choose, _Found, _Panel

    panel = _Panel(np.full((200, 300, 3), 128, np.uint8))

    def asterisk(x: float, score: float) -> _Cand:
        return _Cand(
            "asterisk",
            (int(x) - 4, 96, int(x) + 4, 104),
            (x, 100.0),
            score,
            region=(x - 8, 92.0, x + 8, 108.0),
        )

    faint, strong = asterisk(60.0, 0.25), asterisk(200.0, 0.35)
    assert faint.score < MP.weak_peak <= strong.score and MP.veto < MP.weak_veto
    found = _Found(panel, panel, [], [faint, strong], None)
    between = (MP.veto + MP.weak_veto) / 2
    assert _choose(found, [faint, strong], np.array([between, between]), MP) == [strong]
    assert _choose(found, [faint, strong], np.array([MP.weak_veto, between]), MP) == [faint, strong]
