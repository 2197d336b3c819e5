"""Find where a received image lies in a known figure.

The received image is assumed to be ``resize(figure[crop])`` (possibly with numbered boxes drawn
on it). A :class:`Placement` holds the crop origin and the per-axis scale, so a figure point maps to
the received frame as ``u = (x - ox) * sx``, ``v = (y - oy) * sy`` (continuous pixel-edge
coordinates, exclusive box corners).

Strategy: candidate estimates (whole figure; SIFT matches + RANSAC similarity; multi-scale template
matching), each refined with ECC (affine, sub-pixel) against the figure pre-scaled near the received
scale; the candidate with the best ECC correlation wins.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import cv2
import numpy as np

Box = tuple[float, float, float, float]

MIN_SCORE = 0.45  # ECC correlation below which a location is rejected (drawn marks lower it)
GOOD_SCORE = 0.985  # a candidate this good ends the search
WORK_SIDE = 480  # received images are located at most this large


@dataclass(frozen=True)
class Placement:
    ox: float
    oy: float
    sx: float
    sy: float
    width: int  # received image size
    height: int
    score: float = 1.0

    @property
    def view(self) -> Box:
        """The part of the figure the received image shows, in figure coordinates."""
        return (self.ox, self.oy, self.ox + self.width / self.sx, self.oy + self.height / self.sy)

    def to_received(self, box: Box) -> Box:
        x1, y1, x2, y2 = box
        return (
            (x1 - self.ox) * self.sx,
            (y1 - self.oy) * self.sy,
            (x2 - self.ox) * self.sx,
            (y2 - self.oy) * self.sy,
        )

    def to_figure(self, box: Box) -> Box:
        u1, v1, u2, v2 = box
        return (
            u1 / self.sx + self.ox,
            v1 / self.sy + self.oy,
            u2 / self.sx + self.ox,
            v2 / self.sy + self.oy,
        )

    def point_to_received(self, x: float, y: float) -> tuple[float, float]:
        return ((x - self.ox) * self.sx, (y - self.oy) * self.sy)


def to_gray(image: np.ndarray) -> np.ndarray:
    if image.ndim == 3:
        if image.shape[2] == 4:
            image = image[:, :, :3]
        image = cv2.cvtColor(np.ascontiguousarray(image), cv2.COLOR_RGB2GRAY)
    return np.ascontiguousarray(image.astype(np.float32))


class FigureIndex:
    """A figure prepared for locating: gray pixels and SIFT features (computed once)."""

    def __init__(self, image: np.ndarray) -> None:
        self.gray = to_gray(image)
        self.height, self.width = self.gray.shape
        self._sift = cv2.SIFT_create(nfeatures=4000)  # type: ignore[attr-defined]
        kp, desc = self._sift.detectAndCompute(self.gray.astype(np.uint8), None)
        self.points = np.array([k.pt for k in kp], dtype=np.float32).reshape(-1, 2)
        self.descriptors = desc
        self._scaled: dict[int, np.ndarray] = {}

    def scaled(self, factor: float) -> tuple[np.ndarray, float, float]:
        """The figure downscaled near ``factor`` (<= 1), with the exact per-axis factors."""
        key = max(1, min(100, round(factor * 100)))
        if key >= 100:
            return self.gray, 1.0, 1.0
        img = self._scaled.get(key)
        if img is None:
            w = max(8, round(self.width * key / 100))
            h = max(8, round(self.height * key / 100))
            img = cv2.resize(self.gray, (w, h), interpolation=cv2.INTER_AREA)
            self._scaled[key] = img
        return img, img.shape[1] / self.width, img.shape[0] / self.height


def locate(index: FigureIndex, received: np.ndarray, hints: list[Box] | None = None) -> Placement | None:
    """Where ``received`` (RGB or gray pixels) lies in the indexed figure, or None.

    ``hints``: figure boxes the image may show (the figure's panels): tried first, since a panel
    crop of a plain chart has too little texture for features or a coarse template search."""
    gray = to_gray(received)
    rh, rw = gray.shape
    if rw < 4 or rh < 4:
        return None
    if max(rw, rh) > WORK_SIDE:  # locate a smaller copy: faster, and still sub-pixel in the figure
        g = WORK_SIDE / max(rw, rh)
        small = cv2.resize(gray, (max(4, round(rw * g)), max(4, round(rh * g))), interpolation=cv2.INTER_AREA)
        found = _locate_gray(index, small, hints)
        if found is None:
            return None
        gx, gy = small.shape[1] / rw, small.shape[0] / rh
        return Placement(found.ox, found.oy, found.sx / gx, found.sy / gy, rw, rh, found.score)
    return _locate_gray(index, gray, hints)


def _locate_gray(index: FigureIndex, gray: np.ndarray, hints: list[Box] | None = None) -> Placement | None:
    best: Placement | None = None
    for candidate in _candidates(index, gray, hints or []):
        refined = _refine(index, gray, candidate)
        if refined is not None and (best is None or refined.score > best.score):
            best = refined
        if best is not None and best.score >= GOOD_SCORE:
            break
    if best is None or best.score < MIN_SCORE:
        return None
    return best


def _candidates(index: FigureIndex, gray: np.ndarray, hints: list[Box]) -> Iterator[Placement]:
    rh, rw = gray.shape
    fw, fh = index.width, index.height
    if abs((rw / rh) / (fw / fh) - 1.0) < 0.08:
        yield Placement(0.0, 0.0, rw / fw, rh / fh, rw, rh, 0.0)
    for x1, y1, x2, y2 in hints:
        w, h = x2 - x1, y2 - y1
        if w > 4 and h > 4 and abs((rw / rh) / (w / h) - 1.0) < 0.15:
            yield Placement(x1, y1, rw / w, rh / h, rw, rh, 0.0)
    features = _feature_estimate(index, gray)
    if features is not None:
        yield features
    yield from _template_estimates(index, gray)


def _feature_estimate(index: FigureIndex, gray: np.ndarray) -> Placement | None:
    rh, rw = gray.shape
    if index.descriptors is None or len(index.points) < 4:
        return None
    kp, desc = index._sift.detectAndCompute(gray.astype(np.uint8), None)
    if desc is None or len(kp) < 4:
        return None
    matcher = cv2.BFMatcher(cv2.NORM_L2)
    pairs = matcher.knnMatch(desc, index.descriptors, k=2)
    good = [p[0] for p in pairs if len(p) == 2 and p[0].distance < 0.75 * p[1].distance]
    if len(good) < 4:
        return None
    src = np.array([kp[m.queryIdx].pt for m in good], dtype=np.float32)
    dst = index.points[[m.trainIdx for m in good]]
    matrix, inliers = cv2.estimateAffinePartial2D(
        src, dst, method=cv2.RANSAC, ransacReprojThreshold=3.0, maxIters=4000
    )
    if matrix is None or inliers is None or int(inliers.sum()) < 4:
        return None
    scale = float(np.hypot(matrix[0, 0], matrix[1, 0]))  # received -> figure
    if not 0.02 < scale < 50:
        return None
    s = 1.0 / scale
    # pixel centres: x + 0.5 = (u + 0.5) / s + ox
    ox = float(matrix[0, 2]) + 0.5 - 0.5 * scale
    oy = float(matrix[1, 2]) + 0.5 - 0.5 * scale
    return Placement(ox, oy, s, s, rw, rh, 0.0)


def _template_estimates(index: FigureIndex, gray: np.ndarray, keep: int = 3) -> list[Placement]:
    rh, rw = gray.shape
    results: list[tuple[float, Placement]] = []
    s = 0.25
    while s <= 12.0:
        tw, th = rw / s, rh / s  # size of the crop in figure pixels
        if tw <= index.width and th <= index.height and min(tw, th) >= 6:
            work = min(1.0, 160.0 / max(tw, th))
            fig, fx, fy = index.scaled(work)
            tpl_w, tpl_h = max(4, round(tw * fx)), max(4, round(th * fy))
            if tpl_w <= fig.shape[1] and tpl_h <= fig.shape[0]:
                tpl = cv2.resize(gray, (tpl_w, tpl_h), interpolation=cv2.INTER_AREA)
                if float(tpl.std()) > 1.0:
                    res = cv2.matchTemplate(fig, tpl, cv2.TM_CCOEFF_NORMED)
                    _, score, _, loc = cv2.minMaxLoc(res)
                    sx, sy = rw / (tpl_w / fx), rh / (tpl_h / fy)
                    results.append((float(score), Placement(loc[0] / fx, loc[1] / fy, sx, sy, rw, rh, 0.0)))
        s *= 1.07
    results.sort(key=lambda r: -r[0])
    return [p for _, p in results[:keep]]


def _refine(index: FigureIndex, gray: np.ndarray, start: Placement) -> Placement | None:
    rh, rw = gray.shape
    factor = min(1.0, max(start.sx, start.sy) * 1.25)
    fig, fx, fy = index.scaled(factor)
    # warp maps received pixel centres (u) to scaled-figure pixel centres (p):
    # p + 0.5 = fx * ((u + 0.5) / sx + ox)
    ax, ay = fx / start.sx, fy / start.sy
    warp = np.array(
        [[ax, 0.0, fx * start.ox + 0.5 * ax - 0.5], [0.0, ay, fy * start.oy + 0.5 * ay - 0.5]],
        dtype=np.float32,
    )
    criteria = (cv2.TERM_CRITERIA_EPS | cv2.TERM_CRITERIA_COUNT, 80, 1e-6)
    blur = 3 if min(rw, rh) >= 24 else 1
    try:
        score, warp = cv2.findTransformECC(  # type: ignore[call-overload]
            gray, fig, warp, cv2.MOTION_AFFINE, criteria, None, blur
        )
    except cv2.error:
        return None
    a, d = float(warp[0, 0]), float(warp[1, 1])
    if a <= 0 or d <= 0 or abs(float(warp[0, 1])) > 0.05 * a or abs(float(warp[1, 0])) > 0.05 * d:
        return None
    sx, sy = fx / a, fy / d
    if not 0.6 < sx / sy < 1.67:  # resizing to multiples of 28 distorts a little, never this much
        return None
    ox = (float(warp[0, 2]) + 0.5 - 0.5 * a) / fx
    oy = (float(warp[1, 2]) + 0.5 - 0.5 * d) / fy
    place = Placement(ox, oy, sx, sy, rw, rh, float(score))
    vx1, vy1, vx2, vy2 = place.view
    slack = 3.0 + 2.0 / min(sx, sy)
    if vx1 < -slack or vy1 < -slack or vx2 > index.width + slack or vy2 > index.height + slack:
        return None
    return place
