"""Where a queued job's message is: still waiting on its queue, reserved by a worker, or gone.

The recovery sweep asks this before it sends a queued job again. Without it, the only rule is time
(a job not started ``requeue_after_s`` after it was sent has lost its message), and under a real
backlog a job simply waits longer than that: the sweep then sends duplicates of messages that are
still on the broker (a 5,000-figure load run ended with 5,304 mining task runs and 729 messages on
the queue), which waste worker time and inflate the queue depth that the autoscaler scales on.

kombu's Redis transport keeps one list per queue and priority (``<queue>`` and
``<queue>\\x06\\x16<step>``, see :mod:`p2p.shared.metrics.broker`), pushed on the left and taken
from the right, so each list is in publish order and its last element is its oldest. A message
delivered to a worker and not yet acknowledged (prefetched, or its task running) sits in the
``unacked`` hash, its delivery time in the ``unacked_index`` sorted set. One snapshot per queue
(one MULTI/EXEC round trip, taken once per sweep) reads each list's oldest ``SCAN_MESSAGES``
messages and the whole ``unacked`` hash, and a job is then:

- **reserved** when a message for it is in ``unacked`` (the sweep still re-sends it once it has
  been reserved ``requeue_after_s`` without starting: the worker that took it is gone, and Redis
  would only hand it back after the visibility timeout, an hour by default);
- **waiting** when a message for it is in the scanned part of a list, or may be in the part not
  scanned: a list longer than the scan whose newest scanned message was published no later than
  the job was sent (plus ``CLOCK_SKEW_S`` for publishers' clocks) could hold it further on;
- **absent** otherwise: every list either was read whole without it, or its scanned messages reach
  past the job's send time, so by FIFO order its message would have been among them.

A message's publish time is the ``p2p_published_at`` header (:func:`p2p.shared.queue.stamp_published`);
a message without it counts as old (so a list holding one is never taken to prove absence beyond
what was scanned). A message's job is its task's first argument (every durable job's task takes its
id first).

The view answers None (the caller falls back to the time rule) where the broker cannot be read:
the embedded profile's in-process queue (its messages live in the memory of the process, and the
sweep runs in that process), a broker that is not Redis, or a Redis that does not answer.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, Protocol

import redis

from p2p.shared.metrics.broker import UNACKED_KEY, open_client, priority_lists
from p2p.shared.queue import PUBLISHED_HEADER, CeleryDispatcher

log = logging.getLogger(__name__)

UNACKED_INDEX_KEY = "unacked_index"  # kombu's Channel.unacked_index_key: delivery time per tag
# How many of a list's oldest messages one snapshot reads (a message is 1-2 kB): past a backlog
# this long, the publish-time order decides.
SCAN_MESSAGES = 2000
# Publishers' clocks may differ by this much: a message stamped up to this long after the job was
# sent may still be older than it.
CLOCK_SKEW_S = 5.0
REDIS_SCHEMES = ("redis://", "rediss://", "unix://")

Where = Literal["waiting", "reserved", "absent"]


@dataclass(frozen=True)
class Sighting:
    where: Where
    detail: str  # for the sweep's reason text: what was seen
    reserved_for_s: float | None = None  # reserved: seconds since a worker took the message


class BrokerView(Protocol):
    def locate(self, queue: str, job_id: uuid.UUID, sent_at: datetime) -> Sighting | None:
        """Where the message of ``job_id``, sent to ``queue`` at ``sent_at``, is; None: cannot tell."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class _Message:
    job: str | None  # the task's first argument
    published: float | None  # p2p_published_at


@dataclass
class _ListSnapshot:
    key: str
    depth: int
    scanned: list[_Message]  # the oldest messages, oldest first
    jobs: frozenset[str] = frozenset()  # their jobs

    @property
    def whole(self) -> bool:
        return len(self.scanned) >= self.depth


@dataclass
class _QueueSnapshot:
    lists: list[_ListSnapshot]
    reserved: dict[str, float]  # job id -> when its message was delivered (epoch seconds)
    taken_at: float = field(default_factory=time.time)


def _payload_message(payload: Any) -> _Message:
    """The job id and publish time of one kombu message payload (a dict), tolerant of strangers."""
    if not isinstance(payload, dict):
        return _Message(None, None)
    headers = payload.get("headers") or {}
    stamp = headers.get(PUBLISHED_HEADER) if isinstance(headers, dict) else None
    try:
        published = float(stamp) if stamp is not None else None
    except (TypeError, ValueError):
        published = None
    return _Message(_first_arg(payload), published)


