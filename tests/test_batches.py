"""Server-side bulk ingestion: manifests, WebDataset shards, PMC packages; in-process and on Celery."""

from __future__ import annotations

import io
import json
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from p2p.ingest.app import create_app
from p2p.ingest.samples import write_manifest_folder, write_pmc_package
from p2p.shared.queue import InProcessDispatcher
from p2p.shared.runtime import Runtime, build_runtime, set_process_runtime
from tests.conftest import RuntimeFactory
from tests.helpers import assert_error, image_bytes, object_count, row_counts


@pytest.fixture
def batch_root(tmp_path: Path) -> Path:
    root = tmp_path / "imports"
    root.mkdir()
    return root


@pytest.fixture
def batch_runtime(make_runtime: RuntimeFactory, batch_root: Path) -> Runtime:
    return make_runtime(ingest={"batch_roots": [str(batch_root)]})


@pytest.fixture
def batch_client(batch_runtime: Runtime) -> Iterator[TestClient]:
    with TestClient(create_app(runtime=batch_runtime)) as client:
        yield client


def _wait(client: TestClient, runtime: Runtime, batch_id: str) -> dict[str, Any]:
    if isinstance(runtime.dispatcher, InProcessDispatcher):
        assert runtime.dispatcher.wait_idle(60)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        body: dict[str, Any] = client.get(f"/v1/batches/{batch_id}").json()
        if body["status"] not in ("queued", "running"):
            return body
        time.sleep(0.2)
    raise AssertionError(f"batch {batch_id} did not finish")


