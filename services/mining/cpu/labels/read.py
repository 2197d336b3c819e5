"""Panel labels: OCR on candidate label areas only, then one label per panel.

``find_labels`` never runs OCR over the whole figure. It proposes small glyph groups near each
panel's top-left corner: outside the panel (isolated glyph groups in the gutter, "(a)", "1a",
circled letters, found from connected components of the ink mask, reusing the segmenter's
analysis of the same image), then, for panels still without a clear reading, inside a corner
(white or black glyphs standing alone on the image, either polarity; the corner most panels of the
figure use; near-white/near-black relative to the image's ground, so JPEG-dimmed strokes stay
whole), and last the DB text detector of ``rapidocr_onnxruntime`` on small corner crops. All
crops are read in small batches by the package's PP-OCRv4 recogniser (one ONNX session per process,
one thread): crops are upscaled so glyphs are ~22 px tall, thin glyphs widened and gaps between
glyphs opened ("ii"), and decoding is restricted to the label alphabet. Readings are normalised
("(a)" -> "a", "A." -> "A"), and c/C, o/O, s/S... are settled by comparing glyph heights.

Labels printed light on a solid dark disc or box are read from the plate's holes, inverted; a thin
circle drawn round a label is cut off, also where it touches the letter. Panels left without a
reading in the style the figure's clear readings share get a second look: their candidates are
read again, prepared other ways, and a reading in that style is taken.

``assign_labels`` maps detections to panels (a label inside a panel names that panel; otherwise
the panel whose top-left region it sits in or near; one label per panel) and repairs OCR
confusions (l/I/1, O/0, S/5, case, roman numerals with merged or dropped i's) where the a, b, c...
series in reading order makes the intended label clear; weak readings survive only where the series
confirms them, and a short unread run between confirmed labels gets the labels the series expects.
The series is laid along the reading order (of ``reading_orders``: rows or columns first, at the
top level and below) under which the readings fit it best. ``reading_order`` gives the default
order (rows, then columns, following the gutters) that the caller uses to hand out caption labels
when no label was read, or, given the labels, the order they follow.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import cv2
import numpy as np

from p2p.mining.cpu.imaging import (
    Analysis,
    CornerGlyph,
    as_rgb,
    corner_glyphs,
    full_size_analysis,
)
from p2p.mining.params import LabelParams, load_params
from p2p.mining.types import LabelDetection, PanelCandidate
from p2p.shared import geometry
from p2p.shared.geometry import Box

REC_HEIGHT = 32  # recogniser input height (the model is trained at 48; 32 reads labels as well, 2x faster)
GLYPH_HEIGHT = 22  # label crops (glyphs + 1-2 px) are scaled to this height inside the input
MIN_GLYPH_WIDTH = 14  # thin glyphs are stretched to at least this width
BATCH = 8
OCR_THREADS = 1  # one thread per call: the miner runs one figure per core

ROMAN = ("i", "ii", "iii", "iv", "v", "vi", "vii", "viii", "ix", "x", "xi", "xii")
_LABEL_ALPHABET = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789()[]."
_STRIP = "()[]{}.,:;'\"`*-_ \t"
_LABEL_RE = re.compile(r"^(?:[A-Za-z]|[1-9][0-9]?|[1-9][0-9]?[A-Za-z]|[A-Za-z][1-9])$")

# characters a recogniser confuses on single bold glyphs: what else the glyph may be
_THIN = "lI1ij|"
_CONFUSIONS: dict[str, str] = {
    **{c: c + _THIN.replace(c, "") for c in _THIN},
    "O": "Oo0D",
    "o": "oO0",
    "0": "0Oo",
    "D": "DO0",
    "S": "Ss5",
    "s": "sS5",
    "5": "5Ss",
    "Z": "Zz2",
    "z": "zZ2",
    "2": "2zZ",
    "g": "g9q",
    "9": "9g",
    "q": "qg9",
    "B": "B8b",
    "8": "8B",
    "G": "G6",
    "6": "6Gb",
    "b": "b6",
    "e": "ec",
    "n": "nh",
    "h": "hn",
    "u": "uvU",
    "v": "vuV",
    "r": "rf",
    "f": "fr",
    "t": "tf",
    "J": "Jj",
    "E": "EF",  # small serif capitals on a dark plate: the lower bar of "E" is a blur away
    "F": "FE",
}
# lone letters whose score is that of their shape: the recogniser splits a lone stroke's
# probability among "I", "l", "1" and "|" (and "J" with "j"), which the series and the glyphs'
# sizes tell apart, not the recogniser; a correct "(I)" read alone scores 0.2-0.4. Not "1" and
# "i": broken pieces and dots of small numerals read so, and would outweigh the numerals' series.
_SHARED_SCORE = "Il|J"
for _c in "cCkKoOpPsSuUvVwWxXyYzZ":
    _CONFUSIONS.setdefault(_c, _c)
    if _c.swapcase() not in _CONFUSIONS[_c]:
        _CONFUSIONS[_c] += _c.swapcase()


# --------------------------------------------------------------------------------------------
# normalisation


def normalize_label(raw: str) -> str | None:
    """Label as printed without decoration: "(a)" -> "a", "A." -> "A", "1a", "ii"; None if not a label."""
    text = "".join(raw.split())
    text = text.strip(_STRIP)
    if not text:
        return None
    if text == "|":
        return "l"
    if text.lower() in ROMAN and len(text) > 1:
        return text if text in (text.lower(), text.upper()) else text.lower()
    if _LABEL_RE.match(text):
        return text
    return None


# --------------------------------------------------------------------------------------------
# OCR engine (loaded once per process)


class _Ocr:
    def __init__(self) -> None:
        from rapidocr_onnxruntime import RapidOCR

        engine = RapidOCR(
            intra_op_num_threads=OCR_THREADS,
            inter_op_num_threads=1,
            det_limit_type="max",
            det_limit_side_len=960,
        )
        self.rec = engine.text_rec.session
        self.det = engine.text_det
        characters: list[str] = list(engine.text_rec.postprocess_op.character)
        self.characters = characters
        allowed = [i for i, c in enumerate(characters) if c in _LABEL_ALPHABET]
        self.allowed = np.array([0, *allowed], dtype=np.int64)  # 0 = CTC blank
        self.column = {characters[int(k)]: j for j, k in enumerate(self.allowed) if j > 0}
        self.lock = threading.Lock()

    def read(self, crops: list[np.ndarray]) -> list[tuple[str, float]]:
        """(text, score) per grey crop (dark glyphs on white), decoded over the label alphabet."""
        results: list[tuple[str, float]] = [("", 0.0)] * len(crops)
        if not crops:
            return results
        order = sorted(range(len(crops)), key=lambda i: crops[i].shape[1])
        for start in range(0, len(order), BATCH):
            chunk = order[start : start + BATCH]
            width = max(crops[i].shape[1] for i in chunk)
            width = int(np.ceil(width / 8) * 8)
            batch = np.full((len(chunk), 3, REC_HEIGHT, width), 1.0, dtype=np.float32)
            for row, i in enumerate(chunk):
                crop = crops[i].astype(np.float32) / 127.5 - 1.0
                batch[row, :, :, : crop.shape[1]] = crop[None, :, :]
            with self.lock:
                probs = self.rec(batch)[0]
            sub = probs[:, :, self.allowed]
            best = sub.argmax(axis=2)
            best_p = sub.max(axis=2)
            for row, i in enumerate(chunk):
                text, scores, previous = [], [], 0
                for t, k in enumerate(best[row]):
                    k = int(k)
                    if k != 0 and k != previous:
                        text.append(self.characters[int(self.allowed[k])])
                        scores.append(float(best_p[row, t]))
                    previous = k
                if not text:
                    # a lone thin glyph often loses to the blank: take its strongest character
                    t = int(sub[row, :, 1:].max(axis=1).argmax())
                    k = int(sub[row, t, 1:].argmax()) + 1
                    text, scores = [self.characters[int(self.allowed[k])]], [float(sub[row, t, k])]
                if _lone_stroke("".join(text)) and _narrow_ink(crops[i]):
                    scores = [self._shape_score(sub[row], text[0])]
                results[i] = ("".join(text), float(np.mean(scores)))
        return results

    def _shape_score(self, probs: np.ndarray, char: str) -> float:
        """How surely a lone glyph is ``char`` or one of the glyphs it is confused with."""
        columns = [self.column[c] for c in _CONFUSIONS.get(char, char) if c in self.column]
        own = self.column[char]
        t = int(probs[:, own].argmax())
        return float(min(1.0, probs[t, columns].sum()))

    def detect(self, crop_rgb: np.ndarray) -> list[tuple[int, int, int, int]]:
        """Axis-aligned text boxes found by the DB detector in a small RGB crop."""
        with self.lock:
            boxes, _ = self.det(np.ascontiguousarray(crop_rgb[:, :, ::-1]))
        out: list[tuple[int, int, int, int]] = []
        if boxes is None:
            return out
        for quad in boxes:
            xs, ys = quad[:, 0], quad[:, 1]
            out.append((int(xs.min()), int(ys.min()), int(np.ceil(xs.max())), int(np.ceil(ys.max()))))
        return out


def _lone_stroke(text: str) -> bool:
    return len(text) == 1 and text in _SHARED_SCORE


def _narrow_ink(crop: np.ndarray) -> bool:
    """Whether the ink of a crop is a narrow shape (at most 0.7 as wide as tall), as a lone "I",
    "l" or "J" is, even widened; a blurred "F" read as "I" is not."""
    ys, xs = np.nonzero(crop < 128)
    return bool(xs.size) and xs.max() - xs.min() + 1 <= 0.7 * (ys.max() - ys.min() + 1)


_ENGINE: _Ocr | None = None
_ENGINE_LOCK = threading.Lock()


def _engine() -> _Ocr:
    global _ENGINE
    with _ENGINE_LOCK:
        if _ENGINE is None:
            _ENGINE = _Ocr()
        return _ENGINE


def warm_up() -> None:
    """Load the OCR models and run them once, so the first figure is not slow."""
    engine = _engine()
    engine.read([np.full((REC_HEIGHT, 48), 255, dtype=np.uint8)])
    engine.detect(np.full((64, 64, 3), 255, dtype=np.uint8))


# --------------------------------------------------------------------------------------------
# candidates


# what a crop was made from: glyph mask (None: the plain grey box), crop box, inverted, cores
_Source = tuple[np.ndarray | None, tuple[int, int, int, int], bool, bool]


@dataclass
class _Candidate:
    box: tuple[int, int, int, int]  # glyphs, figure pixels, exclusive
    crop: np.ndarray  # grey, dark glyphs on white, REC_HEIGHT tall
    panel: int
    prior: float  # geometric plausibility, 0..1
    source: _Source | None = None  # to prepare the crop again another way
    text: str | None = None  # the label read from it (set by _read)


def _prepare_crop(
    gray: np.ndarray,
    keep: np.ndarray | None,
    box: tuple[int, int, int, int],
    invert: bool,
    *,
    cores: bool = False,
    spread: bool = True,
    height: int = GLYPH_HEIGHT,
) -> np.ndarray:
    """Grey crop of ``box`` (glyphs plus a 1-2 px margin) with everything but the glyphs whitened,
    scaled so the crop is ``height`` tall; thin glyphs (i, j, l, 1) are widened a little,
    which the recogniser reads far more reliably."""
    x1, y1, x2, y2 = box
    patch = gray[y1:y2, x1:x2].astype(np.float32)
    if invert:
        patch = 255.0 - patch
    ground = 255.0
    if keep is not None and cores:
        patch, ground = _glyph_strokes(patch, keep)
    elif keep is not None:
        patch = np.where(keep, patch, 255.0)
    lo = float(patch.min()) if patch.size else 255.0
    if lo < ground - 5:  # stretch contrast: glyph core black, background white
        patch = np.clip((patch - lo) * (255.0 / max(1.0, ground - lo)), 0, 255)
    # with the ground laid white, any grey left is glyph: a thin junction ("d" at 12 px) stays ink
    if spread:
        patch = _spread(patch, 250.0 if keep is not None and cores else 160.0)
    return _fit(patch, height)


def _fit(patch: np.ndarray, height: int) -> np.ndarray:
    """``patch`` scaled to ``height`` (thin glyphs widened) on the recogniser's white canvas."""
    h, w = patch.shape
    scale = height / max(1, h)
    new_w = max(MIN_GLYPH_WIDTH, round(w * scale))
    resized = cv2.resize(patch.astype(np.float32), (new_w, height), interpolation=cv2.INTER_CUBIC)
    pad_y = (REC_HEIGHT - height) // 2
    pad_x = pad_y
    canvas = np.full((REC_HEIGHT, max(REC_HEIGHT, new_w + 2 * pad_x)), 255.0, dtype=np.float32)
    canvas[pad_y : pad_y + height, pad_x : pad_x + new_w] = resized
    return np.clip(canvas, 0, 255).astype(np.uint8)