def _first_arg(payload: dict[str, Any]) -> str | None:
    body: Any = payload.get("body")
    try:
        if (payload.get("properties") or {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        decoded = json.loads(body)
    except (TypeError, ValueError, binascii.Error):
        return None
    # Celery's protocol 2 body is [args, kwargs, embed]; protocol 1 a dict with "args".
    args = decoded[0] if isinstance(decoded, list) and decoded else None
    if isinstance(decoded, dict):
        args = decoded.get("args")
    return str(args[0]) if isinstance(args, list) and args else None


def _parse(raw: bytes | str) -> Any:
    try:
        return json.loads(raw)
    except (TypeError, ValueError):
        return None


class RedisBrokerView:
    """Reads kombu's Redis keys; one snapshot per queue for the life of the view (one sweep)."""

    def __init__(self, client: redis.Redis, *, scan_messages: int = SCAN_MESSAGES) -> None:
        self.client, self.scan_messages = client, scan_messages
        self._snapshots: dict[str, _QueueSnapshot | None] = {}

    def close(self) -> None:
        self.client.close()

    def _snapshot(self, queue: str) -> _QueueSnapshot | None:
        if queue not in self._snapshots:
            try:
                self._snapshots[queue] = self._read(queue)
            except redis.RedisError as exc:
                log.warning("cannot read queue %s from the broker (%s): the time rule decides", queue, exc)
                self._snapshots[queue] = None
        return self._snapshots[queue]

    def _read(self, queue: str) -> _QueueSnapshot:
        keys = priority_lists(queue)
        pipe = self.client.pipeline(transaction=True)  # one consistent view: lists and unacked
        for key in keys:
            pipe.llen(key)
            pipe.lrange(key, -self.scan_messages, -1)
        pipe.hgetall(UNACKED_KEY)
        pipe.zrange(UNACKED_INDEX_KEY, 0, -1, withscores=True)
        answers = pipe.execute()
        lists = []
        for index, key in enumerate(keys):
            depth, raws = int(answers[2 * index]), answers[2 * index + 1]
            # LRANGE gives newest first within the range; the list's oldest is its last element.
            scanned = [_payload_message(_parse(raw)) for raw in reversed(raws)]
            jobs = frozenset(message.job for message in scanned if message.job is not None)
            lists.append(_ListSnapshot(key, depth, scanned, jobs))
        unacked, index_scores = answers[-2], answers[-1]
        delivered = {_text(tag): float(score) for tag, score in index_scores}
        reserved: dict[str, float] = {}
        for tag, raw in unacked.items():
            entry = _parse(raw)  # [message payload, exchange, routing key]
            if not isinstance(entry, list) or not entry:
                continue
            message = _payload_message(entry[0])
            if message.job is not None:
                reserved[message.job] = delivered.get(_text(tag), time.time())
        return _QueueSnapshot(lists, reserved)

    def locate(self, queue: str, job_id: uuid.UUID, sent_at: datetime) -> Sighting | None:
        snapshot = self._snapshot(queue)
        if snapshot is None:
            return None
        job = str(job_id)
        if job in snapshot.reserved:
            held = max(snapshot.taken_at - snapshot.reserved[job], 0.0)
            return Sighting("reserved", f"reserved by a worker {held:.0f} s ago", held)
        sent = sent_at.timestamp()
        seen: list[str] = []
        for lst in snapshot.lists:
            if job in lst.jobs:
                return Sighting("waiting", f"its message is on {lst.key!r} ({lst.depth} waiting)")
            if lst.whole:
                if lst.depth:
                    seen.append(f"all {lst.depth} on {lst.key!r} read")
                continue
            newest = lst.scanned[-1].published if lst.scanned else None
            if newest is None or newest <= sent + CLOCK_SKEW_S:
                unread = lst.depth - len(lst.scanned)
                return Sighting("waiting", f"it may be among the {unread} newest on {lst.key!r}, not read")
            seen.append(f"the oldest {len(lst.scanned)} of {lst.depth} on {lst.key!r}, sent after it, read")
        where = "; ".join(seen) if seen else f"queue {queue!r} empty"
        return Sighting("absent", f"not on the broker ({where}) nor reserved by a worker")


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def open_broker_view(runtime: Any) -> BrokerView | None:
    """A view of the runtime's broker, or None where it cannot be inspected (see the module doc)."""
    dispatcher = runtime.dispatcher
    if not isinstance(dispatcher, CeleryDispatcher):
        return None  # in-process queue: its messages are this process's memory
    url = dispatcher.broker_url
    if not url.startswith(REDIS_SCHEMES):
        return None  # another transport: its keys are not kombu's Redis lists
    return RedisBrokerView(open_client(url), scan_messages=SCAN_MESSAGES)
