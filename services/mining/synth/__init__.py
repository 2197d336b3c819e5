"""Synthetic compound figures with exact ground truth (``p2p synth``)."""

from p2p.mining.synth.dataset import load_annotations, write_dataset
from p2p.mining.synth.figure import FigureOptions, generate_figure

__all__ = ["FigureOptions", "generate_figure", "load_annotations", "write_dataset"]
