"""Synthetic compound figures with exact ground truth (``p2p synth``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from p2p.mining.lab.synth.dataset import load_annotations, write_dataset
    from p2p.mining.lab.synth.figure import FigureOptions, generate_figure

__all__ = ["FigureOptions", "generate_figure", "load_annotations", "write_dataset"]

_HOMES = {
    "load_annotations": "p2p.mining.lab.synth.dataset",
    "write_dataset": "p2p.mining.lab.synth.dataset",
    "FigureOptions": "p2p.mining.lab.synth.figure",
    "generate_figure": "p2p.mining.lab.synth.figure",
}


def __getattr__(name: str) -> Any:
    # Lazy, so that the CLI can register `p2p synth` without importing matplotlib and scikit-image.
    if name in _HOMES:
        import importlib

        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(name)
