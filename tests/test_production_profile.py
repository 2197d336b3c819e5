"""The production profile: configured servers only, API keys required, mining sent over Redis."""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient
from pydantic import ValidationError
from sqlalchemy import select, text

from p2p.ingest.app import create_app
from p2p.shared.api import startup_notice
from p2p.shared.auth import create_api_key, revoke_api_key
from p2p.shared.db.models import ApiKey
from p2p.shared.queue import MINE_FIGURE_TASK, MINING_QUEUE
from p2p.shared.runtime import Runtime, SchemaOutOfDate, build_runtime
from p2p.shared.settings import Settings
from tests.helpers import assert_error, image_bytes, row_counts, upload


@pytest.fixture
def production_settings(pg_url: str, redis_url: str, s3_settings: dict[str, Any], tmp_path) -> Settings:  # type: ignore[no-untyped-def]
    return Settings(
        profile="production",
        data_dir=tmp_path,
        db={"url": pg_url},
        redis={"url": redis_url},
        s3=s3_settings,
    )


@pytest.fixture
def prod_runtime(db, production_settings: Settings, redis_url: str) -> Iterator[Runtime]:  # type: ignore[no-untyped-def]
    redis.Redis.from_url(redis_url).delete(MINING_QUEUE)
    runtime = build_runtime(production_settings)
    yield runtime
    runtime.close()
    redis.Redis.from_url(redis_url).delete(MINING_QUEUE)


@pytest.fixture
def prod_client(prod_runtime: Runtime) -> Iterator[TestClient]:
    with TestClient(create_app(runtime=prod_runtime)) as client:
        yield client


def _key(runtime: Runtime, *scopes: str) -> str:
    with runtime.session() as session:
        return create_api_key(session, name="test", scopes=list(scopes))[1]


def test_production_requires_servers_and_real_secrets(pg_url: str, redis_url: str, s3_settings) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValidationError, match="P2P_DB__URL"):
        Settings(profile="production")
    with pytest.raises(ValidationError, match="default S3 secret"):
        Settings(
            profile="production",
            db={"url": pg_url},
            redis={"url": redis_url},
            s3={**s3_settings, "secret_key": "minioadmin"},
        )
    with pytest.raises(ValidationError, match="without API keys"):
        Settings(
            profile="production",
            db={"url": pg_url},
            redis={"url": redis_url},
            s3=s3_settings,
            auth={"required": False},
        )
    with pytest.raises(ValidationError):
        Settings(unknown_section=1)  # type: ignore[call-arg]


def test_settings_read_nested_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("P2P_INGEST__MAX_UPLOAD_BYTES", "12345")
    monkeypatch.setenv("P2P_S3__ENDPOINT", "minio:9000")
    settings = Settings()
    assert settings.ingest.max_upload_bytes == 12345
    assert settings.s3.endpoint == "minio:9000" and not settings.embedded_store
    assert settings.embedded_db and settings.embedded_queue and not settings.auth_required


def test_embedded_profile_says_it_runs_open() -> None:
    assert "AUTH DISABLED" in startup_notice(Settings(), "ingest API")
    assert "AUTH DISABLED" not in startup_notice(Settings(auth={"required": True}), "ingest API")


def test_both_apis_say_at_start_that_keys_are_off(make_settings, caplog: pytest.LogCaptureFixture) -> None:  # type: ignore[no-untyped-def]
    from p2p.embedding_api.app import create_app as create_embedding_app

    settings = make_settings()
    for make, name in ((create_app, "ingest API"), (create_embedding_app, "embedding API")):
        caplog.clear()
        with caplog.at_level(logging.WARNING), TestClient(make(settings)):
            pass
        said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert any(m.startswith(f"{name}: ") and "AUTH DISABLED" in m for m in said), said


def test_write_endpoints_need_a_key_with_the_right_scope(
    prod_client: TestClient, prod_runtime: Runtime
) -> None:
    data = image_bytes(seed=40)
    assert_error(upload(prod_client, data), 401, "missing_api_key")
    assert_error(
        upload(prod_client, data, headers={"Authorization": "Bearer nonsense"}), 401, "invalid_api_key"
    )
    assert_error(
        upload(prod_client, data, headers={"Authorization": "Bearer p2p_abc_def"}), 401, "invalid_api_key"
    )
    reader = _key(prod_runtime, "read")
    assert_error(
        upload(prod_client, data, headers={"Authorization": f"Bearer {reader}"}), 403, "insufficient_scope"
    )
    assert row_counts(prod_runtime.engine)["figure"] == 0

    ingester = _key(prod_runtime, "ingest")
    accepted = upload(prod_client, data, headers={"Authorization": f"Bearer {ingester}"})
    assert accepted.status_code == 202
    figure_url = f"/v1/figures/{accepted.json()['figure_id']}"
    assert_error(prod_client.get(figure_url), 401, "missing_api_key")
    assert prod_client.get(figure_url, headers={"Authorization": f"Bearer {reader}"}).status_code == 200
    admin = _key(prod_runtime, "admin")
    assert prod_client.get(figure_url, headers={"Authorization": f"Bearer {admin}"}).status_code == 200

    with prod_runtime.session() as session:
        assert revoke_api_key(session, ingester.split("_")[1])
    assert_error(
        upload(prod_client, image_bytes(seed=41), headers={"Authorization": f"Bearer {ingester}"}),
        401,
        "revoked_api_key",
    )