def _without_parentheses(crop: np.ndarray) -> np.ndarray | None:
    """The glyphs between the parentheses of a prepared crop ("(I)" -> "I"), scaled to the glyph
    height; None when the crop's outermost shapes are not a pair of parentheses round them.

    The recogniser swallows a thin letter between parentheses ("(I)" is read "()", "(J)" "(D"):
    alone, the letter is read. Parentheses are told from thin letters ("II", "l1") by their
    curve: the middle of a "(" lies left of its ends, of a ")" right of them."""
    # the strokes' grey rims join a parenthesis to a serif or hook beside it: darker cuts part them
    for ink in (128, 80, 50):
        inner = _between_parentheses(crop, ink)
        if inner is not None:
            return inner
    return None


def _between_parentheses(crop: np.ndarray, ink: int) -> np.ndarray | None:
    _, comp, stats, _ = cv2.connectedComponentsWithStats((crop < ink).astype(np.uint8), connectivity=8)
    shapes = sorted((k for k in range(1, stats.shape[0]) if stats[k, 4] >= 3), key=lambda k: stats[k, 0])
    if len(shapes) < 3:
        return None
    first, last, inner = shapes[0], shapes[-1], shapes[1:-1]
    ix1 = min(int(stats[k, 0]) for k in inner)
    iy1 = min(int(stats[k, 1]) for k in inner)
    ix2 = max(int(stats[k, 0] + stats[k, 2]) for k in inner)
    iy2 = max(int(stats[k, 1] + stats[k, 3]) for k in inner)
    for k, sign in ((first, 1.0), (last, -1.0)):
        x, y, w, h = (int(v) for v in stats[k, :4])
        # as tall as the glyphs between them, about level with them ("J" may hang below)
        slack = 0.25 * (iy2 - iy1)
        if w > 0.5 * h or h < 0.8 * (iy2 - iy1) or y > iy1 + slack or y + h < iy2 - slack:
            return None
        if (k == first and x + w > ix1) or (k == last and x < ix2):
            return None
        ys, xs = np.nonzero(comp[y : y + h, x : x + w] == k)
        third = h / 3.0
        bands = [xs[(ys >= lo) & (ys < lo + third)] for lo in (0.0, third, 2.0 * third)]
        if any(band.size == 0 for band in bands):
            return None
        ends, middle = 0.5 * (bands[0].mean() + bands[2].mean()), bands[1].mean()
        if sign * (ends - middle) < max(0.6, 0.12 * w):
            return None
    patch = crop[max(0, iy1 - 1) : iy2 + 1, max(0, ix1 - 1) : ix2 + 1]
    return _fit(patch, GLYPH_HEIGHT)


