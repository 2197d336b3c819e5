"""The embedding micro-batcher's hook: items per model call and the model's time."""

from __future__ import annotations

from collections.abc import Callable

from p2p.shared.settings import Settings

BatchObserver = Callable[[str, int, float], None]


def observe_batch(kind: str, size: int, seconds: float) -> None:
    from p2p.shared.metrics import registry as m

    m.EMBED_BATCH_SIZE.labels(kind).observe(size)
    m.EMBED_MODEL_SECONDS.labels(kind).observe(seconds)


def batch_observer(settings: Settings) -> BatchObserver | None:
    return observe_batch if settings.metrics.enabled else None
