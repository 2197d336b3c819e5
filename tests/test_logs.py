"""Structured logs and request ids: JSON lines with their context, the X-Request-ID header checked,
echoed and put in the error envelope, and one upload followed by its id from the ingest API through
a real Celery worker's mining and embedding tasks to the rows it created."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from p2p.apps.ingest import ingest_app
from p2p.ingest.samples import make_figure
from p2p.shared import logs
from p2p.shared.db.models import Figure, JobStatus, MiningJob
from p2p.shared.logs import JsonFormatter, TextFormatter, configure_logging
from p2p.shared.queue import InProcessDispatcher
from p2p.shared.runtime import Runtime
from p2p.shared.settings import Settings
from tests.conftest import RuntimeFactory
from tests.helpers import assert_error, upload, wait_for


@pytest.fixture
def store_kind() -> str:
    return "s3"


class JsonLines(logging.Handler):
    """Every record of the process, formatted by the production formatter, parsed back."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(JsonFormatter(service="test"))
        self.lines: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = self.format(record)
        assert "\n" not in text, text  # one event, one line
        self.lines.append(json.loads(text))

    def with_request(self, request_id: str) -> list[dict[str, Any]]:
        return [line for line in self.lines if line.get("request_id") == request_id]


@pytest.fixture
def json_lines() -> Iterator[JsonLines]:
    handler = JsonLines()
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def _record(name: str, message: str, **extra: Any) -> logging.LogRecord:
    return logging.getLogger(name).makeRecord(name, logging.INFO, __file__, 1, message, (), None, extra=extra)


# --- formats ----------------------------------------------------------------------------------


def test_a_json_line_has_the_event_its_context_and_its_fields() -> None:
    formatter = JsonFormatter(service="ingest-api")
    with logs.bound(request_id="req-1", job_kind="mining", job_id="j1"):
        line = json.loads(formatter.format(_record("p2p.x", "figure stored", figure_id="f1", queued_s=0.25)))
    assert line["level"] == "INFO" and line["logger"] == "p2p.x" and line["message"] == "figure stored"
    assert line["timestamp"].endswith("Z") and "T" in line["timestamp"]
    assert line["service"] == "ingest-api"
    assert (line["request_id"], line["job_kind"], line["job_id"]) == ("req-1", "mining", "j1")
    assert (line["figure_id"], line["queued_s"]) == ("f1", 0.25)
    outside = json.loads(formatter.format(_record("p2p.x", "later")))
    assert "request_id" not in outside  # the context ended with its block


def test_an_exception_stays_on_its_one_json_line() -> None:
    formatter = JsonFormatter()
    try:
        raise ValueError("bad pixels")
    except ValueError:
        record = logging.getLogger("p2p.x").makeRecord(
            "p2p.x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info()
        )
    text = formatter.format(record)
    assert "\n" not in text
    line = json.loads(text)
    assert line["exc_type"] == "ValueError" and "bad pixels" in line["exc_info"]


def test_the_text_format_keeps_the_classic_line_and_adds_the_context() -> None:
    with logs.bound(request_id="req-2"):
        text = TextFormatter().format(_record("p2p.x", "hello", outcome="ok"))
    assert " INFO p2p.x: hello [" in text and "request_id=req-2" in text and "outcome=ok" in text


def test_uvicorn_access_lines_go_through_the_same_json_format() -> None:
    stream = io.StringIO()
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    # as an earlier uvicorn.Config(log_level="critical") or a dictConfig can leave it
    access = logging.getLogger("uvicorn.access")
    access.setLevel(logging.CRITICAL)
    access.propagate, access.disabled = False, True
    try:
        configure_logging(
            Settings(logging={"format": "json"}), service="ingest-api", stream=stream, force=True
        )
        with logs.bound(request_id="req-3"):
            logging.getLogger("uvicorn.access").info(
                '%s - "%s %s HTTP/%s" %d', "127.0.0.1:5000", "GET", "/healthz", "1.1", 200
            )
    finally:
        for handler in [h for h in root.handlers if h not in handlers]:
            root.removeHandler(handler)
        root.setLevel(level)
    line = json.loads(stream.getvalue().strip())
    assert line["logger"] == "uvicorn.access" and line["request_id"] == "req-3"
    assert (line["method"], line["path"], line["status"]) == ("GET", "/healthz", 200)