def _glyph_strokes(patch: np.ndarray, keep: np.ndarray) -> tuple[np.ndarray, float]:
    """The patch with everything but the glyphs laid to the ground's grey level; returns it and
    that level.

    ``keep`` marks the glyphs' cores (the corner search's threshold near black or white, or an
    Otsu split of a textured corner): after JPEG and
    downscaling, most of a small glyph's stroke is grey edge that the threshold cut away. The
    strokes are what is darker than halfway between ground and core, in pieces that touch a
    core, plus a 1 px rim of the original grey.
    """
    if not keep.any() or keep.all():
        return np.where(keep, patch, 255.0), 255.0
    ground = float(np.median(patch[~keep]))
    core = float(patch[keep].min())
    strokes = (patch < 0.5 * (ground + core)).astype(np.uint8)
    _, pieces = cv2.connectedComponents(strokes | keep.astype(np.uint8), connectivity=8)
    touching = np.unique(pieces[keep])
    mask = np.isin(pieces, touching[touching > 0])
    # only within the glyphs' own box: a circle drawn round the label is not a stroke
    ys, xs = np.nonzero(keep)
    inside = np.zeros_like(mask)
    inside[max(0, ys.min() - 1) : ys.max() + 2, max(0, xs.min() - 1) : xs.max() + 2] = True
    mask &= inside
    grown = cv2.dilate(mask.astype(np.uint8), np.ones((3, 3), np.uint8)) > 0
    return np.where(grown, np.minimum(patch, ground), ground), ground


def _spread(patch: np.ndarray, ink_below: float = 160.0) -> np.ndarray:
    """Open up the gaps between glyphs, so that the recogniser's CTC decoding does not merge
    repeated thin letters ("ii", "11") into one."""
    h = patch.shape[0]
    inked = (patch < ink_below).any(axis=0)
    if not inked.any():
        return patch
    edges = np.flatnonzero(np.diff(np.concatenate(([0], inked.astype(np.int8), [0]))))
    runs = list(zip(edges[0::2], edges[1::2], strict=True))
    if len(runs) < 2:
        return patch
    gap = np.full((h, max(2, round(0.35 * h))), 255.0, dtype=np.float32)
    pieces = [patch[:, : runs[0][0]]]
    for k, (start, stop) in enumerate(runs):
        pieces.append(patch[:, start:stop])
        if k + 1 < len(runs):
            pieces.append(gap)
    pieces.append(patch[:, runs[-1][1] :])
    return np.concatenate(pieces, axis=1)


def _crop_box(word: tuple[int, int, int, int], width: int, height: int) -> tuple[int, int, int, int]:
    x1, y1, x2, y2 = word
    pad = max(1, round(0.08 * (y2 - y1)))
    return max(0, x1 - pad), max(0, y1 - pad), min(width, x2 + pad), min(height, y2 + pad)


def _zone(panel: Box, u: float) -> tuple[float, float, float, float, float, float]:
    """Outside/inside extents of the top-left label search zone of a panel."""
    x1, y1, x2, y2 = panel
    side = min(x2 - x1, y2 - y1)
    out = float(np.clip(0.3 * side, 3.0 * u, 9.0 * u))
    inside = float(np.clip(0.25 * side, 2.5 * u, 7.0 * u))
    return x1 - out, y1 - out, x1 + inside, y1 + inside, out, inside


def _outside_candidates(
    glyph_words: list[tuple[tuple[int, int, int, int], list[int]]],
    cc_labels: np.ndarray,
    gray: np.ndarray,
    panels: list[Box],
    u: float,
) -> list[_Candidate]:
    out: list[_Candidate] = []
    for word, members in glyph_words:
        wx1, wy1, wx2, wy2 = word
        gh = wy2 - wy1
        cx, cy = (wx1 + wx2) / 2, (wy1 + wy2) / 2
        best, best_prior = -1, 0.0
        for k, panel in enumerate(panels):
            zx1, zy1, zx2, zy2, reach, _ = _zone(panel, u)
            if not (zx1 <= cx <= zx2 and zy1 <= cy <= zy2):
                continue
            # distance from the label to the panel's top-left corner, outside the content
            dx = max(0.0, panel[0] - wx2, wx1 - panel[0])
            dy = max(0.0, panel[1] - wy2, wy1 - panel[1])
            prior = 1.0 - min(1.0, (dx + dy) / (2.0 * reach + gh))
            if prior > best_prior:
                best, best_prior = k, prior
        if best < 0:
            continue
        x1, y1, x2, y2 = _crop_box(word, gray.shape[1], gray.shape[0])
        region = cc_labels[y1:y2, x1:x2]
        keep = np.isin(region, members)
        plate = _plate_glyphs(region, members, gray[y1:y2, x1:x2])
        invert = False
        # circled labels: drop a ring that encloses the other glyph components, read what is inside
        if plate is None:
            # two components: a ring round a glyph; one: a thin ring that the glyph touches
            dropped = _drop_ring(region, members, keep) if len(members) >= 2 else _cut_ring(keep)
            if dropped is not keep and dropped.any():
                ys, xs = np.nonzero(dropped)
                inner = (
                    x1 + int(xs.min()),
                    y1 + int(ys.min()),
                    x1 + int(xs.max()) + 1,
                    y1 + int(ys.max()) + 1,
                )
                ix1, iy1, ix2, iy2 = _crop_box(inner, gray.shape[1], gray.shape[0])
                keep = dropped[iy1 - y1 : iy2 - y1, ix1 - x1 : ix2 - x1]
                x1, y1, x2, y2 = ix1, iy1, ix2, iy2
        if plate is not None:
            # light glyphs on a solid dark disc or box: read the plate's inside, inverted, around
            # the glyphs (their grey edges kept, the ground outside the plate whitened)
            glyph_mask, inside = plate
            ys, xs = np.nonzero(glyph_mask)
            inner = (x1 + int(xs.min()), y1 + int(ys.min()), x1 + int(xs.max()) + 1, y1 + int(ys.max()) + 1)
            ix1, iy1, ix2, iy2 = _crop_box(inner, gray.shape[1], gray.shape[0])
            full = np.zeros(gray.shape, dtype=bool)
            full[y1:y2, x1:x2] = inside
            keep = full[iy1:iy2, ix1:ix2]
            x1, y1, x2, y2 = ix1, iy1, ix2, iy2
            invert = True
        crop = _prepare_crop(gray, keep, (x1, y1, x2, y2), invert=invert)
        source = (keep, (x1, y1, x2, y2), invert, False)
        out.append(_Candidate(box=word, crop=crop, panel=best, prior=best_prior, source=source))
    return out


