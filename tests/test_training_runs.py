"""Training runs as a service: POST /v1/training-runs -> export -> trainer subprocess -> evaluation ->
model version; progress, cancel, a killed trainer resumed, a worker interrupt re-queued, a duplicate
delivery skipped, and bad input refused before anything runs. Real Postgres and S3 or a local store;
the trainer is the real ``python -m p2p.training`` on a tiny open_clip model."""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from p2p.apps.embedding import embedding_app as create_app
from p2p.shared.db.models import ModelVersion, TrainingRun, TrainingRunStatus
from p2p.shared.jobs import TRAINING, claim
from p2p.shared.runtime import Runtime
from p2p.training import runs
from p2p.training.jobs import TrainingInterrupted, execute_run
from p2p.training.schemas import TrainingRunCreate
from tests.conftest import RuntimeFactory
from tests.helpers import assert_error
from tests.test_training_export import mine_articles
from tests.test_training_runner import TINY_TRAINING, write_snapshot

TINY_RUN: dict[str, Any] = {**TINY_TRAINING, "epochs": 50}
FAST_OPTIONS = {"progress_every": 1, "checkpoint_every": 2, "shuffle_buffer": 3, "threads": 1}


def body(**overrides: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "config": dict(TINY_RUN),
        "data": {"snapshot": "snap/tiny"},
        "options": FAST_OPTIONS,
    }
    for key, value in overrides.items():
        doc[key] = {**doc[key], **value} if isinstance(doc.get(key), dict) else value
    return doc


def wait_for(runtime: Runtime, run_id: uuid.UUID, check: Any, timeout: float = 240.0) -> TrainingRun:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with runtime.session() as session:
            run = session.get(TrainingRun, run_id)
            assert run is not None
            session.expunge(run)
        if check(run):
            return run
        time.sleep(0.2)
    raise AssertionError(f"run {run_id} stuck at {run.status} {run.progress} {run.error}")


def create(runtime: Runtime, doc: dict[str, Any]) -> uuid.UUID:
    with runtime.session() as session:
        return runs.create_run(
            session, runtime.dispatcher, runtime.store, body=TrainingRunCreate.model_validate(doc)
        ).id


@pytest.fixture
def trainer_runtime(make_runtime: RuntimeFactory) -> Iterator[Runtime]:
    """Training runs on the in-process worker; a tiny snapshot in the store."""
    runtime = make_runtime(queue={"embedded_queues": ["training"]})
    write_snapshot(runtime.store, "snap/tiny", 8)  # type: ignore[arg-type]
    yield runtime


@pytest.fixture
def idle_runtime(make_runtime: RuntimeFactory) -> Iterator[Runtime]:
    """Nothing serves the training queue: runs stay queued until a test executes them."""
    runtime = make_runtime(queue={"embedded_queues": []})
    write_snapshot(runtime.store, "snap/tiny", 8)  # type: ignore[arg-type]
    yield runtime


@pytest.mark.parametrize("store_kind", ["s3"], indirect=True)
def test_api_run_exports_trains_evaluates_and_registers(make_runtime: RuntimeFactory) -> None:
    """From mined figures in Postgres to a model version, through the API, with the store on S3."""
    runtime = make_runtime(queue={"embedded_queues": ["ingest", "training", "embedding"]})
    # PMC200001-6 fall in the train split, PMC200007 in test (splits follow the article id's hash)
    mine_articles(runtime, [(seed, f"PMC20000{seed}") for seed in range(1, 8)])
    with TestClient(create_app(runtime=runtime)) as client:
        doc = {
            "name": "tiny e2e",
            "config": {**TINY_RUN, "batch_sizes": {"figure": 1, "panel": 2, "region": 2}, "max_steps": 4},
            "options": {**FAST_OPTIONS, "activate": True, "eval_split": "test"},
        }
        created = client.post("/v1/training-runs", json=doc)
        assert created.status_code == 202, created.text
        run_id = uuid.UUID(created.json()["id"])
        assert created.json()["out_prefix"] == f"training-runs/{run_id}"
        run = wait_for(runtime, run_id, lambda r: r.status.finished)
        shown = client.get(f"/v1/training-runs/{run_id}").json()
        assert shown["status"] == "completed", shown["error"]
        assert shown["name"] == "tiny e2e" and shown["attempts"] == 1
        assert shown["snapshot_prefix"] == f"training-runs/{run_id}/data"
        counts = shown["snapshot"]["counts"]
        assert counts["train"]["figures"] == 6 and counts["test"]["figures"] == 1
        progress = shown["progress"]
        assert progress["step"] == 4 and progress["total_steps"] == 4 and progress["restarts"] == 0
        assert progress["samples_per_s"] > 0 and progress["eta_s"] is not None and progress["losses"]
        phases = progress["phases"]  # where the run's time went
        assert set(phases) == {"export_s", "train_s", "evaluate_s"} and all(v > 0 for v in phases.values())
        assert sum(phases.values()) <= (run.finished_at - run.started_at).total_seconds() + 1
        assert runtime.store.exists(shown["checkpoint"]) and runtime.store.exists(shown["final_model"])
        metrics = shown["metrics"]
        assert {"trained", "untrained", "improved"} <= set(metrics)
        assert "panel i2t R@10" in metrics["trained"] and "zero-shot bal acc" in metrics["trained"]
        version_id = shown["model_version_id"]
        model = client.get(f"/v1/models/{version_id}").json()
        assert model["name"] == "tiny" and model["version"] == f"run-{run_id.hex[:8]}"
        assert model["source"] == f"s3:{shown['final_model']}" and model["metrics"]["trained"]
        with runtime.session() as session:
            row = session.get(ModelVersion, uuid.UUID(version_id))
            assert row is not None and row.training_run_id == run_id
        # activate=True: the corpus is re-embedded with the trained model, which then serves the space
        ready = wait_for(runtime, run_id, lambda r: True)
        assert ready.model_version_id is not None
        deadline = time.monotonic() + 120
        while client.get(f"/v1/models/{version_id}").json()["status"] != "ready":
            assert time.monotonic() < deadline, client.get(f"/v1/models/{version_id}").json()
            time.sleep(0.2)
        listed = client.get("/v1/training-runs", params={"status": "completed"}).json()
        assert [r["id"] for r in listed] == [str(run_id)]
        assert client.get("/v1/training-runs", params={"status": "failed"}).json() == []
        assert_error(client.post(f"/v1/training-runs/{run_id}/cancel"), 409, "run_finished")
        assert_error(client.get(f"/v1/training-runs/{uuid.uuid4()}"), 404, "not_found")
        assert run.finished_at is not None and run.started_at is not None