def test_the_format_defaults_to_json_in_production_and_text_otherwise() -> None:
    assert logs.resolve_format(Settings()) == "text"
    assert logs.resolve_format(Settings(logging={"format": "json"})) == "json"
    production = Settings.model_construct(profile="production", logging=Settings().logging)
    assert logs.resolve_format(production) == "json"
    assert logs.resolve_format(None) == "text"


def test_a_worker_process_writes_json_lines_when_asked() -> None:
    env = {**os.environ, "P2P_LOGGING__FORMAT": "json", "P2P_LOG_LEVEL": "INFO"}
    env.pop("P2P_REDIS__URL", None)
    code = "import logging, p2p.apps.worker; logging.getLogger('p2p.probe').info('worker up')"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    probe = [line for line in lines if line["logger"] == "p2p.probe"]
    assert probe and probe[0]["message"] == "worker up" and probe[0]["service"] == "worker", done.stderr


# --- request ids ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "kept"),
    [
        ("upload-7f3a.b_c:9", True),
        ("x" * 65, False),  # over the bound
        ("bad id\n", False),  # outside the charset
        ("<script>", False),
        (None, False),
    ],
)
def test_the_request_id_is_the_clients_when_safe_else_a_new_one(
    client: TestClient, given: str | None, kept: bool
) -> None:
    headers = {"X-Request-ID": given} if given is not None else {}
    response = client.get("/healthz", headers=headers)
    returned = response.headers["X-Request-ID"]
    if kept:
        assert returned == given
    else:
        assert returned != given and logs.valid_request_id(returned) == returned


def test_errors_carry_the_request_id_in_their_envelope(client: TestClient) -> None:
    response = upload(client, b"", headers={"X-Request-ID": "req-empty-image"})
    assert_error(response, 422, "not_an_image")
    assert response.json()["error"]["request_id"] == "req-empty-image"
    assert response.headers["X-Request-ID"] == "req-empty-image"
    missing = client.get(f"/v1/figures/{uuid.uuid4()}")
    assert missing.json()["error"]["request_id"] == missing.headers["X-Request-ID"]


def test_the_rows_a_request_creates_carry_its_id(client: TestClient, runtime: Runtime) -> None:
    sample = make_figure(3)
    accepted = upload(client, sample.image, caption=sample.caption, headers={"X-Request-ID": "req-rows"})
    assert accepted.status_code == 202, accepted.text
    with runtime.session() as session:
        figure = session.get(Figure, uuid.UUID(accepted.json()["figure_id"]))
        job = session.get(MiningJob, uuid.UUID(accepted.json()["job_id"]))
        assert figure is not None and job is not None
        assert (figure.request_id, job.request_id) == ("req-rows", "req-rows")


def _wait_for_line(lines: JsonLines, request_id: str, logger: str, timeout: float = 180) -> None:
    wait_for(
        lambda: any(line["logger"] == logger for line in lines.with_request(request_id)),
        timeout,
        f"a {logger} line with request id {request_id}",
    )


