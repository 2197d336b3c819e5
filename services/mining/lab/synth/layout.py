"""Figure layouts: regular grids, rows/columns of unequal panels and recursive (guillotine) splits.

A layout is a list of cells (exclusive integer rectangles) in reading order; cells never overlap and
neighbouring cells are exactly ``gutter`` pixels apart (0 = touching). Guillotine splits produce the
irregular arrangements papers use: a large panel spanning several rows next to a stack of small
ones, mixed rows, and so on.
"""

from __future__ import annotations

import math

import numpy as np

from p2p.mining.lab.synth.util import Rect

LAYOUT_KINDS = ("grid", "rows", "columns", "guillotine")


def _split_span(a: int, b: int, weights: list[float], gutter: int) -> list[tuple[int, int]]:
    """Split [a, b) into len(weights) pieces with ``gutter`` pixels between them."""
    k = len(weights)
    avail = (b - a) - gutter * (k - 1)
    total = float(sum(weights))
    spans, acc = [], 0.0
    start = a
    for i, wgt in enumerate(weights):
        acc += wgt
        end = a + round(avail * acc / total) + gutter * i if i < k - 1 else b
        spans.append((start, end))
        start = end + gutter
    return spans


def _grid(rng: np.random.Generator, area: Rect, n: int, gutter: int) -> list[Rect]:
    w, h = area[2] - area[0], area[3] - area[1]
    best = None
    for cols in range(1, n + 1):
        rows = math.ceil(n / cols)
        cell_aspect = ((w - gutter * (cols - 1)) / cols) / max(1.0, (h - gutter * (rows - 1)) / rows)
        score = abs(math.log(max(cell_aspect, 1e-3) / float(rng.uniform(0.9, 1.6)))) + 0.15 * (
            rows * cols - n
        )
        if best is None or score < best[0]:
            best = (score, cols, rows)
    assert best is not None
    _, cols, rows = best
    row_spans = _split_span(area[1], area[3], [1.0] * rows, gutter)
    col_spans = _split_span(area[0], area[2], [1.0] * cols, gutter)
    cells: list[Rect] = []
    stretch_last = rng.random() < 0.5
    for y0, y1 in row_spans:
        left = n - len(cells)
        if left <= 0:
            break
        if left < cols and stretch_last:  # the short last row spans the full width
            for x0, x1 in _split_span(area[0], area[2], [1.0] * left, gutter):
                cells.append((x0, y0, x1, y1))
        else:
            for x0, x1 in col_spans[: min(cols, left)]:
                cells.append((x0, y0, x1, y1))
    return cells


def _partition(rng: np.random.Generator, n: int, k: int) -> list[int]:
    counts = [1] * k
    for _ in range(n - k):
        counts[int(rng.integers(k))] += 1
    return counts


def _rows(rng: np.random.Generator, area: Rect, n: int, gutter: int, transpose: bool) -> list[Rect]:
    n_rows = max(1, min(n, round(math.sqrt(n) * float(rng.uniform(0.7, 1.3)))))
    counts = _partition(rng, n, n_rows)
    lo, hi = (area[0], area[2]) if transpose else (area[1], area[3])
    row_weights = [float(rng.uniform(0.7, 1.4)) for _ in counts]
    cells: list[Rect] = []
    for (a, b), k in zip(_split_span(lo, hi, row_weights, gutter), counts, strict=True):
        weights = [float(rng.uniform(0.6, 1.6)) for _ in range(k)]
        if transpose:
            for y0, y1 in _split_span(area[1], area[3], weights, gutter):
                cells.append((a, y0, b, y1))
        else:
            for x0, x1 in _split_span(area[0], area[2], weights, gutter):
                cells.append((x0, a, x1, b))
    return cells


def _guillotine(rng: np.random.Generator, rect: Rect, n: int, gutter: int) -> list[Rect]:
    if n <= 1:
        return [rect]
    w, h = rect[2] - rect[0], rect[3] - rect[1]
    vertical_stack = h * float(rng.uniform(0.7, 1.5)) > w
    k = 2 if n == 2 or rng.random() < 0.6 else 3
    counts = _partition(rng, n, k)
    weights = [c ** float(rng.uniform(0.5, 1.0)) * float(rng.uniform(0.8, 1.25)) for c in counts]
    out: list[Rect] = []
    if vertical_stack:
        for (y0, y1), c in zip(_split_span(rect[1], rect[3], weights, gutter), counts, strict=True):
            out.extend(_guillotine(rng, (rect[0], y0, rect[2], y1), c, gutter))
    else:
        for (x0, x1), c in zip(_split_span(rect[0], rect[2], weights, gutter), counts, strict=True):
            out.extend(_guillotine(rng, (x0, rect[1], x1, rect[3]), c, gutter))
    return out


def make_layout(rng: np.random.Generator, area: Rect, n: int, gutter: int, kind: str) -> list[Rect]:
    """``n`` cells inside ``area`` in reading order."""
    if kind == "grid":
        return _grid(rng, area, n, gutter)
    if kind == "rows":
        return _rows(rng, area, n, gutter, transpose=False)
    if kind == "columns":
        return _rows(rng, area, n, gutter, transpose=True)
    return _guillotine(rng, area, n, gutter)


def split_group(rng: np.random.Generator, rect: Rect, gap: int) -> tuple[str, list[Rect]]:
    """Sub-images of a nested group printed under one label: a strip, a stack or big + two small."""
    w, h = rect[2] - rect[0], rect[3] - rect[1]
    arrangement = str(rng.choice(["strip", "stack", "big_small"]))
    if arrangement == "stack" and h < 80:
        arrangement = "strip"
    if arrangement == "strip" and w < 100:
        arrangement = "stack"
    if arrangement == "big_small" and (w < 120 or h < 70):
        arrangement = "strip"
    if arrangement == "strip":
        k = 2 if w < 220 else int(rng.integers(2, 4))
        subs = [(x0, rect[1], x1, rect[3]) for x0, x1 in _split_span(rect[0], rect[2], [1.0] * k, gap)]
    elif arrangement == "stack":
        subs = [(rect[0], y0, rect[2], y1) for y0, y1 in _split_span(rect[1], rect[3], [1.0, 1.0], gap)]
    else:
        (ax0, ax1), (bx0, bx1) = _split_span(rect[0], rect[2], [2.0, 1.0], gap)
        subs = [(ax0, rect[1], ax1, rect[3])]
        subs += [(bx0, y0, bx1, y1) for y0, y1 in _split_span(rect[1], rect[3], [1.0, 1.0], gap)]
    return arrangement, subs
