"""The CPU miner's parameters as data (``p2p.mining.params``) and the version they feed."""

from __future__ import annotations

import json

import pytest

from p2p.mining.params import CURRENT, load_params, params_text, parse_params, with_overrides
from p2p.mining.pipeline import CpuMiner
from p2p.mining.version import MINER_REVISION, cpu_version, weight_digests
from tests.test_axis_strips import _as_found, _figure


def test_the_shipped_file_sets_every_parameter_of_every_stage() -> None:
    params = load_params()
    assert params.name == CURRENT
    data = json.loads(params_text())
    assert parse_params(data, CURRENT) == params
    assert params.as_dict()["params_file"] == CURRENT
    assert params.label_trim.unread_height == (0.6, 1.6)  # JSON lists come back as the pairs they are


def test_a_file_with_an_unknown_or_a_missing_value_is_refused_by_name() -> None:
    data = json.loads(params_text())
    data["label_trim"]["padd"] = 0.2
    with pytest.raises(ValueError, match=r"label_trim: unknown \['padd'\], missing none"):
        parse_params(data, "x.json")
    data = json.loads(params_text())
    del data["axis_strips"]["touch"]
    with pytest.raises(ValueError, match=r"missing \['touch'\]"):
        parse_params(data, "x.json")
    data = json.loads(params_text())
    del data["regions"]
    with pytest.raises(ValueError, match=r"missing \['regions'\]"):
        parse_params(data, "x.json")


def test_overrides_replace_single_values_and_say_so() -> None:
    shipped = load_params()
    changed = with_overrides(shipped, {"axis_strips.touch": 0, "label_trim.unread_height": [0.5, 1.5]})
    assert changed.axis_strips.touch == 0 and changed.label_trim.unread_height == (0.5, 1.5)
    assert changed.name == f"{CURRENT}+overrides"
    assert changed.segment == shipped.segment and shipped.axis_strips.touch == 6  # the shipped ones stay
    with pytest.raises(ValueError, match="no parameter"):
        with_overrides(shipped, {"axis_strips.tuch": 1})


def test_a_stage_runs_with_the_parameters_it_is_given() -> None:
    from p2p.mining.cpu.segmentation.axis_strips import return_axis_strips

    shipped = load_params().axis_strips
    moved = return_axis_strips(_figure(), _as_found(), [], params=shipped)
    assert moved != _as_found()
    # a plot further from the picture than ``touch`` gets nothing back
    strict = with_overrides(load_params(), {"axis_strips.touch": 2}).axis_strips
    assert return_axis_strips(_figure(), _as_found(), [], params=strict) == _as_found()


def test_the_version_follows_the_revision_the_parameters_and_the_weights() -> None:
    shipped = load_params()
    version = cpu_version(shipped)
    assert version.startswith(f"cpu-{MINER_REVISION}+")
    assert cpu_version(load_params()) == version  # deterministic
    assert cpu_version(with_overrides(shipped, {"regions.tau": 0.2})) != version
    weights = dict(weight_digests())
    assert set(weights) == {"marker_net.pt", "seam_net.pt", "seam_model.json", "panel_type_model.json"}
    weights["seam_net.pt"] = "0" * 64  # a retrained network
    assert cpu_version(shipped, weights) != version


def test_the_miner_names_its_parameter_file_and_version() -> None:
    miner = CpuMiner(with_overrides(load_params(), {"postprocess.nms_iou": 0.5}), load_text_encoder=False)
    assert miner.params_name == f"{CURRENT}+overrides"
    assert miner.version == cpu_version(miner.params) != cpu_version(load_params())
    assert miner.params.as_dict()["postprocess"]["nms_iou"] == 0.5


def test_the_changelog_has_an_entry_for_the_current_version() -> None:
    from pathlib import Path

    changelog = Path(__file__).resolve().parents[1] / "services" / "mining" / "CHANGELOG.md"
    assert f"## {cpu_version(load_params())} " in changelog.read_text(), "add a CHANGELOG.md entry"
