"""`p2p jobs` on a real database: jobs of several kinds listed and filtered in the one lifecycle
vocabulary, one job's timings, failed jobs retried through the durable-job path (with a dry run and
a confirmation), and bad input refused with exit code 2."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner, Result

from p2p.cli.main import app as cli_app
from p2p.ingest.app import create_app
from p2p.ingest.samples import make_figure
from p2p.shared import jobs
from p2p.shared.db.base import utcnow
from p2p.shared.db.models import Batch, BatchKind, BatchStatus, Figure, FigureStatus, JobStatus, MiningJob
from p2p.shared.job_report import parse_duration
from p2p.shared.queue import InProcessDispatcher
from p2p.shared.runtime import Runtime
from p2p.shared.settings import get_settings
from tests.conftest import RuntimeFactory
from tests.helpers import upload

runner = CliRunner()


@pytest.fixture
def store_kind() -> str:
    return "local"


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch, pg_url: str, tmp_path: Path) -> Iterator[Any]:
    """Runs `p2p ...` on the test database; tasks are not run by the command's own process."""
    monkeypatch.setenv("P2P_DB__URL", pg_url)
    monkeypatch.setenv("P2P_DATA_DIR", str(tmp_path / "cli-data"))
    monkeypatch.setenv("P2P_QUEUE__EMBEDDED_QUEUES", "[]")
    get_settings.cache_clear()

    def invoke(*args: str, input: str | None = None) -> Result:
        return runner.invoke(cli_app, ["jobs", *args], input=input)

    yield invoke
    get_settings.cache_clear()


def _ingest(runtime: Runtime, seed: int, request_id: str) -> tuple[uuid.UUID, uuid.UUID]:
    sample = make_figure(seed, panel_size=(120, 96))
    with TestClient(create_app(runtime=runtime)) as client:
        body = upload(
            client, sample.image, caption=sample.caption, headers={"X-Request-ID": request_id}
        ).json()
    return uuid.UUID(body["figure_id"]), uuid.UUID(body["job_id"])


def _fail(runtime: Runtime, job_id: uuid.UUID, *, age: timedelta, reason: str) -> None:
    """A job that ran once and failed ``age`` ago."""
    with runtime.session() as session:
        job = session.get(MiningJob, job_id)
        assert job is not None
        job.created_at = job.enqueued_at = utcnow() - age
        job.started_at = job.created_at + timedelta(seconds=2)
        job.status, job.attempts = JobStatus.RUNNING, 1
        session.commit()
    assert jobs.mark_failed(runtime, jobs.MINING, job_id, reason)


@pytest.fixture
def stocked(runtime: Runtime) -> dict[str, uuid.UUID]:
    """An old failed mining job, a recent failed one, a queued one and a queued ingest batch."""
    _, old = _ingest(runtime, 11, "req-old")
    _, recent = _ingest(runtime, 12, "req-recent")
    _, queued = _ingest(runtime, 13, "req-queued")
    _fail(runtime, old, age=timedelta(hours=3), reason="PermanentMiningError: the image does not decode")
    _fail(runtime, recent, age=timedelta(minutes=5), reason="SoftTimeLimitExceeded: over 540 s")
    with runtime.session() as session:
        batch = Batch(kind=BatchKind.MANIFEST, source="/data/manifest.jsonl", status=BatchStatus.QUEUED)
        session.add(batch)
        session.commit()
        batch_id = batch.id
    return {"old": old, "recent": recent, "queued": queued, "batch": batch_id}


def _ids(result: Result) -> list[str]:
    assert result.exit_code == 0, result.output
    return [row["id"] for row in json.loads(result.stdout)]


def test_jobs_are_listed_and_filtered_by_status_kind_and_age(cli: Any, stocked: dict[str, uuid.UUID]) -> None:
    everything = _ids(cli("--json"))
    assert set(everything) == {str(v) for v in stocked.values()}
    failed = _ids(cli("--status", "failed", "--kind", "mining", "--json"))
    assert failed == [str(stocked["recent"]), str(stocked["old"])]  # newest first
    assert _ids(cli("--status", "failed", "--kind", "mining", "--older-than", "1h", "--json")) == [
        str(stocked["old"])
    ]
    assert _ids(cli("--kind", "ingest_batch", "--json")) == [str(stocked["batch"])]
    assert set(_ids(cli("--status", "queued", "--json"))) == {str(stocked["queued"]), str(stocked["batch"])}
    assert len(_ids(cli("--limit", "2", "--json"))) == 2
    assert _ids(cli("--request-id", "req-old", "--json")) == [str(stocked["old"])]
    table = cli("--status", "failed")
    assert (
        table.exit_code == 0
        and str(stocked["old"]) in table.stdout
        and "PermanentMiningError" in table.stdout
    )
    assert "no jobs match" in cli("--status", "cancelled").stdout