def _plate_glyphs(
    region: np.ndarray, members: list[int], patch: np.ndarray
) -> tuple[np.ndarray, np.ndarray] | None:
    """Light glyphs printed on a solid dark plate (a filled disc or box): (the glyphs, the plate's
    inside) as masks of ``region``, or None when the group is not such a plate.

    The glyphs are what is lighter than halfway between the plate's and the ground's grey
    (``patch``: the grey image under ``region``), not the ink mask's holes: in a small plate,
    blurred by JPEG or downscaling, the ink mask swallows all but a thread of each stroke."""
    if region.size == 0:
        return None
    ids, counts = np.unique(region[np.isin(region, members)], return_counts=True)
    if ids.size == 0:
        return None
    main = int(ids[int(np.argmax(counts))])
    comp = (region == main).astype(np.uint8)
    ys, xs = np.nonzero(comp)
    bh, bw = int(ys.max() - ys.min() + 1), int(xs.max() - xs.min() + 1)
    if min(bh, bw) < 10 or not 0.6 <= bw / bh <= 1.7 or int(comp.sum()) < 0.45 * bw * bh:
        return None
    contours, _ = cv2.findContours(comp, cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)
    filled = np.zeros_like(comp)
    cv2.drawContours(filled, contours, -1, 1, thickness=-1)
    covered = int(filled.sum())
    ground = patch[(filled == 0) & (region == 0)]
    light = float(np.median(ground)) if ground.size else 255.0
    dark = float(np.percentile(patch[comp > 0], 25))
    if light - dark < 60:
        return None
    filled = cv2.erode(filled, np.ones((3, 3), np.uint8))
    holes = (filled > 0) & (patch > 0.5 * (light + dark))
    if holes.any():
        n, lab, stats, _ = cv2.connectedComponentsWithStats(holes.astype(np.uint8), connectivity=8)
        holes = np.isin(lab, [k for k in range(1, n) if stats[k, 4] >= 3])
    inside = int(filled.sum())
    # a plate fills its box (disc or rectangle); a bold letter with a counter ("A", "O") does not,
    # or its counter is one thick blob rather than thin strokes
    if (
        inside == 0
        or not holes.any()
        or covered < 0.65 * bw * bh
        or not 0.04 * inside <= int(holes.sum()) <= 0.6 * inside
    ):
        return None
    stroke = cv2.distanceTransform(holes.astype(np.uint8), cv2.DIST_L2, 3)
    if float(stroke.max()) > max(1.5, 0.1 * bh):
        return None
    hy, hx = np.nonzero(holes)
    if not 0.25 * bh <= hy.max() - hy.min() + 1 <= 0.8 * bh:
        return None
    # the glyphs sit well inside the plate: a solid rim all round (unlike a letter's counters)
    rim = max(2.0, 0.12 * min(bw, bh))
    cy0, cx0 = int(ys.min()), int(xs.min())
    if min(hy.min() - cy0, cy0 + bh - 1 - hy.max(), hx.min() - cx0, cx0 + bw - 1 - hx.max()) < rim:
        return None
    return holes, filled > 0


def _drop_ring(region: np.ndarray, members: list[int], keep: np.ndarray) -> np.ndarray:
    boxes = {}
    for m in members:
        ys, xs = np.nonzero(region == m)
        if xs.size:
            boxes[m] = (xs.min(), ys.min(), xs.max() + 1, ys.max() + 1)
    for m, (x1, y1, x2, y2) in boxes.items():
        inner = [
            o
            for o, (a1, b1, a2, b2) in boxes.items()
            if o != m and a1 > x1 and b1 > y1 and a2 < x2 and b2 < y2
        ]
        if inner and 0.7 <= (x2 - x1) / max(1, y2 - y1) <= 1.4:
            return keep & (region != m)
    return keep


def _cut_ring(keep: np.ndarray) -> np.ndarray:
    """The glyph inside a circle drawn round it when the two touch (one ink component): the
    pixels well inside the ring, or ``keep`` itself when the shape is not a closed thin ring
    with ink inside ("O" and "0" are rings with nothing inside)."""
    ys, xs = np.nonzero(keep)
    if ys.size == 0:
        return keep
    bh, bw = int(ys.max() - ys.min() + 1), int(xs.max() - xs.min() + 1)
    if min(bh, bw) < 10 or not 0.8 <= bw / bh <= 1.25:
        return keep
    cy, cx = float(ys.min() + ys.max()) / 2.0, float(xs.min() + xs.max()) / 2.0
    radius = (bh + bw) / 4.0
    # the ring's thickness: the ink run met first coming in from the box's edge, on the axes
    runs = []
    for line in (keep[round(cy), :], keep[:, round(cx)]):
        inked = np.flatnonzero(line)
        for seq in (line[inked[0] :], line[inked[-1] :: -1]):
            gaps = np.flatnonzero(~seq)
            runs.append(int(gaps[0]) if gaps.size else len(seq))
    thickness = float(np.median(runs))
    if thickness > 0.3 * radius:
        return keep  # a solid shape or a bold letter, not a thin ring
    yy, xx = np.indices(keep.shape)
    distance = np.hypot(yy - cy, xx - cx)
    annulus = (distance >= radius - thickness - 0.5) & (distance <= radius + 0.5)
    # a closed ring: ink in the annulus at nearly every angle
    angles = np.arctan2(yy - cy, xx - cx)[annulus & keep]
    covered = np.unique(np.floor((angles + np.pi) / (2 * np.pi) * 36).astype(int))
    if covered.size < 32:
        return keep
    inner = keep & (distance < radius - thickness - 1.0)
    if int(inner.sum()) < 0.05 * bh * bw:
        return keep
    return inner


def _corner_distance(glyph: tuple[int, int, int, int], panel: Box, corner: str) -> float:
    gx1, gy1, gx2, gy2 = glyph
    px1, py1, px2, py2 = panel
    dx = gx1 - px1 if corner[1] == "l" else px2 - gx2
    dy = gy1 - py1 if corner[0] == "t" else py2 - gy2
    return float(dx + dy)


def _inside_candidates(gray: np.ndarray, panels: list[Box], indices: list[int], u: float) -> list[_Candidate]:
    """Glyphs printed inside panels near a corner, either polarity. One corner for the figure:
    the one where most of these panels show a label-like glyph (top-left on ties)."""
    found: dict[str, dict[int, list[CornerGlyph]]] = {}
    for corners in (("tl",), ("tr", "bl", "br")):
        for k in indices:
            x1, y1, x2, y2 = (round(v) for v in panels[k])
            for glyph in corner_glyphs(gray, (x1, y1, x2, y2), u, corners, grow=True, panel_scale=True):
                found.setdefault(glyph.corner, {}).setdefault(k, []).append(glyph)
        if len(found.get("tl", {})) >= max(1, 0.5 * len(indices)):
            break
    if not found:
        return []
    best = max(len(panels_hit) for panels_hit in found.values())
    # corners found on as many panels as the best: all are read, the reading decides (text
    # overlays such as "x200" in one corner tie with the labels in another)
    tied = [c for c in found if len(found[c]) == best]
    if "tl" in tied:
        tied = ["tl"]
    out: list[_Candidate] = []
    for corner, k, glyphs in ((c, k, g) for c in tied for k, g in found[c].items()):
        # the glyph group closest to the corner first; at most two per panel
        px1, py1, px2, py2 = panels[k]
        side = max(1.0, min(px2 - px1, py2 - py1))
        ranked = sorted((_corner_distance(g.box, panels[k], corner), i) for i, g in enumerate(glyphs))
        for distance, i in ranked[:2]:
            glyph = glyphs[i]
            crop = _prepare_crop(gray, glyph.keep, glyph.crop_box, invert=glyph.invert, cores=True)
            prior = 0.9 - min(0.5, distance / side)
            source = (glyph.keep, glyph.crop_box, glyph.invert, True)
            out.append(_Candidate(box=glyph.box, crop=crop, panel=k, prior=prior, source=source))
    return out


def _detector_candidates(
    engine: _Ocr, rgb: np.ndarray, gray: np.ndarray, panel: Box, index: int, u: float
) -> list[_Candidate]:
    """Last resort: the DB text detector on a small crop around the panel's top-left corner."""
    height, width = gray.shape
    x1, y1 = int(panel[0]), int(panel[1])
    reach = int(np.clip(3.0 * u, 16, 64))
    cx1, cy1 = max(0, x1 - reach), max(0, y1 - reach)
    cx2, cy2 = min(width, x1 + reach), min(height, y1 + reach)
    if cx2 - cx1 < 8 or cy2 - cy1 < 8:
        return []
    crop = rgb[cy1:cy2, cx1:cx2]
    scale = 2.0 if max(crop.shape[:2]) < 160 else 1.0
    if scale != 1.0:
        crop = cv2.resize(crop, None, fx=scale, fy=scale, interpolation=cv2.INTER_CUBIC)
    out: list[_Candidate] = []
    for bx1, by1, bx2, by2 in engine.detect(crop):
        fx1, fy1 = cx1 + int(bx1 / scale), cy1 + int(by1 / scale)
        fx2, fy2 = cx1 + int(np.ceil(bx2 / scale)), cy1 + int(np.ceil(by2 / scale))
        gh = fy2 - fy1
        if gh < 4 or fx2 - fx1 > 4.0 * gh:
            continue
        patch = gray[fy1:fy2, fx1:fx2]
        if patch.size == 0:
            continue
        invert = float(np.median(patch)) < 128
        crop_g = _prepare_crop(gray, None, (fx1, fy1, fx2, fy2), invert=invert)
        box = (fx1, fy1, fx2, fy2)
        source = (None, box, invert, False)
        out.append(_Candidate(box=box, crop=crop_g, panel=index, prior=0.4, source=source))
    return out


