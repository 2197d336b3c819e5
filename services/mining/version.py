"""The CPU miner's version: it changes whenever what the miner mines may change.

``MINER_REVISION`` is bumped by every code change that changes the miner's outputs
(``tests/test_mining_identity.py`` fails when the outputs on its synthetic figures change and
this number did not).
"""

from __future__ import annotations

MINER_REVISION = 1