@pytest.mark.parametrize("store_kind", ["local"], indirect=True)
def test_bad_requests_are_refused_before_a_run_exists(idle_runtime: Runtime) -> None:
    runtime = idle_runtime
    with TestClient(create_app(runtime=runtime)) as client:
        unknown = client.post("/v1/training-runs", json=body(config={"learning_rate": 1}))
        assert_error(unknown, 422, "invalid_config")
        assert "learning_rate" in unknown.json()["error"]["message"]
        nested = client.post("/v1/training-runs", json=body(config={"lr": {"shard": 1e-4}}))
        assert_error(nested, 422, "invalid_config")
        assert "lr.shard" in nested.json()["error"]["message"]
        assert_error(client.post("/v1/training-runs", json=body(preset="huge")), 422, "invalid_config")
        bad_value = client.post("/v1/training-runs", json=body(config={"levels": "pixels"}))
        assert_error(bad_value, 422, "invalid_config")
        missing = client.post("/v1/training-runs", json=body(data={"snapshot": "snap/none"}))
        assert_error(missing, 422, "invalid_data")
        too_small = client.post(
            "/v1/training-runs", json=body(config={"batch_sizes": {"figure": 50, "panel": 3, "region": 4}})
        )
        assert_error(too_small, 422, "invalid_data")
        assert "fewer than one figure batch" in too_small.json()["error"]["message"]
        no_corpus = client.post("/v1/training-runs", json={"config": TINY_RUN})
        assert_error(no_corpus, 422, "invalid_data")
        assert "no mined figure" in no_corpus.json()["error"]["message"]
        both = client.post(
            "/v1/training-runs", json=body(data={"snapshot": "snap/tiny", "license_groups": ["commercial"]})
        )
        assert both.status_code == 422
        bad_group = client.post("/v1/training-runs", json={"data": {"license_groups": ["gratis"]}})
        assert bad_group.status_code == 422
        assert client.get("/v1/training-runs").json() == []


@pytest.mark.parametrize("store_kind", ["local"], indirect=True)
def test_progress_is_visible_while_training_and_cancel_keeps_the_checkpoint(trainer_runtime: Runtime) -> None:
    runtime = trainer_runtime
    run_id = create(runtime, body(config={"max_steps": 100_000}, options={"checkpoint_every": 1}))
    running = wait_for(runtime, run_id, lambda r: (r.progress.get("step") or 0) >= 3)
    assert running.status is TrainingRunStatus.TRAINING and running.heartbeat_at is not None
    assert running.progress["total_steps"] == 100_000 and running.progress["losses"]
    with runtime.session() as session:
        assert runs.cancel_run(session, run_id).cancel_requested
    run = wait_for(runtime, run_id, lambda r: r.status.finished, timeout=120)
    assert run.status is TrainingRunStatus.CANCELLED
    assert run.checkpoint is not None and runtime.store.exists(run.checkpoint)
    assert run.error is not None and run.checkpoint in run.error
    assert run.final_model is None and run.model_version_id is None
    with runtime.session() as session, pytest.raises(runs.RunConflict):
        runs.cancel_run(session, run_id)


