"""Sub-panel labels printed on the pictures of a grid: "c1", "c2" ... one per picture.

Real figures often print no letter for a group of pictures and label each picture instead, the
group letter followed by a number, in the picture's top-left corner (light on dark pictures,
dark on light ones). The segmenter keeps such a grid whole (its gutters are a few pixels wide,
as in a grid under one letter), and the corner search of ``read.find_labels`` looks only at the
whole piece's corners, so at most the first picture's label is read.

``split_sub_labelled`` looks inside each piece for a grid of pictures (light gutters crossing
the piece), reads each picture's top-left corner, and when the readings are one group's
numbered series ("c1", "c2" ...), cuts the piece into its pictures, each with its own label. A
picture whose label was not read takes its number from its place in the series when the others
agree with theirs; otherwise the piece stays whole.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

import numpy as np

from p2p.mining.cpu.imaging import corner_glyphs
from p2p.mining.cpu.labels.read import read_corner_glyphs
from p2p.mining.types import LabelDetection, PanelCandidate

IntBox = tuple[int, int, int, int]

GUTTER_GREY = 232  # a gutter column or row: light all along the piece
GUTTER_SHARE = 0.97  # of its pixels (JPEG speckle)
MIN_TILE_SHARE = 0.12  # a picture spans at least this share of the piece's side
MIN_TILE_PX = 24
PICTURE_FILL = 0.85  # a picture covers its box (charts and diagrams are mostly white)
PICTURE_STD = 12.0  # and varies across it (a flat grey block is no picture)
MIN_READ_SHARE = 0.5  # of the pictures whose numbered label must be read
SUB_CONFIDENCE = 0.75  # a panel cut out of a grid at its printed sub-label
INFERRED_CONFIDENCE = 0.35  # a sub-label not read, numbered from its place in the series
MIN_SCORE = 0.5  # the recogniser's score for a numbered label read in a corner
MAX_GLYPHS = 3  # glyph groups read per corner, nearest first
MAX_GAP_SHARE = 0.12  # of a picture's side: the widest gutter inside a grid
MIN_PICTURE_COVER = 0.6  # of the piece's area, covered by the pictures found

_SUB_RE = re.compile(r"^([A-Za-z])([1-9])$")
_THIN_ONE = str.maketrans({"I": "1", "l": "1", "|": "1", "i": "1"})
_ROUND = frozenset("cCoO0eGDQ(")  # glyphs a recogniser takes for one another in a corner


@dataclass(frozen=True)
class SubLabel:
    letter: str
    number: int

    @property
    def text(self) -> str:
        return f"{self.letter}{self.number}"


def as_sub_label(text: str) -> SubLabel | None:
    """A numbered sub-panel label ("c1", "B2"); "CI" / "Cl" read for "C1" count as "C1"."""
    if len(text) == 2 and text[0].isalpha():
        text = text[0] + text[1].translate(_THIN_ONE)
    found = _SUB_RE.match(text)
    return SubLabel(found.group(1), int(found.group(2))) if found else None


def _runs(light: np.ndarray) -> list[tuple[int, int]]:
    """Runs of True in a 1-D mask: (start, end exclusive)."""
    edges = np.flatnonzero(np.diff(np.concatenate(([0], light.astype(np.int8), [0]))))
    return [(int(a), int(b)) for a, b in zip(edges[::2], edges[1::2], strict=True)]


def _cuts(gray: np.ndarray, axis: int) -> list[tuple[int, int]]:
    """Spans between light gutters crossing ``gray`` along ``axis`` (0: columns, 1: rows)."""
    light = (gray >= GUTTER_GREY).mean(axis=axis) >= GUTTER_SHARE
    length = light.size
    spans: list[tuple[int, int]] = []
    start = 0
    for a, b in _runs(light):
        if a > start:
            spans.append((start, a))
        start = b
    if start < length:
        spans.append((start, length))
    return spans


def picture_tiles(gray: np.ndarray, box: IntBox) -> list[IntBox]:
    """The pictures of a grid inside ``box`` (columns cut at light gutters, then each column's
    rows), tight to their content; [] when the piece is no grid of pictures."""
    x1, y1, x2, y2 = box
    piece = gray[y1:y2, x1:x2]
    if piece.size == 0:
        return []
    min_w = max(MIN_TILE_PX, MIN_TILE_SHARE * (x2 - x1))
    min_h = max(MIN_TILE_PX, MIN_TILE_SHARE * (y2 - y1))
    tiles: list[IntBox] = []
    for cx1, cx2 in _cuts(piece, axis=0):
        if cx2 - cx1 < min_w:
            continue
        column = piece[:, cx1:cx2]
        for ry1, ry2 in _cuts(column, axis=1):
            if ry2 - ry1 < min_h:
                continue
            if not _fills_like_picture(column[ry1:ry2]):
                continue  # a header row, a chart, a diagram: no picture
            tiles.append((x1 + cx1, y1 + ry1, x1 + cx2, y1 + ry2))
    covered = sum((t[2] - t[0]) * (t[3] - t[1]) for t in tiles)
    if len(tiles) < 2 or covered < MIN_PICTURE_COVER * piece.size:
        return []
    return tiles


def _in_reading_order(tiles: list[IntBox]) -> list[IntBox]:
    """Rows top to bottom (tiles whose tops are within half a tile), left to right in a row."""
    rows: list[list[IntBox]] = []
    for tile in sorted(tiles, key=lambda t: t[1]):
        if rows and tile[1] - rows[-1][0][1] < 0.5 * (rows[-1][0][3] - rows[-1][0][1]):
            rows[-1].append(tile)
        else:
            rows.append([tile])
    return [t for row in rows for t in sorted(row, key=lambda t: t[0])]


def _read_tile(gray: np.ndarray, tile: IntBox, u: float) -> LabelDetection | None:
    """The numbered label in a picture's top-left corner, if one may read there (``text`` the
    reading as a label when it is one, ``raw`` the reading cleaned of punctuation)."""
    glyphs = corner_glyphs(gray, tile, u, ("tl",), grow=True)[:MAX_GLYPHS]
    best: LabelDetection | None = None
    for glyph, readings in zip(glyphs, read_corner_glyphs(gray, glyphs), strict=True):
        for raw, score in readings:
            cleaned = "".join(raw.split()).strip(")[].,:;'")
            if (
                _place(cleaned) is None
                or score < MIN_SCORE
                or (best is not None and score <= best.confidence)
            ):
                continue
            sub = as_sub_label(cleaned)
            box = tuple(float(v) for v in glyph.box)
            text = sub.text if sub is not None else cleaned
            best = LabelDetection(text=text, box=box, confidence=float(score), raw=cleaned)  # type: ignore[arg-type]
    return best


def _place(text: str) -> tuple[str, int] | None:
    """(first character, number) of a reading that may be a numbered label: the first character
    may be a round glyph misread ("02" for "c2") and is judged against the group's letter."""
    if len(text) != 2:
        return None
    first, digit = text[0], text[1].translate(_THIN_ONE)
    if not (first.isalpha() or first in _ROUND) or digit not in "123456789":
        return None
    return first, int(digit)