def find_labels(
    image: np.ndarray,
    panels: Sequence[PanelCandidate],
    *,
    analysis: Analysis | None = None,
    params: LabelParams | None = None,
) -> list[LabelDetection]:
    """Panel labels read by OCR near the panels' corners (figure pixels, exclusive boxes).

    Several detections may concern one panel; ``assign_labels`` picks one per panel. ``analysis``:
    the segmenter's look at this figure (``segment_figure``), reused rather than redone."""
    p = params or load_params().labels
    rgb = as_rgb(image)
    height, width = rgb.shape[:2]
    if not panels or height < 8 or width < 8:
        return []
    boxes = [geometry.clip(p.box, width, height) for p in panels]
    look = full_size_analysis(rgb, analysis)
    gray, glyphs, u = look.gray, look.glyphs, look.u
    cc_labels = glyphs.labels
    # words in the gutters or at a panel's top-left corner; text deep inside a panel is content
    words = []
    for word, members in glyphs.words:
        cx, cy = (word[0] + word[2]) / 2, (word[1] + word[3]) / 2
        reach = 2.0 * (word[3] - word[1])
        if any(b[0] + reach < cx < b[2] and b[1] + reach < cy < b[3] for b in boxes):
            continue
        words.append((word, members))
    engine = _engine()
    candidates = _outside_candidates(words, cc_labels, gray, boxes, u)
    detections = _read(engine, candidates, p.min_score)
    found = {d_panel for d_panel, det in detections if det.confidence >= p.strong_score}
    missing = [k for k in range(len(boxes)) if k not in found]
    if missing:
        inside = _inside_candidates(gray, boxes, missing, u)
        candidates.extend(inside)
        detections.extend(_read(engine, inside, p.min_score))
        found = {d_panel for d_panel, det in detections if det.confidence >= p.strong_score}
        missing = [k for k in range(len(boxes)) if k not in found]
    # every panel still without a clear reading: when segmentation swallows the labels' strip
    # into the panels, no glyph search finds them and most panels are missing
    if missing:
        extra: list[_Candidate] = []
        for k in missing:
            extra.extend(_detector_candidates(engine, rgb, gray, boxes[k], k, u))
        candidates.extend(extra)
        detections.extend(_read(engine, extra, p.min_score))
    detections = _second_look(engine, gray, candidates, detections, p)
    return _settle_case([d for _, d in detections])


# Other ways to prepare a crop: without the gaps opened between glyphs (they split a thin "d"
# into "cl"), larger, and from the plain grey box. (glyph mask kept, gaps opened, glyph height)
_SECOND_LOOK = ((True, False, GLYPH_HEIGHT), (True, False, 28), (True, True, 28), (False, True, 28))


def _second_look(
    engine: _Ocr,
    gray: np.ndarray,
    candidates: list[_Candidate],
    detections: list[tuple[int, LabelDetection]],
    p: LabelParams,
) -> list[tuple[int, LabelDetection]]:
    """Read again, prepared other ways, the candidates of panels that have no reading in the style
    the figure's clear readings share (upper case, "1a"...): the recogniser's reading of a small
    label changes with the crop's preparation, and a reading in that style is taken."""
    clear = {i: d.text for i, (_, d) in enumerate(detections) if d.confidence >= p.strong_score}
    if len(clear) < 2:
        return detections
    main = _main_style(clear, set(clear))
    if main in ("other", "roman"):
        return detections  # numerals are recounted from their strokes, not read again
    styled = {panel for panel, d in detections if _style(d.text) == main}
    todo = [c for c in candidates if c.source is not None and c.panel not in styled]
    todo = sorted(todo, key=lambda c: -c.prior)[: 2 * len({c.panel for c in todo})]
    crops: list[np.ndarray] = []
    owners: list[_Candidate] = []
    for cand in todo:
        keep, box, invert, cores = cand.source  # type: ignore[misc]
        for masked, spread, height in _SECOND_LOOK:
            if not masked and keep is None:
                continue
            mask = keep if masked else None
            crops.append(
                _prepare_crop(gray, mask, box, invert, cores=cores and masked, spread=spread, height=height)
            )
            owners.append(cand)
    best: dict[int, tuple[float, str, str]] = {}
    for cand, crop, (raw, score) in zip(owners, crops, engine.read(crops), strict=True):
        text = normalize_label(raw)
        if text is None or score < p.min_score:
            continue
        text = _count_strokes(crop, raw, text)
        if _style(text) == main and score > best.get(id(cand), (0.0, "", ""))[0]:
            best[id(cand)] = (score, text, raw)
    if not best:
        return detections
    out = list(detections)
    for cand in todo:
        if id(cand) not in best:
            continue
        score, text, raw = best[id(cand)]
        x1, y1, x2, y2 = cand.box
        box = (float(x1), float(y1), float(x2), float(y2))
        out = [(p, d) for p, d in out if d.box != box]
        confidence = float(score * (0.5 + 0.5 * cand.prior))
        out.append((cand.panel, LabelDetection(text=text, box=box, confidence=confidence, raw=raw)))
    return out


_NARROW = set("iIlj1tfrJ")  # the only labels printed narrower than 0.4 of their height
_CASELESS = set("cCkKoOpPsSuUvVwWxXzZ")  # letters whose two cases differ mostly in size
_X_HEIGHT = set("acemnorsuvwxz")


def _settle_case(detections: list[LabelDetection]) -> list[LabelDetection]:
    """Upper or lower case for letters that look alike in both (c/C, o/O, s/S...), by comparing
    their height with the figure's other labels (capitals and x-height letters)."""

    def height(d: LabelDetection) -> float:
        return d.box[3] - d.box[1]

    plain = [d for d in detections if len(d.text) == 1 and "(" not in d.raw and ")" not in d.raw]
    caps = [height(d) for d in plain if (d.text.isupper() or d.text.isdigit()) and d.text not in _CASELESS]
    smalls = [height(d) for d in plain if d.text in _X_HEIGHT and d.text not in _CASELESS]
    if not caps and not smalls:
        return detections
    out = []
    for d in detections:
        if d in plain and d.text in _CASELESS:
            h = height(d)
            cap = float(np.median(caps)) if caps else 0.0
            upper = h >= 0.85 * cap if caps else h > 1.15 * float(np.median(smalls))
            text = d.text.upper() if upper else d.text.lower()
            d = LabelDetection(text=text, box=d.box, confidence=d.confidence, raw=d.raw)
        out.append(d)
    return out


def read_glyphs(
    gray: np.ndarray, glyphs: Sequence[CornerGlyph], *, min_score: float | None = None
) -> list[LabelDetection | None]:
    """What each glyph group reads as a panel label (None when it does not read as one), read as
    the corner search reads them; the detections' confidences carry no corner prior."""
    candidates = [
        _Candidate(
            box=g.box,
            crop=_prepare_crop(gray, g.keep, g.crop_box, invert=g.invert),
            panel=i,
            prior=1.0,
            source=(g.keep, g.crop_box, g.invert, False),
        )
        for i, g in enumerate(glyphs)
    ]
    out: list[LabelDetection | None] = [None] * len(glyphs)
    threshold = load_params().labels.min_score if min_score is None else min_score
    for i, detection in _read(_engine(), candidates, threshold):
        out[i] = detection
    return out


# Preparations for reading a glyph group of several characters ("c1"): the strokes' cores without
# gaps opened between glyphs read best; the others catch what that one misses. (cores, spread)
_GROUP_PREPARATIONS = ((True, False), (True, True), (False, False))


