"""The CPU miner's outputs on a few synthetic figures are the recorded ones, and a change to them
comes with a new ``MINER_REVISION``.

``mining_outputs.json`` holds the digest of the outputs for every miner revision and the full
outputs of the latest one (panels, labels, label boxes, figure types, markers, regions,
subcaptions, notes). Floats are compared to a relative tolerance of ``REL_TOL``: another CPU, or
another BLAS thread count, sums in another order and moves the last digits (a marker's box edge at
507.735186 on one machine was 507.735187 on the next); anything the miner decides moves far more.
When a change to the miner is meant to change what it mines, bump ``MINER_REVISION`` and
record the new outputs:

    .venv/bin/python -m tests.test_mining_identity record

When the synthetic generator changes (the inputs' digests differ), re-record at a commit whose
miner is known to mine as before.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench.mining_identity import digest, first_difference, result_record

RECORDING = Path(__file__).with_name("mining_outputs.json")
REL_TOL = 1e-6

# Small figures of every kind the generator draws, on fixed seeds: image panels with markers
# (markers, regions, caption fragments), touching panels, outside and inside labels, plots, and
# one figure large enough to be segmented on a downscale.
FIGURES: dict[str, tuple[int, dict[str, Any]]] = {
    "markers": (190001, {"width": 640, "height": 480, "n_panels": 4, "marker_rate": 1.0}),
    "touching": (190002, {"width": 600, "height": 420, "gutter": 0, "n_panels": 6}),
    "outside": (190003, {"width": 640, "height": 440, "label_position": "outside"}),
    "mixed": (190004, {"width": 700, "height": 500}),
    "rows": (190005, {"width": 560, "height": 480, "layout": "rows", "marker_rate": 0.6}),
    # longer than MAX_ANALYSIS_SIDE: segmented on a downscale, the other stages at full size
    "large": (190006, {"width": 1700, "height": 620, "n_panels": 3, "marker_rate": 1.0}),
}


def _inputs() -> dict[str, tuple[np.ndarray, str]]:
    from p2p.mining.lab.synth.figure import generate_figure

    out = {}
    for key, (seed, options) in FIGURES.items():
        image, truth = generate_figure(seed, **options)
        out[key] = (np.asarray(image.convert("RGB")), truth["caption"])
    return out


def _input_digest(image: np.ndarray, caption: str) -> str:
    return hashlib.sha256(image.tobytes() + repr(image.shape).encode() + caption.encode()).hexdigest()


def mine_fixed_figures(miner: Any) -> tuple[dict[str, str], dict[str, Any]]:
    inputs = _inputs()
    digests = {key: _input_digest(image, caption) for key, (image, caption) in inputs.items()}
    outputs = {key: result_record(miner.mine(image, caption)) for key, (image, caption) in inputs.items()}
    return digests, _stable(outputs)


def _stable(value: Any) -> Any:
    """The outputs with floats at nine significant digits (see the module's docstring)."""
    if isinstance(value, float):
        return float(f"{value:.9g}")
    if isinstance(value, dict):
        return {key: _stable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_stable(item) for item in value]
    return value


def _revision() -> int:
    from p2p.mining.version import MINER_REVISION

    return MINER_REVISION


@pytest.fixture(scope="module")
def mined() -> tuple[dict[str, str], dict[str, Any]]:
    from p2p.mining.pipeline import CpuMiner

    return mine_fixed_figures(CpuMiner())


def test_outputs_are_the_recorded_ones_for_this_revision(
    mined: tuple[dict[str, str], dict[str, Any]],
) -> None:
    recording = json.loads(RECORDING.read_text())
    inputs, outputs = mined
    assert inputs == recording["inputs"], (
        "the synthetic generator draws other figures now: re-record (see this module's docstring) "
        "at a commit whose miner mines as before"
    )
    revision = str(_revision())
    assert revision in recording["digests"], (
        f"MINER_REVISION {revision} has no recorded outputs: record them (see this module's docstring)"
    )
    latest = max(recording["digests"], key=int)
    assert revision == latest, f"the recording is of MINER_REVISION {latest}, the miner is {revision}"
    where = first_difference(recording["figures"], outputs, rel_tol=REL_TOL)
    if where is not None:
        pytest.fail(
            f"the miner's outputs changed but MINER_REVISION is still {revision}: bump it in "
            f"p2p/mining/version.py and record the new outputs; first difference: {where}"
        )


def test_float_noise_is_no_difference_but_a_moved_box_is() -> None:
    recorded = {"rows": {"markers": [{"target_box": [384.0, 225.0, 507.735186, 249.0]}]}}
    noisy = {"rows": {"markers": [{"target_box": [384.0, 225.0, 507.735187, 249.0]}]}}
    moved = {"rows": {"markers": [{"target_box": [384.0, 225.0, 507.8, 249.0]}]}}
    assert first_difference(recorded, noisy, rel_tol=REL_TOL) is None
    assert first_difference(recorded, moved, rel_tol=REL_TOL) == (
        ".rows.markers[0].target_box[2]: expected 507.735186, found 507.8"
    )
    assert first_difference({"confidence": 0.5}, {"confidence": 0.5000001}, rel_tol=REL_TOL) is None
    assert first_difference({"confidence": 0.5}, {"confidence": 0.501}, rel_tol=REL_TOL) is not None


def _record() -> None:
    from p2p.mining.pipeline import CpuMiner

    inputs, outputs = mine_fixed_figures(CpuMiner())
    recording = json.loads(RECORDING.read_text()) if RECORDING.is_file() else {"digests": {}}
    recording["inputs"] = inputs
    recording["digests"][str(_revision())] = digest(outputs)
    recording["figures"] = outputs
    RECORDING.write_text(json.dumps(recording, indent=1, sort_keys=True) + "\n")
    print(f"revision {_revision()}: {digest(outputs)}")


if __name__ == "__main__" and sys.argv[1:] == ["record"]:
    _record()
