"""The mining service end to end: ingest -> mining task -> panels and regions in Postgres, crops stored."""

from __future__ import annotations

import io
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from PIL import Image

from p2p.ingest.app import create_app
from p2p.ingest.samples import make_figure
from p2p.mining.jobs import mine_job
from p2p.mining.tasks import get_miner
from p2p.shared.db.models import JobStatus, MiningJob
from p2p.shared.queue import InProcessDispatcher
from p2p.shared.runtime import Runtime
from tests.conftest import RuntimeFactory
from tests.helpers import job_row_counts, upload

ALL_QUEUES = {"queue": {"embedded_queues": ["ingest", "mining"]}}


@pytest.fixture
def mining_runtime(make_runtime: RuntimeFactory) -> Runtime:
    return make_runtime(**ALL_QUEUES)


@pytest.fixture
def mining_client(mining_runtime: Runtime) -> Iterator[TestClient]:
    with TestClient(create_app(runtime=mining_runtime)) as client:
        yield client


def _idle(runtime: Runtime) -> None:
    assert isinstance(runtime.dispatcher, InProcessDispatcher)
    assert runtime.dispatcher.wait_idle(120)


def _png(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.mark.parametrize("store_kind", ["local", "s3"], indirect=True)
def test_ingested_figure_is_mined_into_a_hierarchy(
    mining_client: TestClient, mining_runtime: Runtime
) -> None:
    sample = make_figure(4)  # 2x2 grid, labels A-D, arrows on micrographs
    accepted = upload(mining_client, sample.image, caption=sample.caption, filename=sample.name).json()
    _idle(mining_runtime)
    figure = mining_client.get(f"/v1/figures/{accepted['figure_id']}").json()
    assert figure["status"] == "mined", figure
    labels = [p["label"] for p in figure["panels"]]
    assert labels == ["A", "B", "C", "D"]
    for panel in figure["panels"]:
        assert panel["subcaption"] and panel["subcaption"].startswith(f"({panel['label']})")
        assert panel["provenance"]["backend"] == "cpu" and "params" in panel["provenance"]
        assert panel["figure_type"] in ("image", "plot", "schematic", "table")
        crop = Image.open(io.BytesIO(mining_runtime.store.get_bytes(panel["crop_key"])))
        x1, y1, x2, y2 = panel["box"]
        assert abs(crop.width - (x2 - x1)) <= 1 and abs(crop.height - (y2 - y1)) <= 1
    job = mining_client.get(f"/v1/jobs/{accepted['job_id']}").json()
    assert job["status"] == "succeeded" and job["attempts"] == 1
    assert {"segment", "labels", "captions", "panel_type"} <= set(job["stage_timings"])
    assert job["cost"]["seconds"] > 0


@pytest.mark.parametrize("store_kind", ["local"], indirect=True)
def test_rerun_and_duplicate_delivery_replace_never_duplicate(
    mining_client: TestClient, mining_runtime: Runtime
) -> None:
    sample = make_figure(7)
    accepted = upload(mining_client, sample.image, caption=sample.caption).json()
    _idle(mining_runtime)
    job_id = accepted["job_id"]
    first = job_row_counts(mining_runtime, job_id)
    assert first[0] >= 2

    # A finished job delivered again does nothing.
    outcome = mine_job(mining_runtime, uuid.UUID(job_id), get_miner())
    assert outcome.skipped == "already mined"

    # Forced re-runs, two at once: one mines, the other sees the lock or the finished job.
    with mining_runtime.session() as session:
        job = session.get(MiningJob, uuid.UUID(job_id))
        assert job is not None
        job.status = JobStatus.QUEUED
        session.commit()
    outcomes: list[Any] = []
    threads = [
        threading.Thread(
            target=lambda: outcomes.append(mine_job(mining_runtime, uuid.UUID(job_id), get_miner()))
        )
        for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(o.skipped or "ran" for o in outcomes) in (["locked", "ran"], ["already mined", "ran"])
    assert job_row_counts(mining_runtime, job_id) == first
    job_view = mining_client.get(f"/v1/jobs/{job_id}").json()
    assert job_view["attempts"] == 2 and job_view["status"] == "succeeded"


BAD_FIGURES = {
    "blank": lambda: np.full((600, 800, 3), 255, np.uint8),
    "one-pixel": lambda: np.zeros((1, 1, 3), np.uint8),
    "wide-strip": lambda: np.tile(np.linspace(0, 255, 20000, dtype=np.uint8)[None, :, None], (20, 1, 3)),
    "one-huge-panel": lambda: (np.random.default_rng(0).random((900, 1200, 3)) * 255).astype(np.uint8),
}


@pytest.mark.parametrize("store_kind", ["local"], indirect=True)
@pytest.mark.parametrize("case", sorted(BAD_FIGURES))
def test_odd_figures_complete_and_say_what_they_could_not_do(
    mining_client: TestClient, mining_runtime: Runtime, case: str
) -> None:
    data = _png(BAD_FIGURES[case]())
    caption = (
        "A caption without any panel labels at all." if case != "one-huge-panel" else "(A) Left. (B) Right."
    )
    accepted = upload(mining_client, data, caption=caption).json()
    _idle(mining_runtime)
    job = mining_client.get(f"/v1/jobs/{accepted['job_id']}").json()
    assert job["status"] == "succeeded", job
    figure = mining_client.get(f"/v1/figures/{accepted['figure_id']}").json()
    assert len(figure["panels"]) >= 1
    if case in ("blank", "one-pixel", "one-huge-panel"):
        assert job["notes"], job


@pytest.mark.parametrize("store_kind", ["local"], indirect=True)
def test_unreadable_stored_image_fails_the_job_with_its_reason(make_runtime: RuntimeFactory) -> None:
    runtime = make_runtime()  # mining queue not served: we run the job by hand
    with TestClient(create_app(runtime=runtime)) as client:
        accepted = upload(client, make_figure(2).image, caption="x").json()
        key = client.get(f"/v1/figures/{accepted['figure_id']}").json()["object_key"]
        runtime.store.delete(key)
        garbage = b"garbage, not an image"
        import hashlib

        runtime.store.put(
            key,
            io.BytesIO(garbage),
            size=len(garbage),
            sha256=hashlib.sha256(garbage).hexdigest(),
            content_type="image/png",
        )
        outcome = mine_job(runtime, uuid.UUID(accepted["job_id"]), get_miner())
        assert outcome.status is JobStatus.FAILED
        job = client.get(f"/v1/jobs/{accepted['job_id']}").json()
        assert job["status"] == "failed" and "cannot be decoded" in job["error"]
        assert client.get(f"/v1/figures/{accepted['figure_id']}").json()["status"] == "failed"

        # The job's message delivered again (a sweep re-sent it) does not restart the failed job.
        again = mine_job(runtime, uuid.UUID(accepted["job_id"]), get_miner())
        assert again.skipped == "already failed" and again.status is JobStatus.FAILED
        assert client.get(f"/v1/jobs/{accepted['job_id']}").json() == job
        figure = client.get(f"/v1/figures/{accepted['figure_id']}").json()
        assert figure["status"] == "failed" and "cannot be decoded" in figure["mining_error"]


@pytest.mark.parametrize("store_kind", ["local"], indirect=True)
def test_missing_object_fails_through_the_task_failure_handler(make_runtime: RuntimeFactory) -> None:
    from p2p.shared.queue import celery_app

    runtime = make_runtime()
    with TestClient(create_app(runtime=runtime)) as client:
        accepted = upload(client, make_figure(3).image, caption="y").json()
        runtime.store.delete(client.get(f"/v1/figures/{accepted['figure_id']}").json()["object_key"])
        result = celery_app.tasks["p2p.mining.mine_figure"].apply(args=[accepted["job_id"]])
        assert result.failed()
        job = client.get(f"/v1/jobs/{accepted['job_id']}").json()
        assert job["status"] == "failed" and "ObjectNotFound" in job["error"]


def test_mining_runs_on_a_real_celery_worker(make_settings, db, redis_url: str) -> None:  # type: ignore[no-untyped-def]
    from celery.contrib.testing.worker import start_worker

    from p2p.shared.queue import MINING_QUEUE, celery_app, configure_celery, import_task_modules
    from p2p.shared.runtime import build_runtime, set_process_runtime

    settings = make_settings(redis={"url": redis_url})
    runtime = build_runtime(settings)
    set_process_runtime(runtime)
    configure_celery(settings)
    import_task_modules()
    get_miner()  # models load before the worker takes work
    try:
        with (
            start_worker(
                celery_app, pool="solo", queues=[MINING_QUEUE], perform_ping_check=False, shutdown_timeout=30
            ),
            TestClient(create_app(runtime=runtime)) as client,
        ):
            accepted = upload(client, make_figure(5).image, caption=make_figure(5).caption).json()
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline:
                job = client.get(f"/v1/jobs/{accepted['job_id']}").json()
                if job["status"] in ("succeeded", "failed"):
                    break
                time.sleep(0.2)
        assert job["status"] == "succeeded", job
    finally:
        set_process_runtime(None)
        runtime.close()


def test_a_mining_worker_process_runs_torch_on_its_configured_threads() -> None:
    import torch

    from p2p.mining.tasks import prepare_worker_process
    from p2p.shared.settings import MiningSettings, Settings

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        prepare_worker_process(Settings(mining=MiningSettings(torch_threads=1)))
        assert torch.get_num_threads() == 1
        assert get_miner("cpu") is get_miner("cpu")  # loaded once, by the preparation
    finally:
        torch.set_num_threads(before)
