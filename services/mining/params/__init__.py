"""The CPU miner's tuned thresholds, as data: one frozen dataclass per stage, loaded from a
versioned JSON file shipped beside this module (``cpu-<n>.json``, one file per miner release).

A new tuning is a new file (copy the current one, change it, point ``CURRENT`` at it): the file
is part of the miner's version (``p2p.mining.version``) and each job records the name of the file
it ran with. Tests and tools override single values with ``with_overrides``:

    params = with_overrides(load_params(), {"label_trim.pad": 0.25})

What is not here is not tuned: the definitions of ink and of a text unit, the seam and marker
models' feature definitions (bound to their trained weights), and the constants inside the
heuristics that no tuning run has touched (see services/mining/CHANGELOG.md).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, fields
from functools import cache
from importlib import resources
from typing import Any, TypeVar, get_type_hints

CURRENT = "cpu-1.json"


@dataclass(frozen=True)
class SegmentParams:
    max_analysis_side: int  # larger figures are analysed on an ink-preserving downscale
    speck_area: int  # ink components this small (px) are noise
    # the texture split: parts at least this share of the figure may hold touching panels; BAND px
    # of each side compared across a line in blocks of BLOCK px; AGREEMENT of the blocks must differ
    texture_min_area: float
    texture_band: int
    texture_block: int
    texture_agreement: float
    dense_fill: float  # a part whose content fills this share of its box is an image
    # a part is split along straight boundaries when it is an image (split_fill of its box) or at
    # least split_min_area of the figure, at least split_min_units text units across, at most
    # split_depth times over
    split_depth: int
    split_min_units: float
    split_fill: float
    split_min_area: float
    # a cluster is a panel when it holds a panel-sized part, or is at least min_panel_units text
    # units on each side and min_panel_share of the figure
    min_panel_units: float
    min_panel_share: float
    # confidence of a panel headed by a label, of one holding a panel-sized part (and of the parts
    # the seam splitter cuts off a box), of any other
    labelled_confidence: float
    major_confidence: float
    minor_confidence: float


@dataclass(frozen=True)
class SeamParams:
    max_depth: int  # rounds of halving a box of touching panels (a 3 x 4 grid needs four)


@dataclass(frozen=True)
class CountParams:
    min_score: float  # line score below which a line is an edge inside a picture, whatever the count
    max_named: int  # a caption naming more panels than this is not a count to split towards
    merge_fill: float  # of the joint box two boxes must cover to be halves of one panel
    # a pair's doubt: the boundary probability along its junction plus gap_weight times the share
    # of the joint box neither covers (a gutter); pairs are joined least doubtful first, up to max_doubt
    gap_weight: float
    max_doubt: float
    split_confidence: float  # boxes cut or joined this way are less sure than the rules' panels
    # a piece without a label joins a labelled neighbour across a gap of at most join_gap of the
    # figure's size when together they fill join_fill of their joint box
    join_gap: float
    join_fill: float


@dataclass(frozen=True)
class LabelParams:
    min_score: float  # readings below this are dropped
    strong_score: float  # below this they count only if the a, b, c... sequence confirms them
    grid_area_ratio: float  # panels this alike in area are a grid: a printed series runs on over it


@dataclass(frozen=True)
class LabelSplitParams:
    max_offset: float  # a label's corner: offset from its panel's corner, in label heights
    glyph_height: tuple[float, float]  # a second label's glyphs, in heights of the first
    top_slack: float  # their tops within this many label heights of its top line
    alone: float  # no other glyph-sized ink within this many label heights around a label
    light: int  # labels are printed near white (above this grey level) ...
    dark: int  # ... or near black (below this)
    min_part: float  # either part of a cut panel is at least this many label heights across
    reach: float  # the cut is looked for within this many label heights before the label
    min_strength: float  # the boundary network's mean probability along the cut
    min_reading: float  # a reading this sure is a label
    sure_reading: float  # one this sure places the cut where the network sees no boundary
    touch: int  # px: panels this close share a side


@dataclass(frozen=True)
class LabelTrimParams:
    pad: float  # of the label's height: its glyphs (parentheses, a circle) reach past the read box
    glyph_reach: float  # of the label's height: a component no larger than this is one of its glyphs
    edge_band: int  # px along a box's sides where a neighbour's pixels may lie
    sliver: int  # px: the most of a neighbour's image a box may hold along a side
    min_kept: float  # of the box's area: a trim leaving less than this took content, not a label
    max_overlap: float  # of the label's area: it may overlap the tightened box this much
    # an unread label heading a box: ink rows from the top within unread_height label heights,
    # then unread_gap blank rows, looked for within unread_reach heights, no wider than unread_width
    unread_height: tuple[float, float]
    unread_gap: int
    unread_reach: float
    unread_width: float


@dataclass(frozen=True)
class AxisStripParams:
    touch: int  # px between the left panel's right side and the plot's left side
    axis_width: int  # px: the plot's axis line lies within this of its left side
    axis_share: float  # of the plot's height the axis line runs down
    min_gap: int  # blank columns between the panel's own content and the strip
    max_strip: float  # of the left panel's width
    row_slack: int  # px the strip's ink may stand above or below the plot's rows


@dataclass(frozen=True)
class HeadingParams:
    # the top band is one line of text at most ``line`` label heights tall (a label's capital is
    # shorter than a line with ascenders and descenders), spanning at most ``span`` of the panel,
    # with no blank wider than ``word_gap`` label heights inside it (one phrase), set apart by
    # ``min_gap`` label heights, over content at least ``min_rest`` times the band's height
    line: float
    span: float
    word_gap: float
    min_gap: float
    min_rest: float
    bracket_line: float  # label heights: a rule under the band this thin makes it a group header


@dataclass(frozen=True)
class MarkerParams:
    min_confidence: float  # candidates scoring lower are dropped
    min_score: dict[str, float]  # per kind, against the ideal shape (arrows: look-alikes abound)
    # the hand-set fusion: network peaks at their kind's level are markers; rule-based markers
    # scoring rule_sure (per kind: rule_sure_kind) need no support from the network; more than
    # net_crowd (net_crowd_kind) peaks of one kind in a panel are texture
    net_levels: dict[str, float]
    rule_sure: float
    rule_sure_kind: dict[str, float]
    net_crowd: int
    net_crowd_kind: dict[str, int]
    # the fusion model vetoes what the levels keep on the network's word below veto (weak_veto for
    # peaks under weak_peak) and rescues what they drop from rescue (per kind: rescue_kind)
    veto: float
    rescue: float
    rescue_kind: dict[str, float]
    weak_peak: float
    weak_veto: float
    # tiny colour symbols: their confidence, the hue (degrees) within which blobs are alike, and how
    # many alike blobs make texture
    tiny_score: float
    tiny_hue: float
    tiny_alike: int
    # panels shorter than upscale_below px are also examined enlarged, by at most upscale_max
    upscale_below: float
    upscale_max: float
    # panels longer than max_side px are examined shrunk to it (markers are drawn at a size and
    # scaled with the figure; a 3,000 px panel's arrow is tens of pixels)
    max_side: int


@dataclass(frozen=True)
class RegionParams:
    tau: float  # caption-box gate: normalised distance to a marker centre


@dataclass(frozen=True)
class PostprocessParams:
    nms_iou: float
    merge_cosine: float


@dataclass(frozen=True)
class CpuParams:
    """Every stage's parameters and the file they came from."""

    name: str  # the shipped file ("cpu-1.json"), with "+overrides" when overridden
    segment: SegmentParams
    seams: SeamParams
    count_guided: CountParams
    labels: LabelParams
    label_split: LabelSplitParams
    label_trim: LabelTrimParams
    axis_strips: AxisStripParams
    headings: HeadingParams
    markers: MarkerParams
    regions: RegionParams
    postprocess: PostprocessParams

    def as_dict(self) -> dict[str, Any]:
        """What a job records: the file's name and every value (JSON)."""
        out: dict[str, Any] = {"params_file": self.name}
        for f in fields(self):
            if f.name != "name":
                out[f.name] = dataclasses.asdict(getattr(self, f.name))
        return out

    # the regions and postprocess values at the top level too: what jobs recorded before
    @property
    def tau(self) -> float:
        return self.regions.tau

    @property
    def nms_iou(self) -> float:
        return self.postprocess.nms_iou

    @property
    def merge_cosine(self) -> float:
        return self.postprocess.merge_cosine


