"""The CPU miner's shipped model files, in one place: the marker network with its fusion model
(``marker_net.pt``), the panel-boundary network (``seam_net.pt``), the seam splitter
(``seam_model.json``) and the panel type classifier (``panel_type_model.json``).

``MANIFEST.json`` names each file with its sha256, its size, and the command, seeds and commit
that produced it (the trainers live in ``p2p.mining.lab``). The sha256 of every file here is part
of the miner's version (``p2p.mining.version``); ``tests/test_artifacts.py`` checks the manifest
against the files.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

WEIGHT_FILES = ("marker_net.pt", "seam_net.pt", "seam_model.json", "panel_type_model.json")
MANIFEST = "MANIFEST.json"


def artifact_path(name: str) -> Path:
    """Where the shipped file ``name`` is (inside the installed package)."""
    return Path(str(resources.files(__package__).joinpath(name)))