def read_corner_glyphs(gray: np.ndarray, glyphs: Sequence[CornerGlyph]) -> list[list[tuple[str, float]]]:
    """The recogniser's raw readings (text, score) of each glyph group, one per preparation in
    ``_GROUP_PREPARATIONS``, for callers that judge the text themselves."""
    crops = [
        _prepare_crop(gray, g.keep, g.crop_box, invert=g.invert, cores=cores, spread=spread)
        for g in glyphs
        for cores, spread in _GROUP_PREPARATIONS
    ]
    if not crops:
        return []
    readings = _engine().read(crops)
    n = len(_GROUP_PREPARATIONS)
    return [readings[i * n : (i + 1) * n] for i in range(len(glyphs))]


def _read(engine: _Ocr, candidates: list[_Candidate], min_score: float) -> list[tuple[int, LabelDetection]]:
    """What the candidates read as labels: readings scoring below ``min_score`` are dropped."""
    if not candidates:
        return []
    inners = {
        i: inner for i, c in enumerate(candidates) if (inner := _without_parentheses(c.crop)) is not None
    }
    readings = engine.read([c.crop for c in candidates])
    # in a batch of their own: padded out to a wider crop's width, lone thin letters read worse
    inner_readings = dict(zip(inners, engine.read(list(inners.values())), strict=True))
    out: list[tuple[int, LabelDetection]] = []
    seen: set[tuple[int, int, int, int]] = set()
    for i, (cand, (raw, score)) in enumerate(zip(candidates, readings, strict=True)):
        text = normalize_label(raw)
        if text is not None:
            text = _count_strokes(cand.crop, raw, text)
        if i in inner_readings:
            # the glyphs read alone, when they read as a label more surely than with their
            # parentheses (the recogniser swallows thin letters between parentheses, "(I)" ->
            # "()", or reads them as others, "(J)" -> "(D"); the same label read both ways
            # keeps the surer score
            inner_raw, inner_score = inner_readings[i]
            inner_text = normalize_label(inner_raw)
            if text is not None and inner_text is not None and text.casefold() == inner_text.casefold():
                inner_score = max(score, inner_score)
            if inner_text is not None and inner_score >= min_score and (text is None or inner_score >= score):
                text = _count_strokes(inners[i], inner_raw, inner_text)
                raw, score = f"({inner_raw})", inner_score
        if text is None or score < min_score or cand.box in seen:
            continue
        x1, y1, x2, y2 = cand.box
        if x2 - x1 < 0.4 * (y2 - y1) and text not in _NARROW:
            continue  # a lone parenthesis or rule read as a round letter ("(" -> "c")
        seen.add(cand.box)
        x1, y1, x2, y2 = cand.box
        confidence = float(score * (0.5 + 0.5 * cand.prior))
        box = (float(x1), float(y1), float(x2), float(y2))
        out.append((cand.panel, LabelDetection(text=text, box=box, confidence=confidence, raw=raw)))
    return out


def _count_strokes(crop: np.ndarray, raw: str, text: str) -> str:
    """Roman numerals with the i's counted from the crop: the recogniser's CTC decoding merges
    repeated thin letters ("ii" -> "i", "viii" -> "vi") even with the gaps ``_spread`` opens.

    Glyphs are the crop's connected ink shapes: dots are small, the parentheses the reading shows
    are the outermost shapes, i-stems narrow, v's and x's about as wide as tall. The i's are
    recounted only when every shape is clearly one of these (two glyphs touching are not) and
    the v's and x's agree with the reading; else, in lower case, from the dots over the stems
    (bold serifs join the stems of "iii"). i's are only ever added.
    """
    if not text or set(text.lower()) - set("ivx"):
        return text
    _, _, stats, _ = cv2.connectedComponentsWithStats((crop < 128).astype(np.uint8), connectivity=8)
    tall = sorted((int(x), int(y), int(w), int(h)) for x, y, w, h, _ in stats[1:] if h >= 0.3 * GLYPH_HEIGHT)
    stripped = "".join(raw.split())
    if tall and stripped.startswith(("(", "[")):
        tall = tall[1:]
    if tall and stripped.endswith((")", "]")):
        tall = tall[:-1]
    counted = _count_stems(tall, text)
    if counted == text and text.islower():
        counted = _count_dots(stats, tall, text)
    return counted


def _count_stems(tall: list[tuple[int, int, int, int]], text: str) -> str:
    runs: list[str] = []
    for _, _, w, h in tall:
        ratio = w / max(1, h)
        if ratio <= 0.72:  # bold serif stems are wider than sans ones
            runs.append("n")
        elif 0.8 <= ratio <= 1.25:
            runs.append("w")
        else:
            return text  # two glyphs touching, or a shape of neither kind: no count
    wide = [c for c in text if c.lower() in "vx"]
    if len(runs) <= len(text) or runs.count("w") != len(wide):
        return text
    letters = iter(wide)
    counted = "".join(next(letters) if r == "w" else ("I" if text.isupper() else "i") for r in runs)
    return counted if counted.lower() in ROMAN else text


def _count_dots(stats: np.ndarray, tall: list[tuple[int, int, int, int]], text: str) -> str:
    """A lower-case numeral's i's counted from their dots (small shapes above the stems); the
    stems no dot stands over are its v's and x's."""
    if not tall:
        return text
    small = 0.3 * GLYPH_HEIGHT
    top = min(y for _, y, _, _ in tall)
    dots = [(int(x) + w / 2.0) for x, y, w, h, _ in stats[1:] if h < small and w < small and y + h <= top + 1]
    bare = [(x, w) for x, _, w, _ in tall if not any(x - 1 <= d <= x + w + 1 for d in dots)]
    wide = [c for c in text if c in "vx"]
    if not dots or len(bare) != len(wide):
        return text
    items = sorted(
        [(d, "i") for d in dots] + [(x + w / 2.0, c) for (x, w), c in zip(bare, wide, strict=True)]
    )
    counted = "".join(c for _, c in items)
    return counted if counted in ROMAN and counted.count("i") > text.count("i") else text


# --------------------------------------------------------------------------------------------
# reading order and assignment


def reading_order(
    panels: Sequence[PanelCandidate | Box], labels: Sequence[str | None] | None = None
) -> list[int]:
    """Panel indices in reading order: rows top to bottom, left to right within a row, following
    whole-figure gutters first (so a column of stacked panels is read before the next column).

    With ``labels`` (one per panel, None where unread), the order among ``reading_orders`` in
    which the labels run as one a, b, c... series best: figures labelled column by column, or
    a block read before the column beside it."""
    orders = reading_orders(panels)
    if labels is None or len(orders) < 2:
        return orders[0] if orders else []
    texts = {i: text for i, text in enumerate(labels) if text}
    return _best_order(orders, texts, set(texts))[0]


# (axis cut first at the top level, axis cut first below it, overlap tolerated between boxes on
# either side of a gutter as a fraction of the later box's size); 1: rows, 0: columns. The
# default first: rows first everywhere, slightly overlapping boxes tolerated.
_ORDER_POLICIES = tuple(
    (top, below, slack) for slack in (0.1, 0.0) for top, below in ((1, 1), (0, 0), (0, 1), (1, 0))
)


def reading_orders(panels: Sequence[PanelCandidate | Box]) -> list[list[int]]:
    """Distinct candidate reading orders, the default (``reading_order``) first.

    Recursive cuts along whole gutters, rows first or columns first (at the top level and below
    it: a block read row by row before the column beside it); with or without tolerating
    boxes that overlap a little across a gutter (segmentation slack, or a real overlap between a
    block's row and the column beside it, which is no gutter)."""
    boxes = [p.box if isinstance(p, PanelCandidate) else p for p in panels]
    if not boxes:
        return []
    orders: list[list[int]] = []
    for top, below, slack in _ORDER_POLICIES:
        order = _cut_order(boxes, list(range(len(boxes))), top, below, slack)
        if order not in orders:
            orders.append(order)
    return orders


