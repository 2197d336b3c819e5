"""The CPU miner's version: it changes whenever what the miner mines may change.

    version = "cpu-<MINER_REVISION>+<12 hex digits>"

where the digits are a sha256 over the parameter file's content (``p2p.mining.params``, with any
overrides) and the sha256 of every shipped weight file (``p2p.mining.artifacts``). So a retrained
network or a new tuning gives a new version by itself; a code change that changes what the miner
mines must bump ``MINER_REVISION`` (``tests/test_mining_identity.py`` fails when the outputs on
its synthetic figures change and this number did not).
"""

from __future__ import annotations

import hashlib
import json
from functools import cache

from p2p.mining.artifacts import WEIGHT_FILES, artifact_path
from p2p.mining.params import CpuParams

MINER_REVISION = 20  # 20: specks, labels in parentheses and stray letters


@cache
def weight_digests() -> dict[str, str]:
    """sha256 of each shipped weight file (read once per process)."""
    return {name: hashlib.sha256(artifact_path(name).read_bytes()).hexdigest() for name in WEIGHT_FILES}


def cpu_version(params: CpuParams, weights: dict[str, str] | None = None) -> str:
    """The version of a CPU miner running with ``params`` and the shipped weights (``weights``:
    other digests, for a tool comparing builds)."""
    content = json.dumps(
        {"params": params.as_dict(), "weights": weights if weights is not None else weight_digests()},
        sort_keys=True,
    )
    digest = hashlib.sha256(content.encode("utf-8")).hexdigest()[:12]
    return f"cpu-{MINER_REVISION}+{digest}"
