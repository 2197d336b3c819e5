"""Multi-view voting: ask about several random scales and crops of a figure and keep what agrees.

A single LVLM answer jitters its boxes and now and then invents or misses a panel. Every view's
boxes are mapped back to the original figure; votes sharing an identifier are clustered by IoU,
the fused box is the coordinate-wise median (one jittered view cannot move it) and confidence is
the share of the views able to see the box that did report it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from p2p.shared.geometry import Box, center, iou, nms

CONTAIN_SLACK = 1.0  # px: boxes clipped to a crop's edge still count as inside it


@dataclass(frozen=True)
class ViewSpec:
    crop: Box  # region of the original figure, original pixels
    max_pixels: int


def make_views(
    width: int,
    height: int,
    *,
    count: int,
    max_pixels: int,
    rng: np.random.Generator,
    min_side: float = 0.8,
    scale_min: float = 0.6,
) -> list[ViewSpec]:
    """View 0 is the whole figure at full budget, views 1 and 2 rescale it, and from view 3 on
    crops and rescales alternate, each at a random budget. Three whole-figure views give every
    panel three votes, so the median cancels one view's jitter: a crop that cuts a panel cannot
    report it."""
    if count < 1:
        raise ValueError("at least one view is needed")
    whole = (0.0, 0.0, float(width), float(height))
    views = [ViewSpec(whole, max_pixels)]
    for index in range(1, count):
        if index < 3 or index % 2 == 0:
            views.append(ViewSpec(whole, int(rng.uniform(scale_min, 1.0) * max_pixels)))
            continue
        crop_w = max(1, round(width * rng.uniform(min_side, 1.0)))
        crop_h = max(1, round(height * rng.uniform(min_side, 1.0)))
        x1 = int(rng.integers(0, width - crop_w + 1))
        y1 = int(rng.integers(0, height - crop_h + 1))
        budget = int(rng.uniform(scale_min, 1.0) * max_pixels)
        views.append(ViewSpec((float(x1), float(y1), float(x1 + crop_w), float(y1 + crop_h)), budget))
    return views


@dataclass
class PanelVote:
    view: int
    panel_id: str | None
    box: Box  # original frame
    subcaption: str = ""
    description: str = ""


@dataclass
class VotedPanel:
    panel_id: str | None
    box: Box
    confidence: float
    support: int
    subcaption: str
    description: str
    views_seen: int


@dataclass
class VotedBox:
    box: Box
    confidence: float
    support: int
    views_seen: int
    members: list[int] = field(default_factory=list)  # indices into the votes given


def normalize_id(panel_id: str | None) -> str | None:
    """'(a)', ' A ' and '[b]' become 'a', 'A', 'b'; case is kept since 'A' and 'a' may both occur."""
    if panel_id is None:
        return None
    text = "".join(str(panel_id).split()).strip("()[]{}<>.:,;")
    return text or None


def _contains(outer: Box, inner: Box) -> bool:
    return (
        inner[0] >= outer[0] - CONTAIN_SLACK
        and inner[1] >= outer[1] - CONTAIN_SLACK
        and inner[2] <= outer[2] + CONTAIN_SLACK
        and inner[3] <= outer[3] + CONTAIN_SLACK
    )


def _agreement(
    items: Sequence[tuple[int, Box]], pool: Sequence[int], i: int, threshold: float
) -> tuple[int, float]:
    close = [v for j in pool if j != i and (v := iou(items[i][1], items[j][1])) >= threshold]
    return len(close), sum(close)


def _cluster(
    items: Sequence[tuple[int, Box]], views: Sequence[ViewSpec], cluster_iou: float
) -> list[tuple[list[int], Box, int, int]]:
    """Clusters of (view, box) items as (member indices, fused box, support, views seen)."""
    remaining = list(range(len(items)))
    clusters: list[tuple[list[int], Box, int, int]] = []
    while remaining:
        # The seed is the box most others agree with, so a stray box cannot anchor a cluster.
        seed = max(remaining, key=lambda i: _agreement(items, remaining, i, cluster_iou))
        seed_view, seed_box = items[seed]
        best: dict[int, tuple[float, int]] = {}
        for j in remaining:
            view, box = items[j]
            if j == seed or view == seed_view:
                continue
            overlap = iou(seed_box, box)
            if overlap >= cluster_iou and overlap > best.get(view, (-1.0, -1))[0]:
                best[view] = (overlap, j)
        members = [seed, *(j for _, j in best.values())]
        remaining = [j for j in remaining if j not in members]
        coords = np.median(np.array([items[j][1] for j in members], dtype=float), axis=0)
        fused: Box = (float(coords[0]), float(coords[1]), float(coords[2]), float(coords[3]))
        voters = {items[j][0] for j in members}
        # A view whose crop cuts the box could not have reported it; voters saw it regardless.
        seen = voters | {k for k, v in enumerate(views) if _contains(v.crop, fused)}
        clusters.append((members, fused, len(voters), max(1, len(seen))))
    return clusters


def _consensus(values: Sequence[str]) -> str:
    counts = Counter(v.strip() for v in values if v.strip())
    if not counts:
        return ""
    return max(counts, key=lambda v: (counts[v], len(v)))


def reading_order(boxes: Sequence[Box]) -> list[int]:
    """Indices in reading order: rows top to bottom, left to right within a row.

    Two boxes share a row when either one's vertical center lies within the other's height,
    so a tall panel spanning two rows on the left comes before both panels to its right.
    """
    pending = sorted(range(len(boxes)), key=lambda i: (boxes[i][1], boxes[i][0]))
    order: list[int] = []
    while pending:
        anchor = boxes[pending[0]]
        anchor_cy = center(anchor)[1]
        row = [
            i
            for i in pending
            if anchor[1] <= center(boxes[i])[1] < anchor[3] or boxes[i][1] <= anchor_cy < boxes[i][3]
        ]
        row = row or [pending[0]]
        order.extend(sorted(row, key=lambda i: (boxes[i][0], boxes[i][1])))
        pending = [i for i in pending if i not in row]
    return order


def _nms_by_rank(keys: Sequence[tuple[float, int]], boxes: Sequence[Box], nms_iou: float) -> list[int]:
    # Ranks as scores so ties in confidence are broken by support exactly.
    ranked = sorted(range(len(keys)), key=lambda i: keys[i])
    scores = [0.0] * len(keys)
    for rank, i in enumerate(ranked):
        scores[i] = float(rank)
    return nms(boxes, scores, nms_iou)


def aggregate_panels(
    votes: Sequence[PanelVote],
    views: Sequence[ViewSpec],
    *,
    cluster_iou: float = 0.5,
    min_support: float = 0.5,
    nms_iou: float = 0.5,
) -> list[VotedPanel]:
    """Fuse panel votes from several views into panels with agreement-based confidence."""
    groups: dict[str | None, list[PanelVote]] = {}
    for vote in votes:
        groups.setdefault(normalize_id(vote.panel_id), []).append(vote)
    panels: list[VotedPanel] = []
    for panel_id, group in groups.items():
        items = [(v.view, v.box) for v in group]
        for members, fused, support, seen in _cluster(items, views, cluster_iou):
            confidence = support / seen
            if confidence < min_support:
                continue
            chosen = [group[j] for j in members]
            panels.append(
                VotedPanel(
                    panel_id=panel_id,
                    box=fused,
                    confidence=confidence,
                    support=support,
                    subcaption=_consensus([v.subcaption for v in chosen]),
                    description=_consensus([v.description for v in chosen]),
                    views_seen=seen,
                )
            )
    kept = _nms_by_rank([(p.confidence, p.support) for p in panels], [p.box for p in panels], nms_iou)
    survivors = [panels[i] for i in kept]
    return [survivors[i] for i in reading_order([p.box for p in survivors])]


def aggregate_boxes(
    votes: Sequence[tuple[int, Box]],
    views: Sequence[ViewSpec],
    *,
    cluster_iou: float = 0.5,
    min_support: float = 0.5,
    nms_iou: float = 0.5,
) -> list[VotedBox]:
    """The same voting for unlabeled (view, box) votes, e.g. markers or regions across views."""
    fused: list[VotedBox] = []
    for members, box, support, seen in _cluster(votes, views, cluster_iou):
        if support / seen >= min_support:
            fused.append(VotedBox(box, support / seen, support, seen, sorted(members)))
    kept = _nms_by_rank([(b.confidence, b.support) for b in fused], [b.box for b in fused], nms_iou)
    survivors = [fused[i] for i in kept]
    return [survivors[i] for i in reading_order([b.box for b in survivors])]