def _cut_order(boxes: Sequence[Box], indices: list[int], first: int, below: int, slack: float) -> list[int]:
    if len(indices) <= 1:
        return indices
    for axis in (first, 1 - first):  # 1: horizontal gutter (rows), 0: vertical gutter (columns)
        lo, hi = (1, 3) if axis == 1 else (0, 2)
        spans = sorted((boxes[i][lo], boxes[i][hi], i) for i in indices)
        groups: list[list[int]] = []
        reach = -np.inf
        for start, end, i in spans:
            if groups and start < reach - slack * (end - start):
                groups[-1].append(i)
                reach = max(reach, end)
            else:
                groups.append([i])
                reach = end
        if len(groups) > 1:
            return [k for g in groups for k in _cut_order(boxes, g, below, below, slack)]
    return sorted(indices, key=lambda i: (boxes[i][1], boxes[i][0]))


def _style(text: str) -> str:
    if text.isdigit():
        return "digit"
    if text.lower() in ROMAN and len(text) > 1:
        return "roman"
    if len(text) == 1 and text.isalpha():
        return "lower" if text.islower() else "upper"
    if len(text) >= 2 and text[:-1].isdigit() and text[-1].isalpha():
        # "1a", "1b"...: one series per figure number and case
        return f"{text[:-1]}+{'lower' if text[-1].islower() else 'upper'}"
    return "other"


def _fits(expected: str, text: str) -> bool:
    """Whether an OCR reading may stand for the label the series expects."""
    if expected in _options(text):
        return True
    # "1a" labels: the figure number is the series' own, and the letter may be a confusion
    # ("61" for "6l", "1a" for "4a")
    return (
        len(text) == len(expected) >= 2
        and expected[:-1].isdigit()
        and text[:-1].isdigit()
        and expected[-1] in _plain_options(text[-1])
    )


_ROMANISH = str.maketrans({"1": "i", "l": "i", "I": "i", "|": "i", "j": "i", "V": "v", "X": "x", "y": "v"})


def _options(text: str) -> list[str]:
    """What an OCR reading may stand for (itself first)."""
    numerals = _roman_options(text)
    if numerals:
        return list(dict.fromkeys([*_plain_options(text), *numerals]))
    return _plain_options(text)


_STROKES = str.maketrans({"u": "ii", "U": "ii", "n": "ii", "m": "iii", "w": "vv", "W": "vv"})


def _roman_options(text: str) -> list[str]:
    """Roman numerals a reading made of thin strokes, v and x may stand for: the recogniser merges
    or drops repeated i's ("ii" -> "u", "iii" -> "i" or "m"), so only the v/x skeleton must agree."""
    shape = text.translate(_STROKES).translate(_ROMANISH).lower()
    if not shape or any(c not in "ivx" for c in shape):
        return []
    skeleton = shape.replace("i", "")
    strokes = len(shape) - len(skeleton)
    out = []
    for numeral in ROMAN:
        # i's are dropped, hardly ever added: a reading stands for numerals with as many i's or
        # up to two more ("iv" is no "v", "ii" no "i")
        if numeral.replace("i", "") == skeleton and 0 <= numeral.count("i") - strokes <= 2:
            out.append(numeral)
    return out


def _plain_options(text: str) -> list[str]:
    if len(text) != 1:
        options = [text, text.lower(), text.upper()]
        roman = text.translate(_ROMANISH).lower()
        if roman in ROMAN:
            options += [roman, roman.upper()]
        return list(dict.fromkeys(options))
    alternatives = _CONFUSIONS.get(text, text)
    return list(dict.fromkeys(text + alternatives))


def _zone_cost(label: Box, panel: Box) -> float | None:
    """How well a label sits at a panel's top-left, outside or inside, or inside near another
    corner (lower is better); None if it is not where a panel label goes."""
    lx1, ly1, lx2, ly2 = label
    px1, py1, px2, py2 = panel
    lh = max(1.0, ly2 - ly1)
    pw, ph = px2 - px1, py2 - py1
    if lx1 >= px2 or ly1 >= py2:
        return None
    cx, cy = (lx1 + lx2) / 2, (ly1 + ly2) / 2
    inside = px1 - 1 <= lx1 and lx2 <= px2 + 1 and py1 - 1 <= ly1 and ly2 <= py2 + 1
    if inside:
        near_x, near_y = max(3.0 * lh, 0.3 * pw), max(3.0 * lh, 0.3 * ph)
        best: float | None = None
        for right in (False, True):
            for bottom in (False, True):
                dx = px2 - lx2 if right else lx1 - px1
                dy = py2 - ly2 if bottom else ly1 - py1
                if dx <= near_x and dy <= near_y:
                    cost = (dx + dy) / lh + (0.0 if not (right or bottom) else 1.0)
                    best = cost if best is None else min(best, cost)
        return best
    reach = max(6.0 * lh, 0.25 * min(pw, ph))
    if cx < px1 - reach or cy < py1 - reach:
        return None
    if cx > px1 + max(3.0 * lh, 0.3 * pw) or cy > py1 + max(3.0 * lh, 0.3 * ph):
        return None
    dx = max(0.0, px1 - lx2, lx1 - px1)
    dy = max(0.0, py1 - ly2, ly1 - py1)
    return (dx + dy) / lh


def assign_labels(
    panels: Sequence[PanelCandidate], labels: Sequence[LabelDetection], *, params: LabelParams | None = None
) -> list[str | None]:
    """One label (or None) per panel; OCR confusions repaired by the a, b, c... sequence."""
    strong_score = (params or load_params().labels).strong_score
    n = len(panels)
    result: list[str | None] = [None] * n
    if n == 0 or not labels:
        return result
    # the kind of label the figure's clear readings share: a reading of another kind ("G", a
    # speck inside the panel, among numerals) gives way to one of that kind for the same panel
    clear = {li: det.text for li, det in enumerate(labels) if det.confidence >= strong_score}
    main = _main_style(clear, set(clear)) if len(clear) >= 2 else None
    pairs: list[tuple[float, int, int]] = []
    for li, det in enumerate(labels):
        off_kind = 4.0 if main is not None and not _in_style(det.text, main) else 0.0
        # a label printed inside a panel names that panel, never a neighbour
        homes = [
            pi
            for pi, panel in enumerate(panels)
            if geometry.intersection(det.box, panel.box) >= 0.9 * max(1.0, geometry.area(det.box))
        ]
        for pi, panel in enumerate(panels):
            if homes and pi not in homes:
                continue
            cost = _zone_cost(det.box, panel.box)
            if cost is not None:
                pairs.append((cost - 2.0 * det.confidence + off_kind, li, pi))
    pairs.sort()
    used_labels: set[int] = set()
    chosen: dict[int, LabelDetection] = {}
    for _, li, pi in pairs:
        if li in used_labels or pi in chosen:
            continue
        used_labels.add(li)
        chosen[pi] = labels[li]
    if not chosen:
        return result
    texts: dict[int, str] = {pi: det.text for pi, det in chosen.items()}
    confidence = {pi: det.confidence for pi, det in chosen.items()}
    texts = _repair_sequence(reading_orders(panels), texts, confidence, strong_score)
    for pi, text in texts.items():
        result[pi] = text
    return result


def _main_style(texts: dict[int, str], strong: set[int]) -> str:
    def votes(voters: list[str]) -> dict[str, int]:
        counts: dict[str, int] = {}
        for t in voters:
            # a lone i, v or x (either case) may be a letter or a roman numeral: it votes for both
            for s in {_style(t), *(["roman"] if t in "ivxIVX" and len(t) == 1 else [])}:
                counts[s] = counts.get(s, 0) + 1
        return counts

    counts = votes([t for pi, t in texts.items() if pi in strong] or list(texts.values()))
    # ties between the clear readings' styles (lone "i"s: letters or numerals) go to the style
    # most of all readings share ("ii" and "iii" read weakly)
    everyone = votes(list(texts.values()))
    return max(counts, key=lambda s: (counts[s], everyone.get(s, 0), s != "other", s != "roman"))


