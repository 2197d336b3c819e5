"""Annotation markers on photographic panels: arrows, arrowheads, asterisks, stars, drawn
rectangles and circles/ovals (solid or dashed), and zoom-in insets.

Markers are overlays: drawn in a colour or a tone that the micrograph underneath does not have
at that place (saturated colour on a grey image, near-white or near-black strokes on a mid-tone
background). ``detect_markers`` builds "ink" masks from contrast against a local background
estimate (a median over about 20 px, wider than any stroke): white, black and colour ink (colour
only of a hue the panel has little of, so colour maps and stained sections are not read as
markers; in such a colourful panel only where the local background is grey or of a far hue),
each with a strong core. Then it asks shape questions:

* arrows, head first: compact blobs of strong ink are arrowhead candidates; from each, rays in
  all directions look for a shaft, i.e. a straight run of samples brighter (darker, or of the
  head's colour) than the samples a few pixels to either side (a thin ridge, tolerant of the
  breaks anti-aliasing leaves in a one-pixel line). A shaft gives the direction (shaft -> head);
  the tip is the head's extreme pixel along it;
* arrows, whole: connected ink components that are a straight shaft widening into a head at one
  end and tapering to a tip. Every arrow hypothesis is checked on a straightened strip around
  its axis against an ideal arrow (straight flanks, barbs, a shaft of constant width, nothing
  ahead of the tip, little clutter); open "V" heads are measured by the span of their strokes;
* arrowheads: lone compact components fitting an isosceles triangle (or a notched "stealth"
  head) with a sharp apex, checked the same way without a shaft;
* asterisks and stars: five to eight evenly spaced spokes in the radial profile of the outline
  (glyphs of a few pixels are examined on a four-times upsampled copy);
* tiny symbols: a glyph of 4 to 16 px (a figure scaled down) may have no resolvable shape; a
  compact blob of colour ink that contrasts with its background, stands alone and has a hue few
  other blobs of the panel share is reported at low confidence as a star or asterisk (its kind
  is a guess; the neighbourhood it marks is what matters);
* closed outlines: a thin ring with one large hole (rectangle or circle/oval by how much of its
  bounding box the filled outline covers; touching rings hole by hole); dashed outlines after
  joining the dashes by a dilation, with checks that the dashes run around one thin curve;
* long straight (dashed or solid) rows and columns of ink assembled into rectangles whose sides
  are isolated lines;
* insets: an embedded sub-image in a panel corner, bounded by a straight vertical and a straight
  horizontal edge or frame line that meet at its inner corner (and do not run on across the
  whole panel as a white or black strip, which would make them a gutter between juxtaposed
  sub-images). Straight lines leaving an inset's corners lead to its source region, which is
  reported as a ``box`` marker when no drawn box is there already.

A small panel (shorter side under 260 px) is also examined enlarged up to twice, for arrows,
arrowheads, asterisks and stars of a few pixels that the shape tests cannot resolve at the native
scale; what only the enlarged copy shows needs the network's support (below).

Text (rows of letter-sized components), scale bars (solid thin bars in the lower part of a panel,
with their text) and strokes lying along the panel border or an inset frame are not markers.

A small learned detector (``marker_net``, trained on synthetic figures) then runs on the panel.
It finds what the rules miss (glyphs of a few pixels, outlines JPEG washed out, glyphs in the
panel's own hue, heads smeared on texture) and vets what they find: hand-set levels add its
markers where no rule-based marker explains them and keep rule-based markers of a middling score
only where it sees something too. A learned fusion model (gradient-boosted trees,
``marker_net.TreeEnsemble``, trained on synthetic figures by ``train_marker_net --fusion``) then
scores every rule-based candidate and network peak from measurements of both
(``fusion_features``: its score and source, the network's heat of each kind on its glyph, the
best other candidate on it, its size, how many alike the panel has, how colourful and textured
the panel is, how strong and solid its ink is and how common the ink's hue in the panel) with
the probability that it marks a true target, and overrules the levels where it is sure: it
drops what they kept on the network's word alone and adds what they missed.
``detect_markers(..., use_net=False)`` is the rules alone.

Every marker reports the structure it indicates as ``target_box``: an axis-aligned square ahead
of the tip for arrows and arrowheads (sized from the glyph and the panel), the neighbourhood of
the glyph for asterisks and stars, the enclosed region for outlines and the frame for insets.
All boxes are figure pixels with exclusive x2/y2; points are pixel coordinates (the arrow tip
pixel, the centre of an outline or symbol).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, replace

import cv2
import numpy as np

from p2p.mining.cpu.labels.read import _engine as ocr_engine
from p2p.mining.cpu.markers import net as marker_net
from p2p.mining.params import MarkerParams, load_params
from p2p.mining.types import Marker
from p2p.shared import geometry
from p2p.shared.geometry import Box, contains_point

# The rules' candidates scoring below MarkerParams.min_confidence are dropped; arrows are tested
# against an ideal arrow shape, and below their own min_score the look-alikes (texture ridges,
# elongated cells) outnumber real arrows on the development and synthetic sets.

# In a colourful panel (a colour map, a stained section) colour ink off a grey background must
# differ in hue from its surroundings by this much (of 256, about 100 degrees).
_FAR_HUE_COLOURFUL = 72

_POINTING = ("arrow", "arrowhead")
_STRONG = {"white_lo": "white", "black_lo": "black", "colour": "colour"}  # mask -> its strong core
_ENCLOSING = ("box", "circle", "inset")
_COARSE = np.deg2rad(np.arange(0.0, 360.0, 10.0))
_RING = np.deg2rad(np.arange(0.0, 360.0, 10.0))


@dataclass
class _Cand:
    kind: str
    glyph: tuple[int, int, int, int]  # crop pixels, x2/y2 exclusive
    point: tuple[float, float]  # target point, crop pixel coordinates
    score: float
    region: tuple[float, float, float, float] | None = None  # enclosed region (outlines, insets)
    direction: float | None = None  # degrees, image coordinates (y down), tail -> tip
    size: float = 0.0  # glyph length along its axis, sizes a pointing target
    color: tuple[int, int, int] | None = None
    enlarged: bool = False  # found only on the enlarged copy of a small panel


# ----------------------------------------------------------------------------- panel


class _Panel:
    """One panel crop: tone, saturation, background estimate, ink masks (cached components)."""

    def __init__(self, crop: np.ndarray) -> None:
        self.rgb = crop
        self.h, self.w = crop.shape[:2]
        self.diag = math.hypot(self.w, self.h)
        self.gray = cv2.cvtColor(crop, cv2.COLOR_RGB2GRAY)
        self.sat = _saturation(crop)
        factor = 4 if min(self.h, self.w) >= 96 else 2 if min(self.h, self.w) >= 40 else 1
        small = cv2.resize(
            crop, (max(1, self.w // factor), max(1, self.h // factor)), interpolation=cv2.INTER_AREA
        )
        small = cv2.medianBlur(small, 5)
        size = (self.w, self.h)
        self.bg_rgb = cv2.resize(small, size, interpolation=cv2.INTER_LINEAR)
        self.bg_gray = cv2.resize(
            cv2.cvtColor(small, cv2.COLOR_RGB2GRAY), size, interpolation=cv2.INTER_LINEAR
        )
        self.bg_sat = cv2.resize(_saturation(small), size, interpolation=cv2.INTER_LINEAR)
        self._bg_small = small
        gray = self.gray
        lift = gray.astype(np.int16) - self.bg_gray.astype(np.int16)
        neutral = self.sat <= 60
        white_lo = (gray >= 160) & (lift >= 40) & neutral
        black_lo = (gray <= 110) & (lift <= -40) & neutral
        cdiff = cv2.absdiff(crop, self.bg_rgb)
        r, g, b = cv2.split(cdiff)
        cdist = cv2.max(cv2.max(r, g), b)
        # Colour ink: saturated, unlike its surroundings, and of a hue the panel has little of
        # (a colour map or a stained section is not a field of markers).
        hue = cv2.cvtColor(crop, cv2.COLOR_RGB2HSV_FULL)[..., 0]
        saturated = (self.sat >= 70) & (cdist >= 60)
        colour = saturated
        if saturated.any():
            bins = (hue // 8).astype(np.intp)  # 32 hue bins
            counts = np.bincount(bins[self.sat >= 70], minlength=32)
            common = counts > 0.04 * self.h * self.w
            # Neighbouring bins share a hue family with a common one only when they are busy too.
            rare = ~common
            bg_hue = cv2.resize(
                cv2.cvtColor(small, cv2.COLOR_RGB2HSV_FULL)[..., 0], size, interpolation=cv2.INTER_NEAREST
            )
            dh = np.abs(hue.astype(np.int16) - bg_hue.astype(np.int16))
            far = np.minimum(dh, 256 - dh) >= 36
            # In a colourful panel (a colour map, a stained section) a marker is only trusted on
            # a locally grey background, or where its hue is far from the local one (a green
            # glyph on red tissue; not a red one on brown).
            if float(np.count_nonzero(self.sat >= 70)) > 0.3 * self.h * self.w:
                far = np.minimum(dh, 256 - dh) >= _FAR_HUE_COLOURFUL
            colour = saturated & rare[bins] & ((self.bg_sat <= 60) | far)
        self.masks: dict[str, np.ndarray] = {
            "white_lo": white_lo.view(np.uint8),
            # Strong cores (arrowhead seeds): near-pure white or black.
            "white": (white_lo & (gray >= 225) & (lift >= 50)).view(np.uint8),
            "black_lo": black_lo.view(np.uint8),
            "black": (black_lo & (gray <= 40) & (lift <= -50)).view(np.uint8),
            # Drawn-glyph evidence: strong cores, or a large step above/below the background
            # (thin, blurred or downscaled strokes do not reach pure white or black).
            "white_core": (white_lo & (((gray >= 225) & (lift >= 50)) | (lift >= 75))).view(np.uint8),
            "black_core": (black_lo & (((gray <= 40) & (lift <= -50)) | (lift <= -60))).view(np.uint8),
            "colour": colour.view(np.uint8),
            # Any saturated ink unlike its surroundings, whatever its hue: only for drawn
            # rectangles, whose two long straight parallel sides no stain or colour map makes
            # (a magenta box on magenta-stained nuclei).
            "colour_any": saturated.view(np.uint8),
        }
        self.cdist = cdist  # colour distance from the background estimate, per pixel
        self.hue = hue
        self._cc: dict[str, tuple[int, np.ndarray, np.ndarray]] = {}
        # Where the sides of a shaft are sampled: shafts are at most a few pixels wide, a little
        # wider on large panels (figures are drawn at a size and scaled).
        self.side_offsets = (3.0, 3.0 + max(1.0, min(self.h, self.w) / 250.0))
        self._planes_cache: tuple[np.ndarray, np.ndarray] | None = None
        self._rgb16_cache: np.ndarray | None = None

    @property
    def _planes(self) -> tuple[np.ndarray, np.ndarray]:
        """Strength of white and of black ink per pixel (float32)."""
        if self._planes_cache is None:
            gray_f = self.gray.astype(np.float32)
            self._planes_cache = (gray_f, 255.0 - gray_f)
        return self._planes_cache

    @property
    def _rgb16(self) -> np.ndarray:
        if self._rgb16_cache is None:
            self._rgb16_cache = self.rgb.astype(np.int16)
        return self._rgb16_cache

    def components(self, name: str) -> tuple[int, np.ndarray, np.ndarray]:
        if name not in self._cc:
            n, labels, stats, _ = cv2.connectedComponentsWithStats(self.masks[name], connectivity=8)
            self._cc[name] = (n, labels, stats)
        return self._cc[name]

    def strength(
        self, polarity: str, xs: np.ndarray, ys: np.ndarray, colour: np.ndarray | None = None
    ) -> np.ndarray:
        """How much each sample looks like ink of this polarity (0..255), nearest pixel."""
        xi = (xs + 0.5).astype(np.intp)
        yi = (ys + 0.5).astype(np.intp)
        np.minimum(xi, self.w - 1, out=xi)
        np.maximum(xi, 0, out=xi)
        np.minimum(yi, self.h - 1, out=yi)
        np.maximum(yi, 0, out=yi)
        if polarity == "white":
            return self._planes[0][yi, xi]
        if polarity == "black":
            return self._planes[1][yi, xi]
        assert colour is not None
        diff = np.abs(self._rgb16[yi, xi] - colour.astype(np.int16))
        return 255.0 - diff.max(axis=-1).astype(np.float32)


def _saturation(rgb: np.ndarray) -> np.ndarray:
    r, g, b = cv2.split(rgb)
    return cv2.subtract(cv2.max(cv2.max(r, g), b), cv2.min(cv2.min(r, g), b))


def _polarity(name: str) -> str:
    return "white" if name.startswith("white") else "black" if name.startswith("black") else "colour"


# ----------------------------------------------------------------------------- ridges


def _ridge_ok(
    panel: _Panel,
    polarity: str,
    cx: np.ndarray,
    cy: np.ndarray,
    nx: np.ndarray,
    ny: np.ndarray,
    floor: float,
    thr: float,
    colour: np.ndarray | None,
) -> np.ndarray:
    """Samples on a thin stroke: the best of three lateral positions is ink (>= floor) and clearly
    stronger than the samples 3 or 5 px to both sides. Arrays broadcast together."""
    best = None
    for lateral in (-1.0, 0.0, 1.0):
        s = panel.strength(polarity, cx + lateral * nx, cy + lateral * ny, colour)
        best = s if best is None else np.maximum(best, s)
    assert best is not None
    ok = np.zeros(best.shape, dtype=bool)
    for off in panel.side_offsets:
        left = panel.strength(polarity, cx + off * nx, cy + off * ny, colour)
        right = panel.strength(polarity, cx - off * nx, cy - off * ny, colour)
        ok |= best - np.maximum(left, right) >= thr
    return ok & (best >= floor)


def _run_lengths(ok: np.ndarray) -> np.ndarray:
    """Per row of a 2-D bool array: length of the leading run that stays >= 70 % true, ends on a
    true sample and has no four misses in a row; 0 unless two of the first three are true."""
    rows, cols = ok.shape
    if cols == 0:
        return np.zeros(rows, dtype=np.int64)
    miss = (~ok).astype(np.int16)
    four = np.zeros_like(miss)
    four[:, 3:] = miss[:, 3:] + miss[:, 2:-1] + miss[:, 1:-2] + miss[:, :-3]
    broken = np.cumsum(four >= 4, axis=1) > 0
    frac = np.cumsum(ok, axis=1) / np.arange(1, cols + 1)[None, :]
    good = ok & (frac >= 0.7) & ~broken
    last = np.where(good.any(axis=1), cols - np.argmax(good[:, ::-1], axis=1), 0)
    last[ok[:, :3].sum(axis=1) < 2] = 0
    return last


# ----------------------------------------------------------------------------- arrows


@dataclass
class _Ink:
    """Ink model of one glyph: polarity, colour (for coloured glyphs), background strength and
    the contrast between the glyph and its background, in strength units."""

    polarity: str
    colour: np.ndarray | None
    bg: float
    contrast: float

    @property
    def floor(self) -> float:
        return self.bg + 0.45 * self.contrast


def _verify_arrow(
    panel: _Panel,
    ink: _Ink,
    tip: tuple[float, float],
    ux: float,
    uy: float,
    reach: float,
    *,
    need_shaft: bool,
) -> tuple[float, tuple[float, float], float] | None:
    """Straighten the neighbourhood of a hypothesised arrow (rows run from the tip back along the
    axis, columns across it) and compare the inked pixels with an ideal arrow: a head tapering to
    the tip, widest at its base, then (for arrows) a thin shaft; symmetric about the axis, with
    nothing inked just ahead of the tip and little ink around the glyph. The head's width is the
    solid run through the axis (filled heads) or, failing that, the span between its outermost
    strokes (open "V" heads drawn with two lines).
    Returns (score, refined tip, glyph length) or None."""
    half = 9
    lead = 8  # rows examined ahead of the hypothesised tip
    smax = int(min(max(reach, 8.0), 0.6 * panel.diag)) + 3
    s = np.arange(-lead, smax + 1, dtype=np.float64)
    o = np.arange(-half, half + 1, dtype=np.float64)
    xs = tip[0] - s[:, None] * ux - o[None, :] * uy
    ys = tip[1] - s[:, None] * uy + o[None, :] * ux
    inside = (xs >= 0) & (xs <= panel.w - 1) & (ys >= 0) & (ys <= panel.h - 1)
    ink_map = (panel.strength(ink.polarity, xs, ys, ink.colour) >= ink.floor) & inside
    centre = ink_map[:, half - 1 : half + 2].any(axis=1)
    left_side = ink_map[:, :half][:, ::-1]  # column j: distance j + 1 from the axis
    right_side = ink_map[:, half + 1 :]
    left = np.where(centre, np.where(left_side.all(axis=1), half, np.argmin(left_side, axis=1)), 0)
    right = np.where(centre, np.where(right_side.all(axis=1), half, np.argmin(right_side, axis=1)), 0)
    verdict = _judge_profile(ink_map, centre, left, right, half, lead, need_shaft)
    if verdict is None and need_shaft:
        left = np.where(centre & left_side.any(axis=1), half - np.argmax(left_side[:, ::-1], axis=1), 0)
        right = np.where(centre & right_side.any(axis=1), half - np.argmax(right_side[:, ::-1], axis=1), 0)
        verdict = _judge_profile(ink_map, centre, left, right, half, lead, need_shaft, open_head=True)
        if verdict is not None:
            verdict = (verdict[0] - 0.05, verdict[1], verdict[2])
    if verdict is None:
        return None
    score, first, length = verdict
    new_tip = (float(np.rint(tip[0] - first * ux)), float(np.rint(tip[1] - first * uy)))
    return score, new_tip, length


def _judge_profile(
    ink_map: np.ndarray,
    centre: np.ndarray,
    left: np.ndarray,
    right: np.ndarray,
    half: int,
    lead: int,
    need_shaft: bool,
    *,
    open_head: bool = False,
) -> tuple[float, int, float] | None:
    """The arrow-shape test on a straightened glyph with per-row extents left/right of the axis:
    (score, tip row offset, glyph length) or None."""
    width = np.where(centre, left + right + 1, 0)
    # The tip row: the hypothesis may sit a pixel or two inside the glyph (opened masks lose the
    # sharp apex) or just behind it.
    k = lead
    if centre[k]:
        while k > 3 and centre[k - 1]:
            k -= 1
    else:
        ahead_k = [j for j in range(k + 1, min(k + 4, centre.size)) if centre[j]]
        if not ahead_k:
            return None
        k = ahead_k[0]
    first = k - lead
    ahead = width[max(0, k - 3) : k]
    body, bl, br = width[k:], left[k:], right[k:]
    if body.size < 4:
        return None
    # The glyph ends at three empty rows in a row (shorter breaks: anti-aliased thin shafts).
    empty = (body == 0).astype(np.int16)
    triple = empty[:-2] + empty[1:-1] + empty[2:] if body.size >= 3 else np.zeros(0, np.int16)
    stops = np.nonzero(triple >= 3)[0]
    end = int(stops[0]) if stops.size else body.size
    body, bl, br = body[:end], bl[:end], br[:end]
    if body.size < 3:
        return None
    # The head: widest row within the first part of the glyph.
    head_zone = max(3, int(0.65 * body.size)) if need_shaft else body.size
    base = int(np.argmax(body[:head_zone]))
    wmax = float(body[base])
    if wmax < 3 or base < 1:
        return None
    tipw = float(body[0])
    if tipw > 0.6 * wmax + 0.5:
        return None
    # Straight flanks: from the tip to the widest row the width grows about linearly (a rounded
    # blob widens at once).
    if base >= 3:
        ramp = 1.0 + (wmax - 1.0) * np.arange(base + 1) / base
        if float(np.mean(np.abs(body[: base + 1] - ramp))) > 0.22 * wmax + 0.3:
            return None
    if min(bl[base], br[base]) < 0.3 * max(bl[base], br[base]) - 1:
        return None
    if open_head:
        # Two thin strokes leave the tip: the head's rows are mostly empty between them.
        rows = ink_map[k + 1 : k + base + 1]
        spans = [(rows[j, half - int(bl[j + 1]) : half + int(br[j + 1]) + 1]) for j in range(rows.shape[0])]
        wide = [sp for sp in spans if sp.size >= 5]
        if not wide or float(np.mean([sp.mean() for sp in wide])) > 0.6:
            return None
    shaft = body[base + 2 :]
    shaft_len = float(shaft.size)
    if need_shaft:
        if shaft_len < max(4.0, 0.6 * (base + 1)):
            return None
        sw = float(np.median(shaft[shaft > 0])) if np.any(shaft > 0) else 0.0
        if sw == 0 or wmax < max(3.0, 1.45 * sw) or float((shaft > 0).mean()) < 0.7:
            return None
        # The shaft keeps its width and stays on the axis.
        if float(np.percentile(shaft[shaft > 0], 90)) > max(sw + 2.0, 0.75 * wmax):
            return None
        # The head has barbs: behind its widest row the width drops to the shaft's within a few
        # rows (a teardrop or comet-shaped blob narrows gradually).
        behind = body[base + 1 : base + 4]
        if behind.size and float(behind.min()) > max(sw + 1.0, 0.7 * wmax):
            return None
    elif shaft_len > 2 and float(np.mean(shaft > 0)) > 0.5 and float(np.median(shaft)) >= 0.4 * wmax:
        return None
    # Nothing inked straight ahead of the tip (a line running through a blob is not an arrow).
    if ahead.size and float(np.mean(ahead[-3:] > 0)) > 0.34:
        return None
    # Clutter: ink in the window outside the glyph's own rows' extents (plus one pixel).
    window = ink_map[max(0, k - 3) : k + body.size + 2]
    off = k - max(0, k - 3)
    cols = np.arange(2 * half + 1)[None, :]
    bl_full = np.zeros(window.shape[0])
    br_full = np.zeros(window.shape[0])
    bl_full[off : off + body.size] = bl
    br_full[off : off + body.size] = br
    present = np.zeros(window.shape[0], dtype=bool)
    present[off : off + body.size] = body > 0
    own = present[:, None] & (cols >= half - bl_full[:, None] - 1) & (cols <= half + br_full[:, None] + 1)
    clutter = float((window & ~own).sum()) / max(float(body.sum()), 1.0)
    if clutter > (0.25 if open_head else 0.5):
        return None
    score = 0.45 + 0.2 * (1.0 - tipw / wmax) + 0.2 * (1.0 - clutter / 0.5)
    if need_shaft:
        score += 0.15 * min(1.0, shaft_len / max(2.0 * (base + 1), 1.0))
    return float(min(1.0, score)), first, float(body.size)


def _ink_of(panel: _Panel, polarity: str, xs: np.ndarray, ys: np.ndarray, colour: np.ndarray | None) -> _Ink:
    cx, cy = round(float(xs.mean())), round(float(ys.mean()))
    cx = min(max(cx, 0), panel.w - 1)
    cy = min(max(cy, 0), panel.h - 1)
    if polarity == "colour":
        assert colour is not None
        bg = 255.0 - float(np.abs(panel.bg_rgb[cy, cx].astype(np.float32) - colour).max())
        return _Ink(polarity, colour, bg, 255.0 - bg)
    head = float(np.percentile(panel.strength(polarity, xs, ys), 75))
    bgv = float(panel.bg_gray[cy, cx])
    bg = bgv if polarity == "white" else 255.0 - bgv
    return _Ink(polarity, None, bg, head - bg)


def _head_arrows(panel: _Panel, name: str, text: np.ndarray) -> list[_Cand]:
    """Arrows found from their heads: compact strong-ink blobs with a thin ridge (the shaft)
    leaving them, verified against the ideal arrow shape."""
    polarity = _polarity(name)
    mask = panel.masks[name]
    opened = cv2.morphologyEx(mask, cv2.MORPH_OPEN, np.ones((3, 3), np.uint8))
    n, labels, stats, cents = cv2.connectedComponentsWithStats(opened, connectivity=8)
    if n <= 1:
        return []
    limit = max(8.0, 0.1 * panel.diag + 6.0)
    areas = stats[:, cv2.CC_STAT_AREA]
    ws, hs = stats[:, cv2.CC_STAT_WIDTH], stats[:, cv2.CC_STAT_HEIGHT]
    keep = (areas >= 6) & (np.maximum(ws, hs) <= limit) & (np.maximum(ws, hs) >= 3)
    keep &= np.maximum(ws, hs) <= 3.0 * np.minimum(ws, hs)
    keep[0] = False
    idx = np.nonzero(keep)[0]
    if idx.size == 0:
        return []
    if idx.size > 60:  # texture rather than overlays: the largest blobs only
        idx = idx[np.argsort(-areas[idx])[:60]]
    # Blob colour, strength, background: vectorised over blobs (over inked pixels only).
    nz = np.flatnonzero(labels)
    flat = labels.ravel()[nz]
    area = np.maximum(areas.astype(np.float64), 1.0)
    if polarity == "colour":
        rgb_flat = panel.rgb.reshape(-1, 3)[nz].astype(np.float64)
        chans = [np.bincount(flat, weights=rgb_flat[:, c], minlength=n) / area for c in range(3)]
        colours = np.stack(chans, axis=1)[idx].astype(np.float32)
    else:
        colours = None
    cx = cents[idx, 0]
    cy = cents[idx, 1]
    radius = 0.5 * np.hypot(ws[idx], hs[idx]) + 0.5
    ix = np.clip(np.rint(cx), 0, panel.w - 1).astype(np.intp)
    iy = np.clip(np.rint(cy), 0, panel.h - 1).astype(np.intp)
    bg: np.ndarray
    head: np.ndarray
    if polarity == "colour":
        assert colours is not None
        bg = 255.0 - np.abs(panel.bg_rgb[iy, ix].astype(np.float32) - colours).max(axis=1)
        head = np.full(idx.size, 255.0, dtype=np.float32)
        col_b = colours[:, None, None, :]
    else:
        weights = panel.gray.ravel()[nz].astype(np.float64)
        mean_gray = (np.bincount(flat, weights=weights, minlength=n) / area)[idx]
        bgv = panel.bg_gray[iy, ix].astype(np.float64)
        head = mean_gray if polarity == "white" else 255.0 - mean_gray
        bg = bgv if polarity == "white" else 255.0 - bgv
        col_b = None
    contrast = head - bg
    floor = bg + 0.45 * contrast
    thr = np.maximum(25.0, 0.35 * contrast)
    good = contrast >= 45
    if polarity == "colour":
        # Drawn colours are pure; stained or fluorescent structures are duller.
        nz_sat = panel.sat.ravel()[nz].astype(np.float64)
        mean_sat = (np.bincount(flat, weights=nz_sat, minlength=n) / area)[idx]
        good &= mean_sat >= 120
    # Isolation: a ring just outside the blob is mostly background (a shaft crosses it).
    rr = radius[:, None] + 3.0
    ring = panel.strength(
        polarity,
        cx[:, None] + rr * np.cos(_RING)[None, :],
        cy[:, None] + rr * np.sin(_RING)[None, :],
        None if col_b is None else col_b[:, 0, :, :],
    )
    ring_frac = (ring >= floor[:, None]).mean(axis=1)
    good &= ring_frac <= 0.34
    sel = np.nonzero(good)[0]
    if sel.size == 0:
        return []
    # Coarse shaft search, all blobs at once: 36 directions x 10 samples.
    cos_c, sin_c = np.cos(_COARSE), np.sin(_COARSE)
    t = np.arange(10, dtype=np.float64)
    r0 = radius[sel][:, None, None] + 1.0 + t[None, None, :]
    px = cx[sel][:, None, None] + r0 * cos_c[None, :, None]
    py = cy[sel][:, None, None] + r0 * sin_c[None, :, None]
    ok = _ridge_ok(
        panel,
        polarity,
        px,
        py,
        -sin_c[None, :, None],
        cos_c[None, :, None],
        floor[sel][:, None, None],
        thr[sel][:, None, None],
        None if col_b is None else col_b[sel],
    )
    support = ok.sum(axis=2)
    out: list[_Cand] = []
    tmax = int(min(160, max(24, 0.45 * panel.diag)))
    # Blobs with a shaft-like ridge leaving them, most convincing first (bounded work on texture).
    best_support = support.max(axis=1)
    rows = [r for r in np.argsort(-best_support, kind="stable") if best_support[r] >= 6][:16]
    for row in rows:
        k = sel[row]
        i = idx[k]
        x, y, w, h = (int(v) for v in stats[i, :4])
        sub = labels[y : y + h, x : x + w] == i
        bys, bxs = np.nonzero(sub)
        bx = bxs.astype(np.float64) + x
        by = bys.astype(np.float64) + y
        colour = None if colours is None else colours[k]
        ink = _Ink(polarity, colour, float(bg[k]), float(contrast[k]))
        best: tuple[float, tuple[float, float], float, float, float] | None = None
        for a in np.argsort(-support[row])[:2]:
            if support[row, a] < 6:
                break
            fine = _COARSE[a] + np.deg2rad(np.arange(-5.0, 5.5, 2.5))
            cf, sf = np.cos(fine), np.sin(fine)
            lengths = np.zeros(fine.size, dtype=np.int64)
            # Short shafts are the rule: look 32 samples out first, further only if needed.
            for span in (min(32, tmax), tmax):
                tf = float(radius[k]) + 1.0 + np.arange(span, dtype=np.float64)
                fx = cx[k] + tf[None, :] * cf[:, None]
                fy = cy[k] + tf[None, :] * sf[:, None]
                inside = (fx >= 0) & (fx <= panel.w - 1) & (fy >= 0) & (fy <= panel.h - 1)
                okf = (
                    _ridge_ok(
                        panel,
                        polarity,
                        fx,
                        fy,
                        -sf[:, None],
                        cf[:, None],
                        float(floor[k]),
                        float(thr[k]),
                        colour,
                    )
                    & inside
                )
                lengths = _run_lengths(okf)
                if lengths.max() < span - 4 or span == tmax:
                    break
            j = int(np.argmax(lengths))
            if lengths[j] < 5:
                continue
            ux, uy = -float(cf[j]), -float(sf[j])  # travel: shaft -> head
            proj = (bx - cx[k]) * ux + (by - cy[k]) * uy
            top = proj >= proj.max() - 1.0
            tip = (float(np.rint(bx[top].mean())), float(np.rint(by[top].mean())))
            reach = float(proj.max() - proj.min()) + float(radius[k]) + float(lengths[j]) + 2.0
            verdict = _verify_arrow(panel, ink, tip, ux, uy, reach, need_shaft=True)
            if verdict is not None and (best is None or verdict[0] > best[0]):
                best = (verdict[0], verdict[1], verdict[2], ux, uy)
        if best is not None:
            score, tip, length, ux, uy = best
            glyph = _glyph_box(tip, ux, uy, length, bx, by)
            out.append(
                _Cand(
                    "arrow",
                    glyph,
                    tip,
                    score,
                    direction=math.degrees(math.atan2(uy, ux)),
                    size=length,
                    color=_rgb_tuple(colour),
                )
            )
            continue
    return out


def _arrowhead(
    panel: _Panel, polarity: str, xs: np.ndarray, ys: np.ndarray, col: tuple[int, int, int] | None
) -> tuple[float, tuple[float, float], float, float] | None:
    """A lone filled arrowhead (triangle, or "stealth" head with a notched base):
    (score, tip, direction_deg, length) or None."""
    fx, fy = xs.astype(np.float64), ys.astype(np.float64)
    tri = _triangle(fx, fy)
    if tri is None:
        return None
    fill_score, (ux, uy) = tri
    cx, cy = float(fx.mean()), float(fy.mean())
    proj = (fx - cx) * ux + (fy - cy) * uy
    if proj.max() < 1.2 * -proj.min():
        return None
    top = proj >= proj.max() - 1.0
    tip = (float(np.rint(fx[top].mean())), float(np.rint(fy[top].mean())))
    colour = None if col is None else np.array(col, dtype=np.float32)
    ink = _ink_of(panel, polarity, fx, fy, colour)
    if ink.contrast < 45:
        return None
    # Isolation: a ring just outside the glyph is background.
    radius = float(np.hypot(fx - cx, fy - cy).max()) + 2.5
    ring = panel.strength(polarity, cx + radius * np.cos(_RING), cy + radius * np.sin(_RING), colour)
    if float((ring >= ink.floor).mean()) > 0.2:
        return None
    length = float(proj.max() - proj.min() + 1.0)
    verdict = _verify_arrow(panel, ink, tip, ux, uy, length + 3.0, need_shaft=False)
    if verdict is None:
        return None
    score = 0.5 * verdict[0] + 0.35 * fill_score
    return score, verdict[1], math.degrees(math.atan2(uy, ux)), length


def _glyph_box(
    tip: tuple[float, float], ux: float, uy: float, length: float, bx: np.ndarray, by: np.ndarray
) -> tuple[int, int, int, int]:
    tail = (tip[0] - ux * (length - 1.0), tip[1] - uy * (length - 1.0))
    x1 = math.floor(min(float(bx.min()), tail[0], tip[0]))
    y1 = math.floor(min(float(by.min()), tail[1], tip[1]))
    x2 = math.floor(max(float(bx.max()), tail[0], tip[0])) + 1
    y2 = math.floor(max(float(by.max()), tail[1], tip[1])) + 1
    return (x1, y1, x2, y2)


def _rgb_tuple(colour: np.ndarray | None) -> tuple[int, int, int] | None:
    if colour is None:
        return None
    return (int(colour[0]), int(colour[1]), int(colour[2]))


def _triangle(xs: np.ndarray, ys: np.ndarray) -> tuple[float, tuple[float, float]] | None:
    """Filled isosceles triangle with a sharp apex: (fill score 0..1, unit vector base -> apex)."""
    area = xs.size
    if area < 12:
        return None
    pts = np.stack([xs, ys], axis=1).astype(np.float32).reshape(-1, 1, 2)
    hull = cv2.convexHull(pts)
    hull_area = cv2.contourArea(hull)
    if hull_area <= 0:
        return None
    tri_area, tri = cv2.minEnclosingTriangle(hull)
    if tri is None or tri_area <= 0:
        return None
    # Pixel counts exceed the polygon area through pixel centres by about half the perimeter.
    fill = (area - 0.5 * cv2.arcLength(hull, True)) / tri_area
    if fill < 0.6:
        return None
    corners = tri.reshape(3, 2).astype(np.float64)
    angles = []
    for i in range(3):
        a, b, c = corners[i], corners[(i + 1) % 3], corners[(i + 2) % 3]
        v1, v2 = b - a, c - a
        cosang = float(np.dot(v1, v2) / (np.linalg.norm(v1) * np.linalg.norm(v2) + 1e-9))
        angles.append(math.degrees(math.acos(max(-1.0, min(1.0, cosang)))))
    apex_i = int(np.argmin(angles))
    ordered = sorted(angles)
    if ordered[0] > 75 or abs(ordered[1] - ordered[2]) > 25:
        return None
    apex = corners[apex_i]
    base = (corners[(apex_i + 1) % 3] + corners[(apex_i + 2) % 3]) / 2.0
    d = apex - base
    norm = float(np.linalg.norm(d))
    if norm < 3:
        return None
    return float(min(1.0, (fill - 0.6) / 0.3)), (float(d[0] / norm), float(d[1] / norm))


# ----------------------------------------------------------------------------- whole components


def _holes(sub: np.ndarray) -> tuple[np.ndarray, int, np.ndarray]:
    """Hole mask (background not reachable from outside), hole count, per-hole stats."""
    padded = np.pad(sub, 1).view(np.uint8).copy()
    cv2.floodFill(padded, None, (0, 0), 2)
    holes = (padded == 0)[1:-1, 1:-1]
    if not holes.any():
        return holes, 0, np.zeros((1, 5), dtype=np.int32)
    n, _, st, _ = cv2.connectedComponentsWithStats(holes.view(np.uint8), connectivity=4)
    return holes, n - 1, st


def _shape_of(region: np.ndarray, area: int) -> tuple[str, float] | None:
    """Rectangle or circle/oval test of a filled region (its own bounding box): (kind, score)."""
    h, w = region.shape
    rect_fill = area / float(w * h)
    contours, _ = cv2.findContours(region.view(np.uint8), cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_NONE)
    if not contours:
        return None
    contour = max(contours, key=cv2.contourArea)
    if rect_fill >= 0.86:
        return "box", float(min(1.0, 0.6 + 0.4 * (rect_fill - 0.86) / 0.14))
    if len(contour) >= 5 and 0.66 <= rect_fill < 0.86:
        hull = cv2.convexHull(contour)
        # Contours run through pixel centres: add a pixel to areas and axes measured on them.
        hull_area = cv2.contourArea(hull) + 0.5 * cv2.arcLength(hull, True) + 1.0
        if area / hull_area < 0.9:
            return None
        _, (ma, mb), _ = cv2.fitEllipse(contour)
        ratio = area / max(math.pi / 4.0 * (ma + 1.0) * (mb + 1.0), 1.0)
        if 0.88 <= ratio <= 1.12:
            return "circle", float(min(1.0, 0.55 + 0.45 * (1.0 - abs(1.0 - ratio) / 0.12)))
    return None


def _outlines(
    sub: np.ndarray, *, dashed: bool, grown: int = 0
) -> list[tuple[str, float, tuple[int, int, int, int]]]:
    """Closed outlines in a component mask: (kind, score, enclosed region in sub pixels).

    A ring with one dominant hole is judged by its filled outline; a component holding several
    rings that touch (circles drawn side by side) is judged hole by hole."""
    h, w = sub.shape
    if min(h, w) < 6:
        return []
    holes, count, st = _holes(sub)
    if count == 0:
        return []
    ink = int(np.count_nonzero(sub))
    hole_area = int(st[1:, cv2.CC_STAT_AREA].sum())
    largest = int(st[1:, cv2.CC_STAT_AREA].max())
    fill_area = ink + hole_area
    if dashed:  # pinholes between joined dashes do not count
        hole_area = int(st[1:, cv2.CC_STAT_AREA][st[1:, cv2.CC_STAT_AREA] >= 0.05 * largest].sum())
    if largest >= 0.75 * hole_area:
        if largest < max(
            8, (0.3 if min(h, w) >= 10 else 0.4) * fill_area - (grown * (w + h) if grown else 0)
        ):
            return []
        # Stroke width: the band between the outer outline and the main hole, over the outline's
        # length (pinholes in a ragged ring do not make it thin).
        rims, _ = cv2.findContours((sub | holes).view(np.uint8), cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_NONE)
        rim = max((cv2.arcLength(c, True) for c in rims), default=0.0)
        stroke = (fill_area - largest) / max(rim, 1.0) - grown
        if stroke > max(2.5, 0.09 * min(w, h)):
            return []
        shape = _shape_of(sub | holes, fill_area)
        if shape is None:
            return []
        kind, score = shape
        if kind == "box":
            sides = [
                float(sub[:2].any(axis=0).mean()),
                float(sub[-2:].any(axis=0).mean()),
                float(sub[:, :2].any(axis=1).mean()),
                float(sub[:, -2:].any(axis=1).mean()),
            ]
            if min(sides) < (0.55 if dashed else 0.8):
                return []
            score = min(1.0, score + 0.2 * min(sides))
        return [(kind, score, (0, 0, w, h))]
    if count > 8 or dashed:
        return []
    out = []
    for j in range(1, count + 1):
        hx, hy, hw, hh, ha = (int(v) for v in st[j, :5])
        if ha < max(12, 0.1 * hole_area) or min(hw, hh) < 4:
            continue
        shape = _shape_of(holes[hy : hy + hh, hx : hx + hw] & (_label_of(holes, hx, hy, hw, hh, ha)), ha)
        if shape is None:
            continue
        # The ring around this hole: ink on (nearly) all of a band two pixels wide around it.
        x1, y1 = max(0, hx - 2), max(0, hy - 2)
        x2, y2 = min(w, hx + hw + 2), min(h, hy + hh + 2)
        band = np.ones((y2 - y1, x2 - x1), dtype=bool)
        band[hy - y1 : hy - y1 + hh, hx - x1 : hx - x1 + hw] = False
        if float(sub[y1:y2, x1:x2][band].mean()) < 0.35:
            continue
        kind, score = shape
        out.append((kind, score * 0.9, (x1, y1, x2, y2)))
    return out


def _label_of(holes: np.ndarray, hx: int, hy: int, hw: int, hh: int, area: int) -> np.ndarray:
    """The one hole filling this bounding box (others may poke into it)."""
    window = holes[hy : hy + hh, hx : hx + hw].view(np.uint8)
    n, lab, st, _ = cv2.connectedComponentsWithStats(window, connectivity=4)
    if n <= 2:
        return window.astype(bool)
    j = int(np.argmax(st[1:, cv2.CC_STAT_AREA])) + 1
    return lab == j


def _arrow_shape(
    xs: np.ndarray, ys: np.ndarray
) -> tuple[float, tuple[float, float], float, float, float] | None:
    """Whole-component arrow test: (score, tip, direction_deg, length, shaft width) or None."""
    if xs.size < 12:
        return None
    fx = xs.astype(np.float64)
    fy = ys.astype(np.float64)
    dx = fx - fx.mean()
    dy = fy - fy.mean()
    cxx = float(np.dot(dx, dx))
    cyy = float(np.dot(dy, dy))
    cxy = float(np.dot(dx, dy))
    theta = 0.5 * math.atan2(2 * cxy, cxx - cyy)
    ex, ey = math.cos(theta), math.sin(theta)
    u = dx * ex + dy * ey
    v = -dx * ey + dy * ex
    umin = float(u.min())
    length = float(u.max()) - umin + 1.0
    if length < 9:
        return None
    nbins = math.ceil(length)
    idx = np.minimum((u - umin).astype(np.intp), nbins - 1)
    count = np.bincount(idx, minlength=nbins).astype(np.float64)
    present = count > 0
    if (~present).sum() > 0.15 * nbins:
        return None
    width = count
    centre = np.where(present, np.bincount(idx, weights=v, minlength=nbins) / np.maximum(count, 1.0), np.nan)
    best: tuple[float, int, float] | None = None
    split = int(nbins * 0.45)
    for end in (0, 1):
        wprof = width if end == 1 else width[::-1]
        cprof = centre if end == 1 else centre[::-1]
        head_zone = wprof[split:]
        if head_zone.size < 3:
            continue
        peak = int(np.argmax(head_zone)) + split
        wmax = float(wprof[peak])
        shaft = wprof[1 : max(2, split)]
        shaft = shaft[shaft > 0]
        if shaft.size < 3:
            continue
        sw = float(np.median(shaft))
        if sw > max(3.5, 0.25 * length) or wmax < max(3.0, 1.45 * sw):
            continue
        tip_len = nbins - 1 - peak
        if tip_len < 2 or tip_len > 0.55 * length:
            continue
        if float(wprof[-2:].mean()) > 0.65 * wmax:
            continue
        taper = wprof[peak:]
        if taper.size >= 3 and np.any(np.diff(taper) > max(1.5, 0.3 * wmax)):
            continue
        shaft_c = cprof[1 : max(2, split)]
        shaft_c = shaft_c[~np.isnan(shaft_c)]
        wobble = float(np.std(shaft_c)) if shaft_c.size > 2 else 0.0
        if wobble > 1.2 + 0.04 * length:
            continue
        head_c = float(np.nanmean(cprof[peak - 1 : peak + 2]))
        if shaft_c.size and abs(head_c - float(np.median(shaft_c))) > max(2.0, 0.35 * wmax):
            continue
        ratio = wmax / max(sw, 1.0)
        score = 0.45 + 0.15 * min(1.0, (ratio - 1.75) / 1.5) + 0.2 * min(1.0, length / 25.0)
        score += 0.2 * (1.0 - min(1.0, wobble / (1.2 + 0.04 * length)))
        if best is None or score > best[0]:
            best = (score, end, sw)
    if best is None:
        return None
    score, end, sw = best
    sign = 1.0 if end == 1 else -1.0
    ext = u.max() if end == 1 else u.min()
    near = np.abs(u - ext) <= 1.0
    tip = (float(np.rint(fx[near].mean())), float(np.rint(fy[near].mean())))
    return score, tip, math.degrees(math.atan2(sign * ey, sign * ex)), length, sw


def _radial_profile(sub: np.ndarray, bins: int = 72) -> tuple[np.ndarray, float, float] | None:
    """Outer radius of a shape against angle around its centroid, from its outline (dense even for
    small glyphs), lightly smoothed: (profile, cx, cy) in sub pixels."""
    contours, _ = cv2.findContours(sub.view(np.uint8), cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_NONE)
    if not contours:
        return None
    contour = max(contours, key=len).reshape(-1, 2).astype(np.float64)
    if contour.shape[0] < 8:
        return None
    mom = cv2.moments(sub.view(np.uint8), binaryImage=True)
    if mom["m00"] <= 0:
        return None
    cx, cy = mom["m10"] / mom["m00"], mom["m01"] / mom["m00"]
    ang = np.arctan2(contour[:, 1] - cy, contour[:, 0] - cx)
    rad = np.hypot(contour[:, 0] - cx, contour[:, 1] - cy) + 0.5
    idx = ((ang + math.pi) / (2 * math.pi) * bins).astype(np.intp) % bins
    prof = np.zeros(bins)
    np.maximum.at(prof, idx, rad)
    # Fill empty bins from their neighbours (small outlines leave gaps), then smooth.
    empty = prof == 0
    if empty.all():
        return None
    if empty.any():
        known = np.nonzero(~empty)[0]
        prof = np.interp(np.arange(bins), known, prof[known], period=bins)
    prof = (np.roll(prof, 1) + 2 * prof + np.roll(prof, -1)) / 4.0
    return prof, cx, cy


def _peaks(prof: np.ndarray, high: float, drop: float) -> list[int]:
    """Circular peaks of a profile: local maxima >= high * max, each separated from the next by a
    dip of at least drop * max."""
    top = float(prof.max())
    n = prof.size
    cand = [
        i
        for i in range(n)
        if prof[i] >= high * top and prof[i] >= prof[i - 1] and prof[i] >= prof[(i + 1) % n]
    ]
    if len(cand) < 2:
        return cand
    peaks: list[int] = []
    for i in cand:
        if peaks:
            j = peaks[-1]
            seg = prof[j : i + 1]
            if float(seg.min()) > min(prof[i], prof[j]) - drop * top:
                if prof[i] > prof[j]:
                    peaks[-1] = i
                continue
        peaks.append(i)
    if len(peaks) >= 2:
        j, i = peaks[-1], peaks[0]
        seg = np.concatenate([prof[j:], prof[: i + 1]])
        if float(seg.min()) > min(prof[i], prof[j]) - drop * top:
            peaks = peaks[1:] if prof[j] >= prof[i] else peaks[:-1]
    return peaks


def _star(sub: np.ndarray, xs: np.ndarray, ys: np.ndarray) -> tuple[str, float] | None:
    """Asterisk (thin spokes, 5 to 8) or star (filled five-point star): (kind, score) or None."""
    h, w = sub.shape
    if min(h, w) < 7 or max(h, w) > 1.6 * min(h, w):
        return None
    found = _radial_profile(sub)
    if found is None:
        return None
    prof, _, _ = found
    r = float(prof.max())
    if r < 3.5:
        return None
    peaks = _peaks(prof, 0.7, 0.25)
    n = len(peaks)
    if not 5 <= n <= 8:
        return None
    gaps = np.diff([*peaks, peaks[0] + prof.size])
    even = prof.size / n
    if gaps.max() > 1.5 * even or gaps.min() < 0.5 * even:
        return None
    # Spoke tips about equally long, valleys clearly inside.
    tips = prof[peaks]
    if float(tips.min()) < 0.75 * float(tips.max()):
        return None
    valley = float(np.median([prof[(peaks[k] + int(gaps[k] // 2)) % prof.size] for k in range(n)])) / r
    fill = xs.size / (math.pi * r * r)
    if n == 5 and 0.25 <= valley <= 0.65 and 0.25 <= fill <= 0.65:
        return "star", float(min(1.0, 0.6 + 0.4 * (1.0 - abs(valley - 0.45) / 0.2)))
    if n >= 6 and valley <= 0.7 and fill <= 0.7:
        return "asterisk", float(min(1.0, 0.55 + 0.45 * (1.0 - valley / 0.7)))
    if n == 5 and valley <= 0.3 and fill <= 0.4:
        return "asterisk", 0.6
    return None


def _small_star(
    panel: _Panel, polarity: str, x: int, y: int, w: int, h: int, col: tuple[int, int, int] | None
) -> tuple[str, float] | None:
    """Star test for glyphs of a few pixels: the ink strength around the glyph is upsampled four
    times (cubic) and thresholded half-way between glyph and background, which recovers spokes
    that the pixel mask merges."""
    pad = 2
    x0, y0 = max(0, x - pad), max(0, y - pad)
    x1, y1 = min(panel.w, x + w + pad), min(panel.h, y + h + pad)
    gy, gx = np.mgrid[y0:y1, x0:x1]
    colour = None if col is None else np.array(col, dtype=np.float32)
    patch = panel.strength(polarity, gx.astype(np.float64), gy.astype(np.float64), colour).astype(np.float32)
    border = np.concatenate([patch[0], patch[-1], patch[:, 0], patch[:, -1]])
    lo, hi = float(border.mean()), float(patch.max())
    if hi - lo < 40:
        return None
    big = cv2.resize(patch, ((x1 - x0) * 4, (y1 - y0) * 4), interpolation=cv2.INTER_CUBIC)
    mask = (big >= lo + 0.5 * (hi - lo)).view(np.uint8)
    n, labels, stats, _ = cv2.connectedComponentsWithStats(mask, connectivity=8)
    if n <= 1:
        return None
    j = int(np.argmax(stats[1:, cv2.CC_STAT_AREA])) + 1
    bx, by, bw, bh = (int(v) for v in stats[j, :4])
    sub = labels[by : by + bh, bx : bx + bw] == j
    ys, xs = np.nonzero(sub)
    found = _star(sub, xs, ys)
    if found is None:
        return None
    kind, score = found
    return kind, score * 0.9


def _text_flags(stats: np.ndarray, h_img: int, w_img: int) -> np.ndarray:
    """Text-like: a pixel mask covering components that sit in a row with at least two
    similar-height neighbours at letter spacing (or one, for glyphs smaller than 12 px)."""
    flags = np.zeros((h_img, w_img), dtype=bool)
    small = np.nonzero(
        (stats[:, cv2.CC_STAT_HEIGHT] >= 5)
        & (stats[:, cv2.CC_STAT_HEIGHT] <= 40)
        & (stats[:, cv2.CC_STAT_AREA] >= 4)
    )[0]
    small = small[small > 0]
    if small.size < 2:
        return flags
    if small.size > 300:
        small = small[np.argsort(-stats[small, cv2.CC_STAT_AREA])[:300]]
    x = stats[small, 0].astype(np.float64)
    y = stats[small, 1].astype(np.float64)
    w = stats[small, 2].astype(np.float64)
    h = stats[small, 3].astype(np.float64)
    hr = h[:, None] / h[None, :]
    similar = (hr >= 0.45) & (hr <= 2.2)
    top = np.maximum(y[:, None], y[None, :])
    bottom = np.minimum(y[:, None] + h[:, None], y[None, :] + h[None, :])
    overlap = (bottom - top) / np.minimum(h[:, None], h[None, :])
    gap = np.maximum(x[None, :] - (x[:, None] + w[:, None]), x[:, None] - (x[None, :] + w[None, :]))
    hmax = np.maximum(h[:, None], h[None, :])
    pair = similar & (overlap >= 0.5) & (gap <= 0.5 * hmax) & (gap >= -0.3 * hmax)
    np.fill_diagonal(pair, False)
    count = pair.sum(axis=1)
    size = np.maximum(w, h)
    is_text = (count >= 2) | ((count >= 1) & (size < 12))
    for k in np.nonzero(is_text)[0]:
        xx, yy, ww, hh = int(x[k]), int(y[k]), int(w[k]), int(h[k])
        pad = max(1, hh // 4)
        flags[yy : yy + hh, max(0, xx - pad) : xx + ww + pad] = True
    return flags


def _in_text(cand: _Cand, text_zone: np.ndarray) -> bool:
    """Small glyphs lying mostly inside a line of text are letters, not markers."""
    if cand.kind in ("inset", "arrow"):
        return False
    x1, y1, x2, y2 = cand.glyph
    if max(x2 - x1, y2 - y1) > 40:
        return False
    window = text_zone[max(0, y1) : max(0, y2), max(0, x1) : max(0, x2)]
    return window.size > 0 and float(window.mean()) > 0.4


def _mean_colour(rgb: np.ndarray, mask: np.ndarray) -> tuple[int, int, int]:
    mean = cv2.mean(rgb, mask=mask.view(np.uint8))
    return (int(mean[0]), int(mean[1]), int(mean[2]))


def _component_measures(stats: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Area, longer side, shorter side and box fill of each connected component."""
    areas = stats[:, cv2.CC_STAT_AREA]
    ws = stats[:, cv2.CC_STAT_WIDTH]
    hs = stats[:, cv2.CC_STAT_HEIGHT]
    return areas, np.maximum(ws, hs), np.minimum(ws, hs), areas / np.maximum(ws * hs, 1)