def test_one_upload_is_followed_by_its_request_id_through_a_real_celery_worker(
    make_runtime: RuntimeFactory, redis_url: str, json_lines: JsonLines
) -> None:
    from celery.contrib.testing.worker import start_worker

    from p2p.mining.tasks import get_miner
    from p2p.shared.queue import EMBEDDING_QUEUE, MINING_QUEUE, celery_app, configure_celery

    runtime = make_runtime(redis={"url": redis_url})
    configure_celery(runtime.settings)
    get_miner()  # models load before the worker takes work
    request_id = f"upload-{uuid.uuid4().hex[:12]}"
    sample = make_figure(6)
    with (
        start_worker(
            celery_app,
            pool="solo",
            queues=[MINING_QUEUE, EMBEDDING_QUEUE],
            perform_ping_check=False,
            shutdown_timeout=30,
            loglevel="INFO",  # the test worker's default (error) would drop the lines looked for
        ),
        TestClient(ingest_app(runtime=runtime)) as client,
    ):
        accepted = upload(client, sample.image, caption=sample.caption, headers={"X-Request-ID": request_id})
        assert accepted.status_code == 202, accepted.text
        assert accepted.headers["X-Request-ID"] == request_id
        _wait_for_line(json_lines, request_id, "p2p.embedding_api.tasks")
    ours = json_lines.with_request(request_id)
    by_logger = {line["logger"] for line in ours}
    assert {
        "p2p.ingest.service",
        "p2p.shared.jobs",
        "p2p.mining.tasks",
        "p2p.embedding_api.tasks",
    } <= by_logger
    mining = [
        line for line in ours if line["logger"] == "p2p.shared.jobs" and line.get("outcome") == "succeeded"
    ]
    assert mining and mining[0]["job_kind"] == "mining" and mining[0]["job_id"] == accepted.json()["job_id"]
    assert mining[0]["task_name"] == "p2p.mining.mine_figure" and mining[0]["queue"] == MINING_QUEUE
    assert isinstance(mining[0]["running_s"], float)
    embedded = [line for line in ours if line["logger"] == "p2p.embedding_api.tasks"]
    assert embedded[0]["task_name"] == "p2p.embedding.embed_figures"
    assert embedded[0]["figure_ids"] == [accepted.json()["figure_id"]]
    with runtime.session() as session:
        job = session.get(MiningJob, uuid.UUID(accepted.json()["job_id"]))
        figure = session.get(Figure, uuid.UUID(accepted.json()["figure_id"]))
        assert job is not None and figure is not None
        assert job.status is JobStatus.SUCCEEDED
        assert (job.request_id, figure.request_id) == (request_id, request_id)
    # The worker's context ended with each task: nothing after them carries the id.
    assert logs.current_request_id() is None


def test_in_process_tasks_carry_the_request_id_too(
    make_runtime: RuntimeFactory, json_lines: JsonLines
) -> None:
    runtime = make_runtime(queue={"embedded_queues": ["ingest", "mining", "embedding"]})
    sample = make_figure(8)
    with TestClient(ingest_app(runtime=runtime)) as client:
        accepted = upload(
            client, sample.image, caption=sample.caption, headers={"X-Request-ID": "req-embedded"}
        )
        assert accepted.status_code == 202, accepted.text
        _wait_for_line(json_lines, "req-embedded", "p2p.embedding_api.tasks")
    loggers = {line["logger"] for line in json_lines.with_request("req-embedded")}
    assert {"p2p.ingest.service", "p2p.mining.tasks", "p2p.embedding_api.tasks"} <= loggers
    assert isinstance(runtime.dispatcher, InProcessDispatcher) and runtime.dispatcher.wait_idle(120)


def test_new_request_ids_take_no_os_randomness_and_a_forked_child_makes_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_urandom(size: int) -> bytes:  # releases the GIL: the event loop would wait to get it back
        raise AssertionError("os.urandom on the request path")

    monkeypatch.setattr(os, "urandom", no_urandom)
    ids = [logs.new_request_id() for _ in range(1000)]
    assert len(set(ids)) == 1000 and all(logs.valid_request_id(i) == i and len(i) == 32 for i in ids)
    monkeypatch.undo()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.write(write, logs.new_request_id().encode())
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(read, 64).decode() != logs.new_request_id()
