"""Fixtures shared by the LVLM backend's tests: a synthetic set, the simulated server, miners."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from p2p.mining.lab.synth.dataset import load_annotations, write_dataset
from p2p.mining.pipeline import CpuMiner
from p2p.shared.settings import LvlmSettings
from tests.lvlm_sim import SimFaults, SimServer

FAST_RETRIES = {"backoff_s": 0.01, "backoff_max_s": 0.05, "max_retries": 3}


@pytest.fixture(scope="session")
def lvlm_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("lvlm-figures")
    write_dataset(folder, 6, 31337, size=(900, 700), rescale_fraction=0.0)
    return folder


@pytest.fixture(scope="session")
def lvlm_entries(lvlm_dataset: Path) -> dict[str, Any]:
    return {k: v for k, v in load_annotations(lvlm_dataset).items() if not k.startswith("_")}


@pytest.fixture(scope="session")
def cpu_miner() -> CpuMiner:
    return CpuMiner()


@pytest.fixture(scope="session")
def sim_server(lvlm_dataset: Path) -> Iterator[SimServer]:
    server = SimServer([lvlm_dataset], faults=SimFaults(seed=5))
    server.start()
    server.warm()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def sim(sim_server: SimServer) -> Iterator[SimServer]:
    """The session's server with its faults and statistics reset for each test."""
    sim_server.revive()
    sim_server.faults.reset()
    sim_server.reseed(5)
    sim_server.stats.reset()
    yield sim_server
    sim_server.revive()
    sim_server.faults.reset()


def lvlm_settings(sim: SimServer, **overrides: Any) -> LvlmSettings:
    return LvlmSettings(**{"base_url": sim.url, **FAST_RETRIES, **overrides})


def figure_pixels(folder: Path, name: str) -> np.ndarray:
    with Image.open(folder / name) as img:
        return np.asarray(img.convert("RGB"))
