"""Learned seam splitter: a second look at the segmenter's panel boxes for touching panels.

The rules in ``segment`` find gutters and clear seams, but two panels that touch without a
gutter (dark fluorescence beside dark fluorescence, grey beside grey) often come back as one box.
For every box, each straight full-length line (vertical or horizontal) away from the box's ends
is a candidate seam, described by cheap features from running sums over a half-resolution copy of
the box: the colour step across the line and how it stands out from the steps beside it, whether
the line itself is a uniform rule, how the two sides differ (mean colour, contrast, texture
energy) in bands of three widths, block by block along the line, the line's position and the
parts' shapes, whether the parts' sizes match other panels of the figure, and the mean
probability along the line of a panel boundary in the maps of ``seam_net`` (a network that sees
the whole figure; retrain this model when its weights change). A small MLP
scores the lines; a box's best line, when it passes the scorer's threshold, goes to a second,
smaller MLP (the cut judge) that also sees which corners of the two parts carry a label-like
glyph (``segment.corner_glyphs``), and whether that is the corner where the figure's other boxes
carry theirs (``label_corner``): panels of a labelled figure each carry one in the same corner,
sub-images of one panel do not. A cut the judge accepts splits the box; the parts are
tightened to their ink and looked at again (``recurse``, ``SeamParams.max_depth`` rounds), with the figure's
boxes as they stand. Both MLPs clip each feature to the range they were trained on before
standardising (a ReLU MLP extrapolates badly past its data). Weights ship in ``seam_model.json``
(written by ``train_seams``); inference is plain numpy.

    >>> boxes = split_boxes(rgb, boxes)   # boxes: figure pixels, x2/y2 exclusive
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from p2p.mining.artifacts import artifact_path
from p2p.mining.cpu.imaging import INK_THRESHOLD, corner_glyphs, tight_box

# segment imports this module only when its rules are done, so this import is not circular
from p2p.mining.cpu.segmentation import seam_net
from p2p.mining.params import SeamParams, load_params

MODEL_FILE = "seam_model.json"
SCALE = 2  # features are computed on a copy shrunk by this factor (cost), seams placed at full size
MIN_PART = 20  # px (shrunk): no panel is thinner than this
MIN_PART_SHARE = 0.06  # of the box's length: nor a sliver of the box
BLOCK = 8  # px (shrunk) along the line per block of the side-by-side comparison
WIDTHS = (2, 6, 20)  # px (shrunk) of each side compared across the line (at most MIN_PART)
CONTEXT = (2, 8)  # steps of lines this far (px) from the candidate are its neighbourhood

IntBox = tuple[int, int, int, int]

FEATURE_NAMES = (
    "step_mean",
    "step_strong",
    "step_standout",
    "step_ratio",
    "step_peak",
    "step_repeats",
    "strong_even",
    "standout_even",
    "step_even",
    "colour_even",
    "line_std",
    "line_grey",
    "line_ink",
    *(f"{kind}_{w}" for w in WIDTHS for kind in ("colour", "colour_frac", "std", "energy")),
    "colour_whole",
    "energy_whole",
    "pos",
    "pos_min",
    "length_share",
    "across_share",
    "part_a_aspect",
    "part_b_aspect",
    "box_share",
    "box_vs_others",
    "n_boxes",
    "size_match_a",
    "size_match_b",
    "across_match",
    "box_ink",
    "axis",
    # the panel-boundary network's mean probability along the line (seam_net, whole-figure view)
    "net_strength",
)


# the second look at a box's best line: panels of a labelled figure each carry a label in the
# same corner, sub-images of one panel do not. That corner is the figure's own (where its other
# boxes carry theirs, ``label_corner``): labels at the bottom left are no rarer in a figure
# than at the top left in another
CUT_FEATURES = (
    "seam_logit",
    "axis",
    "part_share",
    "glyph_a_label",
    "glyph_b_label",
    "glyph_same_corner",
    "glyphs_a",
    "glyphs_b",
    "glyph_box_label",
    # share of the figure's other boxes with a glyph in that corner (0: none, the top left assumed)
    "label_share",
    "box_vs_others",
    "size_match_a",
    "size_match_b",
    "across_match",
    "step_standout",
    "standout_even",
    # touching pictures fill their box; a drawing on white cut through its blank space does not
    "line_ink",
    "box_ink",
    "step_mean",
    "colour_6",
)
# of the line's own features, those the cut judge sees again
_JUDGED_LINE_FEATURES = CUT_FEATURES[-10:]
CORNERS = ("tl", "tr", "bl", "br")


def _shrink(crop: np.ndarray) -> np.ndarray:
    h, w = crop.shape[:2]
    return cv2.resize(crop, (max(1, w // SCALE), max(1, h // SCALE)), interpolation=cv2.INTER_AREA)


def _block_sums(values: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Sums over row blocks, then running sums along the columns: (blocks, width + 1, ...)."""
    blocks = np.add.reduceat(values, starts, axis=0)
    pad = np.zeros((blocks.shape[0], 1, *blocks.shape[2:]), dtype=np.float64)
    return np.concatenate([pad, np.cumsum(blocks, axis=1, dtype=np.float64)], axis=1)