def test_an_upload_without_a_key_is_refused_whatever_its_body(
    prod_client: TestClient, prod_runtime: Runtime
) -> None:
    """The key is checked first: a client without one gets 401 however broken its body is."""
    headers = {"Content-Type": "multipart/form-data; boundary=b0undary"}
    broken = b"--b0undary\r\nContent-Disposition: form-data; name=image; filename=a.png\r\n"
    assert_error(prod_client.post("/v1/figures", content=broken, headers=headers), 401, "missing_api_key")
    ingester = _key(prod_runtime, "ingest")
    keyed = {**headers, "Authorization": f"Bearer {ingester}"}
    refused = prod_client.post("/v1/figures", content=broken, headers=keyed)
    assert 400 <= refused.status_code < 500 and refused.status_code not in (401, 403), refused.text
    assert row_counts(prod_runtime.engine)["figure"] == 0


def test_the_key_check_runs_outside_a_transaction(prod_client: TestClient, prod_runtime: Runtime) -> None:
    """Autocommit: the key's SELECT (and its last_used_at UPDATE) need no BEGIN and ROLLBACK."""
    from sqlalchemy import event

    seen: list[tuple[str, bool]] = []

    def record(conn, cursor, statement, parameters, context, executemany) -> None:  # type: ignore[no-untyped-def]
        if "api_key" in statement:
            seen.append((statement.split()[0], conn.connection.dbapi_connection.autocommit))

    ingester = _key(prod_runtime, "ingest")
    event.listen(prod_runtime.engine, "before_cursor_execute", record)
    try:
        accepted = upload(prod_client, image_bytes(seed=44), headers={"Authorization": f"Bearer {ingester}"})
    finally:
        event.remove(prod_runtime.engine, "before_cursor_execute", record)
    assert accepted.status_code == 202, accepted.text
    assert ("SELECT", True) in seen and ("UPDATE", True) in seen
    assert all(autocommit for _, autocommit in seen), seen
    with prod_runtime.session() as session:
        assert session.scalars(select(ApiKey.last_used_at)).all() != [None]


def test_keys_are_stored_hashed(prod_runtime: Runtime) -> None:
    token = _key(prod_runtime, "ingest", "read")
    secret = token.split("_", 2)[2]
    with prod_runtime.engine.connect() as conn:
        dump = json.dumps([list(map(str, row)) for row in conn.execute(text("SELECT * FROM api_key"))])
    assert secret not in dump and token.split("_")[1] in dump


def test_ingest_sends_mining_task_over_redis(
    prod_client: TestClient, prod_runtime: Runtime, redis_url: str
) -> None:
    key = _key(prod_runtime, "ingest")
    response = upload(prod_client, image_bytes(seed=42), headers={"Authorization": f"Bearer {key}"})
    assert response.status_code == 202
    job_id = response.json()["job_id"]
    client = redis.Redis.from_url(redis_url)
    messages = client.lrange(MINING_QUEUE, 0, -1)
    assert len(messages) == 1
    message = json.loads(messages[0])
    assert message["headers"]["task"] == MINE_FIGURE_TASK
    args = json.loads(base64.b64decode(message["body"]))[0]
    assert args == [job_id]

    # A retried upload of the same figure does not enqueue the job twice.
    again = upload(prod_client, image_bytes(seed=42), headers={"Authorization": f"Bearer {key}"})
    assert again.status_code == 200
    assert client.llen(MINING_QUEUE) == 1
    job = prod_client.get(
        f"/v1/jobs/{job_id}", headers={"Authorization": f"Bearer {_key(prod_runtime, 'read')}"}
    )
    assert job.json()["enqueued_at"] is not None


def test_broker_down_keeps_figure_and_a_retry_enqueues(
    db,
    production_settings: Settings,
    redis_url: str,  # type: ignore[no-untyped-def]
) -> None:
    redis.Redis.from_url(redis_url).delete(MINING_QUEUE)
    dead = production_settings.model_copy(
        update={"redis": production_settings.redis.model_copy(update={"url": "redis://127.0.0.1:1/0"})}
    )
    runtime = build_runtime(dead)
    try:
        key = _key(runtime, "ingest")
        with TestClient(create_app(runtime=runtime)) as client:
            failed = upload(client, image_bytes(seed=43), headers={"Authorization": f"Bearer {key}"})
        assert_error(failed, 503, "broker_unavailable")
        assert row_counts(runtime.engine)["figure"] == 1
    finally:
        runtime.close()
    live = build_runtime(production_settings)
    try:
        with TestClient(create_app(runtime=live)) as client:
            retried = upload(client, image_bytes(seed=43), headers={"Authorization": f"Bearer {key}"})
        assert retried.status_code == 200 and retried.json()["duplicate"] is True
        assert redis.Redis.from_url(redis_url).llen(MINING_QUEUE) == 1
    finally:
        live.close()
        redis.Redis.from_url(redis_url).delete(MINING_QUEUE)


def test_production_refuses_an_unmigrated_database(postgres, production_settings: Settings) -> None:  # type: ignore[no-untyped-def]
    if postgres.embedded is None:
        pytest.skip("needs the embedded test server to create a scratch database")
    postgres.embedded.ensure_database("p2p_unmigrated")
    settings = production_settings.model_copy(
        update={
            "db": production_settings.db.model_copy(update={"url": postgres.embedded.url("p2p_unmigrated")})
        }
    )
    with pytest.raises(SchemaOutOfDate, match="p2p db upgrade"):
        build_runtime(settings)
