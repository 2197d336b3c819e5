"""Embeddings of recent text queries, so a repeated search skips the text tower.

Keyed by the served model (its version id, or its name while the space has none) and the query
text with runs of whitespace collapsed (the tokenizers split on whitespace, so such texts embed
alike). Bounded: the least recently used entry goes first. Each served model state owns its cache,
and :meth:`TextCache.clear` empties it when the space activates another version.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np

DEFAULT_ENTRIES = 4096


def normalised(text: str) -> str:
    return " ".join(text.split())


class TextCache:
    def __init__(self, max_entries: int = DEFAULT_ENTRIES) -> None:
        if max_entries < 0:
            raise ValueError(f"max_entries must not be negative, got {max_entries}")
        self.max_entries = int(max_entries)
        self._rows: OrderedDict[tuple[str, str], np.ndarray] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._rows)

    def get(self, model: str, text: str) -> np.ndarray | None:
        key = (model, normalised(text))
        with self._lock:
            row = self._rows.get(key)
            if row is None:
                self.misses += 1
                return None
            self._rows.move_to_end(key)
            self.hits += 1
            return row

    def put(self, model: str, text: str, vector: np.ndarray) -> None:
        if self.max_entries == 0:
            return
        row = np.array(vector, dtype=np.float32)  # a copy no caller can change
        row.setflags(write=False)
        with self._lock:
            self._rows[(model, normalised(text))] = row
            self._rows.move_to_end((model, normalised(text)))
            while len(self._rows) > self.max_entries:
                self._rows.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._rows.clear()

    def stats(self) -> dict[str, int]:
        return {
            "entries": len(self._rows),
            "max_entries": self.max_entries,
            "hits": self.hits,
            "misses": self.misses,
        }
