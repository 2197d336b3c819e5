"""The seam between the mining jobs and the miners: what every backend (CPU, LVLM paper-faithful,
LVLM hybrid) offers. ``jobs.mine_job`` and the worker tasks know miners only through it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from p2p.mining.types import FigureContext, MiningResult

if TYPE_CHECKING:  # the task modules import this seam in every worker; the ingest image has no numpy
    import numpy as np


class MinerParams(Protocol):
    def as_dict(self) -> dict[str, Any]:
        """What a job records of the parameters it ran with (JSON)."""
        ...


@runtime_checkable
class Miner(Protocol):
    @property
    def backend(self) -> str:
        """The backend's name: "cpu" or "lvlm"."""
        ...

    @property
    def version(self) -> str:
        """Changes whenever what the miner mines may change (``p2p.mining.version``)."""
        ...

    @property
    def params_name(self) -> str:
        """The shipped parameter file the miner runs with, e.g. "cpu-1.json"."""
        ...

    @property
    def prompt_version(self) -> str | None: ...

    @property
    def params(self) -> MinerParams: ...

    def ensure_ready(self) -> None:
        """Raises when something the miner needs (a model server) is not there."""
        ...

    def mine(self, image: np.ndarray, caption: str, *, context: FigureContext | None = None) -> MiningResult:
        """One figure (RGB array) with its caption; ``context`` is what the article says around it."""
        ...