def _tar_member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def test_manifest_folder_with_one_bad_item(
    batch_client: TestClient, batch_runtime: Runtime, batch_root: Path
) -> None:
    folder = batch_root / "set1"
    manifest = write_manifest_folder(folder, count=3)
    whole = image_bytes("PNG", (200, 100), seed=9)
    (folder / "broken.png").write_bytes(whole[: len(whole) // 2])
    with manifest.open("a") as fh:
        fh.write(json.dumps({"image": "broken.png", "caption": "broken"}) + "\n")
        fh.write(json.dumps({"image": "missing.png", "caption": "gone"}) + "\n")
        fh.write("{not json\n")
    response = batch_client.post("/v1/batches", json={"kind": "manifest", "source": str(folder)})
    assert response.status_code == 202, response.text
    body = _wait(batch_client, batch_runtime, response.json()["id"])
    assert body["status"] == "completed_with_errors"
    assert (body["ingested"], body["duplicates"], body["failed"], body["total"]) == (3, 0, 3, 6)
    reasons = sorted(f["error_type"] for f in body["failures"])
    assert reasons == ["corrupt_image", "invalid_json", "missing_image"]
    assert row_counts(batch_runtime.engine)["figure"] == 3

    # The same source again: everything is a duplicate, nothing new is stored.
    objects = object_count(batch_runtime.store)
    again = batch_client.post("/v1/batches", json={"kind": "manifest", "source": str(manifest)})
    body = _wait(batch_client, batch_runtime, again.json()["id"])
    assert (body["ingested"], body["duplicates"]) == (0, 3)
    assert object_count(batch_runtime.store) == objects


def test_webdataset_shards(batch_client: TestClient, batch_runtime: Runtime, batch_root: Path) -> None:
    shards = batch_root / "shards"
    shards.mkdir()
    for shard_index in range(2):
        with tarfile.open(shards / f"shard-{shard_index:05d}.tar", "w") as tar:
            for i in range(3):
                key = f"{shard_index:02d}{i:04d}"
                _tar_member(tar, f"{key}.jpg", image_bytes("JPEG", seed=100 + shard_index * 10 + i))
                if i == 2:
                    _tar_member(
                        tar, f"{key}.json", json.dumps({"caption": f"Fig {key}", "pmcid": "PMC777"}).encode()
                    )
                else:
                    _tar_member(tar, f"{key}.txt", f"Figure {key}. (A) Panel.".encode())
    response = batch_client.post("/v1/batches", json={"kind": "webdataset", "source": str(shards)})
    assert response.status_code == 202, response.text
    body = _wait(batch_client, batch_runtime, response.json()["id"])
    assert body["status"] == "succeeded", body
    assert body["ingested"] == 6 and body["total"] == 6
    figures = batch_client.get("/v1/figures", params={"limit": 10}).json()
    assert {f["article"]["pmcid"] for f in figures if f["article"]} == {"PMC777"}


def test_pmc_package_from_server_path(
    batch_client: TestClient, batch_runtime: Runtime, batch_root: Path
) -> None:
    package = write_pmc_package(batch_root / "PMC9000001.tar.gz")
    response = batch_client.post("/v1/batches", json={"kind": "pmc", "source": str(package)})
    assert response.status_code == 202, response.text
    body = _wait(batch_client, batch_runtime, response.json()["id"])
    assert body["status"] == "succeeded" and body["ingested"] == 2, body
    figures = batch_client.get("/v1/figures").json()
    article = figures[0]["article"]
    assert article["pmcid"] == "PMC9000001" and article["license_group"] == "commercial"
    assert article["title"] == "Synthetic tissue atlas for the Panel2Patch demo"
    by_label = {f["figure_label"]: f for f in figures}
    assert set(by_label) == {"Figure 1", "Figure 2"}
    assert len(by_label["Figure 1"]["inline_references"]) == 2
    assert len(by_label["Figure 2"]["inline_references"]) == 1
    assert by_label["Figure 1"]["caption"].startswith("Characterisation of")


def _hostile_packages() -> dict[str, tuple[bytes, str]]:
    packages: dict[str, tuple[bytes, str]] = {}

    def build(members: list[tuple[str, bytes]], **extra: Any) -> bytes:
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
            for name, data in members:
                _tar_member(tar, name, data)
            if extra.get("symlink"):
                link = tarfile.TarInfo("PMC1/evil")
                link.type = tarfile.SYMTYPE
                link.linkname = "/etc/passwd"
                tar.addfile(link)
        return buffer.getvalue()

    png = image_bytes()
    packages["traversal"] = (
        build([("PMC1/a.nxml", b"<article/>"), ("../../etc/x.png", png)]),
        "hostile_package",
    )
    packages["absolute"] = (build([("PMC1/a.nxml", b"<article/>"), ("/tmp/x.png", png)]), "hostile_package")
    packages["symlink"] = (build([("PMC1/a.nxml", b"<article/>")], symlink=True), "hostile_package")
    packages["no-nxml"] = (build([("PMC1/a.png", png)]), "missing_nxml")
    packages["not-xml"] = (build([("PMC1/a.nxml", b"this is <not xml")]), "invalid_nxml")
    bomb = (
        b'<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;&lol;&lol;">]>'
        b"<article>&lol2;</article>"
    )
    packages["entities"] = (build([("PMC1/a.nxml", bomb)]), "invalid_nxml")
    packages["not-a-tar"] = (b"\x1f\x8b not really gzip", "not_a_tar")
    return packages


@pytest.mark.parametrize(
    "case", ["traversal", "absolute", "symlink", "no-nxml", "not-xml", "entities", "not-a-tar"]
)
def test_hostile_or_malformed_pmc_upload_is_refused(
    batch_client: TestClient, batch_runtime: Runtime, tmp_path: Path, case: str
) -> None:
    data, error_type = _hostile_packages()[case]
    response = batch_client.post(
        "/v1/batches/upload", data={"kind": "pmc"}, files={"file": ("PMC1.tar.gz", data, "application/gzip")}
    )
    assert_error(response, 422, error_type)
    assert row_counts(batch_runtime.engine) == {"figure": 0, "article": 0, "job": 0, "batch": 0}
    assert object_count(batch_runtime.store) == 0


def test_hostile_pmc_package_on_server_path_is_refused(
    batch_client: TestClient, batch_runtime: Runtime, batch_root: Path
) -> None:
    data, error_type = _hostile_packages()["traversal"]
    (batch_root / "evil.tar.gz").write_bytes(data)
    response = batch_client.post(
        "/v1/batches", json={"kind": "pmc", "source": str(batch_root / "evil.tar.gz")}
    )
    assert_error(response, 422, error_type)
    assert row_counts(batch_runtime.engine)["batch"] == 0


def test_pmc_package_upload(batch_client: TestClient, batch_runtime: Runtime, tmp_path: Path) -> None:
    data = write_pmc_package(tmp_path / "PMC9000001.tar.gz").read_bytes()
    response = batch_client.post(
        "/v1/batches/upload",
        data={"kind": "pmc"},
        files={"file": ("PMC9000001.tar.gz", data, "application/gzip")},
    )
    assert response.status_code == 202, response.text
    body = _wait(batch_client, batch_runtime, response.json()["id"])
    assert body["status"] == "succeeded" and body["ingested"] == 2
    assert body["source"].startswith("upload:uploads/")


def test_batch_sources_are_confined(
    batch_client: TestClient, batch_runtime: Runtime, tmp_path: Path, batch_root: Path
) -> None:
    outside = tmp_path / "elsewhere"
    write_manifest_folder(outside, count=1)
    assert_error(
        batch_client.post("/v1/batches", json={"kind": "manifest", "source": str(outside)}),
        403,
        "source_not_allowed",
    )
    assert_error(
        batch_client.post(
            "/v1/batches", json={"kind": "manifest", "source": str(batch_root / ".." / "elsewhere")}
        ),
        403,
        "source_not_allowed",
    )
    assert_error(
        batch_client.post("/v1/batches", json={"kind": "manifest", "source": str(batch_root / "nope")}),
        422,
        "source_not_found",
    )
    assert_error(
        batch_client.post("/v1/batches", json={"kind": "manifest", "source": str(batch_root)}),
        422,
        "manifest_not_found",
    )
    assert_error(
        batch_client.post("/v1/batches", json={"kind": "zip", "source": str(batch_root)}),
        422,
        "validation_error",
    )
    assert_error(
        batch_client.post("/v1/batches", json={"kind": "manifest", "source": "x", "extra": 1}),
        422,
        "unknown_field",
    )
    assert_error(batch_client.get("/v1/batches/6f1c2d7e-0000-4000-8000-000000000000"), 404, "not_found")
    assert row_counts(batch_runtime.engine)["batch"] == 0


@pytest.mark.parametrize("store_kind", ["s3"], indirect=True)
def test_manifest_under_s3_prefix(batch_client: TestClient, batch_runtime: Runtime, tmp_path: Path) -> None:
    from p2p.shared.storage import S3ObjectStore

    store = batch_runtime.store
    assert isinstance(store, S3ObjectStore)
    folder = tmp_path / "s3set"
    write_manifest_folder(folder, count=2)
    for path in folder.iterdir():
        store.client.fput_object(store.bucket, f"incoming/set/{path.name}", str(path))
    response = batch_client.post(
        "/v1/batches", json={"kind": "manifest", "source": f"s3://{store.bucket}/incoming/set/manifest.jsonl"}
    )
    assert response.status_code == 202, response.text
    body = _wait(batch_client, batch_runtime, response.json()["id"])
    assert body["status"] == "succeeded" and body["ingested"] == 2, body


@pytest.mark.parametrize("store_kind", ["local"], indirect=True)
def test_batch_runs_on_a_real_celery_worker(
    db,
    make_settings,
    redis_url: str,
    batch_root: Path,
    store_kind: str,  # type: ignore[no-untyped-def]
) -> None:
    """The production path: the API publishes to Redis, a Celery worker consumes the ingest queue."""
    from celery.contrib.testing.worker import start_worker

    from p2p.shared.queue import INGEST_QUEUE, celery_app, configure_celery, import_task_modules

    settings = make_settings(redis={"url": redis_url}, ingest={"batch_roots": [str(batch_root)]})
    runtime = build_runtime(settings)
    set_process_runtime(runtime)
    configure_celery(settings)
    import_task_modules()
    write_manifest_folder(batch_root / "celery", count=2)
    try:
        with (
            start_worker(
                celery_app, pool="solo", queues=[INGEST_QUEUE], perform_ping_check=False, shutdown_timeout=20
            ),
            TestClient(create_app(runtime=runtime)) as client,
        ):
            response = client.post(
                "/v1/batches", json={"kind": "manifest", "source": str(batch_root / "celery")}
            )
            assert response.status_code == 202
            body = _wait(client, runtime, response.json()["id"])
        assert body["status"] == "succeeded" and body["ingested"] == 2, body
    finally:
        set_process_runtime(None)
        runtime.close()