@pytest.mark.parametrize("store_kind", ["local"], indirect=True)
def test_a_queued_run_is_cancelled_at_once_and_never_starts(idle_runtime: Runtime) -> None:
    runtime = idle_runtime
    run_id = create(runtime, body())
    with runtime.session() as session:
        run = runs.cancel_run(session, run_id)
        assert run.status is TrainingRunStatus.CANCELLED
    assert execute_run(runtime, run_id) is TrainingRunStatus.CANCELLED
    run = wait_for(runtime, run_id, lambda r: True)
    assert run.attempts == 0 and run.progress == {}


@pytest.mark.parametrize("store_kind", ["local"], indirect=True)
def test_a_killed_trainer_is_restarted_and_resumes_from_its_checkpoint(trainer_runtime: Runtime) -> None:
    runtime = trainer_runtime
    run_id = create(runtime, body(config={"max_steps": 40}, options={"checkpoint_every": 2}))
    running = wait_for(runtime, run_id, lambda r: (r.progress.get("step") or 0) >= 5)
    os.kill(int(running.progress["trainer_pid"]), signal.SIGKILL)
    run = wait_for(runtime, run_id, lambda r: r.status.finished)
    assert run.status is TrainingRunStatus.COMPLETED, run.error
    assert run.progress["restarts"] == 1 and run.progress["step"] == 40
    assert run.progress["trainer_pid"] != running.progress["trainer_pid"]


@pytest.mark.parametrize("store_kind", ["local"], indirect=True)
def test_trainer_killed_too_often_fails_with_the_last_checkpoint(trainer_runtime: Runtime) -> None:
    runtime = trainer_runtime
    run_id = create(
        runtime, body(config={"max_steps": 100_000}, options={"checkpoint_every": 1, "max_restarts": 0})
    )
    running = wait_for(runtime, run_id, lambda r: (r.progress.get("step") or 0) >= 2)
    os.kill(int(running.progress["trainer_pid"]), signal.SIGKILL)
    run = wait_for(runtime, run_id, lambda r: r.status.finished)
    assert run.status is TrainingRunStatus.FAILED
    assert run.error is not None and "killed by signal 9" in run.error
    assert run.checkpoint is not None and run.checkpoint in run.error and runtime.store.exists(run.checkpoint)


@pytest.mark.parametrize("store_kind", ["local"], indirect=True)
def test_non_finite_loss_fails_the_run_with_its_reason(trainer_runtime: Runtime) -> None:
    runtime = trainer_runtime
    exploding = {
        "lr": {"shared": 1e30, "bbox_head": 1e30, "fine": 1e30, "coarse": 1e30},
        "grad_clip_norm": None,
    }
    run_id = create(runtime, body(config={**exploding, "max_steps": 50}, options={"checkpoint_every": 1}))
    run = wait_for(runtime, run_id, lambda r: r.status.finished)
    assert run.status is TrainingRunStatus.FAILED
    assert run.error is not None and "non-finite" in run.error and "last good checkpoint" in run.error
    assert run.model_version_id is None


@pytest.mark.parametrize("store_kind", ["local"], indirect=True)
def test_fine_tuning_starts_from_a_stored_checkpoint_and_refuses_another_architecture(
    idle_runtime: Runtime,
) -> None:
    """A run can start from a registered model's weights in the store (``model.source`` s3:KEY); a
    checkpoint that does not fit the run's architecture fails the run with the loader's reason."""
    runtime = idle_runtime
    first = create(runtime, body(options={"register_model": False}))
    assert execute_run(runtime, first) is TrainingRunStatus.COMPLETED
    weights = wait_for(runtime, first, lambda r: True).final_model
    model = {"name": "tiny", "config": TINY_TRAINING["model"]["config"], "source": f"s3:{weights}"}
    again = create(runtime, body(config={"model": model}, options={"register_model": False}))
    assert execute_run(runtime, again) is TrainingRunStatus.COMPLETED
    wider = {**model, "config": {**model["config"], "embed_dim": 48}}
    mismatch = create(runtime, body(config={"model": wider}))
    assert execute_run(runtime, mismatch) is TrainingRunStatus.FAILED
    failed = wait_for(runtime, mismatch, lambda r: True)
    assert (
        failed.error is not None and weights in failed.error and "last good checkpoint: none" in failed.error
    )
    assert failed.progress.get("step") is None