def _component_shapes(panel: _Panel, name: str, text: np.ndarray, *, outlines: bool = True) -> list[_Cand]:
    n, labels, stats = panel.components(name)
    if n <= 1:
        return []
    areas, big, small, density = _component_measures(stats)
    limit = 0.7 * max(panel.w, panel.h)
    keep = (areas >= 10) & (big >= 6) & (big <= limit) & (density <= 0.7)
    colour = name == "colour"
    core = panel.masks[_STRONG[name] + ("" if colour else "_core")]
    # Drawn glyphs reach full strength over much of their area; faint texture does not.
    nz = np.flatnonzero(core)
    strong_px = np.bincount(labels.ravel()[nz], minlength=n)
    strong_frac = strong_px / np.maximum(areas, 1)
    if not colour:
        keep &= strong_px >= np.maximum(2, 0.1 * areas)
    keep[0] = False
    idx = np.nonzero(keep)[0]
    if idx.size > 60:  # bounded work on texture: the most glyph-like components first
        idx = idx[np.argsort(-(strong_frac[idx] + 0.002 * np.minimum(areas[idx], 200)))[:60]]
    polarity = _polarity(name)
    out: list[_Cand] = []
    for i in idx:
        x, y, w, h = (int(v) for v in stats[i, :4])
        sub = labels[y : y + h, x : x + w] == i
        glyph = (x, y, x + w, y + h)
        in_text = bool(text[y + h // 2, x + w // 2])
        col = _mean_colour(panel.rgb[y : y + h, x : x + w], sub) if colour else None
        # Second moments: elongation decides whether the arrow test is worth running.
        mom = cv2.moments(sub.view(np.uint8), binaryImage=True)
        mu20, mu02, mu11 = mom["mu20"], mom["mu02"], mom["mu11"]
        spread = math.sqrt(max(0.0, (mu20 - mu02) ** 2 + 4.0 * mu11 * mu11))
        lam1, lam2 = mu20 + mu02 + spread, mu20 + mu02 - spread
        elongated = lam1 > 0 and lam2 <= 0.3 * lam1
        if outlines and small[i] >= 6 and density[i] <= 0.6 and not elongated:
            found = _outlines(sub, dashed=False)
            if found:
                if in_text or (not colour and big[i] < 10):
                    continue
                for kind, score, (rx1, ry1, rx2, ry2) in found:
                    box = (x + rx1, y + ry1, x + rx2, y + ry2)
                    out.append(
                        _Cand(
                            kind,
                            box,
                            ((box[0] + box[2] - 1) / 2.0, (box[1] + box[3] - 1) / 2.0),
                            score,
                            region=(float(box[0]), float(box[1]), float(box[2]), float(box[3])),
                            color=col,
                        )
                    )
                continue
        ys, xs = np.nonzero(sub)
        xs = xs + x
        ys = ys + y
        # Symbols (stars, asterisks, lone arrowheads) are solid strong ink, not faint texture.
        strong = colour or float(core[ys, xs].mean()) >= 0.5
        if big[i] >= 9 and density[i] <= 0.6 and elongated and strong_frac[i] >= 0.5:
            arrow = _arrow_shape(xs, ys)
            if arrow is not None:
                score, tip, direction, length, _ = arrow
                if in_text and length < 25:
                    continue
                ink = _ink_of(
                    panel,
                    polarity,
                    xs.astype(np.float64),
                    ys.astype(np.float64),
                    None if col is None else np.array(col, dtype=np.float32),
                )
                if ink.contrast < 40:
                    continue
                rad = math.radians(direction)
                verdict = _verify_arrow(
                    panel, ink, tip, math.cos(rad), math.sin(rad), length + 2.0, need_shaft=True
                )
                if verdict is None:
                    continue
                out.append(
                    _Cand(
                        "arrow",
                        glyph,
                        verdict[1],
                        0.5 * (score + verdict[0]),
                        direction=direction,
                        size=verdict[2],
                        color=col,
                    )
                )
                continue
        if in_text:
            continue
        if strong and small[i] >= 5 and 0.12 <= density[i] <= 0.75:
            star = _star(sub, xs, ys) if small[i] >= 7 else None
            if star is None and big[i] <= 18 and big[i] <= 1.5 * small[i] and strong_frac[i] >= 0.6:
                star = _small_star(panel, polarity, x, y, w, h, col)
            if star is not None:
                kind, score = star
                out.append(
                    _Cand(
                        kind,
                        glyph,
                        (x + (w - 1) / 2.0, y + (h - 1) / 2.0),
                        score,
                        size=float(max(w, h)),
                        color=col,
                    )
                )
                continue
        if strong and big[i] >= 5 and big[i] <= 0.1 * panel.diag + 8 and density[i] >= 0.3:
            head = _arrowhead(panel, polarity, xs, ys, col)
            if head is not None:
                score, tip, direction, size = head
                out.append(_Cand("arrowhead", glyph, tip, score, direction=direction, size=size, color=col))
    return out


# ----------------------------------------------------------------------------- tiny symbols

# Tiny glyphs (a few pixels after a figure is scaled down) have no resolvable spokes or barbs.
# A compact, solid blob of colour ink, strongly contrasting, alone in its neighbourhood and of a
# hue few other blobs of the panel have, is reported as a symbol at a low confidence: for the
# region it indicates (the glyph's neighbourhood) its exact kind does not matter. White and
# black specks are everywhere in grey texture, so only colour ink is read this way.
_TINY_MIN, _TINY_MAX = 4, 16  # glyph size, pixels
# Their confidence, the hue of "alike" blobs and how many may share it are MarkerParams.tiny_*.


def _strong_outlines(panel: _Panel, name: str) -> list[_Cand]:
    """Circles and rectangles drawn in pure white or black on a textured picture: in the wider
    masks the outline merges with dark stripes or bright grain and loses its shape, in the
    near-pure mask it stands alone."""
    mask = panel.masks[name]
    n, labels, stats, _ = cv2.connectedComponentsWithStats(mask, connectivity=8)
    if n <= 1 or n > 400:  # a grain of pure pixels, not a few drawn outlines
        return []
    _, big, small, density = _component_measures(stats)
    keep = (big >= 16) & (small >= 10) & (big <= 0.7 * max(panel.w, panel.h)) & (density <= 0.4)
    keep[0] = False
    out: list[_Cand] = []
    for i in np.flatnonzero(keep)[:20]:
        x, y, w, h = (int(v) for v in stats[i, :4])
        sub = labels[y : y + h, x : x + w] == i
        for kind, score, (rx1, ry1, rx2, ry2) in _outlines(sub, dashed=False):
            box = (x + rx1, y + ry1, x + rx2, y + ry2)
            centre = ((box[0] + box[2] - 1) / 2.0, (box[1] + box[3] - 1) / 2.0)
            region = (float(box[0]), float(box[1]), float(box[2]), float(box[3]))
            out.append(_Cand(kind, box, centre, score, region=region))
    return out


def _tiny_symbols(panel: _Panel, name: str, text: np.ndarray, p: MarkerParams) -> list[_Cand]:
    n, labels, stats = panel.components(name)
    if n <= 1:
        return []
    areas, big, small, density = _component_measures(stats)
    tiny = (big >= _TINY_MIN) & (big <= _TINY_MAX) & (small >= 3) & (big <= 2.5 * small)
    tiny &= (density >= 0.2) & (areas >= 8)
    tiny[0] = False
    idx = np.nonzero(tiny)[0]
    if idx.size == 0:
        return []
    # Texture (speckle, cells, fluorescent dots) makes many such blobs of one hue; markers are few.
    blobs = (big >= 3) & (big <= 2 * _TINY_MAX)
    blobs[0] = False
    hue = cv2.cvtColor(panel.rgb, cv2.COLOR_RGB2HSV_FULL)[..., 0].astype(np.float64) * (2 * math.pi / 256)
    flat = labels.ravel()
    on = flat > 0
    lab = flat[on]
    hx = np.bincount(lab, np.cos(hue.ravel()[on]), minlength=n)
    hy = np.bincount(lab, np.sin(hue.ravel()[on]), minlength=n)
    mean_hue = np.arctan2(hy, hx)
    colour = name == "colour"
    core = panel.masks[_STRONG[name] + ("" if colour else "_core")]
    polarity = _polarity(name)
    out: list[_Cand] = []
    for i in idx:
        x, y, w, h = (int(v) for v in stats[i, :4])
        if text[y + h // 2, x + w // 2]:
            continue
        dh = np.abs(np.angle(np.exp(1j * (mean_hue - mean_hue[i]))))
        if np.count_nonzero(blobs & (dh <= math.radians(p.tiny_hue))) > p.tiny_alike:
            continue
        sub = labels[y : y + h, x : x + w] == i
        if float(core[y : y + h, x : x + w][sub].mean()) < 0.6:
            continue
        # Alone: no other ink of this kind in a ring about twice the glyph's size.
        r = 2 * int(big[i])
        x0, y0 = max(0, x - r), max(0, y - r)
        x1, y1 = min(panel.w, x + w + r), min(panel.h, y + h + r)
        around = labels[y0:y1, x0:x1]
        if np.count_nonzero((around > 0) & (around != i)) > 1.0 * areas[i]:
            continue
        col = _mean_colour(panel.rgb[y : y + h, x : x + w], sub) if colour else None
        ys, xs = np.nonzero(sub)
        ink = _ink_of(
            panel,
            polarity,
            (xs + x).astype(np.float64),
            (ys + y).astype(np.float64),
            None if col is None else np.array(col, dtype=np.float32),
        )
        if ink.contrast < 45:
            continue
        kind = "star" if density[i] >= 0.45 else "asterisk"
        out.append(
            _Cand(
                kind,
                (x, y, x + w, y + h),
                (x + (w - 1) / 2.0, y + (h - 1) / 2.0),
                p.tiny_score,
                size=float(big[i]),
                color=col,
            )
        )
    return out


# ----------------------------------------------------------------------------- dashed outlines


def _dashed_outlines(panel: _Panel, name: str) -> list[_Cand]:
    """Outlines drawn with dashes: bridge the gaps between short strokes, test the closed shape."""
    n, labels, stats = panel.components(name)
    if n <= 6:
        return []
    areas = stats[:, cv2.CC_STAT_AREA]
    big = np.maximum(stats[:, cv2.CC_STAT_WIDTH], stats[:, cv2.CC_STAT_HEIGHT])
    # Dash and gap lengths grow with the panel (figures are drawn at a size, then scaled).
    scale = max(1.0, min(panel.w, panel.h) / 250.0)
    longest = max(24.0, 0.12 * min(panel.w, panel.h), 10.0 * scale)
    dash = (areas >= 2) & (big <= longest) & (areas <= 8.0 * big)
    dash[0] = False
    if dash.sum() < 6:
        return []
    if dash.sum() > 1500:  # speckle texture, not a few dashed outlines
        return []
    dashes = dash.view(np.uint8)[labels]
    out: list[_Cand] = []
    wide = int(max(7, round(3.0 * scale + 4))) | 1
    # Large panels are searched at half resolution (max-pooled, so thin dashes survive).
    step = _pool_step(panel)
    if step > 1:
        dashes = _pool(dashes)
        wide = max(5, wide // 2) | 1
    for k in (wide,):
        # Dilation (not closing: a closing does not bridge the gap between two thin collinear
        # dashes) joins the dashes into a thick ring; shapes are judged on that ring.
        kernel = cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (k, k))
        grown = cv2.dilate(dashes, kernel)
        m, lab2, st2, _ = cv2.connectedComponentsWithStats(grown, connectivity=8)
        r = k // 2
        for j in range(1, m):
            x, y, w, h = (int(v) for v in st2[j, :4])
            if min(w, h) < 12 // step + 2 * r or max(w, h) > 0.9 * max(panel.w, panel.h) / step:
                continue
            if st2[j, cv2.CC_STAT_AREA] > 0.75 * w * h:
                continue
            sub = lab2[y : y + h, x : x + w] == j
            found = _outlines(sub, dashed=True, grown=2 * r)
            if not found:
                continue
            kind, score, _ = found[0]
            raw = (dashes[y : y + h, x : x + w] & sub.view(np.uint8)).astype(np.uint8)
            nd, _, _, dcent = cv2.connectedComponentsWithStats(raw, connectivity=8)
            if nd - 1 < 6:
                continue
            cx, cy = (w - 1) / 2.0, (h - 1) / 2.0
            ang = np.arctan2((dcent[1:, 1] - cy) / max(h, 1), (dcent[1:, 0] - cx) / max(w, 1))
            sectors = np.unique(((ang + math.pi) / (2 * math.pi) * 8).astype(int) % 8).size
            if sectors < 6:
                continue
            if not _thin_band(raw, kind):
                continue
            score = min(1.0, score * (0.75 + 0.25 * sectors / 8.0))
            x, y, w, h = x + r, y + r, w - 2 * r, h - 2 * r  # undo the dilation
            x, y, w, h = x * step, y * step, w * step, h * step
            out.append(
                _Cand(
                    kind,
                    (x, y, x + w, y + h),
                    (x + (w - 1) / 2.0, y + (h - 1) / 2.0),
                    score,
                    region=(float(x), float(y), float(x + w), float(y + h)),
                )
            )
    return out


def _thin_band(raw: np.ndarray, kind: str) -> bool:
    """The dashes of an outline lie on one thin closed curve: an ellipse fitted to them (or the
    rectangle of their bounding box) passes within a few pixels of nearly all dash pixels."""
    ys, xs = np.nonzero(raw)
    if xs.size < 12:
        return False
    h, w = raw.shape
    if kind == "box":
        d = np.minimum(np.minimum(xs, w - 1 - xs), np.minimum(ys, h - 1 - ys))
        return float(np.percentile(d, 90)) <= max(3.0, 0.08 * min(w, h))
    pts = np.stack([xs, ys], axis=1).astype(np.float32)
    (cx, cy), (ma, mb), ang = cv2.fitEllipse(pts)
    a, b = ma / 2.0, mb / 2.0
    if a < 3 or b < 3:
        return False
    t = math.radians(ang)
    dx, dy = xs - cx, ys - cy
    u = dx * math.cos(t) + dy * math.sin(t)
    v = -dx * math.sin(t) + dy * math.cos(t)
    rho = np.sqrt((u / a) ** 2 + (v / b) ** 2)
    off = np.abs(rho - 1.0) * (a + b) / 2.0
    return float(np.percentile(off, 90)) <= max(2.5, 0.08 * (a + b))


# ----------------------------------------------------------------------------- line rectangles


def _line_rectangles(panel: _Panel, name: str) -> list[_Cand]:
    """Axis-aligned rectangles from long (dashed or solid) horizontal and vertical ink lines: two
    parallel lines, joined at both ends by lines of the other orientation."""
    mask = panel.masks[name]
    h, w = mask.shape
    min_len = max(12, int(0.08 * min(w, h)))
    hclosed = cv2.morphologyEx(mask, cv2.MORPH_CLOSE, cv2.getStructuringElement(cv2.MORPH_RECT, (7, 1)))
    vclosed = cv2.morphologyEx(mask, cv2.MORPH_CLOSE, cv2.getStructuringElement(cv2.MORPH_RECT, (1, 7)))
    hlines = cv2.morphologyEx(
        hclosed, cv2.MORPH_OPEN, cv2.getStructuringElement(cv2.MORPH_RECT, (min_len, 1))
    )
    vlines = cv2.morphologyEx(
        vclosed, cv2.MORPH_OPEN, cv2.getStructuringElement(cv2.MORPH_RECT, (1, min_len))
    )
    # Lines of the other orientation, widened by a pixel, for the cross checks.
    vwide = cv2.dilate(vclosed, np.ones((1, 3), np.uint8))
    hwide = cv2.dilate(hclosed, np.ones((3, 1), np.uint8))
    out: list[_Cand] = []
    for orient in ("h", "v"):
        lines = hlines if orient == "h" else vlines
        segs = _segments(lines if orient == "h" else lines.T)
        if len(segs) > 24:  # a line texture (fringes, stripes), not a few drawn rectangles
            continue
        for s1, e1, p1, _ in segs:
            for s2, e2, p2, q2 in segs:
                if p2 <= p1 + 4:
                    continue
                lo, hi = max(s1, s2), min(e1, e2)
                if hi - lo < 0.5 * min(e1 - s1, e2 - s2) or hi - lo < 8:
                    continue
                # The other two sides: at the ends of the common stretch, or (lines running on past
                # the rectangle) the outermost columns (rows) inked along the whole gap.
                limit = w if orient == "h" else h
                spans = [(max(0, lo - 2), min(limit, hi + 2))]
                cross = vwide[p1:q2, lo:hi] if orient == "h" else hwide[lo:hi, p1:q2].T
                strong = np.nonzero(cross.mean(axis=0) >= 0.75)[0]
                strong = strong[(lo + strong > 2) & (lo + strong < limit - 3)]  # not the panel border
                if strong.size >= 2 and strong[-1] - strong[0] >= 8:
                    spans.append((lo + int(strong[0]) - 1, lo + int(strong[-1]) + 2))
                best: tuple[float, tuple[int, int, int, int]] | None = None
                for c1, c2 in spans:
                    x1, y1, x2, y2 = (c1, p1, c2, q2) if orient == "h" else (p1, c1, q2, c2)
                    borders = (x1 <= 2) + (y1 <= 2) + (x2 >= w - 2) + (y2 >= h - 2)
                    if borders >= 1 or (x2 - x1) * (y2 - y1) > 0.5 * w * h:
                        continue
                    score = _rect_support(mask, hclosed, vclosed, x1, y1, x2, y2)
                    if score is not None and (best is None or score > best[0]):
                        best = (score, (x1, y1, x2, y2))
                if best is None:
                    continue
                score, (x1, y1, x2, y2) = best
                out.append(
                    _Cand(
                        "box",
                        (x1, y1, x2, y2),
                        ((x1 + x2 - 1) / 2.0, (y1 + y2 - 1) / 2.0),
                        score,
                        region=(float(x1), float(y1), float(x2), float(y2)),
                    )
                )
    return out


def _pool_step(panel: _Panel) -> int:
    return 2 if min(panel.h, panel.w) >= 200 else 1


def _pool(mask: np.ndarray) -> np.ndarray:
    """2 x 2 max-pooling of a 0/1 mask."""
    h, w = mask.shape
    grown = cv2.dilate(mask, np.ones((2, 2), np.uint8), anchor=(0, 0))
    return np.ascontiguousarray(grown[: h - h % 2 : 2, : w - w % 2 : 2])


def _segments(lines: np.ndarray) -> list[tuple[int, int, int, int]]:
    """Horizontal runs of a sparse line mask merged across adjacent rows into segments
    (start, end, first row, last row + 1); at most five rows thick."""
    rows = np.flatnonzero(lines.any(axis=1))
    if rows.size > 150:  # a line texture: report it as too many segments
        return [(0, 0, 0, 1)] * 100
    runs: list[tuple[int, int, int]] = []
    for row in rows.tolist():
        padded = np.concatenate(([0], lines[row].view(np.uint8) > 0, [0])).astype(np.int8)
        d = np.diff(padded)
        for start, stop in zip(np.flatnonzero(d == 1), np.flatnonzero(d == -1), strict=True):
            runs.append((int(start), int(stop), int(row)))
    segs: list[list[int]] = []
    for a, b, r in runs:
        for seg in segs:
            if seg[3] == r and min(b, seg[1]) - max(a, seg[0]) > 0.5 * min(b - a, seg[1] - seg[0]):
                seg[0], seg[1], seg[3] = min(a, seg[0]), max(b, seg[1]), r + 1
                break
        else:
            segs.append([a, b, r, r + 1])
    return [(s0, s1, r0, r1) for s0, s1, r0, r1 in segs if r1 - r0 <= 5]


def _rect_support(
    mask: np.ndarray, hclosed: np.ndarray, vclosed: np.ndarray, x1: int, y1: int, x2: int, y2: int
) -> float | None:
    """How completely the four sides of a rectangle are inked; None when a side is missing, when
    a side is not an isolated line (bands just inside and outside it inked too: text, line
    texture) or when the interior is inked."""
    w, h = x2 - x1, y2 - y1
    if w < 8 or h < 8:
        return None
    band = 3
    m = 4  # keep the perpendicular sides out of the isolation bands
    sides = []
    for name in ("top", "bottom", "left", "right"):
        if name == "top":
            cov = hclosed[y1 : y1 + band, x1:x2].any(axis=0).mean()
            near = [
                mask[max(0, y1 - 6) : max(0, y1 - 1), x1 + m : x2 - m],
                mask[y1 + band + 1 : y1 + band + 5, x1 + m : x2 - m],
            ]
        elif name == "bottom":
            cov = hclosed[y2 - band : y2, x1:x2].any(axis=0).mean()
            near = [
                mask[y2 + 1 : y2 + 6, x1 + m : x2 - m],
                mask[max(0, y2 - band - 5) : y2 - band - 1, x1 + m : x2 - m],
            ]
        elif name == "left":
            cov = vclosed[y1:y2, x1 : x1 + band].any(axis=1).mean()
            near = [
                mask[y1 + m : y2 - m, max(0, x1 - 6) : max(0, x1 - 1)],
                mask[y1 + m : y2 - m, x1 + band + 1 : x1 + band + 5],
            ]
        else:
            cov = vclosed[y1:y2, x2 - band : x2].any(axis=1).mean()
            near = [
                mask[y1 + m : y2 - m, x2 + 1 : x2 + 6],
                mask[y1 + m : y2 - m, max(0, x2 - band - 5) : x2 - band - 1],
            ]
        clutter = max((float(b.mean()) for b in near if b.size), default=0.0)
        sides.append(float(cov) if clutter <= 0.2 else -float(cov))
    ranked = sorted(sides)  # a cluttered side (negative) counts as the weakest
    # One side may fade, or be lost in clutter, where the line crosses image content of its own
    # tone; the other three must be clean, isolated lines.
    if abs(ranked[0]) < 0.3 or min(ranked[1:]) < 0.8:
        return None
    sides = [abs(v) for v in sides]
    inner = mask[y1 + band : y2 - band, x1 + band : x2 - band]
    density = float(inner.mean()) if inner.size else 0.0
    if density > 0.12:
        return None
    return float(min(1.0, 0.4 + 0.6 * float(np.mean(sides)) - density))


# ----------------------------------------------------------------------------- insets


def _corner_insets(panel: _Panel) -> list[_Cand]:
    """Embedded sub-images in a panel corner, bounded by straight edges meeting at an inner corner."""
    if min(panel.h, panel.w) < 40:
        return []
    # Insets are large: their straight sides are found at half resolution on big panels.
    step = 2 if min(panel.h, panel.w) >= 160 else 1
    if step == 2:
        g = cv2.resize(panel.gray, (panel.w // 2, panel.h // 2), interpolation=cv2.INTER_AREA)
    else:
        g = cv2.GaussianBlur(panel.gray, (3, 3), 0)
    h, w = g.shape
    gx = np.abs(cv2.Sobel(g, cv2.CV_16S, 1, 0, ksize=3))
    gy = np.abs(cv2.Sobel(g, cv2.CV_16S, 0, 1, ksize=3))
    horiz = ((gy >= 72) & (gy >= 2.5 * gx)).view(np.uint8)
    vert = ((gx >= 72) & (gx >= 2.5 * gy)).view(np.uint8)
    hz = cv2.dilate(horiz, np.ones((3, 1), np.uint8))
    vt = cv2.dilate(vert, np.ones((1, 3), np.uint8))
    rows = np.arange(1, h + 1, dtype=np.float32)[:, None]
    cols = np.arange(1, w + 1, dtype=np.float32)[None, :]
    out: list[_Cand] = []
    ymin, ymax = int(0.12 * h), int(0.7 * h)
    xmin, xmax = int(0.12 * w), int(0.7 * w)
    for flip_y in (False, True):
        vv = vt[::-1] if flip_y else vt
        for flip_x in (False, True):
            hh = hz[::-1] if flip_y else hz
            hh = hh[:, ::-1] if flip_x else hh
            vflip = vv[:, ::-1] if flip_x else vv
            # Only the window of possible inner corners is needed.
            cov_v = np.cumsum(vflip[:ymax, xmin:xmax], axis=0, dtype=np.float32)[ymin:] / rows[ymin:ymax]
            cov_h = np.cumsum(hh[ymin:ymax, :xmax], axis=1, dtype=np.float32)[:, xmin:] / cols[:, xmin:xmax]
            score = np.minimum(cov_v, cov_h)
            best = float(score.max()) if score.size else 0.0
            if best < 0.7:
                continue
            ys_, xs_ = np.nonzero(score >= best - 0.05)
            k = int(np.argmax(ys_ + xs_))
            ye, xe = int(ys_[k]) + ymin, int(xs_[k]) + xmin
            if not 0.4 <= (xe + 1) / float(ye + 1) <= 2.5:
                continue
            beyond_v = float(vflip[ye + 3 :, xe].mean()) if ye + 3 < h else 0.0
            beyond_h = float(hh[ye, xe + 3 :].mean()) if xe + 3 < w else 0.0
            # Back to full-resolution panel pixels.
            pw, ph = panel.w, panel.h
            xe_f, ye_f = min(pw - 1, (xe + 1) * step - 1), min(ph - 1, (ye + 1) * step - 1)
            x1, x2 = (pw - 1 - xe_f, pw) if flip_x else (0, xe_f + 1)
            y1, y2 = (ph - 1 - ye_f, ph) if flip_y else (0, ye_f + 1)
            # A gutter between juxtaposed images crosses the whole panel: the edge continues past
            # the corner as a uniform white (or black) strip.
            xc = x2 - 1 if not flip_x else x1
            yc = y2 - 1 if not flip_y else y1
            if beyond_v > 0.8 and _strip(panel, "v", xc, y2 if not flip_y else 0, ph if not flip_y else y1):
                continue
            if beyond_h > 0.8 and _strip(panel, "h", yc, x2 if not flip_x else 0, pw if not flip_x else x1):
                continue
            if not _differs(panel, x1, y1, x2, y2):
                continue
            out.append(
                _Cand(
                    "inset",
                    (x1, y1, x2, y2),
                    ((x1 + x2 - 1) / 2.0, (y1 + y2 - 1) / 2.0),
                    min(1.0, 0.3 + 0.7 * best),
                    region=(float(x1), float(y1), float(x2), float(y2)),
                )
            )
    return out


def _strip(panel: _Panel, orient: str, at: int, start: int, stop: int) -> bool:
    """A white or black strip (a gutter) within four pixels of row/column ``at``."""
    if stop - start < 4:
        return False
    if orient == "v":
        band = panel.gray[start:stop, max(0, at - 4) : at + 5]
        extreme = np.maximum((band >= 215).any(axis=1), (band <= 40).any(axis=1))
    else:
        band = panel.gray[max(0, at - 4) : at + 5, start:stop]
        extreme = np.maximum((band >= 215).any(axis=0), (band <= 40).any(axis=0))
    return float(extreme.mean()) >= 0.8


def _differs(panel: _Panel, x1: int, y1: int, x2: int, y2: int, *, frame_ok: bool = True) -> bool:
    """Inside and outside of a candidate frame look like different images, or a frame line runs
    along it: an inset, not a stretch of one micrograph."""
    g = panel.gray
    h, w = g.shape
    d0, d1 = 3, 10
    pairs = []
    if x1 > d1:
        pairs.append((g[y1:y2, x1 + d0 : x1 + d1], g[y1:y2, x1 - d1 : x1 - d0]))
    if x2 + d1 < w:
        pairs.append((g[y1:y2, x2 - d1 : x2 - d0], g[y1:y2, x2 + d0 : x2 + d1]))
    if y1 > d1:
        pairs.append((g[y1 + d0 : y1 + d1, x1:x2], g[y1 - d1 : y1 - d0, x1:x2]))
    if y2 + d1 < h:
        pairs.append((g[y2 - d1 : y2 - d0, x1:x2], g[y2 + d0 : y2 + d1, x1:x2]))
    diffs = []
    for inside, outside in pairs:
        if inside.size == 0 or outside.size == 0:
            continue
        dm = abs(float(inside.mean()) - float(outside.mean()))
        ds = abs(float(inside.std()) - float(outside.std()))
        diffs.append(max(dm, 1.5 * ds))
    if not diffs:
        return False
    return float(np.mean(diffs)) >= 18.0 or (frame_ok and _framed(panel, x1, y1, x2, y2))


def _framed(panel: _Panel, x1: int, y1: int, x2: int, y2: int) -> bool:
    h, w = panel.h, panel.w
    best = 0.0
    for name in ("white_lo", "black_lo"):
        mask = panel.masks[name]
        cov = []
        if x1 > 2:
            cov.append(mask[y1:y2, max(0, x1 - 1) : x1 + 2].any(axis=1).mean())
        if x2 < w - 2:
            cov.append(mask[y1:y2, x2 - 2 : x2 + 1].any(axis=1).mean())
        if y1 > 2:
            cov.append(mask[max(0, y1 - 1) : y1 + 2, x1:x2].any(axis=0).mean())
        if y2 < h - 2:
            cov.append(mask[y2 - 2 : y2 + 1, x1:x2].any(axis=0).mean())
        if cov:
            best = max(best, float(min(cov)))
    return best >= 0.8


# ----------------------------------------------------------------------------- filters


def _scale_bars(panel: _Panel) -> list[tuple[int, int, int, int]]:
    """Solid thin horizontal bars in the lower part of the panel, with a margin for their text."""
    out = []
    for name in ("white_lo", "black_lo"):
        _n, _, st = panel.components(name)
        x, y, w, h, area = (st[1:, k] for k in range(5))
        bar = (h <= 8) & (w >= 4 * h) & (w >= 10) & (area >= 0.8 * w * h) & (y >= 0.6 * panel.h)
        for k in np.nonzero(bar)[0]:
            bx, by, bw, bh = int(x[k]), int(y[k]), int(w[k]), int(h[k])
            pad = 3 * max(bh, 4)
            out.append((bx - bh, by - pad, bx + bw + bh, by + bh + pad))
    return out


def _on_scale_bar(glyph: tuple[float, ...], bars: list[tuple[int, int, int, int]]) -> bool:
    """The glyph lies mostly on a scale bar or its text (of ``_scale_bars``)."""
    return any(_overlap_frac(glyph, bar) > 0.5 for bar in bars)


def _overlap_frac(a: tuple[float, ...], b: tuple[float, ...]) -> float:
    w = min(a[2], b[2]) - max(a[0], b[0])
    h = min(a[3], b[3]) - max(a[1], b[1])
    if w <= 0 or h <= 0:
        return 0.0
    small = min((a[2] - a[0]) * (a[3] - a[1]), (b[2] - b[0]) * (b[3] - b[1]))
    return w * h / max(small, 1e-9)


def _along_edge(cand: _Cand, edges: list[tuple[float, float, float, float]], tol: float = 3.0) -> bool:
    """A pointing glyph lying along a border or frame line (parallel to it and within tol px)."""
    if cand.direction is None:
        return False
    gx1, gy1, gx2, gy2 = cand.glyph
    d = cand.direction % 180.0
    horizontal = d < 20 or d > 160
    vertical = 70 < d < 110
    for x1, y1, x2, y2 in edges:
        if (
            vertical
            and min(abs(gx1 - x1), abs(gx2 - x2), abs(gx1 - x2), abs(gx2 - x1)) <= tol
            and gy1 >= y1 - tol
            and gy2 <= y2 + tol
            and gx2 - gx1 <= 12
        ):
            return True
        if (
            horizontal
            and min(abs(gy1 - y1), abs(gy2 - y2), abs(gy1 - y2), abs(gy2 - y1)) <= tol
            and gx1 >= x1 - tol
            and gx2 <= x2 + tol
            and gy2 - gy1 <= 12
        ):
            return True
    return False


def _inset_sources(panel: _Panel, cands: list[_Cand]) -> list[_Cand]:
    """Zoom-in insets are often tied to their source region by two straight lines drawn from the
    inset's corners. Straight segments of the frame's tone (probabilistic Hough transform on the
    ink mask) that start at an inset corner and run away from the inset are such lines; the far
    ends of two of them span the source region. A drawn box already there is confirmed (its score
    raised); otherwise the region becomes a new ``box`` marker."""
    out: list[_Cand] = []
    insets = [c for c in cands if c.kind == "inset"]
    if not insets:
        return out
    min_len = max(15.0, 0.08 * panel.diag)
    for inset in insets:
        x1, y1, x2, y2 = inset.glyph
        # The frame's tone: the brightest (darkest) line within a few pixels of each side.
        g = panel.gray.astype(np.float32)
        bands = [
            g[y1 : y1 + 5, x1:x2].mean(axis=1),
            g[max(y1, y2 - 5) : y2, x1:x2].mean(axis=1),
            g[y1:y2, x1 : x1 + 5].mean(axis=0),
            g[y1:y2, max(x1, x2 - 5) : x2].mean(axis=0),
        ]
        bands = [b for b in bands if b.size]
        if not bands:
            continue
        light = float(np.mean([b.max() for b in bands]))
        dark = float(np.mean([b.min() for b in bands]))
        name = "white_lo" if light >= 170 else "black_lo" if dark <= 80 else ""
        if not name:
            continue
        mask = panel.masks[name]
        segments = cv2.HoughLinesP(
            mask, 1, math.pi / 180, threshold=15, minLineLength=int(min_len), maxLineGap=3
        )
        if segments is None:
            continue
        corners = np.array([(x1, y1), (x2 - 1, y1), (x1, y2 - 1), (x2 - 1, y2 - 1)], dtype=np.float64)
        ends: list[tuple[float, float, float, int]] = []
        for ax, ay, bx, by in segments.reshape(-1, 4).astype(np.float64):
            for (px, py), (qx, qy) in (((ax, ay), (bx, by)), ((bx, by), (ax, ay))):
                d = np.hypot(corners[:, 0] - px, corners[:, 1] - py)
                k = int(np.argmin(d))
                if d[k] > 8.0:
                    continue
                # It must leave the inset: the far end lies outside it and away from its centre.
                if x1 - 2 <= qx <= x2 + 1 and y1 - 2 <= qy <= y2 + 1:
                    continue
                # ... and does not cut through the inset on its way.
                run = math.hypot(qx - px, qy - py)
                sx, sy = px + 6.0 * (qx - px) / run, py + 6.0 * (qy - py) / run
                if x1 + 4 <= sx <= x2 - 5 and y1 + 4 <= sy <= y2 - 5:
                    continue
                qx, qy = _follow(mask, px, py, qx, qy)  # a dashed or crossing-broken line goes on
                ends.append((float(np.hypot(qx - px, qy - py)), qx, qy, k))
        ends.sort(reverse=True)
        picked: list[tuple[float, float, float, int]] = []
        for end in ends:
            if all(end[3] != p[3] for p in picked):
                picked.append(end)
            if len(picked) == 2:
                break
        if len(picked) < 2:
            continue
        (_, ax, ay, _), (_, bx, by, _) = picked
        sx1, sy1, sx2, sy2 = min(ax, bx), min(ay, by), max(ax, bx) + 1.0, max(ay, by) + 1.0
        if sx2 - sx1 < 6 or sy2 - sy1 < 6 or _overlap_frac((sx1, sy1, sx2, sy2), inset.glyph) > 0.2:
            continue
        source = (int(sx1), int(sy1), math.ceil(sx2), math.ceil(sy2))
        drawn = [c for c in cands if c.kind == "box" and _iou(c.glyph, source) >= 0.3]
        if drawn:
            for c in drawn:
                c.score = max(c.score, 0.85)
            continue
        region = (float(source[0]), float(source[1]), float(source[2]), float(source[3]))
        centre_pt = ((source[0] + source[2] - 1) / 2.0, (source[1] + source[3] - 1) / 2.0)
        out.append(_Cand("box", source, centre_pt, 0.55, region=region))
    return out


def _follow(
    mask: np.ndarray, px: float, py: float, qx: float, qy: float, gap: int = 8
) -> tuple[float, float]:
    """Extend the segment p -> q along its direction while the mask stays inked (within a pixel
    of the line, gaps up to ``gap``); the last inked point."""
    length = math.hypot(qx - px, qy - py)
    if length == 0:
        return qx, qy
    ux, uy = (qx - px) / length, (qy - py) / length
    h, w = mask.shape
    t = np.arange(1.0, 2.0 * (h + w))
    xs, ys = qx + t * ux, qy + t * uy
    valid = (xs >= 1) & (xs <= w - 2) & (ys >= 1) & (ys <= h - 2)
    xs, ys = xs[valid], ys[valid]
    if xs.size == 0:
        return qx, qy
    xi, yi = np.rint(xs).astype(np.intp), np.rint(ys).astype(np.intp)
    inked = (mask[yi, xi] | mask[yi, xi - 1] | mask[yi, xi + 1] | mask[yi - 1, xi] | mask[yi + 1, xi]) > 0
    last, misses = -1, 0
    for k, hit in enumerate(inked.tolist()):
        if hit:
            last, misses = k, 0
        else:
            misses += 1
            if misses > gap:
                break
    if last < 0:
        return qx, qy
    return float(xs[last]), float(ys[last])


def _prefer_insets(panel: _Panel, cands: list[_Cand]) -> list[_Cand]:
    """A framed rectangle in a panel corner holding a different picture is an inset, not a drawn
    box: retype such boxes, and drop boxes that duplicate a detected inset."""
    h, w = panel.h, panel.w
    insets = [c for c in cands if c.kind == "inset"]
    out: list[_Cand] = []
    for c in cands:
        if c.kind == "box":
            twin = next((i for i in insets if _iou(c.glyph, i.glyph) >= 0.7), None)
            if twin is not None:
                # The drawn frame is the more precise outline of the inset.
                twin.glyph, twin.region, twin.point = c.glyph, c.region, c.point
                continue
            x1, y1, x2, y2 = c.glyph
            mx, my = max(6.0, 0.03 * w), max(6.0, 0.03 * h)
            corner = (x1 <= mx or x2 >= w - mx) and (y1 <= my or y2 >= h - my)
            big = (x2 - x1) >= 0.12 * w and (y2 - y1) >= 0.12 * h and (x2 - x1) * (y2 - y1) <= 0.5 * w * h
            if corner and big and _differs(panel, x1, y1, x2, y2, frame_ok=False):
                c = _Cand("inset", c.glyph, c.point, max(c.score, 0.6), region=c.region)
        out.append(c)
    return out


def _iou(a: tuple[float, ...], b: tuple[float, ...]) -> float:
    w = min(a[2], b[2]) - max(a[0], b[0])
    h = min(a[3], b[3]) - max(a[1], b[1])
    if w <= 0 or h <= 0:
        return 0.0
    inter = w * h
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


def _dedupe(cands: list[_Cand]) -> list[_Cand]:
    """One candidate per glyph: the best-scoring of those whose glyph boxes mostly overlap."""
    order = sorted(cands, key=lambda c: -c.score)
    kept: list[_Cand] = []
    for cand in order:
        if not any(_clash(cand, other) for other in kept):
            kept.append(cand)
    return kept


def _clash(cand: _Cand, other: _Cand) -> bool:
    """The two candidates are one glyph (their glyph boxes mostly overlap)."""
    if _overlap_frac(cand.glyph, other.glyph) < 0.6:
        return False
    ga = (cand.glyph[2] - cand.glyph[0]) * (cand.glyph[3] - cand.glyph[1])
    gb = (other.glyph[2] - other.glyph[0]) * (other.glyph[3] - other.glyph[1])
    # A small glyph inside a large outline or inset is a marker of its own.
    if other.kind in _ENCLOSING and ga < 0.35 * gb:
        return False
    return not (cand.kind in _ENCLOSING and gb < 0.35 * ga)


def _target(cand: _Cand, w: int, h: int) -> tuple[float, float, float, float]:
    """Target box in crop coordinates."""
    diag = math.hypot(w, h)
    if cand.region is not None:
        return cand.region
    if cand.kind in _POINTING and cand.direction is not None:
        base = cand.size * (1.2 if cand.kind == "arrow" else 3.0)
        side = float(np.clip(base, 0.07 * diag, 0.3 * min(w, h) + 8))
        # An axis-aligned square ahead of the tip, the tip just inside its trailing part.
        rad = math.radians(cand.direction)
        tx, ty = cand.point
        cx, cy = tx + 0.42 * side * math.cos(rad), ty + 0.42 * side * math.sin(rad)
        half = side / 2.0
        return (min(cx - half, tx), min(cy - half, ty), max(cx + half, tx + 1.0), max(cy + half, ty + 1.0))
    # Asterisks and stars: the structure lies next to the glyph.
    gx1, gy1, gx2, gy2 = cand.glyph
    size = max(gx2 - gx1, gy2 - gy1)
    side = float(np.clip(3.0 * size, 0.08 * diag, 0.35 * min(w, h) + 8))
    cx, cy = (gx1 + gx2) / 2.0, (gy1 + gy2) / 2.0
    return (cx - side / 2.0, cy - side / 2.0, cx + side / 2.0, cy + side / 2.0)


# ----------------------------------------------------------------------------- entry point


def _rule_cands(panel: _Panel, p: MarkerParams, *, glyphs_only: bool = False) -> list[_Cand]:
    """The rule-based detector on one panel (crop pixels). ``glyphs_only``: arrows, arrowheads
    and symbols only (no outlines, line rectangles or insets: the enlarged copy's pass)."""
    h, w = panel.h, panel.w
    cands: list[_Cand] = [] if glyphs_only else _corner_insets(panel)
    text_zone = np.zeros((h, w), dtype=bool)
    for name in ("white_lo", "black_lo", "colour"):
        n, _, stats = panel.components(name)
        if n <= 1:
            continue
        text = _text_flags(stats, h, w)
        if name != "colour":
            text_zone |= text
        cands += _head_arrows(panel, _STRONG[name], text)
        cands += _component_shapes(panel, name, text, outlines=not glyphs_only)
        if name == "colour":
            cands += _tiny_symbols(panel, name, text, p)
        if not glyphs_only:
            cands += _dashed_outlines(panel, name)
            cands += _line_rectangles(panel, name)
    if glyphs_only:
        cands = [c for c in cands if c.kind in _ENLARGED_KINDS]
    else:
        cands += _line_rectangles(panel, "colour_any")
        for name in ("white", "black"):
            cands += _strong_outlines(panel, name)
    cands = [c for c in cands if c.score >= p.min_score.get(c.kind, p.min_confidence)]
    if text_zone.any():
        cands = [c for c in cands if not _in_text(c, text_zone)]

    bars = _scale_bars(panel)
    if bars:
        cands = [c for c in cands if c.kind == "inset" or not _on_scale_bar(c.glyph, bars)]
    edges: list[tuple[float, float, float, float]] = [
        (0.0, 0.0, float(w), 0.0),
        (0.0, float(h), float(w), float(h)),
        (0.0, 0.0, 0.0, float(h)),
        (float(w), 0.0, float(w), float(h)),
    ]
    for c in cands:
        if c.kind == "inset" and c.region is not None:
            rx1, ry1, rx2, ry2 = c.region
            edges += [(rx1, ry1, rx2, ry1), (rx1, ry2, rx2, ry2), (rx1, ry1, rx1, ry2), (rx2, ry1, rx2, ry2)]
    cands = [c for c in cands if c.kind not in _POINTING or not _along_edge(c, edges)]
    if glyphs_only:
        return _dedupe(cands)
    cands = _dedupe(_prefer_insets(panel, cands))
    cands += _inset_sources(panel, cands)
    return cands


def _scaled(cand: _Cand, fx: float, fy: float) -> _Cand:
    """``cand`` in the pixels of a copy of its panel enlarged by ``fx`` x ``fy``."""
    g = cand.glyph
    r = cand.region
    return replace(
        cand,
        glyph=(math.floor(g[0] * fx), math.floor(g[1] * fy), math.ceil(g[2] * fx), math.ceil(g[3] * fy)),
        point=((cand.point[0] + 0.5) * fx - 0.5, (cand.point[1] + 0.5) * fy - 0.5),
        region=None if r is None else (r[0] * fx, r[1] * fy, r[2] * fx, r[3] * fy),
        size=cand.size * max(fx, fy),
    )


# A panel whose shorter side is below ``upscale_below`` pixels is also examined enlarged (by at
# most ``upscale_max``, to about that side): its glyphs are a few pixels wide (a figure scaled down,
# a narrow strip), below the sizes the rules' tests resolve. The enlarged copy's candidates are
# added where the native scale found nothing (on larger panels the enlarged glyphs outgrow the
# rules' size limits); the network runs at the native scale it was trained at.
# Only glyphs of a few pixels are looked for there (outlines are large enough at the native
# scale, and enlarged texture makes small rings); what only the enlarged copy shows is kept only
# where the network sees something too (enlarged texture also makes small arrow look-alikes).
_ENLARGED_KINDS = ("arrow", "arrowhead", "asterisk", "star")


def _upscale_factor(w: int, h: int, p: MarkerParams) -> float:
    side = min(w, h)
    if side >= p.upscale_below:
        return 1.0
    return min(p.upscale_max, p.upscale_below / side)


# ----------------------------------------------------------------------------- learned fusion

# Network peaks at or above this are candidates of their own for the fusion model; lower peaks
# are on every textured panel and only feed it noise (they still count as heat, below).
_NET_CANDIDATE = 0.1
# Two candidates are one marker when their glyph boxes overlap this much (intersection over
# union) or, both glyphs or both outlines, their points lie this close (of the panel diagonal).
_SAME_GLYPH_IOU = 0.3
_SAME_POINT = 0.02

# Heat-map peaks of the marker network at or above these become markers of their own (set for
# recall plus precision on development seeds). Arrows need more than symbols: the network's weak
# peaks of arrows fall on sharp edges and cell outlines of the texture. Boxes are low for small,
# thin rectangles (inset sources), which it sees faintly; asterisks and circles lower still, their
# faint peaks (under ``weak_peak``) held to a stricter veto (``weak_veto``), without which real
# precision falls. How each level was set and what it measured: services/mining/CHANGELOG.md.
# A rule-based marker scoring below ``rule_sure`` (but an inset, found by its frame) is kept
# only when the network sees something there (a peak of at least ``_NET_CANDIDATE``): texture
# look-alikes pass the rules' shape tests at middling scores, and the network, trained on many
# panels, rarely peaks on them. Above it the rules are trusted: on the real figures the network
# (trained on synthetic ones) misses some markers the rules find with high scores.
# Circles are trusted earlier: the network misses small drawn rings inside insets (real figures),
# where the rules' ring test is reliable, and without them the inset's kind is all that is left.
# This only spares them the network's support; the fusion model may still veto a ring under
# ``rule_sure`` (``_choose``). Both levels are deliberate: one level for both costs real
# precision at unchanged recall either way (lower, the model can no longer drop false rings;
# higher for every kind, true rings go; CHANGELOG.md).
# More network peaks of one kind than this in one panel are texture (puncta, a field of cells
# alike), not markers: authors mark a few structures, and the rules still find dense markers.
# Arrows are rarer look-alikes of texture than dots: a panel with four arrows is common enough.
# A network marker is already explained by a rule-based one when its point lies this close (a
# fraction of the panel diagonal) to that marker's target box or their glyph boxes overlap.
_NET_EXPLAINED_MARGIN = 0.02


# The learned fusion model overrules the hand-set levels above where it is sure: what they keep
# only on the network's word (its peaks, rule-based markers of a middling score, anything only
# the enlarged copy shows) goes when the model gives it less than ``veto``; a candidate they
# drop is reported when the model gives it ``rescue`` or more (both set on training seed 120000
# and the real figures). The model alone, in place of the hand-set levels, finds more on
# synthetic figures but not on the real ones: its network evidence, learned on synthetic
# texture, is weak on real markers and strong on real texture (CHANGELOG.md). Rule-based markers
# the rules are sure of stay for the same reason.
# A network peak the levels keep at a score under this needs the model's probability of at
# least ``weak_veto``: such faint peaks are texture more often than the levels' usual ones.
# Asterisks and stars are rescued earlier: the model's middling probabilities on symbols the levels
# drop (tiny, or in the panel's own hue) are mostly right, and real figures, where its network
# evidence is weakest, rarely carry them. Stars earlier still, and boxes earlier than pointing
# markers: the model's middling stars are small glyphs of the panel's own hue, its middling boxes
# thin rectangles (inset sources) the network sees faintly; neither is a common look-alike of
# real texture. Boxes lowest, as the blended model of the glyph features (below) gives faint boxes
# lower probabilities. Asterisks or arrowheads rescued later cost real precision for little
# synthetic recall (CHANGELOG.md).

# Measurements of the candidate's own pixels and neighbours, appended to the fusion model's
# columns. Drawn glyphs are strong, solid ink of a hue the panel has little of; network peaks on
# texture are faint and of the panel's common hues. A model fitted with them alone tells true
# candidates better on synthetic figures but worse on real ones (faint real markers, strong
# real texture), so the shipped model averages its log-odds half and half with the model fitted
# before on the columns before these only (``train_marker_net --fusion --blend 0.5``; the
# measurements of each choice: CHANGELOG.md, the commands: artifacts/MANIFEST.json).
_GLYPH_FEATURES = (
    ("contrast", "95th percentile of the colour distance from the background on the glyph, of 255"),
    ("ink_share", "share of the glyph's pixels at least 40 from the background"),
    ("in_inset", "best score of an inset candidate whose frame holds the candidate's point"),
    ("on_glyph", "other candidates on the glyph (any kind, any source)"),
    ("other_kind", "best score of a candidate of another kind on the glyph"),
    ("hue_share", "share of the panel's pixels saturated in the hue of the glyph's ink"),
    ("glyph_sat", "mean saturation of the glyph's ink, of 255"),
    ("surround", "mean grey-level step from the background around the glyph, of 64"),
    ("rank", "candidates of its kind that score higher"),
)

FUSION_FEATURES = (
    "rule",
    "score",
    "enlarged",
    *(f"heat_{k}" for k in marker_net.KINDS),
    "heat_own",
    "other_rule",
    "other_net",
    "log_glyph",
    "glyph_of_diag",
    "log_side",
    "crowd",
    "target_of_diag",
    *(f"is_{k}" for k in marker_net.KINDS),
    "saturated",
    "texture",
    *(name for name, _ in _GLYPH_FEATURES),
)


@dataclass
class _Found:
    """Everything found on one panel before the fusion model's choice."""

    panel: _Panel  # the pixels of every candidate (the enlarged copy of a small panel)
    native: _Panel
    rules: list[_Cand]
    net: list[_Cand]  # network peaks of at least ``_NET_CANDIDATE``, in ``panel`` pixels
    heat: np.ndarray | None  # the network's heat maps over ``native`` (kinds x h/4 x w/4)


def _net_cands(panel: _Panel, found: list[marker_net.NetMarker], native: _Panel) -> list[_Cand]:
    """The network's markers (``native`` pixels) in ``panel`` pixels."""
    f = panel.w / native.w
    cands = []
    for m in found:
        g = (m.glyph[0] * f, m.glyph[1] * f, m.glyph[2] * f, m.glyph[3] * f)
        cands.append(
            _Cand(
                kind=m.kind,
                glyph=(
                    math.floor(g[0]),
                    math.floor(g[1]),
                    max(math.ceil(g[2]), math.floor(g[0]) + 1),
                    max(math.ceil(g[3]), math.floor(g[1]) + 1),
                ),
                point=((m.point[0] + 0.5) * f - 0.5, (m.point[1] + 0.5) * f - 0.5),
                score=m.score,
                region=(m.target[0] * f, m.target[1] * f, m.target[2] * f, m.target[3] * f),
                direction=m.direction,
                size=max(g[2] - g[0], g[3] - g[1]),
            )
        )
    return cands


def _find(
    native_rgb: np.ndarray, p: MarkerParams, *, use_net: bool, net: marker_net.MarkerNet | None = None
) -> _Found:
    """The rules (at the native scale and, for a small panel, enlarged) and the network (``net``,
    the shipped one by default) on one panel crop."""
    panel = native = _Panel(native_rgb)
    rules = _rule_cands(panel, p)
    scale = _upscale_factor(panel.w, panel.h, p)
    if scale > 1.0:
        # Glyphs of a small panel are a few pixels: the rules also look at an enlarged copy.
        big = _Panel(
            cv2.resize(
                native_rgb, (round(panel.w * scale), round(panel.h * scale)), interpolation=cv2.INTER_CUBIC
            )
        )
        fx, fy = big.w / panel.w, big.h / panel.h
        rules = [_scaled(c, fx, fy) for c in rules]
        for extra in _rule_cands(big, p, glyphs_only=True):
            if not any(_clash(extra, c) for c in rules):
                rules.append(replace(extra, enlarged=True))
        panel = big
    if not use_net:
        return _Found(panel, native, rules, [], None)
    out = marker_net.run_net(net if net is not None else marker_net.shipped_net(), native_rgb)
    peaks = [
        m for m in marker_net.decode(out, _NET_CANDIDATE) if m.point[0] < native.w and m.point[1] < native.h
    ]
    net_cands = _net_cands(panel, peaks, native)
    # A scale bar's text is not a marker for the network either (the rules filter their own).
    bars = _scale_bars(native)
    if bars:
        back = native.w / panel.w
        net_cands = [
            c for c in net_cands if c.kind == "inset" or not _on_scale_bar(_scaled(c, back, back).glyph, bars)
        ]
    return _Found(panel, native, rules, net_cands, out[: len(marker_net.KINDS)])


def _near_all(cands: list[_Cand], reach: float) -> list[list[int]]:
    """For each candidate i, the others j on it: j's point lies on i's glyph (within ``reach``)
    or their glyphs overlap (intersection over union above ``_SAME_GLYPH_IOU``). All pairs at
    once: a panel has tens of candidates."""
    glyph = np.array([c.glyph for c in cands], dtype=np.float64).reshape(-1, 4)
    point = np.array([c.point for c in cands], dtype=np.float64).reshape(-1, 2)
    gx1, gy1, gx2, gy2 = (glyph[:, k, None] for k in range(4))
    px, py = point[None, :, 0], point[None, :, 1]
    on = (gx1 - reach <= px) & (px <= gx2 + reach) & (gy1 - reach <= py) & (py <= gy2 + reach)
    w = np.minimum(gx2, glyph[None, :, 2]) - np.maximum(gx1, glyph[None, :, 0])
    h = np.minimum(gy2, glyph[None, :, 3]) - np.maximum(gy1, glyph[None, :, 1])
    inter = np.where((w > 0) & (h > 0), w * h, 0.0)
    area = (glyph[:, 2] - glyph[:, 0]) * (glyph[:, 3] - glyph[:, 1])
    union = area[:, None] + area[None, :] - inter
    overlap = (inter > 0) & (inter > _SAME_GLYPH_IOU * union)
    near = on | overlap
    np.fill_diagonal(near, False)
    return [np.flatnonzero(row).tolist() for row in near]


def fusion_features(found: _Found) -> tuple[list[_Cand], np.ndarray]:
    """Every candidate of ``found`` (rules first, then network peaks) and its measurements, in
    the column order of ``FUSION_FEATURES``: its own score and source, the network's heat of
    every kind on its glyph, the best other candidate of each source on it, its size against
    the panel's, how many of its kind the panel has (texture repeats, markers are few), how
    colourful and textured the panel is, and the ``_GLYPH_FEATURES`` of its pixels."""
    panel, native = found.panel, found.native
    cands = found.rules + found.net
    n_rules = len(found.rules)
    rows = np.zeros((len(cands), len(FUSION_FEATURES)), dtype=np.float64)
    if not cands:
        return cands, rows
    kinds = marker_net.KINDS
    f = native.w / panel.w  # panel pixels -> native pixels
    reach = _SAME_POINT * panel.diag
    saturated = float(np.count_nonzero(native.sat >= 70)) / (native.w * native.h)
    texture = float(native.gray.std()) / 64.0
    heat = found.heat
    near = _near_all(cands, reach)
    for i, c in enumerate(cands):
        rule = i < n_rules
        own = found.rules if rule else found.net
        others_rule = [cands[j].score for j in near[i] if j < n_rules]
        others_net = [cands[j].score for j in near[i] if j >= n_rules]
        crowd = sum(1 for o in own if o.kind == c.kind and o.score >= 0.8 * c.score)
        gx1, gy1, gx2, gy2 = c.glyph
        glyph = max(gx2 - gx1, gy2 - gy1) * f
        tx1, ty1, tx2, ty2 = _target(c, panel.w, panel.h)
        row = [
            float(rule),
            float(c.score),
            float(c.enlarged),
        ]
        own_heat = 0.0
        if heat is None:
            row += [0.0] * len(kinds)
        else:
            gh, gw = heat.shape[1:]
            px, py = c.point[0] * f / marker_net.STRIDE, c.point[1] * f / marker_net.STRIDE
            cx1 = int(max(0, min(gx1 * f / marker_net.STRIDE, px) - 1))
            cy1 = int(max(0, min(gy1 * f / marker_net.STRIDE, py) - 1))
            cx2 = int(min(gw, max(gx2 * f / marker_net.STRIDE, px) + 2))
            cy2 = int(min(gh, max(gy2 * f / marker_net.STRIDE, py) + 2))
            window = heat[:, cy1:cy2, cx1:cx2]
            row += (
                [float(v) for v in window.reshape(len(kinds), -1).max(axis=1)]
                if window.size
                else [0.0] * len(kinds)
            )
            ix, iy = int(np.clip(px, 0, gw - 1)), int(np.clip(py, 0, gh - 1))
            own_heat = float(
                heat[kinds.index(c.kind), max(0, iy - 1) : iy + 2, max(0, ix - 1) : ix + 2].max()
            )
        row += [
            own_heat,
            max(others_rule, default=0.0),
            max(others_net, default=0.0),
            math.log1p(glyph),
            glyph / native.diag,
            math.log(min(native.w, native.h)),
            float(crowd),
            max(tx2 - tx1, ty2 - ty1) / panel.diag,
            *(float(c.kind == k) for k in kinds),
            saturated,
            texture,
        ]
        rows[i, : len(row)] = row
    rows[:, -len(_GLYPH_FEATURES) :] = _glyph_features(found, cands, near)
    return cands, rows


def _percentile(values: np.ndarray, q: float) -> float:
    """``np.percentile(values, q)`` (linear interpolation) by a partial sort: glyph windows are
    small and the full call's overhead was most of the glyph features' time."""
    flat = values.ravel()
    at = (flat.size - 1) * q / 100.0
    lo = math.floor(at)
    hi = min(lo + 1, flat.size - 1)
    part = np.partition(flat, (lo, hi))
    return float(part[lo]) + (float(part[hi]) - float(part[lo])) * (at - lo)


def _glyph_features(found: _Found, cands: list[_Cand], near: list[list[int]]) -> np.ndarray:
    """The ``_GLYPH_FEATURES`` columns of ``cands``, measured on the native panel; ``near[i]``
    lists the candidates on candidate i's glyph."""
    panel, native = found.panel, found.native
    out = np.zeros((len(cands), len(_GLYPH_FEATURES)))
    f = native.w / panel.w
    hue = native.hue
    hue_counts = np.bincount(hue[native.sat >= 70] // 8, minlength=32).astype(np.float64)
    step = cv2.absdiff(native.gray, native.bg_gray)
    insets = [c for c in cands if c.kind == "inset" and c.region is not None]
    for i, c in enumerate(cands):
        x1, y1 = max(0, int(c.glyph[0] * f)), max(0, int(c.glyph[1] * f))
        x2 = min(native.w, max(x1 + 1, math.ceil(c.glyph[2] * f)))
        y2 = min(native.h, max(y1 + 1, math.ceil(c.glyph[3] * f)))
        window = native.cdist[y1:y2, x1:x2]
        if window.size == 0:
            continue
        ink = window >= 40
        hue_share = glyph_sat = 0.0
        if ink.any():
            sat = native.sat[y1:y2, x1:x2]
            glyph_sat = float(sat[ink].mean()) / 255.0
            inked = hue[y1:y2, x1:x2][ink & (sat >= 70)]
            if inked.size:
                b = int(np.bincount(inked // 8, minlength=32).argmax())
                hue_share = float(hue_counts[[(b - 1) % 32, b, (b + 1) % 32]].sum()) / (native.w * native.h)
        gw, gh = x2 - x1, y2 - y1
        around = step[max(0, y1 - gh) : min(native.h, y2 + gh), max(0, x1 - gw) : min(native.w, x2 + gw)]
        in_inset = max(
            (
                s.score
                for s in insets
                if s is not c
                and s.region is not None
                and s.region[0] <= c.point[0] <= s.region[2]
                and s.region[1] <= c.point[1] <= s.region[3]
            ),
            default=0.0,
        )
        out[i] = [
            _percentile(window, 95) / 255.0,
            float(ink.mean()),
            in_inset,
            float(len(near[i])),
            max((cands[j].score for j in near[i] if cands[j].kind != c.kind), default=0.0),
            hue_share,
            glyph_sat,
            float(around.mean()) / 64.0,
            float(sum(1 for o in cands if o.kind == c.kind and o.score > c.score)),
        ]
    return out


def _explained(net: _Cand, rules: list[_Cand], w: int, h: int) -> bool:
    margin = _NET_EXPLAINED_MARGIN * math.hypot(w, h)
    px, py = net.point
    for c in rules:
        tx1, ty1, tx2, ty2 = _target(c, w, h)
        if tx1 - margin <= px <= tx2 + margin and ty1 - margin <= py <= ty2 + margin:
            return True
        if _iou(c.glyph, net.glyph) > 0.3:
            return True
    return False


def _supported(rule: _Cand, net: list[_Cand], w: int, h: int) -> bool:
    """Some network peak lies on the rule-based marker's glyph or next to its point."""
    reach = _NET_EXPLAINED_MARGIN * math.hypot(w, h)
    gx1, gy1, gx2, gy2 = rule.glyph
    for c in net:
        px, py = c.point
        if gx1 - reach <= px <= gx2 + reach and gy1 - reach <= py <= gy2 + reach:
            return True
        if math.hypot(px - rule.point[0], py - rule.point[1]) <= 2 * reach:
            return True
    return False


def _hand_fusion(found: _Found, p: MarkerParams) -> list[int]:
    """Indices (rules, then network peaks, as ``fusion_features`` orders them) of the hand-set
    fusion's markers: rule-based markers the network does not contradict, plus the network's
    markers of their kind's level that none of them explains (the rules are precise where they
    fire; the network finds tiny glyphs, washed-out outlines, glyphs in the panel's own hue)."""
    w, h = found.panel.w, found.panel.h
    rules, net = found.rules, found.net
    kept = [
        i
        for i, r in enumerate(rules)
        if (r.score >= p.rule_sure_kind.get(r.kind, p.rule_sure) and not r.enlarged)
        or r.kind == "inset"
        or _supported(r, net, w, h)
    ]
    strong = sorted(
        (i for i, c in enumerate(net) if c.score >= p.net_levels[c.kind]), key=lambda i: -net[i].score
    )
    crowded = _crowded_kinds(net, p)
    explaining = [rules[i] for i in kept]
    added: list[int] = []
    for i in strong:  # best first; a second peak on one glyph (two kinds, two cells) is one marker
        c = net[i]
        if c.kind not in crowded and not _explained(c, explaining, w, h):
            added.append(len(rules) + i)
            explaining.append(c)
    return kept + added


def _crowded_kinds(net: list[_Cand], p: MarkerParams) -> set[str]:
    """Kinds of which the network has more glyphs with a peak at their level than ``net_crowd``
    (or ``net_crowd_kind``) in the panel: texture, not markers. Peaks on one glyph count once:
    the network often peaks at both ends of a block arrow, and a panel of three such arrows is
    not a crowd of six."""
    glyphs: list[_Cand] = []
    for c in sorted((c for c in net if c.score >= p.net_levels[c.kind]), key=lambda c: -c.score):
        if not any(o.kind == c.kind and _iou(o.glyph, c.glyph) > _SAME_GLYPH_IOU for o in glyphs):
            glyphs.append(c)
    crowd = Counter(c.kind for c in glyphs)
    return {kind for kind, n in crowd.items() if n > p.net_crowd_kind.get(kind, p.net_crowd)}


def _one_marker(a: _Cand, b: _Cand, reach: float) -> bool:
    if _iou(a.glyph, b.glyph) > _SAME_GLYPH_IOU:
        return True
    if (a.kind in _ENCLOSING) != (b.kind in _ENCLOSING):
        return False  # a glyph inside an outline is a marker of its own
    return math.hypot(a.point[0] - b.point[0], a.point[1] - b.point[1]) <= reach


def _choose(found: _Found, cands: list[_Cand], probability: np.ndarray, p: MarkerParams) -> list[_Cand]:
    """The hand-set fusion's markers less those the fusion model vetoes, plus those it rescues;
    one per marker (the hand-set fusion's first, then the most probable)."""
    hand = set(_hand_fusion(found, p))
    n_rules = len(found.rules)
    crowded = _crowded_kinds(found.net, p)

    def vetoable(i: int) -> bool:
        c = cands[i]
        return i >= n_rules or c.score < p.rule_sure or c.enlarged

    def veto(i: int) -> float:
        return p.weak_veto if i >= n_rules and cands[i].score < p.weak_peak else p.veto

    picked = [
        i
        for i in range(len(cands))
        if (i in hand and (probability[i] >= veto(i) or not vetoable(i)))
        or probability[i] >= p.rescue_kind.get(cands[i].kind, p.rescue)
    ]
    picked.sort(key=lambda i: (i not in hand, -probability[i]))
    reach = _SAME_POINT * found.panel.diag
    chosen: list[_Cand] = []
    for i in picked:
        c = cands[i]
        if any(_one_marker(c, o, reach) for o in chosen):
            continue
        # A rescued candidate is added, as the levels add the network's, where nothing chosen
        # explains it (not a second peak on an arrow's shaft, ahead of its tip), and a network
        # peak not among a crowd of its kind (puncta of a fluorescent field).
        if i not in hand and (
            _explained(c, chosen, found.panel.w, found.panel.h) or (i >= n_rules and c.kind in crowded)
        ):
            continue
        chosen.append(c)
    chosen += _inset_source(found, cands, probability, chosen)
    net = {id(c) for c in found.net}
    return [_orient(found.panel, c) if id(c) in net and c.kind in _POINTING else c for c in chosen]


# A box candidate scoring this much may be an inset's source region (below the network's level
# for boxes: the source of a zoom-in is often a small, thin rectangle that it sees only faintly).
_SOURCE_BOX = 0.2


def _inset_source(
    found: _Found, cands: list[_Cand], probability: np.ndarray, chosen: list[_Cand]
) -> list[_Cand]:
    """The most probable box candidate outside a chosen inset, when the panel has an inset but no
    chosen box: a zoom-in has a source region, and when no connecting lines led to it
    (``_inset_sources``) its drawn rectangle is the likeliest of the weak boxes."""
    insets = [c for c in chosen if c.kind == "inset"]
    if not insets or any(c.kind == "box" for c in chosen):
        return []
    reach = _SAME_POINT * found.panel.diag
    best: int | None = None
    for i, c in enumerate(cands):
        if c.kind != "box" or c.score < _SOURCE_BOX:
            continue
        if any(
            _iou(c.glyph, s.glyph) > 0 or contains_point(_target(s, found.panel.w, found.panel.h), *c.point)
            for s in insets
        ):
            continue
        if any(_one_marker(c, o, reach) for o in chosen):
            continue
        if best is None or probability[i] > probability[best]:
            best = i
    return [] if best is None else [cands[best]]


# A pointing glyph's widest cross-section (the barbs of its head) lies in the part of its length
# towards the tip: below this fraction of the length from the network's tip it faces the other way.
_HEAD_END = 0.45
# ... and only when that cross-section is this much wider than the glyph's typical one (a shaft
# with no head to speak of gives no direction).
_HEAD_WIDER = 1.2


def _orient(panel: _Panel, cand: _Cand) -> _Cand:
    """A network arrow or arrowhead turned round when its ink says the head is at the other end.

    The network's peak sometimes sits on the tail of an arrow (a block arrow's flat end looks
    like a tip to it), so its target box lies behind the arrow. The glyph's ink (its largest
    component of strong contrast against the background estimate) is measured across the
    network's axis, slice by slice: the head is the widest part and lies near the tip."""
    if cand.direction is None:
        return cand
    gx1, gy1, gx2, gy2 = cand.glyph
    x1, y1, x2, y2 = max(0, gx1 - 2), max(0, gy1 - 2), min(panel.w, gx2 + 2), min(panel.h, gy2 + 2)
    if x2 - x1 < 3 or y2 - y1 < 3:
        return cand
    ink = cv2.absdiff(panel.rgb[y1:y2, x1:x2], panel.bg_rgb[y1:y2, x1:x2]).max(axis=-1)
    top = int(ink.max())
    if top < 40:
        return cand
    n, labels, stats, _ = cv2.connectedComponentsWithStats(
        (ink >= max(40, top // 2)).view(np.uint8), connectivity=8
    )
    if n < 2:
        return cand
    ys, xs = np.nonzero(labels == 1 + int(np.argmax(stats[1:, cv2.CC_STAT_AREA])))
    if len(xs) < 8:
        return cand
    rad = math.radians(cand.direction)
    ux, uy = math.cos(rad), math.sin(rad)
    dx, dy = xs - (cand.point[0] - x1), ys - (cand.point[1] - y1)
    along = dx * ux + dy * uy
    across = dy * ux - dx * uy
    lo = float(along.min())
    length = float(along.max()) - lo
    if length < 6:
        return cand
    slices = np.floor(along - lo).astype(np.intp)
    high = np.full(int(slices.max()) + 1, -np.inf)
    low = np.full(len(high), np.inf)
    np.maximum.at(high, slices, across)
    np.minimum.at(low, slices, across)
    width = np.where(high >= low, high - low + 1.0, 0.0)
    widest = (float(np.argmax(width)) + 0.5) / length  # 0 at the tail end, 1 at the tip end
    if widest >= _HEAD_END or width.max() < _HEAD_WIDER * float(np.median(width[width > 0])):
        return cand
    tail = along <= lo + 1.0
    tip = (float(xs[tail].mean()) + x1, float(ys[tail].mean()) + y1)
    # The network's target box lay ahead of its tip; ``_target`` places it ahead of the new one.
    return replace(cand, point=tip, direction=(cand.direction + 180.0) % 360.0, region=None)


def detect_markers(
    image: np.ndarray, panel_box: Box, *, use_net: bool = True, params: MarkerParams | None = None
) -> list[Marker]:
    """Markers drawn on one photographic panel of ``image`` (RGB uint8, H x W x 3).

    ``panel_box`` is in figure pixels (x2/y2 exclusive); every returned box and point is in
    figure pixels too, best confidence first. The caller runs this on image-type panels only.
    ``use_net=False`` gives the rule-based detector alone (for comparison).
    """
    crop = _crop(image, panel_box)
    if crop is None:
        return []
    native, x0, y0 = crop
    p = params or load_params().markers
    shrink = min(1.0, p.max_side / max(native.shape[:2]))
    if shrink < 1.0:
        size = (max(16, round(native.shape[1] * shrink)), max(16, round(native.shape[0] * shrink)))
        native = cv2.resize(native, size, interpolation=cv2.INTER_AREA)
    found = _find(native, p, use_net=use_net)
    cands = found.rules
    if use_net:
        cands, rows = fusion_features(found)
        cands = _choose(found, cands, marker_net.shipped_fusion().probability(rows), p)
    cands = [c for c in cands if not _in_word(found, c)]
    markers = [m for c in cands if (m := _as_marker(c, found, 0, 0)) is not None]
    sx, sy = crop[0].shape[1] / native.shape[1], crop[0].shape[0] / native.shape[0]
    markers = [_in_figure(m, sx, sy, x0, y0) for m in markers]
    markers.sort(key=lambda m: -m.confidence)
    return markers


def _in_figure(marker: Marker, sx: float, sy: float, x0: int, y0: int) -> Marker:
    """A marker found on a (shrunk) crop, in figure pixels."""
    point = (marker.target_point[0] * sx + x0, marker.target_point[1] * sy + y0)
    return replace(
        marker,
        glyph_box=geometry.translate(geometry.scale(marker.glyph_box, sx, sy), x0, y0),
        target_box=geometry.translate(geometry.scale(marker.target_box, sx, sy), x0, y0),
        target_point=point,
    )


# Printed words on a picture (a channel name, a heading, a label) hold letters that pass for
# arrows, arrowheads, stars and rings ("A", "l", "7", "O"): the rules' text test sees only rows of
# three or more letter-sized components of one ink, so two-letter words, coloured words and
# letters that touch slip through. A small glyph of those kinds is a letter when the labels' text
# detector (the DB detector of their OCR engine) finds a line of text on a window around it, across
# or up the picture (a rotated label), that covers ``_WORD_COVER`` of the glyph and runs on past
# it by ``_WORD_MORE`` of the line's thickness (about another letter: the detector's boxes are
# padded, and a lone glyph is often boxed as text on its own). On real-dev tune it dropped 42
# false markers and one that was right by chance (an arrow read in a word); on the real figures
# three false ones and no true one (CHANGELOG.md).
# Boxes and insets are not asked: a small drawn square often starts a text line ("[] Site A").
_WORD_KINDS = ("arrow", "arrowhead", "asterisk", "star", "circle")
_WORD_GLYPH = 64  # px at the native scale: larger glyphs are no letters
_WORD_COVER = 0.5
_WORD_MORE = 0.5
_WORD_SMALL = 160  # a window shorter than this is enlarged twice for the detector


def _in_word(found: _Found, cand: _Cand) -> bool:
    """``cand`` lies in a line of printed text on its panel (module notes above)."""
    if cand.kind not in _WORD_KINDS:
        return False
    native = found.native
    f = native.w / found.panel.w
    x1, y1 = max(0.0, cand.glyph[0] * f), max(0.0, cand.glyph[1] * f)
    x2, y2 = min(float(native.w), cand.glyph[2] * f), min(float(native.h), cand.glyph[3] * f)
    gw, gh = x2 - x1, y2 - y1
    if gw <= 0 or gh <= 0 or max(gw, gh) > _WORD_GLYPH:
        return False
    pad = max(16, math.ceil(1.5 * max(gw, gh)))
    cx1, cy1 = max(0, math.floor(x1) - pad), max(0, math.floor(y1) - pad)
    cx2, cy2 = min(native.w, math.ceil(x2) + pad), min(native.h, math.ceil(y2) + pad)
    window = native.rgb[cy1:cy2, cx1:cx2]
    scale = 2.0 if max(window.shape[:2]) < _WORD_SMALL else 1.0
    if scale != 1.0:
        window = cv2.resize(window, None, fx=scale, fy=scale, interpolation=cv2.INTER_CUBIC)
    for bx1, by1, bx2, by2 in ocr_engine().detect(window):
        tx1, ty1 = cx1 + bx1 / scale, cy1 + by1 / scale
        tx2, ty2 = cx1 + bx2 / scale, cy1 + by2 / scale
        tw, th = tx2 - tx1, ty2 - ty1
        iw = min(tx2, x2) - max(tx1, x1)
        ih = min(ty2, y2) - max(ty1, y1)
        if iw <= 0 or ih <= 0 or iw * ih < _WORD_COVER * gw * gh:
            continue
        # a line across, or one up the picture (a rotated label)
        if (tw > th and tw - gw >= _WORD_MORE * th) or (th > tw and th - gh >= _WORD_MORE * tw):
            return True
    return False


def _crop(image: np.ndarray, panel_box: Box) -> tuple[np.ndarray, int, int] | None:
    """The panel's RGB uint8 pixels and its top-left figure pixel; None below 16 px a side."""
    if image.ndim == 2:
        image = np.stack([image] * 3, axis=-1)
    image = image[..., :3]
    if image.dtype != np.uint8:
        image = np.clip(image, 0, 255).astype(np.uint8)
    fh, fw = image.shape[:2]
    x0 = max(0, math.floor(panel_box[0]))
    y0 = max(0, math.floor(panel_box[1]))
    x1 = min(fw, math.ceil(panel_box[2]))
    y1 = min(fh, math.ceil(panel_box[3]))
    if x1 - x0 < 16 or y1 - y0 < 16:
        return None
    return np.ascontiguousarray(image[y0:y1, x0:x1]), x0, y0


def _as_marker(cand: _Cand, found: _Found, x0: int, y0: int) -> Marker | None:
    """``cand`` (pixels of ``found.panel``) in figure pixels; None when its target box is empty."""
    w, h = found.panel.w, found.panel.h
    sx, sy = found.native.w / w, found.native.h / h  # back to figure pixels (1 unless upscaled)
    tx1, ty1, tx2, ty2 = _target(cand, w, h)
    tx1, ty1 = max(0.0, tx1), max(0.0, ty1)
    tx2, ty2 = min(float(w), tx2), min(float(h), ty2)
    if tx2 - tx1 < 1 or ty2 - ty1 < 1:
        return None
    gx1, gy1, gx2, gy2 = (
        max(0, cand.glyph[0]),
        max(0, cand.glyph[1]),
        min(w, cand.glyph[2]),
        min(h, cand.glyph[3]),
    )
    return Marker(
        kind=cand.kind,
        glyph_box=(gx1 * sx + x0, gy1 * sy + y0, gx2 * sx + x0, gy2 * sy + y0),
        target_point=((cand.point[0] + 0.5) * sx - 0.5 + x0, (cand.point[1] + 0.5) * sy - 0.5 + y0),
        target_box=(tx1 * sx + x0, ty1 * sy + y0, tx2 * sx + x0, ty2 * sy + y0),
        confidence=float(round(min(1.0, cand.score), 4)),
        direction_deg=None if cand.direction is None else float(round(cand.direction, 2)),
        color=cand.color,
    )


def panel_candidates(
    image: np.ndarray,
    panel_box: Box,
    net: marker_net.MarkerNet | None = None,
    params: MarkerParams | None = None,
) -> tuple[list[Marker | None], np.ndarray]:
    """Every candidate the fusion model chooses from on one panel, in figure pixels (None where
    its target box is empty), with its ``FUSION_FEATURES`` row: the training data of the fusion
    model (``train_marker_net --fusion``), measured with ``net`` (the shipped network by
    default)."""
    crop = _crop(image, panel_box)
    if crop is None:
        return [], np.zeros((0, len(FUSION_FEATURES)))
    native, x0, y0 = crop
    found = _find(native, params or load_params().markers, use_net=True, net=net)
    cands, rows = fusion_features(found)
    return [_as_marker(c, found, x0, y0) for c in cands], rows
