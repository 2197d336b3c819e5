"""The recovery sweep reads the broker before it re-sends a queued job: a job waiting its turn under a
backlog (its message still on a queue list, a priority list included, or reserved by a worker) is
left alone however long it has waited; a job whose message is gone is sent again, with the reason.

A real Celery dispatcher publishes to a redis-server of the test's own (queue names are fixed, so no
other run may share its lists); a worker's reservation is made by kombu itself (``basic_get``
without an ack puts the message in the ``unacked`` hash, as a prefetching worker does)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from p2p.cli.main import app as cli_app
from p2p.ingest.app import create_app
from p2p.ingest.samples import make_figure
from p2p.shared import broker_view
from p2p.shared.db.models import JobStatus, MiningJob
from p2p.shared.metrics.broker import PRIORITY_SEP, open_client
from p2p.shared.queue import MINE_FIGURE_TASK, MINING_QUEUE, PUBLISHED_HEADER, CeleryDispatcher
from p2p.shared.recovery import recover
from p2p.shared.runtime import Runtime
from p2p.shared.settings import get_settings
from tests.conftest import RuntimeFactory
from tests.helpers import upload
from tests.test_faults import OwnRedis

LONG_AGO = timedelta(hours=2)  # far beyond requeue_after_s (900 s by default)


@pytest.fixture
def store_kind() -> str:
    return "local"


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[OwnRedis]:
    server = OwnRedis(tmp_path / "redis", persistent=False).start()
    yield server
    server.stop()


@pytest.fixture
def broker_runtime(make_runtime: RuntimeFactory, own_redis: OwnRedis) -> Runtime:
    """Ingest publishing to Redis through Celery; no worker consumes the mining queue."""
    runtime = make_runtime(redis={"url": own_redis.url})
    assert isinstance(runtime.dispatcher, CeleryDispatcher)
    return runtime


def _queue_job(runtime: Runtime, seed: int) -> uuid.UUID:
    sample = make_figure(seed, panel_size=(96, 80))
    with TestClient(create_app(runtime=runtime)) as client:
        body = upload(client, sample.image, caption=sample.caption, filename=sample.name).json()
    return uuid.UUID(body["job_id"])


def _sent_long_ago(runtime: Runtime, job_id: uuid.UUID) -> None:
    """The job has waited far longer than requeue_after_s (a backlog, or a lost message)."""
    with runtime.session() as session:
        job = session.get(MiningJob, job_id)
        assert job is not None and job.status is JobStatus.QUEUED
        job.created_at -= LONG_AGO
        if job.enqueued_at is not None:  # None: the in-process queue did not take it
            job.enqueued_at -= LONG_AGO
        session.commit()


def _depth(url: str, key: str = MINING_QUEUE) -> int:
    client = open_client(url)
    try:
        return int(client.llen(key))
    finally:
        client.close()


def _drop_message(url: str, job_id: uuid.UUID) -> None:
    """What a broker that lost one message leaves: the job's message gone from its list."""
    client = open_client(url)
    try:
        (raw,) = [raw for raw in client.lrange(MINING_QUEUE, 0, -1) if str(job_id).encode() in raw]
        assert client.lrem(MINING_QUEUE, 1, raw) == 1
    finally:
        client.close()


def test_a_job_whose_message_waits_on_its_queue_is_not_sent_again(
    broker_runtime: Runtime, own_redis: OwnRedis
) -> None:
    job_id = _queue_job(broker_runtime, 31)
    _sent_long_ago(broker_runtime, job_id)
    assert _depth(own_redis.url) == 1
    assert recover(broker_runtime) == []  # its message is in line: a copy would be a duplicate
    assert recover(broker_runtime, requeue_after_s=0) == []
    assert _depth(own_redis.url) == 1


def test_a_job_whose_message_was_lost_is_sent_again_with_the_reason(
    broker_runtime: Runtime, own_redis: OwnRedis
) -> None:
    waiting = _queue_job(broker_runtime, 32)
    lost = _queue_job(broker_runtime, 33)
    _sent_long_ago(broker_runtime, waiting)
    _sent_long_ago(broker_runtime, lost)
    _drop_message(own_redis.url, lost)
    (found,) = recover(broker_runtime, dry_run=True)
    assert (found.job_id, found.action) == (lost, "send")
    assert "not on the broker" in found.reason and "nor reserved by a worker" in found.reason, found.reason
    assert _depth(own_redis.url) == 1  # the dry run sent nothing

    (sent,) = recover(broker_runtime)
    assert sent.job_id == lost and sent.done
    assert _depth(own_redis.url) == 2
    assert recover(broker_runtime) == []  # sent once: its new message is in line now


def test_a_job_whose_message_a_worker_reserved_is_not_sent_again_until_that_worker_is_gone(
    broker_runtime: Runtime, own_redis: OwnRedis
) -> None:
    job_id = _queue_job(broker_runtime, 34)
    _sent_long_ago(broker_runtime, job_id)
    assert isinstance(broker_runtime.dispatcher, CeleryDispatcher)
    with broker_runtime.dispatcher.app.connection_for_read(own_redis.url) as conn:
        channel = conn.default_channel
        message = channel.basic_get(MINING_QUEUE, no_ack=False)  # what a prefetching worker does
        assert message is not None and _depth(own_redis.url) == 0
        client = open_client(own_redis.url)
        try:
            assert client.hlen(broker_view.UNACKED_KEY) == 1
            assert recover(broker_runtime) == []  # reserved a moment ago: a worker holds it

            # Reserved for longer than requeue_after_s and still not started: that worker is gone.
            tag = message.delivery_tag
            client.zadd(broker_view.UNACKED_INDEX_KEY, {tag: time.time() - LONG_AGO.total_seconds()})
            (sent,) = recover(broker_runtime)
            assert sent.job_id == job_id and sent.done
            assert "reserved by a worker" in sent.reason and "never started" in sent.reason, sent.reason
            assert _depth(own_redis.url) == 1
        finally:
            client.close()
        channel.basic_ack(message.delivery_tag)


