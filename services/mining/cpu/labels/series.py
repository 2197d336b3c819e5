"""The figure's printed label series: which readings are panel labels, which letters it lacks,
and those looked for again among lone glyphs of the labels' size.

- Labels are the read detections that form one series (one case of letters, or the labels the
  caption names; sub-panel labels such as "a1" beside "A").
- Letters the series lacks are looked for among lone glyphs (a blank margin all round) and read
  again (``unread_labels``): those between the readings, those up to a letter read past a gap in
  the series (``past_gap``), and the one after the last read (``next_letter``). A lone upright bar
  is the series' I when it lacks one.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import cv2
import numpy as np

from p2p.mining.cpu.imaging import INK_THRESHOLD, CornerGlyph, IntBox, tight_box
from p2p.mining.cpu.labels.read import read_glyphs
from p2p.mining.types import LabelDetection
from p2p.shared.geometry import Box

# Tuned on real-dev "tune" only (bench/README.md, real figures).
MIN_LABEL_CONFIDENCE = 0.3  # reads below this own nothing unless the caption names them
MAX_SERIES_GAP = 2  # letters missing in a row before the series is taken to have ended
BAR_READINGS = frozenset({"I", "i", "l", "1", "|"})
BAR_WIDTH = 0.3  # of its height: a bar glyph no wider than this is a sans-serif I
LABEL_HEIGHT = 0.7  # of the labels' median height: a reading of a letter this tall may be it
GRID_ROW = 0.3  # label heights: a glyph whose top is this near a label's tops its row
GRID_COLUMN = 0.5  # label heights: one whose left edge is this near a label's starts its column
SOLID_BAR = 0.85  # of its box a bar's ink fills (an l's hook or a 1's flag leave more blank)
MAX_GLYPH_READS = 48  # lone glyphs read in search of unread labels, likeliest sizes first
GLYPH_WIDTH = 1.5  # of the labels' height: a lone glyph no wider than this may be a label
WORD_WIDTH = 3.0  # ... and a lone word of glyphs ("(b)", "b.")
WORD_GAP = 0.3  # of the labels' height: glyphs this close on one line are one word
MIN_ORDERED = 3  # letters read before a small one out of their order counts as a stray


def series_labels(detections: list[LabelDetection], named: list[str]) -> list[LabelDetection]:
    """The detections that are panel labels: one per text, in one series.

    With a caption that names labels, those the caption names (case aside). Without, letters of
    the case most reads have, from "a" on up to the first run of more than ``MAX_SERIES_GAP``
    missing letters; digits and words only when the caption names them."""
    if named:
        wanted = {n.lower() for n in named}
        return list(
            _one_each(
                _without_strays([d for d in detections if d.text.lower() in wanted]), str.lower
            ).values()
        )
    letters = _without_strays(
        [
            d
            for d in detections
            if len(d.text) == 1 and d.text.isalpha() and d.confidence >= MIN_LABEL_CONFIDENCE
        ]
    )
    upper = [d for d in letters if d.text.isupper()]
    lower = [d for d in letters if d.text.islower()]
    best = _one_each(upper if len(upper) >= len(lower) else lower, str)
    kept: list[LabelDetection] = []
    expected = 0
    for det in sorted(best.values(), key=lambda d: d.text.lower()):
        index = ord(det.text.lower()) - ord("a")
        if index - expected > MAX_SERIES_GAP:
            break
        if index - expected >= 2 and kept and not _follows(det, kept):
            # a letter past two or more missing that the figure prints before the last one read
            # is text ("M" in a heading after labels A-J)
            break
        kept.append(det)
        expected = index + 1
    return kept + _sub_labels(detections, kept)


def _without_strays(detections: list[LabelDetection]) -> list[LabelDetection]:
    """The readings without letters both smaller than the labels (``LABEL_HEIGHT`` of their
    median height) and out of their order: a glyph inside a picture read as "A", printed after
    B, C and D, is no label however sure the reading."""
    letters = [d for d in detections if len(d.text) == 1 and d.text.isalpha()]
    if len(letters) < MIN_ORDERED:
        return detections
    median = float(np.median([d.box[3] - d.box[1] for d in letters]))
    return [
        d
        for d in detections
        if d not in letters
        or d.box[3] - d.box[1] >= LABEL_HEIGHT * median
        or _in_series_order(d.box, d.text.lower(), [o for o in letters if o is not d])
    ]


def _one_each(detections: list[LabelDetection], key: Callable[[str], str]) -> dict[str, LabelDetection]:
    """The likeliest reading of each label: the most confident of its readings as tall as the
    labels are (``LABEL_HEIGHT`` of their median height), or of all when none is. A tick or a
    stroke read as the letter is smaller than the label itself, however sure the reading."""
    by_key: dict[str, list[LabelDetection]] = {}
    for det in detections:
        by_key.setdefault(key(det.text), []).append(det)
    if not by_key:
        return {}
    firsts = [max(found, key=lambda d: d.confidence) for found in by_key.values()]
    median = float(np.median([d.box[3] - d.box[1] for d in firsts]))
    best: dict[str, LabelDetection] = {}
    for name, found in by_key.items():
        tall = [d for d in found if d.box[3] - d.box[1] >= LABEL_HEIGHT * median]
        best[name] = max(tall or found, key=lambda d: d.confidence)
    return best


def _follows(det: LabelDetection, kept: list[LabelDetection]) -> bool:
    """``det`` lies after the last of ``kept`` in the order the kept labels follow: by rows
    (below, or on the line to the right) or by columns. Without one clear order, it may."""
    by_rows = all(_after(b, a, rows=True) for a, b in itertools.pairwise(kept))
    by_columns = all(_after(b, a, rows=False) for a, b in itertools.pairwise(kept))
    if not (by_rows or by_columns):
        return True
    last = kept[-1]
    return (by_rows and _after(det, last, rows=True)) or (by_columns and _after(det, last, rows=False))


def _after(det: LabelDetection, last: LabelDetection, *, rows: bool) -> bool:
    (x1, y1, _, _), (lx1, ly1, _, ly2) = det.box, last.box
    line = 0.5 * (ly2 - ly1)
    if rows:
        return y1 > ly1 + line or (abs(y1 - ly1) <= line and x1 > lx1)
    return x1 > lx1 + line or (abs(x1 - lx1) <= line and y1 > ly1)


def _sub_labels(detections: list[LabelDetection], kept: list[LabelDetection]) -> list[LabelDetection]:
    """Sub-panel labels of a kept letter ("a1", "a2" beside "A") are printed labels too, and so
    are those of a letter the series lacks or would print next ("c1", "c2" between B and D: the
    group's letter is not printed, its pictures' labels are)."""
    letters = {d.text.lower() for d in kept}
    if kept:
        last = max(ord(d.text.lower()) for d in kept)
        letters |= {chr(c) for c in range(ord("a"), last + 2)}
    subs: dict[str, LabelDetection] = {}
    for det in detections:
        text = det.text
        if (
            len(text) == 2
            and text[0].lower() in letters
            and text[1].isdigit()
            and det.confidence >= MIN_LABEL_CONFIDENCE
            and (text not in subs or det.confidence > subs[text].confidence)
        ):
            subs[text] = det
    return list(subs.values())


def expected_letters(series: list[LabelDetection], named: list[str], upto: str | None = None) -> list[str]:
    """The single-letter labels the figure should print: the caption's, or a to the last read
    (or to ``upto``, a letter read past a gap in the series)."""
    if named:
        return [n for n in named if len(n) == 1 and n.isalpha()]
    if not series:
        return []
    upper = series[0].text.isupper()
    last = max(ord(d.text.lower()) for d in series)
    if upto is not None:
        last = max(last, ord(upto.lower()))
    letters = [chr(c) for c in range(ord("a"), last + 1)]
    return [c.upper() if upper else c for c in letters]


def unread_labels(
    image: np.ndarray,
    ink: np.ndarray,
    factor: int,
    series: list[LabelDetection],
    named: list[str],
    upto: str | None = None,
) -> list[LabelDetection]:
    """Labels the series lacks, looked for among lone glyphs the size of those read: a letter
    standing apart (blank margin all round) read by the label recogniser as a missing letter."""
    have = {d.text.lower() for d in series}
    missing = {c.lower(): c for c in expected_letters(series, named, upto) if c.lower() not in have}
    if not missing or not series:
        return []
    heights = sorted(d.box[3] - d.box[1] for d in series)
    found = _lone_glyphs(ink, factor, heights[len(heights) // 2] / factor, [d.box for d in series])
    best: dict[str, LabelDetection] = {}
    for det in _read_glyphs(image, found, factor):
        if "i" in missing and _bar(det):
            # a lone upright bar is an I, l, 1 or |: the recogniser cannot tell which and is
            # unsure of any; where the series lacks an I, the bar is it
            det = LabelDetection(
                text=missing["i"],
                box=det.box,
                confidence=max(det.confidence, MIN_LABEL_CONFIDENCE),
                raw=det.raw,
            )
        key = det.text.lower()
        if (
            det.confidence < MIN_LABEL_CONFIDENCE
            or key not in missing
            or (det.text != missing[key] and not named)
        ):
            continue
        if key not in best or det.confidence > best[key].confidence:
            best[key] = LabelDetection(text=missing[key], box=det.box, confidence=det.confidence, raw=det.raw)
    if "i" in missing and "i" not in best:
        # a bar one or two pixels wide (a small copy's I) gives the recogniser nothing to read;
        # the only solid lone bar in a figure whose series expects an I is that I
        bars = [box for box in found if _solid_bar(ink, factor, box)]
        if len(bars) == 1:
            best["i"] = _glyph_label(missing["i"], bars[0], raw="|")
    unread = [key for key in missing if key not in best]
    if len(unread) == 1:
        # a glyph the recogniser cannot read (a small copy's J is a bar with a one-pixel hook)
        # standing where the labels' rows and columns meet is the one letter still missing
        placed = [
            box
            for box in found
            if _on_label_grid(box, series)
            and _in_series_order(box, unread[0], series)
            and not any(_overlap(box, d.box) for d in best.values())
        ]
        if len(placed) == 1:
            best[unread[0]] = _glyph_label(missing[unread[0]], placed[0], raw="")
    return list(best.values())


def _glyph_label(text: str, box: Box, *, raw: str) -> LabelDetection:
    """A lone glyph (figure-pixel ``box``) taken for the label ``text`` by its shape or place,
    not by a reading: as sure as a label must be to count."""
    x1, y1, x2, y2 = (float(v) for v in box)
    return LabelDetection(text=text, box=(x1, y1, x2, y2), confidence=MIN_LABEL_CONFIDENCE, raw=raw)


def _in_series_order(box: Box, letter: str, series: list[LabelDetection]) -> bool:
    """Whether ``box`` lies where ``letter`` goes in the order the labels follow (by rows or by
    columns): after the label of the letter before it and before that of the letter after it."""
    at = _glyph_label(letter, box, raw="")
    before = [d for d in series if len(d.text) == 1 and d.text.lower() < letter]
    after = [d for d in series if len(d.text) == 1 and d.text.lower() > letter]
    previous = max(before, key=lambda d: d.text.lower(), default=None)
    following = min(after, key=lambda d: d.text.lower(), default=None)
    return any(
        (previous is None or _after(at, previous, rows=rows))
        and (following is None or _after(following, at, rows=rows))
        for rows in (True, False)
    )


def _on_label_grid(box: IntBox, series: list[LabelDetection]) -> bool:
    """Whether ``box`` tops a row of the labels read and starts a column of them (not the same
    label's): the place of a panel's label in a grid of panels."""
    height = float(np.median([d.box[3] - d.box[1] for d in series]))
    rows = {id(d) for d in series if abs(d.box[1] - box[1]) <= GRID_ROW * height}
    columns = {id(d) for d in series if abs(d.box[0] - box[0]) <= GRID_COLUMN * height}
    return bool(rows) and bool(columns) and len(rows | columns) >= 2


def _solid_bar(ink: np.ndarray, factor: int, box: IntBox) -> bool:
    """An upright bar: no wider than a sans-serif I and nearly all ink (figure-pixel ``box``)."""
    x1, y1, x2, y2 = (v // factor for v in box)
    width, height = x2 - x1, y2 - y1
    return 0 < width <= BAR_WIDTH * height and float(ink[y1:y2, x1:x2].mean()) >= SOLID_BAR


def next_letter(series: list[LabelDetection]) -> str | None:
    """The letter after the series' last: the last panel's label is often the one unread."""
    letters = [d.text for d in series if len(d.text) == 1 and d.text.isalpha()]
    if not letters:
        return None
    last = max(letters, key=str.lower)
    return chr(ord(last) + 1) if last.lower() < "z" else None


def _bar(det: LabelDetection) -> bool:
    """A glyph read as a letter shaped like an upright bar, and that thin."""
    x1, y1, x2, y2 = det.box
    return det.text in BAR_READINGS and x2 - x1 <= BAR_WIDTH * (y2 - y1)


def past_gap(detections: list[LabelDetection], series: list[LabelDetection]) -> str | None:
    """The last letter of the series' case read past the gap where the series stopped (a J read
    after A to E, F to I unread), if any: the letters between are worth looking for."""
    letters = [d for d in series if len(d.text) == 1]
    if not letters:
        return None
    upper = letters[0].text.isupper()
    last = max(ord(d.text.lower()) for d in letters)
    past = [
        d.text
        for d in detections
        if len(d.text) == 1
        and d.text.isalpha()
        and d.text.isupper() == upper
        and d.confidence >= MIN_LABEL_CONFIDENCE
        and ord(d.text.lower()) > last
    ]
    return max(past, key=str.lower) if past else None


def _lone_glyphs(ink: np.ndarray, factor: int, h: float, taken: list[Box]) -> list[IntBox]:
    """Shapes about ``h`` tall (working scale) with a blank margin all round, in figure pixels,
    likeliest sizes first; none overlapping a label already read. A shape is one glyph, or a
    short word of glyphs close on one line: a label in parentheses, "(b)", is three glyphs, none
    of them alone."""
    ink_u8 = ink.astype(np.uint8)
    integral = cv2.integral(ink_u8)
    margin = max(1, round(0.6 * h))
    height, width = ink.shape

    def inked(x1: int, y1: int, x2: int, y2: int) -> int:
        return int(integral[y2, x2] - integral[y1, x2] - integral[y2, x1] + integral[y1, x1])

    # glyphs of one word close up along the line; the closing adds no ink past the word's ends
    # (an odd width: an even one is anchored off centre and moves the word a pixel)
    gap = max(3, round(WORD_GAP * h) | 1)
    words = cv2.morphologyEx(ink_u8, cv2.MORPH_CLOSE, np.ones((1, gap), np.uint8))
    found: dict[IntBox, float] = {}
    for mask, widest in ((ink_u8, GLYPH_WIDTH), (words, WORD_WIDTH)):
        _, _, stats, _ = cv2.connectedComponentsWithStats(mask, connectivity=8)
        for x, y, w, hh, _area in (tuple(int(v) for v in row) for row in stats[1:]):
            if not (0.7 * h <= hh <= 1.4 * h and w <= widest * h):
                continue
            around = inked(
                max(0, x - margin),
                max(0, y - margin),
                min(width, x + w + margin),
                min(height, y + hh + margin),
            )
            full = (x * factor, y * factor, (x + w) * factor, (y + hh) * factor)
            if around == inked(x, y, x + w, y + hh) and not any(_overlap(full, t) for t in taken):
                found[full] = abs(hh - h)
    ranked = sorted(found, key=lambda box: found[box])
    return ranked[:MAX_GLYPH_READS]


def _read_glyphs(image: np.ndarray, boxes: list[IntBox], factor: int) -> list[LabelDetection]:
    """What the label recogniser reads in each glyph box (figure pixels), where it reads a label."""
    if not boxes:
        return []
    gray = cv2.cvtColor(np.ascontiguousarray(image[..., :3]), cv2.COLOR_RGB2GRAY)
    glyphs = []
    pad = max(2, factor)
    for x1, y1, x2, y2 in boxes:
        cx1, cy1 = max(0, x1 - pad), max(0, y1 - pad)
        cx2, cy2 = min(gray.shape[1], x2 + pad), min(gray.shape[0], y2 + pad)
        keep = gray[cy1:cy2, cx1:cx2] < INK_THRESHOLD
        tight = tight_box(keep, (0, 0, keep.shape[1], keep.shape[0]))
        if tight is None:
            continue
        box = (cx1 + tight[0], cy1 + tight[1], cx1 + tight[2], cy1 + tight[3])
        glyphs.append(
            CornerGlyph(box=box, crop_box=(cx1, cy1, cx2, cy2), keep=keep, invert=False, corner="tl")
        )
    return [det for det in read_glyphs(gray, glyphs) if det is not None]


def _overlap(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    return min(a[2], b[2]) > max(a[0], b[0]) and min(a[3], b[3]) > max(a[1], b[1])