_T = TypeVar("_T")


def _build(kind: type[_T], values: dict[str, Any], where: str) -> _T:
    names = {f.name: f for f in fields(kind)}  # type: ignore[arg-type]
    unknown, missing = sorted(set(values) - set(names)), sorted(set(names) - set(values))
    if unknown or missing:
        raise ValueError(f"{where}: unknown {unknown or 'none'}, missing {missing or 'none'}")
    converted = {}
    for key, value in values.items():
        # JSON has no tuples: the pairs (ranges) come back as lists
        converted[key] = tuple(value) if isinstance(value, list) else value
    return kind(**converted)


def parse_params(data: dict[str, Any], name: str) -> CpuParams:
    """A parameter file's content; raises ``ValueError`` naming what is unknown or missing."""
    stages = {f.name: f.type for f in fields(CpuParams) if f.name != "name"}
    unknown, missing = sorted(set(data) - set(stages)), sorted(set(stages) - set(data))
    if unknown or missing:
        raise ValueError(f"{name}: unknown stages {unknown or 'none'}, missing {missing or 'none'}")
    kinds = get_type_hints(CpuParams)
    return CpuParams(
        name=name, **{stage: _build(kinds[stage], data[stage], f"{name} {stage}") for stage in stages}
    )


def params_text(name: str = CURRENT) -> str:
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


@cache
def load_params(name: str = CURRENT) -> CpuParams:
    """A shipped parameter file (read once per process; the objects are frozen)."""
    return parse_params(json.loads(params_text(name)), name)


def params_digest(name: str = CURRENT) -> str:
    return hashlib.sha256(params_text(name).encode("utf-8")).hexdigest()


def with_overrides(params: CpuParams, overrides: dict[str, Any]) -> CpuParams:
    """``params`` with ``{"stage.field": value}`` replaced; the name says it was overridden."""
    by_stage: dict[str, dict[str, Any]] = {}
    for key, value in overrides.items():
        stage, _, field = key.partition(".")
        if not hasattr(params, stage) or stage == "name" or not hasattr(getattr(params, stage), field):
            raise ValueError(f"no parameter {key!r}")
        by_stage.setdefault(stage, {})[field] = tuple(value) if isinstance(value, list) else value
    changed = {
        stage: dataclasses.replace(getattr(params, stage), **values) for stage, values in by_stage.items()
    }
    name = params.name if not overrides else f"{params.name.split('+')[0]}+overrides"
    return dataclasses.replace(params, name=name, **changed)