def test_messages_on_the_priority_lists_count(broker_runtime: Runtime, own_redis: OwnRedis) -> None:
    job_id = _queue_job(broker_runtime, 35)
    _sent_long_ago(broker_runtime, job_id)
    assert isinstance(broker_runtime.dispatcher, CeleryDispatcher)
    client = open_client(own_redis.url)
    try:
        client.delete(MINING_QUEUE)
        with broker_runtime.dispatcher._pool.acquire(block=True) as conn:  # its message, sent urgent
            broker_runtime.dispatcher.app.send_task(
                MINE_FIGURE_TASK, args=[str(job_id)], queue=MINING_QUEUE, priority=9, connection=conn
            )
        assert client.exists(f"{MINING_QUEUE}{PRIORITY_SEP}9") and not client.exists(MINING_QUEUE)
    finally:
        client.close()
    assert recover(broker_runtime) == []


def test_past_the_scanned_messages_publish_order_decides(
    broker_runtime: Runtime, own_redis: OwnRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A list longer than one snapshot reads: a job behind older messages may be in the unread part;
    one sent before the oldest message still there has left the list."""
    monkeypatch.setattr(broker_view, "SCAN_MESSAGES", 1)
    assert isinstance(broker_runtime.dispatcher, CeleryDispatcher)
    dispatcher = broker_runtime.dispatcher
    earlier = time.time() - 3600
    with dispatcher._pool.acquire(block=True) as conn:  # an older message of another job, in front
        dispatcher.app.send_task(
            MINE_FIGURE_TASK, args=[str(uuid.uuid4())], queue=MINING_QUEUE,
            headers={PUBLISHED_HEADER: earlier}, connection=conn,
        )  # fmt: skip
    behind = _queue_job(broker_runtime, 36)  # sent now, behind it: not among the one message read
    assert recover(broker_runtime, requeue_after_s=0) == []

    gone = _queue_job(broker_runtime, 37)
    _sent_long_ago(broker_runtime, gone)  # sent two hours ago: the one message read is newer
    _drop_message(own_redis.url, gone)
    found = recover(broker_runtime, dry_run=True)
    assert [(f.job_id, f.action) for f in found] == [(gone, "send")], found
    assert "sent after it" in found[0].reason, found[0].reason
    assert behind not in {f.job_id for f in recover(broker_runtime, dry_run=True, requeue_after_s=0)}


def test_without_a_readable_broker_time_alone_decides(make_runtime: RuntimeFactory) -> None:
    """The in-process queue is this process's memory (nothing to read): past requeue_after_s a
    queued job is sent again, as before."""
    runtime = make_runtime(queue={"embedded_queues": []})  # nothing runs the mining job
    job_id = _queue_job(runtime, 38)
    assert broker_view.open_broker_view(runtime) is None
    _sent_long_ago(runtime, job_id)
    (found,) = recover(runtime, dry_run=True)
    assert found.job_id == job_id and found.reason == "created, never sent, 7200 s ago and not started"


def test_p2p_recover_dry_run_says_why_a_message_counts_as_lost(
    broker_runtime: Runtime,
    own_redis: OwnRedis,
    monkeypatch: pytest.MonkeyPatch,
    pg_url: str,
    tmp_path: Path,
) -> None:
    waiting, lost = _queue_job(broker_runtime, 39), _queue_job(broker_runtime, 40)
    for job_id in (waiting, lost):
        _sent_long_ago(broker_runtime, job_id)
    _drop_message(own_redis.url, lost)
    monkeypatch.setenv("P2P_DB__URL", pg_url)
    monkeypatch.setenv("P2P_REDIS__URL", own_redis.url)
    monkeypatch.setenv("P2P_DATA_DIR", str(tmp_path / "cli-data"))
    monkeypatch.setenv("COLUMNS", "300")
    get_settings.cache_clear()
    try:
        listed = CliRunner().invoke(cli_app, ["recover", "--dry-run"])
    finally:
        get_settings.cache_clear()
    assert listed.exit_code == 0, listed.output
    assert str(lost) in listed.output and str(waiting) not in listed.output, listed.output
    assert "not on the broker" in listed.output, listed.output


def test_with_its_redis_away_time_alone_decides(broker_runtime: Runtime, own_redis: OwnRedis) -> None:
    """A broker that does not answer cannot show the message: the time rule decides (sending then
    fails and the job stays queued for the next sweep)."""
    job_id = _queue_job(broker_runtime, 41)
    _sent_long_ago(broker_runtime, job_id)
    own_redis.kill()
    (found,) = recover(broker_runtime, dry_run=True)
    assert found.job_id == job_id and found.reason == "sent 7200 s ago and not started", found.reason