def _best_order(
    orders: list[list[int]], texts: dict[int, str], strong: set[int]
) -> tuple[list[int], int, str]:
    """The reading order (and offset into the series) under which most readings, strong ones
    counted twice, are what the a, b, c... series expects at their rank; earlier orders win ties.
    Returns (order, offset, style)."""
    main = _main_style(texts, strong) if texts else "other"
    series = _series(main)
    best_order, best_offset, best = orders[0], 0, (-1, -1)
    for order in orders:
        positions = {pi: rank for rank, pi in enumerate(order)}
        for offset in range(-len(order), len(series)):
            fit = exact = 0
            for pi, text in texts.items():
                index = positions[pi] + offset
                if 0 <= index < len(series) and _fits(series[index], text):
                    # a reading that is the label counts twice what a confusion of it does
                    same = series[index] == text
                    fit += (1 + int(pi in strong)) * (1 + int(same))
                    exact += int(same)
            if (fit, exact) > best:
                best_order, best_offset, best = order, offset, (fit, exact)
    return best_order, best_offset, main


def _repair_sequence(
    orders: list[list[int]], texts: dict[int, str], confidence: dict[int, float], strong_score: float
) -> dict[int, str]:
    """Fix confusable readings so the labels, in reading order, form one consecutive series.
    The reading order is the one of ``orders`` under which the readings fit the series best.

    Weak readings (confidence below ``strong_score``) survive only when the series confirms them;
    a panel whose reading does not fit (or that has none) gets the label the series expects there
    when its neighbours in reading order carry the expected labels.
    """
    strong = {pi: t for pi, t in texts.items() if confidence.get(pi, 0.0) >= strong_score}
    order, best_offset, main = _best_order(orders, texts, set(strong))
    series = _series(main)
    positions = {pi: rank for rank, pi in enumerate(order)}
    fitting = {
        pi
        for pi, text in texts.items()
        if 0 <= positions[pi] + best_offset < len(series) and _fits(series[positions[pi] + best_offset], text)
    }
    # readings that are exactly the labels of their ranks confirm the series even when specks
    # read inside the panels (tick values, texture) outnumber them
    exact = [pi for pi in fitting if series[positions[pi] + best_offset] == texts[pi]]
    consistent = (
        bool(series)
        and len(fitting) >= 2
        and (len(fitting) >= 0.6 * len(texts) or len(exact) >= max(3, 0.5 * len(strong)))
    )
    fixed: dict[int, str] = {}
    if not consistent:
        # no series to fill from, but the figure's labels share a kind: a clear reading of
        # another kind ("30" among letters) is text near a corner, not a label
        kinds = [_in_style(text, main) for text in strong.values()]
        one_kind = sum(kinds) >= 2 and sum(kinds) > 2 * (len(kinds) - sum(kinds))
        for pi, text in strong.items():
            if one_kind and not _in_style(text, main):
                continue
            fits = [o for o in _options(text) if _of_style(o, main)]
            fixed[pi] = text if _of_style(text, main) or not fits else fits[0]
        return _dedupe(fixed, confidence)

    def expected_at(rank: int) -> str | None:
        index = rank + best_offset
        return series[index] if 0 <= index < len(series) else None

    def confirmed(rank: int) -> bool:
        if 0 <= rank < len(order):
            return order[rank] in fitting
        return True  # the figure's edge

    def bracketed(rank: int) -> bool:
        """A run of at most two unconfirmed panels with confirmed ones (or the figure's edge) on
        both sides, in a series that most panels confirm."""
        lo, hi = rank - 1, rank + 1
        while lo >= 0 and not confirmed(lo):
            lo -= 1
        while hi < len(order) and not confirmed(hi):
            hi += 1
        return hi - lo - 1 <= 2 and len(fitting) >= max(3, 0.5 * len(order))

    # No candidate order may explain a layout (panels labelled in an order no gutter shows): then
    # a clear reading that is itself a label of the series stays, whatever its rank expects;
    # not roman numerals, whose i's OCR merges or drops into other numerals of the series.
    # Lone strokes do not vote: a blurred letter decays into one.
    solid = {pi: text for pi, text in strong.items() if not _lone_stroke(text)}
    agree = sum(expected_at(positions[pi]) == text for pi, text in solid.items())
    order_trusted = main == "roman" or agree >= 0.75 * len(solid)

    def filled(rank: int) -> bool:
        """Whether the series' label goes to an unconfirmed panel: between confirmed ones."""
        return (confirmed(rank - 1) and confirmed(rank + 1)) or bracketed(rank)

    def stroke_in_series(rank: int) -> bool:
        """A lone stroke ("I", "l") read where the trusted series expects another letter, between
        confirmed neighbours: what a blurred letter decays into, not a label out of order."""
        reading = texts.get(order[rank])
        return (
            order_trusted
            and reading is not None
            and _lone_stroke(reading)
            and expected_at(rank) is not None
            and confirmed(rank - 1)
            and confirmed(rank + 1)
        )

    members = set(series)
    for rank, pi in enumerate(order):
        expected = expected_at(rank)
        reading = texts.get(pi)
        keep = not order_trusted and pi in strong and reading in members
        if pi in fitting and expected is not None and not keep:
            fixed[pi] = expected
        elif reading is not None and pi in strong and _in_style(reading, main) and not stroke_in_series(rank):
            # a clear reading that no confusion at its rank explains: trust it, in the series'
            # style when it has one ("c" in an upper-case series whose ranks are off); one in
            # no way of the series' style ("40", "R" among roman numerals) is text beside the
            # label, which is filled as if unread
            styled = [o for o in _options(reading) if _of_style(o, main)]
            fixed[pi] = reading if _of_style(reading, main) or not styled else styled[0]
            if (
                not _of_style(reading, main)
                and expected is not None
                and reading.casefold() != expected.casefold()
                and filled(rank)
            ):
                # a reading of another style ("6" or "g" among capitals), not the expected label
                # in the other case, is no surer than the series between confirmed labels
                fixed[pi] = expected
        elif expected is not None and filled(rank):
            fixed[pi] = expected
    return _dedupe(fixed, confidence)


def _of_style(text: str, style: str) -> bool:
    """Whether a reading is a label of ``style`` as it stands (a lone i, v or x is a numeral too)."""
    return _style(text) == style or (style == "roman" and text in ("i", "v", "x"))


def _family(style: str) -> str:
    """Letters of either case, numbers (digits and "1a" compounds, which OCR confuses: "3c" is
    read "30"), roman numerals, other."""
    if style in ("lower", "upper"):
        return "letter"
    return "number" if style == "digit" or "+" in style else style


def _in_style(text: str, style: str) -> bool:
    """Whether a reading is, or may stand for, a label of ``style``'s kind (letters of either
    case, digits, roman numerals, figure-number compounds)."""
    return any(_family(_style(o)) == _family(style) for o in _options(text))


def _dedupe(fixed: dict[int, str], confidence: dict[int, float]) -> dict[int, str]:
    seen: dict[str, int] = {}
    for pi in sorted(fixed, key=lambda p: -confidence.get(p, 0.0)):
        seen.setdefault(fixed[pi], pi)
    return {pi: text for text, pi in seen.items()}


def _series(style: str) -> list[str]:
    if "+" in style:
        number, case = style.split("+")
        letters = "abcdefghijklmnopqrstuvwxyz"
        return [number + (c if case == "lower" else c.upper()) for c in letters]
    if style == "lower":
        return list("abcdefghijklmnopqrstuvwxyz")
    if style == "upper":
        return list("ABCDEFGHIJKLMNOPQRSTUVWXYZ")
    if style == "digit":
        return [str(i) for i in range(1, 100)]
    if style == "roman":
        return list(ROMAN)
    return []