def _series(readings: list[LabelDetection | None], named: set[str]) -> list[str] | None:
    """One label per picture when the readings are one group's numbered series in reading
    order (a picture without a reading takes the number of its place), else None."""
    places = [_place(r.raw) if r is not None else None for r in readings]
    letters = Counter(p[0] for p in places if p is not None and p[0].isalpha())
    if not letters:
        return None
    letter = letters.most_common(1)[0][0]
    read = 0
    for i, place in enumerate(places):
        if place is None:
            continue
        first, number = place
        alike = first == letter or (first in _ROUND and letter in _ROUND)
        if not alike or number != i + 1:
            return None
        read += 1
    if read < max(1, MIN_READ_SHARE * len(places)):
        return None
    labels = [f"{letter}{i + 1}" for i in range(len(places))]
    if read == 1 and {lab.lower() for lab in labels} - named:
        return None  # one reading alone: only when the caption names the whole series
    return labels


def _fills_like_picture(patch: np.ndarray) -> bool:
    return float((patch < GUTTER_GREY).mean()) >= PICTURE_FILL and float(patch.std()) >= PICTURE_STD


def _is_picture(gray: np.ndarray, box: IntBox) -> bool:
    x1, y1, x2, y2 = box
    patch = gray[y1:y2, x1:x2]
    if patch.size == 0 or min(x2 - x1, y2 - y1) < MIN_TILE_PX:
        return False
    return _fills_like_picture(patch)


