from __future__ import annotations

from fastapi.testclient import TestClient

from p2p.ingest.app import create_app
from p2p.shared.db.engine import make_engine
from p2p.shared.queue import CeleryDispatcher, configure_celery
from p2p.shared.runtime import Runtime, build_runtime
from p2p.shared.storage import S3ObjectStore


def test_healthz_and_readyz_when_everything_answers(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json()["checks"] == {"database": "ok", "broker": "ok", "object_store": "ok"}


def test_readyz_reports_each_dead_dependency(make_settings, db) -> None:  # type: ignore[no-untyped-def]
    runtime: Runtime = build_runtime(make_settings())
    live_engine = runtime.engine
    try:
        runtime.engine = make_engine("postgresql+psycopg://nobody@127.0.0.1:1/none")
        settings = make_settings(redis={"url": "redis://127.0.0.1:1/0"})
        runtime.dispatcher = CeleryDispatcher(configure_celery(settings), "redis://127.0.0.1:1/0")
        runtime.store = S3ObjectStore(
            endpoint="127.0.0.1:1", access_key="a", secret_key="b", bucket="nothing"
        )
        with TestClient(create_app(runtime=runtime)) as client:
            assert client.get("/healthz").status_code == 200
            response = client.get("/readyz")
        assert response.status_code == 503
        body = response.json()
        assert body["error"]["type"] == "not_ready"
        assert all(value != "ok" for value in body["checks"].values()), body
    finally:
        runtime.engine.dispose()
        runtime.engine = live_engine
        runtime.close()
