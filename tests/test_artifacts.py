"""The shipped model files and their manifest (``p2p.mining.artifacts``)."""

from __future__ import annotations

import hashlib
import json

from p2p.mining.artifacts import MANIFEST, WEIGHT_FILES, artifact_path


def test_the_manifest_names_every_shipped_file_with_its_digest_size_and_origin() -> None:
    manifest = json.loads(artifact_path(MANIFEST).read_text())
    assert set(manifest) == set(WEIGHT_FILES)
    for name, entry in manifest.items():
        data = artifact_path(name).read_bytes()
        assert entry["sha256"] == hashlib.sha256(data).hexdigest(), f"{name} changed: update {MANIFEST}"
        assert entry["size"] == len(data)
        assert entry["commands"] and all(c.startswith("python -m p2p.mining.lab.") for c in entry["commands"])
        assert entry["seeds"] and entry["commits"]["shipped"]