def _channel_max(values: np.ndarray) -> np.ndarray:
    return np.asarray(np.maximum(np.maximum(values[..., 0], values[..., 1]), values[..., 2]))


def _match(lengths: np.ndarray, others: np.ndarray) -> np.ndarray:
    """How far (|log ratio|) each length is from the nearest of the other boxes' (3 when none)."""
    if others.size == 0:
        return np.full(lengths.shape, 3.0)
    ratio = np.abs(np.log(np.maximum(lengths, 1.0)[:, None] / np.maximum(others, 1.0)[None, :]))
    return np.minimum(ratio.min(axis=1), 3.0)


def line_features(
    rgb: np.ndarray,
    box: IntBox,
    axis: int,
    others: list[IntBox],
    small: np.ndarray | None = None,
    maps: seam_net.BoundaryMaps | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Candidate seams of ``box`` across ``axis`` (0: vertical lines) and their features.

    Returns full-size offsets from the box's start (the first column/row of the second part) and
    one feature row per offset (``FEATURE_NAMES``). ``others`` are the figure's other panel boxes;
    ``small``, the box's crop already shrunk; ``maps``, the figure's boundary maps (made here
    when not given).
    """
    x1, y1, x2, y2 = box
    if small is None:
        small = _shrink(rgb[y1:y2, x1:x2])
    if axis == 1:
        small = np.ascontiguousarray(small.transpose(1, 0, 2))
    h, w = small.shape[:2]
    margin = max(MIN_PART, math.ceil(MIN_PART_SHARE * w))
    if h < 4 or w < 2 * margin + 1:
        return np.zeros(0, dtype=np.int64), np.zeros((0, len(FEATURE_NAMES)))
    cols = np.arange(margin, w - margin + 1)
    first, last = margin, w - margin + 1  # cols as a slice
    f = small.astype(np.float32)
    grey = cv2.cvtColor(small, cv2.COLOR_RGB2GRAY).astype(np.float32)
    # colour step across two pixels, then a line's step: the larger either side of it
    s = np.zeros((h, w), dtype=np.float32)
    s[:, 1:-1] = _channel_max(cv2.absdiff(small[:, 2:], small[:, :-2]))
    t = np.zeros((h, w + 1), dtype=np.float32)
    t[:, 1:w] = np.maximum(s[:, :-1], s[:, 1:])
    sv = np.zeros((h, w), dtype=np.float32)
    sv[1:-1] = _channel_max(cv2.absdiff(small[2:], small[:-2]))
    energy = np.maximum(s, sv)

    starts = np.arange(0, h, BLOCK)
    if starts.size > 1 and h - starts[-1] < BLOCK // 2:
        starts = starts[:-1]
    heights = np.diff(np.append(starts, h)).astype(np.float64)[:, None]
    nb = starts.size

    # steps: along the line, and against the lines around it, block by block
    col_step = t.mean(axis=0)  # (w + 1,)
    step = col_step[first:last]
    strong_rows = t[:, first:last] >= 24.0
    strong = strong_rows.mean(axis=0)
    tb = np.add.reduceat(t, starts, axis=0) / heights  # (nb, w + 1)
    tcum = np.concatenate([np.zeros((nb, 1)), np.cumsum(tb, axis=1)], axis=1)
    near, far = CONTEXT

    def around(c: np.ndarray) -> np.ndarray:
        lo1, hi1 = np.maximum(c - far, 0), np.maximum(c - near, 0)
        lo2, hi2 = np.minimum(c + near + 1, w + 1), np.minimum(c + far + 1, w + 1)
        total = tcum[:, hi1] - tcum[:, lo1] + tcum[:, hi2] - tcum[:, lo2]
        count = np.maximum((hi1 - lo1) + (hi2 - lo2), 1)
        return np.asarray(total / count)

    local = around(cols)
    here = tb[:, first:last]
    stands = (here >= 2.0 * local + 8.0) & (here >= 16.0)
    standout = stands.mean(axis=0)
    strong_blocks = np.add.reduceat(strong_rows.astype(np.float32), starts, axis=0) / heights
    ratio = np.log((here.mean(axis=0) + 1.0) / (local.mean(axis=0) + 1.0))
    window = np.lib.stride_tricks.sliding_window_view(np.pad(col_step, 12), 25)  # (w + 1, 25)
    ring = np.concatenate([window[:, :9], window[:, 16:]], axis=1).max(axis=1)
    peak = np.log((col_step[first:last] + 1.0) / (ring[first:last] + 1.0))
    ordered = np.sort(col_step)
    repeats = (ordered.size - np.searchsorted(ordered, 0.6 * step)) / float(w)

    # the line itself: a uniform rule (or gutter) is a separator
    line_pair = np.stack([grey[:, cols - 1], grey[:, np.minimum(cols, w - 1)]])
    line_std = line_pair.std(axis=1).min(axis=0)
    line_grey = line_pair.mean(axis=1).mean(axis=0) / 255.0
    ink = np.minimum(np.minimum(small[..., 0], small[..., 1]), small[..., 2]) < INK_THRESHOLD
    line_ink = np.minimum(ink[:, cols - 1].mean(axis=0), ink[:, np.minimum(cols, w - 1)].mean(axis=0))

    # the two sides, band by band
    stack = np.dstack([f, grey * grey, energy, grey])  # (h, w, 6): r, g, b, grey², energy, grey
    run = _block_sums(stack, starts)  # (nb, w + 1, 6)
    side_feats: list[np.ndarray] = []
    # candidates keep MIN_PART (>= the widest band) from the ends: bands are never clipped
    at = run[:, first:last]
    per_pixel = 1.0 / heights[..., None]
    for width in WIDTHS:
        left = (at - run[:, first - width : last - width]) * (per_pixel / width)
        right = (run[:, first + width : last + width] - at) * (per_pixel / width)
        colour = _channel_max(np.abs(left[..., :3] - right[..., :3]))
        mean_l, mean_r = left[..., 5], right[..., 5]
        std_l = np.sqrt(np.maximum(left[..., 3] - mean_l * mean_l, 0.0))
        std_r = np.sqrt(np.maximum(right[..., 3] - mean_r * mean_r, 0.0))
        if width == WIDTHS[1]:
            colour_blocks = colour >= 12.0
        side_feats += [
            colour.mean(axis=0),
            (colour >= 12.0).mean(axis=0),
            np.abs(std_l - std_r).mean(axis=0),
            np.abs(np.log((left[..., 4] + 2.0) / (right[..., 4] + 2.0))).mean(axis=0),
        ]
    whole = run.sum(axis=0)  # (w + 1, 6)
    width = WIDTHS[-1]
    left = (whole[first:last] - whole[first - width : last - width]) / (width * float(h))
    right = (whole[first + width : last + width] - whole[first:last]) / (width * float(h))
    colour_whole = _channel_max(np.abs(left[:, :3] - right[:, :3]))
    energy_whole = np.abs(np.log((left[:, 4] + 2.0) / (right[:, 4] + 2.0)))

    # a seam runs the whole length: its weakest quarter (an inset's edge, a sub-image's gutter
    # under one label, end part of the way along)
    quarters = np.array_split(np.arange(nb), min(4, nb))

    def weakest(values: np.ndarray) -> np.ndarray:
        return np.asarray(np.min([values[q].mean(axis=0) for q in quarters], axis=0))

    evenness = [
        weakest(strong_blocks),
        weakest(stands.astype(np.float32)),
        weakest(here) / (here.mean(axis=0) + 1.0),
        weakest(colour_blocks.astype(np.float32)),
    ]

    # shape and size: against the figure and its other panels
    fig_h, fig_w = rgb.shape[:2]
    along_fig, across_fig = (fig_w, fig_h) if axis == 0 else (fig_h, fig_w)
    length = float((x2 - x1) if axis == 0 else (y2 - y1))
    across = float((y2 - y1) if axis == 0 else (x2 - x1))
    offsets = np.minimum(cols * SCALE, int(length) - 1)
    part_a = offsets.astype(np.float64)
    part_b = length - part_a
    area = length * across
    other_boxes = [b for b in others if b != box]
    other_areas = np.array([(b[2] - b[0]) * (b[3] - b[1]) for b in other_boxes], dtype=np.float64)
    other_along = np.array(
        [(b[2] - b[0]) if axis == 0 else (b[3] - b[1]) for b in other_boxes], dtype=np.float64
    )
    other_across = np.array(
        [(b[3] - b[1]) if axis == 0 else (b[2] - b[0]) for b in other_boxes], dtype=np.float64
    )
    vs_others = math.log(area / float(np.median(other_areas))) if other_areas.size else 0.0
    across_match = float(_match(np.array([across]), other_across)[0])
    n = cols.size

    def const(value: float) -> np.ndarray:
        return np.full(n, value)

    features = np.column_stack(
        [
            step,
            strong,
            standout,
            ratio,
            peak,
            repeats,
            *evenness,
            line_std,
            line_grey,
            line_ink,
            *side_feats,
            colour_whole,
            energy_whole,
            part_a / length,
            np.minimum(part_a, part_b) / length,
            const(length / along_fig),
            const(across / across_fig),
            np.log(part_a / across),
            np.log(part_b / across),
            const(area / float(fig_h * fig_w)),
            const(vs_others),
            const(min(len(other_boxes), 20) / 10.0),
            _match(part_a, other_along),
            _match(part_b, other_along),
            const(across_match),
            const(float(ink.mean())),
            const(float(axis)),
            (maps or seam_net.boundary_maps(rgb)).line_strength(box, axis, offsets),
        ]
    )
    return offsets, features


def _refine(rgb: np.ndarray, box: IntBox, axis: int, offset: int) -> int:
    """The full-size line beside ``offset`` with the strongest colour step across it."""
    x1, y1, x2, y2 = box
    crop = rgb[y1:y2, x1:x2].astype(np.int16)
    if axis == 1:
        crop = crop.transpose(1, 0, 2)
    length = crop.shape[1]
    best, best_step = offset, -1.0
    for c in range(max(1, offset - SCALE), min(length - 1, offset + SCALE) + 1):
        value = float(np.abs(crop[:, c] - crop[:, c - 1]).max(axis=1).mean())
        if value > best_step:
            best, best_step = c, value
    return best


class _Mlp:
    """Clip features to the range trained on, standardise, then a small MLP (ReLU) ->
    probability."""

    def __init__(self, model: dict[str, Any], names: tuple[str, ...]) -> None:
        if tuple(model["features"]) != names:
            raise ValueError("model was trained on a different feature set")
        # a ReLU MLP extrapolates wildly past its data: a step twice as strong as any it saw is
        # read as the strongest it saw, not as something else
        self.low = np.asarray(model.get("low", [-np.inf] * len(names)), dtype=np.float64)
        self.high = np.asarray(model.get("high", [np.inf] * len(names)), dtype=np.float64)
        self.mean = np.asarray(model["mean"], dtype=np.float64)
        self.scale = np.asarray(model["scale"], dtype=np.float64)
        self.layers = [
            (np.asarray(layer["W"], dtype=np.float64), np.asarray(layer["b"], dtype=np.float64))
            for layer in model["layers"]
        ]
        self.threshold = float(model["threshold"])

    def predict(self, features: np.ndarray) -> np.ndarray:
        x = (np.clip(np.atleast_2d(features), self.low, self.high) - self.mean) / self.scale
        for k, (weights, bias) in enumerate(self.layers):
            x = x @ weights + bias
            if k < len(self.layers) - 1:
                x = np.maximum(x, 0.0)
        return np.asarray(1.0 / (1.0 + np.exp(-np.clip(x[:, 0], -30.0, 30.0))))


class SeamModelError(RuntimeError):
    """The seam model file is missing, unreadable or does not fit this code."""


class SeamModel(_Mlp):
    """Line scorer (``FEATURE_NAMES``; its threshold picks the lines worth a closer look) and,
    when trained, the cut judge (``CUT_FEATURES``: the best line's score and the parts' label
    glyphs), whose threshold decides the cut."""

    def __init__(self, model: dict[str, Any] | None = None, path: Path | None = None) -> None:
        if model is not None:
            super().__init__(model, FEATURE_NAMES)
            self.cuts = _Mlp(model["cuts"], CUT_FEATURES) if model.get("cuts") else None
            return
        source = Path(path) if path is not None else artifact_path(MODEL_FILE)
        try:
            model = dict(json.loads(source.read_text(encoding="utf-8")))
            super().__init__(model, FEATURE_NAMES)
            self.cuts = _Mlp(model["cuts"], CUT_FEATURES) if model.get("cuts") else None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            # the worker stops at start with this message rather than failing every figure
            raise SeamModelError(
                f"seam model {source} is unusable ({exc}); regenerate it with "
                "python -m p2p.mining.lab.train_seams (commands in its docstring)"
            ) from exc


@lru_cache(maxsize=1)
def default_model() -> SeamModel:
    """The shipped model, loaded once."""
    return SeamModel()


@dataclass
class Seam:
    """A box's best candidate line."""

    axis: int
    offset: int  # full size, from the box's start, on the shrunk grid
    score: float
    features: np.ndarray  # its FEATURE_NAMES row


def _halves(box: IntBox, axis: int, offset: int) -> list[IntBox]:
    x1, y1, x2, y2 = box
    if axis == 0:
        return [(x1, y1, x1 + offset, y2), (x1 + offset, y1, x2, y2)]
    return [(x1, y1, x2, y1 + offset), (x1, y1 + offset, x2, y2)]


Corners = dict[IntBox, frozenset[str]]


def glyph_corners(gray: np.ndarray, box: IntBox, u: float, seen: Corners) -> frozenset[str]:
    """The corners of ``box`` holding a label-like glyph, kept in ``seen`` (a figure's boxes are
    looked at again after every cut)."""
    if box not in seen:
        seen[box] = frozenset(g.corner for g in corner_glyphs(gray, box, u, CORNERS, otsu=False))
    return seen[box]


def label_corner(corner_sets: list[frozenset[str]]) -> tuple[str, float]:
    """The corner in which most of ``corner_sets`` (the figure's other boxes) hold a glyph, and
    the share that do; the top left (the commonest in print) on a tie or when none does."""
    if not corner_sets:
        return "tl", 0.0
    counts = {c: sum(c in found for found in corner_sets) for c in CORNERS}
    corner = max(CORNERS, key=lambda c: counts[c])  # the first of equals: tl
    return corner, counts[corner] / len(corner_sets)


def cut_features(
    gray: np.ndarray,
    u: float,
    box: IntBox,
    axis: int,
    parts: list[IntBox],
    seam: Seam,
    others: list[IntBox] | None = None,
    seen: Corners | None = None,
) -> np.ndarray:
    """``CUT_FEATURES`` of cutting ``box`` into ``parts`` (tightened halves) along ``seam``:
    its score, which corners of each part, and of the box, hold a label-like glyph, whether
    that is the corner where the figure's ``others`` boxes hold theirs, and some of the line's
    own features (how the parts' sizes match the figure's other panels). ``seen`` keeps the
    boxes' glyph corners between calls."""
    seen = {} if seen is None else seen
    a = glyph_corners(gray, parts[0], u, seen)
    b = glyph_corners(gray, parts[1], u, seen)
    whole = glyph_corners(gray, box, u, seen)
    first, share = label_corner([glyph_corners(gray, o, u, seen) for o in others or [] if o != box])
    logit = math.log(max(seam.score, 1e-6) / max(1.0 - seam.score, 1e-6))
    length = [(p[2] - p[0]) if axis == 0 else (p[3] - p[1]) for p in parts]
    return np.array(
        [
            logit,
            float(axis),
            min(length) / max(1.0, float(sum(length))),
            float(first in a),
            float(first in b),
            float(bool(a & b)),
            float(len(a)),
            float(len(b)),
            float(first in whole),
            share,
            *(float(seam.features[FEATURE_NAMES.index(name)]) for name in _JUDGED_LINE_FEATURES),
        ]
    )


def cut_parts(
    rgb: np.ndarray, ink: np.ndarray, box: IntBox, axis: int, offset: int
) -> tuple[int, int, list[IntBox]]:
    """The cut along a (shrunk-grid) line placed on the full-size pixels: (axis, offset, the
    halves tightened to their ink; fewer than two when one holds none)."""
    offset = _refine(rgb, box, axis, offset)
    return axis, offset, [p for p in (tight_box(ink, h) for h in _halves(box, axis, offset)) if p is not None]


def box_lines(
    rgb: np.ndarray, box: IntBox, others: list[IntBox], maps: seam_net.BoundaryMaps
) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """The box's candidate lines: (axis, offsets, features) for each axis that has some."""
    x1, y1, x2, y2 = box
    small = _shrink(rgb[y1:y2, x1:x2])
    out = []
    for axis in (0, 1):
        offsets, features = line_features(rgb, box, axis, others, small, maps)
        if offsets.size:
            out.append((axis, offsets, features))
    return out


def top_seam(lines: list[tuple[int, np.ndarray, np.ndarray]], scores: list[np.ndarray]) -> Seam | None:
    """The line (of ``box_lines``) with the highest score, or None without candidates."""
    best: Seam | None = None
    for (axis, offsets, features), axis_scores in zip(lines, scores, strict=True):
        k = int(np.argmax(axis_scores))
        if best is None or axis_scores[k] > best.score:
            best = Seam(axis, int(offsets[k]), float(axis_scores[k]), features[k])
    return best


def best_seam(
    rgb: np.ndarray, box: IntBox, others: list[IntBox], model: SeamModel, maps: seam_net.BoundaryMaps
) -> Seam | None:
    """The box's likeliest seam (either axis), or None without candidates."""
    lines = box_lines(rgb, box, others, maps)
    return top_seam(lines, [model.predict(features) for _, _, features in lines])


Cutter = Callable[[IntBox, list[IntBox]], "list[IntBox] | None"]


def recurse(boxes: list[IntBox], cut: Cutter, max_depth: int) -> list[IntBox]:
    """``boxes`` with each one that ``cut(box, all boxes so far)`` splits in two replaced by its
    first part, the second appended, and both looked at again, ``max_depth`` rounds deep."""
    out = list(boxes)
    todo = [(k, 0) for k in range(len(out))]
    while todo:
        k, depth = todo.pop()
        parts = cut(out[k], out)
        if parts is None:
            continue
        out[k] = parts[0]
        out.append(parts[1])
        if depth + 1 < max_depth:
            todo += [(k, depth + 1), (len(out) - 1, depth + 1)]
    return out


def split_boxes(
    rgb: np.ndarray,
    boxes: list[IntBox],
    *,
    ink: np.ndarray | None = None,
    u: float = 10.0,
    model: SeamModel | None = None,
    threshold: float | None = None,
    maps: seam_net.BoundaryMaps | None = None,
    params: SeamParams | None = None,
) -> list[IntBox]:
    """``boxes`` with each box that holds touching panels cut along its seams (recursively,
    ``params.max_depth`` rounds), every part tightened to its ink (``ink``: the figure's ink mask). ``u`` is
    the figure's text unit (px), for the label-glyph search; ``threshold`` overrides the
    deciding one (the cut judge's when the model has one, else the line scorer's); ``maps``, the
    figure's boundary maps when the caller already has them."""
    model = model or default_model()
    judge = model.cuts
    line_threshold = model.threshold if judge is not None or threshold is None else threshold
    cut_threshold = (judge.threshold if threshold is None else threshold) if judge is not None else 0.0
    figure_ink = rgb.min(axis=2) < INK_THRESHOLD if ink is None else ink
    gray: np.ndarray | None = None  # for the judge's glyph search, made at the first cut it weighs
    seen: Corners = {}  # boxes' glyph corners, for the judge
    if not boxes:
        return []
    if maps is None:
        maps = seam_net.boundary_maps(rgb)

    def cut(box: IntBox, out: list[IntBox]) -> list[IntBox] | None:
        nonlocal gray
        seam = best_seam(rgb, box, out, model, maps)
        if seam is None or seam.score < line_threshold:
            return None
        axis, _, parts = cut_parts(rgb, figure_ink, box, seam.axis, seam.offset)
        if len(parts) < 2:
            return None
        if judge is not None:
            if gray is None:
                gray = cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY)
            if judge.predict(cut_features(gray, u, box, axis, parts, seam, out, seen))[0] < cut_threshold:
                return None
        return parts

    return recurse(boxes, cut, (params or load_params().seams).max_depth)
