"""Per-key rate limits on write routes: a fixed window per key, counted in Redis when the
deployment has one (shared by every API replica), else in the process (embedded profile).

Over the limit a request gets 429 with Retry-After (seconds to the next window). A limiter that
cannot reach Redis lets requests through: losing the broker must not also stop writes that the
API can still take (they get their own 503 when they need the broker).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Protocol

import redis

from p2p.shared.errors import P2PError

log = logging.getLogger(__name__)


class RateLimited(P2PError):
    status_code = 429
    error_type = "rate_limited"


class RateLimiter(Protocol):
    def hit(self, key: str) -> int | None:
        """Count one request of ``key``; None when allowed, else seconds until it may retry."""
        ...


class MemoryWindow:
    def __init__(self, limit: int, window_s: int) -> None:
        self.limit, self.window_s = limit, window_s
        self._counts: dict[tuple[str, int], int] = {}
        self._lock = threading.Lock()

    def hit(self, key: str) -> int | None:
        now = time.time()
        window = int(now // self.window_s)
        with self._lock:
            if len(self._counts) > 10_000:  # old windows: dropped wholesale, they are over anyway
                self._counts = {k: v for k, v in self._counts.items() if k[1] == window}
            count = self._counts.get((key, window), 0) + 1
            self._counts[(key, window)] = count
        if count <= self.limit:
            return None
        return max(1, int((window + 1) * self.window_s - now + 0.999))


class RedisWindow:
    def __init__(self, url: str, limit: int, window_s: int) -> None:
        self.limit, self.window_s = limit, window_s
        self._client = redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=1)

    def hit(self, key: str) -> int | None:
        now = time.time()
        window = int(now // self.window_s)
        name = f"p2p:ratelimit:{key}:{window}"
        try:
            pipe = self._client.pipeline()
            pipe.incr(name)
            pipe.expire(name, self.window_s + 1)
            count = int(pipe.execute()[0])
        except redis.exceptions.RedisError as exc:
            log.warning("rate limiter cannot reach Redis (%s); letting the request through", exc)
            return None
        if count <= self.limit:
            return None
        return max(1, int((window + 1) * self.window_s - now + 0.999))


def check(limiter: RateLimiter | None, key: str) -> None:
    if limiter is None:
        return
    retry_after = limiter.hit(key)
    if retry_after is not None:
        raise RateLimited(
            f"too many write requests for {key}; retry in {retry_after} s",
            headers={"Retry-After": str(retry_after)},
        )
