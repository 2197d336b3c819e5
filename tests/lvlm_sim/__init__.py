"""A simulated OpenAI-compatible vLLM server for the LVLM mining prompts (tests and benchmarks only).

with SimServer([folder], faults=SimFaults(latency_s=0.2)) as sim:
    httpx.post(f"{sim.url}/v1/chat/completions", json=...)
"""

from tests.lvlm_sim.faults import MALFORMED_KINDS, SimFaults
from tests.lvlm_sim.locate import FigureIndex, Placement, locate
from tests.lvlm_sim.registry import Figure, GtMarker, GtPanel, Registry, normalize_caption
from tests.lvlm_sim.server import DEFAULT_MODEL, SimModel, SimServer, SimStats, create_app, parse_request

__all__ = [
    "DEFAULT_MODEL",
    "MALFORMED_KINDS",
    "Figure",
    "FigureIndex",
    "GtMarker",
    "GtPanel",
    "Placement",
    "Registry",
    "SimFaults",
    "SimModel",
    "SimServer",
    "SimStats",
    "create_app",
    "locate",
    "normalize_caption",
    "parse_request",
]
