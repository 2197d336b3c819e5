"""What waits in the broker, read straight from Redis the way kombu stores it.

kombu's Redis transport keeps each queue as a list named after the queue, new messages pushed on
the left and taken from the right, so the oldest message is the list's last element. A message
sent with a priority goes to a sub-list ``<queue>\\x06\\x16<step>`` (steps 3, 6, 9; step 0 is the
plain list): every sub-list is counted. Messages delivered but not yet acknowledged sit in the
``unacked`` hash until their task ends.

A message's age comes from the ``p2p_published_at`` header that every task message gets at publish
time (``p2p.shared.queue.stamp_published``): Celery's own headers carry no send time.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass

import redis

from p2p.shared.queue import (
    EMBEDDING_QUEUE,
    INGEST_QUEUE,
    MINING_LVLM_QUEUE,
    MINING_QUEUE,
    PUBLISHED_HEADER,
    TRAINING_QUEUE,
)

QUEUES = (INGEST_QUEUE, MINING_QUEUE, MINING_LVLM_QUEUE, EMBEDDING_QUEUE, TRAINING_QUEUE)
PRIORITY_SEP = "\x06\x16"
PRIORITY_STEPS = (0, 3, 6, 9)
UNACKED_KEY = "unacked"


@dataclass(frozen=True)
class QueueState:
    name: str
    depth: int
    oldest_age_s: float | None  # None: empty, or its oldest message carries no publish time
    oldest_task: str | None = None


def priority_lists(queue: str) -> list[str]:
    return [queue if step == 0 else f"{queue}{PRIORITY_SEP}{step}" for step in PRIORITY_STEPS]


def _published(raw: bytes | None) -> tuple[float | None, str | None]:
    if raw is None:
        return None, None
    try:
        headers = json.loads(raw).get("headers") or {}
        stamp = headers.get(PUBLISHED_HEADER)
        return (float(stamp) if stamp is not None else None), headers.get("task")
    except (ValueError, TypeError, AttributeError):
        return None, None


def read_queues(
    client: redis.Redis, queues: Iterable[str] = QUEUES, *, now: float | None = None
) -> list[QueueState]:
    """Depth and oldest-message age of each queue, in one round trip."""
    names = list(queues)
    pipe = client.pipeline(transaction=False)
    for queue in names:
        for key in priority_lists(queue):
            pipe.llen(key)
            pipe.lindex(key, -1)
    answers = pipe.execute()
    now = time.time() if now is None else now
    states = []
    per_queue = 2 * len(PRIORITY_STEPS)
    for index, queue in enumerate(names):
        chunk = answers[index * per_queue : (index + 1) * per_queue]
        depth = sum(int(n) for n in chunk[0::2])
        oldest = [_published(raw) for raw in chunk[1::2]]
        stamped = [(stamp, task) for stamp, task in oldest if stamp is not None]
        first = min(stamped, default=(None, None), key=lambda pair: pair[0] or 0.0)
        age = max(now - first[0], 0.0) if first[0] is not None else None
        states.append(QueueState(queue, depth, age, first[1]))
    return states


def unacked(client: redis.Redis) -> int:
    return int(client.hlen(UNACKED_KEY))


def open_client(url: str) -> redis.Redis:
    """A short-lived client: the caller closes it, so no socket outlives a scrape (or a fork)."""
    return redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=5)
