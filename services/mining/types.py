"""What mining stages produce. Boxes are ``p2p.shared.geometry.Box``: figure pixels, x2/y2 exclusive."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from p2p.shared.geometry import Box

# Panel types: "image" (photograph, micrograph, medical image, map) feeds region mining;
# the others are non-photographic and are skipped by it (as the paper does).
PANEL_TYPES = ("image", "plot", "schematic", "table")

# Marker kinds the detectors report.
MARKER_KINDS = ("arrow", "arrowhead", "asterisk", "star", "box", "circle", "inset")


@dataclass(frozen=True)
class FigureContext:
    """What the article says around a figure, for the backends that read it."""

    caption: str
    title: str = ""
    abstract: str = ""


@dataclass
class PanelCandidate:
    box: Box
    confidence: float = 1.0
    # what the panel's label owns around its box: headings, outside row/column text, colour bars
    outer_box: Box | None = None


@dataclass
class LabelDetection:
    text: str  # normalised label as printed without punctuation: "A", "b", "1", "ii", "1a"
    box: Box
    confidence: float
    raw: str = ""  # what OCR read, e.g. "(a)"


@dataclass
class Marker:
    kind: str
    glyph_box: Box
    target_point: tuple[float, float]
    target_box: Box  # the structure pointed at, not the glyph
    confidence: float
    direction_deg: float | None = None  # arrows: direction of travel tail -> tip, image coordinates
    color: tuple[int, int, int] | None = None


@dataclass
class CaptionFragment:
    text: str
    mentions: tuple[str, ...]  # marker words found: "arrow", "arrowhead", "asterisk", "box", "inset", ...


@dataclass
class CaptionSplit:
    preamble: str
    subcaptions: dict[str, str]  # label -> verbatim pieces joined by one space (label tokens kept)
    own_fragments: dict[str, list[str]]  # label -> the pieces specific to that panel
    shared_trailing: list[str]  # sentences after the last labelled fragment that apply to all panels
    marker_fragments: dict[str, list[CaptionFragment]]  # label -> fragments mentioning markers
    labels_in_order: list[str] = field(default_factory=list)


@dataclass
class Region:
    panel_index: int
    box: Box
    kind: str  # "marker", "caption" or "inferred"
    marker_type: str | None
    caption_text: str | None
    confidence: float
    description: str | None = None


@dataclass
class MinedPanel:
    box: Box
    label: str | None
    label_box: Box | None
    figure_type: str
    type_confidence: float
    confidence: float
    subcaption: str | None = None
    description: str | None = None
    outer_box: Box | None = None  # the box with the panel's headings and outside text (or None)


@dataclass
class MiningResult:
    width: int
    height: int
    panels: list[MinedPanel]
    markers: list[Marker]
    regions: list[Region]
    stage_seconds: dict[str, float]
    notes: list[str]  # what could not be done, in words ("no labels found: reading order used")
    cost: dict[str, Any] = field(default_factory=dict)  # LVLM requests, tokens, retries, fallbacks
    provenance: dict[str, Any] = field(default_factory=dict)  # backend-specific: mode, prompt versions
