"""The embedding API's cache of text query embeddings (p2p.embedding_api.text_cache)."""

from __future__ import annotations

import numpy as np
import pytest

from p2p.embedding_api.text_cache import TextCache


def row(value: float) -> np.ndarray:
    return np.full(4, value, dtype=np.float32)


def test_a_repeated_text_is_a_hit_whatever_its_whitespace() -> None:
    cache = TextCache(8)
    assert cache.get("v1", "lung tissue") is None
    cache.put("v1", "lung tissue", row(1.0))
    got = cache.get("v1", "  lung \t tissue\n")
    assert got is not None and np.array_equal(got, row(1.0))
    assert (cache.hits, cache.misses) == (1, 1)
    assert cache.get("v1", "Lung tissue") is None  # case matters to a cased tokenizer


def test_entries_of_one_model_are_not_answers_for_another() -> None:
    cache = TextCache(8)
    cache.put("v1", "lung", row(1.0))
    assert cache.get("v2", "lung") is None


def test_the_cache_is_bounded_and_drops_the_least_recently_used() -> None:
    cache = TextCache(3)
    for i, text in enumerate(("a", "b", "c")):
        cache.put("v1", text, row(i))
    assert cache.get("v1", "a") is not None  # "a" is now the most recent
    cache.put("v1", "d", row(3.0))
    assert len(cache) == 3
    assert cache.get("v1", "b") is None
    assert all(cache.get("v1", t) is not None for t in ("a", "c", "d"))
    off = TextCache(0)
    off.put("v1", "a", row(0.0))
    assert len(off) == 0 and off.get("v1", "a") is None
    with pytest.raises(ValueError):
        TextCache(-1)


def test_cached_rows_cannot_be_changed_through_the_caller_or_the_answer() -> None:
    cache = TextCache(2)
    given = row(1.0)
    cache.put("v1", "a", given)
    given[:] = 9.0
    got = cache.get("v1", "a")
    assert got is not None and np.array_equal(got, row(1.0))
    with pytest.raises(ValueError):
        got[0] = 5.0


def test_clear_empties_it() -> None:
    cache = TextCache(4)
    cache.put("v1", "a", row(1.0))
    cache.clear()
    assert len(cache) == 0 and cache.get("v1", "a") is None
    assert cache.stats()["entries"] == 0
