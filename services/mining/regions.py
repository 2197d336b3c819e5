"""Marker-guided region fusion (the paper's rule).

Two sources propose regions inside one photographic panel:

* caption-derived boxes: a grounding step read a phrase of the subcaption ("infiltrating
  cells") and proposed where it is. Such boxes are often hallucinated, so one is kept only when
  its centre lies within ``tau`` (a distance normalised by the panel diagonal) of the centre of
  some detected marker's target;
* markers: every detected marker whose target has no caption box near it becomes a region by
  expanding its target box by ``expand`` (a fraction of the box size on every side) to include
  the context around the indicated structure.

The union is de-duplicated by non-maximum suppression, and each region gets the caption fragment
that speaks about its marker type ("arrows indicate infiltrating cells" goes to arrow regions,
"asterisk marks necrosis" to asterisk regions).

Region kinds: ``caption`` (a kept caption box), ``marker`` (the region a box, circle or inset
encloses: drawn by the author), ``inferred`` (the region beyond an arrow tip or around an
asterisk/star: its extent is estimated).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from p2p.mining.types import CaptionFragment, Marker, Region
from p2p.shared.geometry import Box, center, clip, nms, translate

# Marker kinds each caption mention word can refer to, best match first.
MENTION_KINDS: dict[str, tuple[str, ...]] = {
    "arrow": ("arrow", "arrowhead"),
    "arrowhead": ("arrowhead", "arrow"),
    "asterisk": ("asterisk", "star"),
    "star": ("star", "asterisk"),
    "box": ("box",),
    "square": ("box",),
    "rectangle": ("box",),
    "circle": ("circle",),
    "oval": ("circle",),
    "inset": ("inset",),
    "dashed line": ("box", "circle"),
    "dotted": ("box", "circle"),
    "outlined": ("box", "circle"),
}

# Fallback mention finder, for fragments handed over as plain strings.
_MENTION_RE: list[tuple[str, re.Pattern[str]]] = [
    ("arrowhead", re.compile(r"(?i)\barrow[\s-]?heads?\b")),
    ("arrow", re.compile(r"(?i)\barrows?\b")),
    ("asterisk", re.compile(r"(?i)\basterisks?\b")),
    ("star", re.compile(r"(?i)\bstars?\b")),
    ("box", re.compile(r"(?i)\bbox(?:es|ed)?\b")),
    ("square", re.compile(r"(?i)\bsquares?\b")),
    ("rectangle", re.compile(r"(?i)\brectangles?\b|\brectangular\b")),
    ("circle", re.compile(r"(?i)\bcircles?\b|\bcircled\b")),
    ("oval", re.compile(r"(?i)\bovals?\b")),
    ("inset", re.compile(r"(?i)\binsets?\b|\binserts?\b")),
    ("dashed line", re.compile(r"(?i)\b(?:dashed|broken)[\s-]+lines?\b")),
    ("dotted", re.compile(r"(?i)\bdotted\b")),
    ("outlined", re.compile(r"(?i)\boutlined\b|\boutlines?\b")),
]

ENCLOSING = ("box", "circle", "inset")
FRAGMENT_NMS_IOU = 0.5  # union of caption and marker regions: suppress near duplicates


def mentions_of(text: str) -> tuple[str, ...]:
    """Marker words in ``text`` (canonical names, first-mention order)."""
    found: list[tuple[int, str]] = []
    taken: list[tuple[int, int]] = []
    for name, pattern in _MENTION_RE:
        for m in pattern.finditer(text or ""):
            if any(a < m.end() and m.start() < b for a, b in taken):
                continue  # "arrowhead" already claimed this span; do not also count "arrow"
            taken.append((m.start(), m.end()))
            found.append((m.start(), name))
    out: list[str] = []
    for _, name in sorted(found):
        if name not in out:
            out.append(name)
    return tuple(out)


def _as_fragments(fragments: Sequence[CaptionFragment | str] | None) -> list[CaptionFragment]:
    out: list[CaptionFragment] = []
    for frag in fragments or []:
        if isinstance(frag, CaptionFragment):
            mentions = frag.mentions or mentions_of(frag.text)
            out.append(CaptionFragment(text=frag.text, mentions=tuple(mentions)))
        elif isinstance(frag, str) and frag.strip():
            out.append(CaptionFragment(text=frag.strip(), mentions=mentions_of(frag)))
    return out


def fragment_for(kind: str | None, fragments: Sequence[CaptionFragment | str] | None) -> str | None:
    """The caption text grounded to a marker kind: every fragment whose mention words refer to
    that kind (exact kind preferred over a related one, e.g. "arrows" for an arrowhead), joined
    in caption order; None when no fragment speaks about it."""
    if kind is None:
        return None
    frags = _as_fragments(fragments)
    best_rank = None
    chosen: list[str] = []
    for frag in frags:
        ranks = [
            MENTION_KINDS[word].index(kind) for word in frag.mentions if kind in MENTION_KINDS.get(word, ())
        ]
        if not ranks:
            continue
        rank = min(ranks)
        if best_rank is None or rank < best_rank:
            best_rank, chosen = rank, [frag.text]
        elif rank == best_rank and frag.text not in chosen:
            chosen.append(frag.text)
    return " ".join(chosen) if chosen else None


def expand_box(box: Box, expand: float, bounds: Box) -> Box:
    """``box`` grown by ``expand`` times its width/height on each side, clipped to ``bounds``."""
    w, h = box[2] - box[0], box[3] - box[1]
    grown = (box[0] - expand * w, box[1] - expand * h, box[2] + expand * w, box[3] + expand * h)
    x1, y1, x2, y2 = clip(
        translate(grown, -bounds[0], -bounds[1]), bounds[2] - bounds[0], bounds[3] - bounds[1]
    )
    return (x1 + bounds[0], y1 + bounds[1], x2 + bounds[0], y2 + bounds[1])


def _marker_centres(marker: Marker) -> list[tuple[float, float]]:
    """Where a marker says the structure is: the centre of its target box, and its target point."""
    return [center(marker.target_box), (float(marker.target_point[0]), float(marker.target_point[1]))]


def fuse_regions(
    markers: list[Marker],
    caption_boxes: list[tuple[Box, str]],
    *,
    panel_box: Box,
    tau: float = 0.15,
    expand: float = 0.25,
    fragments: Sequence[CaptionFragment | str] | None = None,
    panel_index: int = 0,
    nms_iou: float = FRAGMENT_NMS_IOU,
) -> list[Region]:
    """Fuse caption-derived boxes and markers of one panel into regions (figure pixels).

    ``caption_boxes``: (box, phrase) proposals from the subcaption; kept only within ``tau`` of a
    marker. ``fragments``: the marker-mentioning pieces of the panel's subcaption (or plain
    strings), attached to regions by marker type. Regions are returned best first.
    """
    diag = math.hypot(panel_box[2] - panel_box[0], panel_box[3] - panel_box[1]) or 1.0
    frags = _as_fragments(fragments)
    candidates: list[Region] = []
    covered: set[int] = set()

    for box, phrase in caption_boxes:
        box = expand_box((float(box[0]), float(box[1]), float(box[2]), float(box[3])), 0.0, panel_box)
        if box[2] - box[0] <= 0 or box[3] - box[1] <= 0:
            continue
        cx, cy = center(box)
        best: tuple[float, int] | None = None
        for i, marker in enumerate(markers):
            d = min(math.hypot(cx - mx, cy - my) for mx, my in _marker_centres(marker)) / diag
            if d <= tau and (best is None or d < best[0]):
                best = (d, i)
        if best is None:
            continue  # no marker anywhere near: a hallucinated grounding
        d, i = best
        covered.add(i)
        marker = markers[i]
        confidence = marker.confidence * (1.0 - 0.5 * d / tau) if tau > 0 else marker.confidence
        grounded = fragment_for(marker.kind, frags)
        candidates.append(
            Region(
                panel_index=panel_index,
                box=box,
                kind="caption",
                marker_type=marker.kind,
                caption_text=phrase.strip() or grounded,
                confidence=float(min(1.0, confidence + 0.05)),  # two sources agree: preferred in NMS
                description=grounded if grounded and grounded != phrase.strip() else None,
            )
        )

    for i, marker in enumerate(markers):
        if i in covered:
            continue
        box = expand_box(marker.target_box, expand, panel_box)
        if box[2] - box[0] <= 0 or box[3] - box[1] <= 0:
            continue
        candidates.append(
            Region(
                panel_index=panel_index,
                box=box,
                kind="marker" if marker.kind in ENCLOSING else "inferred",
                marker_type=marker.kind,
                caption_text=fragment_for(marker.kind, frags),
                confidence=float(marker.confidence),
            )
        )

    keep = nms([r.box for r in candidates], [r.confidence for r in candidates], nms_iou)
    return [candidates[i] for i in keep]