@pytest.mark.parametrize("store_kind", ["local"], indirect=True)
def test_a_split_without_regions_fails_before_training(idle_runtime: Runtime) -> None:
    runtime = idle_runtime
    write_snapshot(runtime.store, "snap/no-regions", 8, regions=False)  # type: ignore[arg-type]
    with runtime.session() as session, pytest.raises(runs.InvalidInput, match="has no regions"):
        runs.create_run(
            session,
            runtime.dispatcher,
            runtime.store,
            body=TrainingRunCreate.model_validate(body(data={"snapshot": "snap/no-regions"})),
        )
    panel_only = create(runtime, body(data={"snapshot": "snap/no-regions"}, config={"levels": "panel"}))
    assert execute_run(runtime, panel_only) is TrainingRunStatus.COMPLETED


@pytest.mark.parametrize("store_kind", ["local"], indirect=True)
def test_duplicate_delivery_is_skipped_and_a_finished_run_is_not_rerun(idle_runtime: Runtime) -> None:
    runtime = idle_runtime
    run_id = create(runtime, body(options={"register_model": False}))
    with claim(runtime, TRAINING, run_id) as held:
        assert held is not None
        assert execute_run(runtime, run_id) is None  # another worker holds it
    run = wait_for(runtime, run_id, lambda r: True)
    assert run.status is TrainingRunStatus.QUEUED and run.attempts == 0
    assert execute_run(runtime, run_id) is TrainingRunStatus.COMPLETED
    first = wait_for(runtime, run_id, lambda r: True)
    assert first.model_version_id is None and first.metrics.get("split") in ("test", "val")
    assert execute_run(runtime, run_id) is TrainingRunStatus.COMPLETED
    assert wait_for(runtime, run_id, lambda r: True).attempts == first.attempts == 1


@pytest.mark.parametrize("store_kind", ["local"], indirect=True)
def test_a_worker_interrupt_requeues_the_run_and_the_next_attempt_resumes(idle_runtime: Runtime) -> None:
    """SIGTERM reaching the trainer without a cancel request (a worker shutting down): the run goes
    back to queued with its checkpoint; executing it again continues from there."""
    runtime = idle_runtime
    run_id = create(runtime, body(config={"max_steps": 30}, options={"checkpoint_every": 1}))
    errors: list[BaseException] = []

    def work() -> None:
        try:
            execute_run(runtime, run_id)
        except BaseException as exc:
            errors.append(exc)

    worker = threading.Thread(target=work)
    worker.start()
    running = wait_for(runtime, run_id, lambda r: (r.progress.get("step") or 0) >= 3)
    os.kill(int(running.progress["trainer_pid"]), signal.SIGTERM)
    worker.join(120)
    assert len(errors) == 1 and isinstance(errors[0], TrainingInterrupted)
    interrupted = wait_for(runtime, run_id, lambda r: True)
    assert interrupted.status is TrainingRunStatus.QUEUED and interrupted.checkpoint is not None
    stopped_at = int(interrupted.progress["step"])
    assert 3 <= stopped_at < 30
    assert execute_run(runtime, run_id) is TrainingRunStatus.COMPLETED
    done = wait_for(runtime, run_id, lambda r: True)
    assert done.attempts == 2 and done.progress["step"] == 30
    assert done.progress["resumed_from"] == stopped_at


PARENT_SCRIPT = """
import sys, time, json
from pathlib import Path
from p2p.shared.settings import Settings
from p2p.shared.storage import LocalObjectStore
from p2p.training.trainer_process import TrainerProcess
store = LocalObjectStore(Path(sys.argv[1]))
trainer = TrainerProcess(
    store=store, settings=Settings(), config_path=Path(sys.argv[2]), data_prefix="snap/tiny",
    out_prefix="runs/orphan", checkpoint_every=1, keep_checkpoints=2, progress_every=1, shuffle_buffer=3,
    threads=1,
)
trainer.start()
for event in trainer.events(1.0):
    if event and event.get("event") == "progress":
        print(trainer.pid, flush=True)
        break
time.sleep(600)
"""


def test_the_trainer_stops_with_a_checkpoint_when_its_worker_is_killed(tmp_path: Any) -> None:
    import json
    import subprocess
    import sys

    from p2p.shared.storage import LocalObjectStore

    store = LocalObjectStore(tmp_path / "objects")
    write_snapshot(store, "snap/tiny", 8)
    config = tmp_path / "config.json"
    config.write_text(json.dumps({**TINY_RUN, "max_steps": 100_000}))
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT_SCRIPT, str(store.root), str(config)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        parent.kill()
        parent.wait(30)
        deadline = time.monotonic() + 120
        while os.path.exists(f"/proc/{child}") and "zombie" not in _state(child):
            assert time.monotonic() < deadline, "the trainer outlived its worker"
            time.sleep(0.2)
    finally:
        parent.kill()
        parent.wait(30)
    assert json.loads(store.get_bytes("runs/orphan/latest.json"))["step"] >= 1


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/status") as status:
            return next((line.lower() for line in status if line.startswith("State:")), "")
    except OSError:
        return ""
