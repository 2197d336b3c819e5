"""Publishing tasks to Redis through the Celery dispatcher, against the test session's Redis."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
import redis

from p2p.shared.queue import MINE_FIGURE_TASK, CeleryDispatcher, configure_celery
from p2p.shared.settings import Settings


def test_publishes_reuse_the_channels_redis_client_and_every_message_arrives(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kombu built a redis client for every publish; the dispatcher's channels keep theirs."""
    dispatcher = CeleryDispatcher(configure_celery(Settings(redis={"url": redis_url})), redis_url)
    reader = redis.Redis.from_url(redis_url)
    queue = f"test-publish-{uuid.uuid4().hex}"
    try:
        dispatcher.send(MINE_FIGURE_TASK, args=["first"], queue=queue)  # connection, channel, client
        built: list[int] = []
        real_init = redis.Redis.__init__

        def counting(self: redis.Redis, *args: Any, **kwargs: Any) -> None:
            built.append(1)
            real_init(self, *args, **kwargs)

        monkeypatch.setattr(redis.Redis, "__init__", counting)
        for i in range(5):
            assert dispatcher.send(MINE_FIGURE_TASK, args=[f"job-{i}"], queue=queue)
        monkeypatch.undo()
        assert built == []
        messages = [json.loads(raw) for raw in reader.lrange(queue, 0, -1)]
        assert sorted(m["headers"]["argsrepr"] for m in messages) == sorted(
            repr([name]) for name in ["first", *(f"job-{i}" for i in range(5))]
        )
    finally:
        reader.delete(queue)
        reader.close()
        dispatcher.close()