def _neighbours(a: IntBox, b: IntBox) -> bool:
    """Pictures side by side in a row or one above the other in a column, a narrow gutter apart."""
    aw, ah, bw, bh = a[2] - a[0], a[3] - a[1], b[2] - b[0], b[3] - b[1]
    gap_x = max(a[0], b[0]) - min(a[2], b[2])
    gap_y = max(a[1], b[1]) - min(a[3], b[3])
    same_row = abs(a[1] - b[1]) <= 0.1 * min(ah, bh) and abs(ah - bh) <= 0.15 * max(ah, bh)
    same_col = abs(a[0] - b[0]) <= 0.1 * min(aw, bw) and abs(aw - bw) <= 0.15 * max(aw, bw)
    return (same_row and 0 <= gap_x <= MAX_GAP_SHARE * min(aw, bw)) or (
        same_col and 0 <= gap_y <= MAX_GAP_SHARE * min(ah, bh)
    )


def _groups(boxes: dict[int, IntBox]) -> list[list[int]]:
    """Sets of two or more pictures joined by narrow gutters."""
    seen: set[int] = set()
    out: list[list[int]] = []
    for start in boxes:
        if start in seen:
            continue
        group, todo = [], [start]
        seen.add(start)
        while todo:
            k = todo.pop()
            group.append(k)
            for other, box in boxes.items():
                if other not in seen and _neighbours(boxes[k], box):
                    seen.add(other)
                    todo.append(other)
        if len(group) >= 2:
            out.append(group)
    return out


def _numbered(
    gray: np.ndarray, box: IntBox, label: str | None, detections: list[LabelDetection], u: float
) -> LabelDetection | None:
    """The numbered label of a picture: the one the label stage gave it, else its corner read."""
    if label is not None and as_sub_label(label) is not None:
        for d in detections:
            if d.text == label:
                return LabelDetection(text=label, box=d.box, confidence=d.confidence, raw=label)
    return _read_tile(gray, box, u)


def _detection(text: str, tile: IntBox, reading: LabelDetection | None, u: float) -> LabelDetection:
    if reading is not None:
        return LabelDetection(text=text, box=reading.box, confidence=reading.confidence, raw=reading.raw)
    # placed where its series prints it, so that the later stages count it as read
    side = 2.0 * u
    corner = (float(tile[0]), float(tile[1]), tile[0] + side, tile[1] + side)
    return LabelDetection(text=text, box=corner, confidence=INFERRED_CONFIDENCE, raw="")


def _pictures(
    gray: np.ndarray, candidates: list[PanelCandidate], labels: list[str | None]
) -> tuple[dict[int, tuple[int, IntBox]], dict[int, str | None]]:
    """Every piece's pictures: picture id -> (its piece, its box), and the label the label stage
    gave each picture that is a whole piece."""
    pictures: dict[int, tuple[int, IntBox]] = {}
    given: dict[int, str | None] = {}
    for k, candidate in enumerate(candidates):
        box: IntBox = tuple(round(v) for v in candidate.box)  # type: ignore[assignment]
        tiles = picture_tiles(gray, box)
        if not tiles and _is_picture(gray, box):
            given[len(pictures)] = labels[k]
            tiles = [box]
        for tile in tiles:
            pictures[len(pictures)] = (k, tile)
    return pictures, given


