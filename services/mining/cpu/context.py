"""What the CPU miner knows about one figure while its stages run, and the stage declaration.

A ``StageContext`` is made per figure and handed to each stage in turn; the stages share the
segmenter's analysis, the panels, labels and caption split through it and through nothing else
(no state outlives the figure). A ``Stage`` says which fields it reads and which it writes, so
the order of ``p2p.mining.pipeline.cpu_stages`` can be checked (``check_order``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields

import numpy as np

from p2p.mining.cpu.imaging import Analysis
from p2p.mining.types import (
    CaptionSplit,
    LabelDetection,
    Marker,
    MinedPanel,
    MiningResult,
    PanelCandidate,
    Region,
)
from p2p.shared.geometry import Box


@dataclass
class StageContext:
    image: np.ndarray  # RGB uint8, contiguous
    caption: str
    named: list[str] = field(default_factory=list)  # the labels the caption names, in its order
    analysis: Analysis | None = None  # the segmenter's look at the figure (at its own size)
    # the figure at its own size, as the label reader saw it: the segmenter's analysis, or the
    # reader's own where the segmenter worked on a downscale (made once, read by later stages)
    full_look: Analysis | None = None
    candidates: list[PanelCandidate] = field(default_factory=list)
    labels: list[str | None] = field(default_factory=list)  # one per candidate
    detections: list[LabelDetection] = field(default_factory=list)  # labels read in the image
    split: CaptionSplit | None = None  # the caption split on the panels' labels
    panel_types: list[tuple[str, float]] = field(default_factory=list)  # (type, confidence) per candidate
    panels: list[MinedPanel] = field(default_factory=list)
    markers_by_panel: dict[int, list[Marker]] = field(default_factory=dict)  # image panels only
    regions: list[Region] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def height(self) -> int:
        return int(self.image.shape[0])

    @property
    def width(self) -> int:
        return int(self.image.shape[1])

    @property
    def label_boxes(self) -> dict[str, Box]:
        return {d.text: d.box for d in self.detections}

    def run(self, stage: Stage) -> None:
        started = time.perf_counter()
        try:
            stage.run(self)
        finally:
            self.seconds[stage.name] = time.perf_counter() - started

    def result(self) -> MiningResult:
        return MiningResult(
            width=self.width,
            height=self.height,
            panels=self.panels,
            markers=[m for k in sorted(self.markers_by_panel) for m in self.markers_by_panel[k]],
            regions=self.regions,
            stage_seconds=self.seconds,
            notes=self.notes,
        )


INPUTS = frozenset({"image", "caption"})  # what a context holds before the first stage
FIELDS = frozenset(f.name for f in fields(StageContext)) - {"notes", "seconds"}


@dataclass(frozen=True)
class Stage:
    """One step of the miner. ``name`` is its timer's name; a stage that moves panel boxes is
    named ``panels_*``. ``reads``/``writes``: the ``StageContext`` fields it uses and sets (every
    stage may add notes)."""

    name: str
    reads: tuple[str, ...]
    writes: tuple[str, ...]
    run: Callable[[StageContext], None]


def check_order(stages: Sequence[Stage]) -> None:
    """Raises ``ValueError`` unless every stage reads only fields set before it, and names are unique."""
    available = set(INPUTS)
    names: set[str] = set()
    for stage in stages:
        unknown = (set(stage.reads) | set(stage.writes)) - FIELDS
        if unknown:
            raise ValueError(f"stage {stage.name} names no context field: {', '.join(sorted(unknown))}")
        missing = set(stage.reads) - available
        if missing:
            raise ValueError(
                f"stage {stage.name} reads {', '.join(sorted(missing))} before any stage sets it"
            )
        if stage.name in names:
            raise ValueError(f"two stages are named {stage.name}")
        names.add(stage.name)
        available |= set(stage.writes)