def test_one_job_is_shown_with_its_timings_attempts_reason_and_request(
    cli: Any, stocked: dict[str, uuid.UUID]
) -> None:
    shown = cli("show", "mining", str(stocked["old"]), "--json")
    assert shown.exit_code == 0, shown.output
    job = json.loads(shown.stdout)
    assert (job["kind"], job["id"], job["status"], job["stored_status"]) == (
        "mining",
        str(stocked["old"]),
        "failed",
        "failed",
    )
    assert job["attempts"] == 1 and job["error"].startswith("PermanentMiningError")
    assert job["request_id"] == "req-old" and job["queue"] == "mining"
    assert job["queued_s"] == 2.0  # sent, then started two seconds later
    assert job["running_s"] > 3 * 3600 - 60  # started three hours ago, failed just now
    assert job["finished_at"] is not None
    queued = json.loads(cli("show", "mining", str(stocked["queued"]), "--json").stdout)
    assert queued["status"] == "queued" and queued["running_s"] is None and queued["queued_s"] >= 0
    table = cli("show", "mining", str(stocked["recent"]))
    assert table.exit_code == 0 and "SoftTimeLimitExceeded" in table.stdout and "req-recent" in table.stdout
    assert cli("show", "mining", str(uuid.uuid4())).exit_code == 1


def _status(runtime: Runtime, job_id: uuid.UUID) -> tuple[JobStatus, FigureStatus]:
    with runtime.session() as session:
        job = session.get(MiningJob, job_id)
        assert job is not None
        figure = session.get(Figure, job.figure_id)
        assert figure is not None
        return job.status, figure.status


def test_retry_lists_asks_then_requeues_the_failed_jobs(
    cli: Any, stocked: dict[str, uuid.UUID], runtime: Runtime
) -> None:
    events: list[jobs.JobEvent] = []
    runtime.job_observers.append(events.append)
    dry = cli("retry", "--kind", "mining", "--dry-run", "--json")
    assert _ids(dry) == [str(stocked["recent"]), str(stocked["old"])]
    assert _status(runtime, stocked["old"]) == (JobStatus.FAILED, FigureStatus.FAILED)
    refused = cli("retry", "--kind", "mining", "--older-than", "1h", input="n\n")
    assert refused.exit_code == 1 and _status(runtime, stocked["old"])[0] is JobStatus.FAILED
    done = cli("retry", "--kind", "mining", "--older-than", "1h", input="y\n")
    assert done.exit_code == 0, done.output
    assert "retried 1 of 1" in done.output
    assert _status(runtime, stocked["old"]) == (JobStatus.QUEUED, FigureStatus.QUEUED)
    assert _status(runtime, stocked["recent"])[0] is JobStatus.FAILED  # not old enough
    one = cli("retry", "mining", str(stocked["recent"]), "--yes")
    assert one.exit_code == 0, one.output
    assert _status(runtime, stocked["recent"])[0] is JobStatus.QUEUED
    again = cli("retry", "mining", str(stocked["recent"]), "--yes")
    assert again.exit_code == 1 and "not failed" in again.output
    shown = json.loads(cli("show", "mining", str(stocked["old"]), "--json").stdout)
    assert shown["finished_at"] is None and shown["request_id"] == "req-old"


def test_a_retried_job_runs_again_through_its_queue_with_its_request_id(make_runtime: RuntimeFactory) -> None:
    runtime = make_runtime(queue={"embedded_queues": ["ingest", "mining"]})
    sent: list[tuple[str, dict[str, str]]] = []
    dispatcher = runtime.dispatcher
    assert isinstance(dispatcher, InProcessDispatcher)
    original = dispatcher._run

    def recording_run(task: Any, args: list[Any], headers: dict[str, str]) -> None:
        sent.append((task.name, headers))
        original(task, args, headers)

    dispatcher._run = recording_run  # type: ignore[method-assign]
    _, job_id = _ingest(runtime, 14, "req-retry")
    assert dispatcher.wait_idle(120)
    assert _status(runtime, job_id)[0] is JobStatus.SUCCEEDED
    with runtime.session() as session:
        job = session.get(MiningJob, job_id)
        assert job is not None
        job.status, job.error = JobStatus.FAILED, "made to fail by the test"
        session.commit()
    sent.clear()
    assert jobs.retry_failed(runtime, jobs.MINING, job_id)
    assert dispatcher.wait_idle(120)
    assert ("p2p.mining.mine_figure", {"p2p_request_id": "req-retry"}) in sent
    assert _status(runtime, job_id) == (JobStatus.SUCCEEDED, FigureStatus.MINED)
    assert not jobs.retry_failed(runtime, jobs.MINING, job_id)  # only a failed job is retried


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--kind", "nope"], "unknown job kind nope"),
        (["--status", "stuck"], "unknown status stuck"),
        (["--older-than", "soon"], "bad duration 'soon'"),
        (["--older-than", "1h-5m"], "bad duration"),
        (["show", "nope", str(uuid.uuid4())], "unknown job kind nope"),
        (["show", "mining", "not-a-uuid"], "bad job id"),
        (["retry", "--kind", "nope"], "unknown job kind nope"),
        (["retry", "mining"], "give KIND and ID"),
        (["retry", "mining", str(uuid.uuid4()), "--kind", "mining"], "give KIND and ID"),
    ],
)
def test_bad_input_is_refused_with_exit_code_2(cli: Any, db: Any, args: list[str], message: str) -> None:
    result = cli(*args)
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())


def test_durations_read_as_operators_write_them() -> None:
    assert parse_duration("90s") == timedelta(seconds=90)
    assert parse_duration("1h30m") == timedelta(minutes=90)
    assert parse_duration("2d") == timedelta(days=2)
    assert parse_duration("45") == timedelta(seconds=45)
    for bad in ("", "h", "1x", "-1h", "1h 30m"):
        with pytest.raises(ValueError, match="bad duration"):
            parse_duration(bad)