def split_sub_labelled(
    gray: np.ndarray,
    candidates: list[PanelCandidate],
    labels: list[str | None],
    detections: list[LabelDetection],
    *,
    u: float,
    named: list[str],
) -> tuple[list[PanelCandidate], list[str | None], list[LabelDetection]]:
    """Grids of pictures with numbered labels ("c1", "c2" ...), one panel per picture.

    The pictures are those of every piece (a piece may hold several, cut at light gutters, or
    be one); pictures joined by narrow gutters form a grid, however the segmenter cut it, and a
    grid whose corners read as one group's numbered series gives each picture its label. A
    piece is cut into its pictures only when all of them are in such a grid."""
    named_keys = {n.lower() for n in named}
    # sub-labels are printed near the size of the figure's letters, which on a large figure are
    # far taller than its text unit: the corner windows are sized from the letters read
    heights = sorted(d.box[3] - d.box[1] for d in detections if d.confidence >= 0.5)
    if heights:
        u = max(u, 0.5 * heights[len(heights) // 2])
    pictures, given = _pictures(gray, candidates, labels)
    named_pictures: dict[int, tuple[str, LabelDetection]] = {}
    for group in _groups({i: tile for i, (_, tile) in pictures.items()}):
        boxes = _in_reading_order([pictures[i][1] for i in group])
        order = sorted(group, key=lambda i: boxes.index(pictures[i][1]))

        def read(i: int) -> LabelDetection | None:
            return _numbered(gray, pictures[i][1], given.get(i), detections, u)

        # a grid numbers its first pictures too: when neither of the first two reads as a numbered
        # label, the rest are not read (most grids under one letter; the reads are the cost)
        readings = [read(i) for i in order[:2]]
        if all(r is None or _place(r.raw) is None for r in readings):
            continue
        readings += [read(i) for i in order[2:]]
        series = _series(readings, named_keys)
        if series is None:
            continue
        for i, text, reading in zip(order, series, readings, strict=True):
            named_pictures[i] = (text, _detection(text, pictures[i][1], reading, u))
    if not named_pictures:
        return candidates, labels, detections
    return _cut(candidates, labels, detections, pictures, named_pictures)


def _cut(
    candidates: list[PanelCandidate],
    labels: list[str | None],
    detections: list[LabelDetection],
    pictures: dict[int, tuple[int, IntBox]],
    named_pictures: dict[int, tuple[str, LabelDetection]],
) -> tuple[list[PanelCandidate], list[str | None], list[LabelDetection]]:
    """Pieces all of whose pictures are named replaced by their pictures, in reading order."""
    out_c: list[PanelCandidate] = []
    out_l: list[str | None] = []
    found: list[LabelDetection] = []
    for k, (candidate, label) in enumerate(zip(candidates, labels, strict=True)):
        own = [i for i, (piece, _) in pictures.items() if piece == k]
        if not own or any(i not in named_pictures for i in own):
            out_c.append(candidate)
            out_l.append(label)
            continue
        in_order = _in_reading_order([pictures[i][1] for i in own])
        for i in sorted(own, key=lambda i: in_order.index(pictures[i][1])):
            text, detection = named_pictures[i]
            tile = pictures[i][1]
            confidence = candidate.confidence if len(own) == 1 else SUB_CONFIDENCE
            out_c.append(PanelCandidate(box=tuple(float(v) for v in tile), confidence=confidence))  # type: ignore[arg-type]
            out_l.append(text)
            found.append(detection)
    # what was read before inside the named pictures (the same labels, or misreadings of them)
    # gives way to their numbered labels
    named_tiles = [pictures[i][1] for i in named_pictures]
    replaced = {d.text for d in found}
    kept = [
        d
        for d in detections
        if d.text not in replaced and not any(_holds(tile, d.box) for tile in named_tiles)
    ]
    return out_c, out_l, kept + found


def _holds(tile: IntBox, box: tuple[float, float, float, float]) -> bool:
    cx, cy = (box[0] + box[2]) / 2, (box[1] + box[3]) / 2
    return tile[0] <= cx < tile[2] and tile[1] <= cy < tile[3]
