"""Indices grouped by the pairs that join them (union-find)."""

from __future__ import annotations

from collections.abc import Iterable


def connected_groups(count: int, pairs: Iterable[tuple[int, int]]) -> list[list[int]]:
    """``0 .. count - 1`` grouped by ``pairs``: each group ascending, groups by their first index."""
    parent = list(range(count))

    def root(k: int) -> int:
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    for a, b in pairs:
        ra, rb = root(a), root(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    groups: dict[int, list[int]] = {}
    for k in range(count):
        groups.setdefault(root(k), []).append(k)
    return [groups[r] for r in sorted(groups)]
