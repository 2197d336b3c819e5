from __future__ import annotations

import io

import redis
from sqlalchemy import Engine, text

from p2p.shared.storage import S3ObjectStore


def test_postgres_has_pgvector_and_schema(db: Engine) -> None:
    with db.connect() as conn:
        version = conn.execute(text("SELECT extversion FROM pg_extension WHERE extname = 'vector'")).scalar()
        tables = set(
            conn.execute(text("SELECT tablename FROM pg_tables WHERE schemaname='public'")).scalars()
        )
        distance = conn.execute(text("SELECT '[1,0]'::vector <=> '[0,1]'::vector")).scalar()
    assert version is not None
    assert {"article", "figure", "panel", "region", "mining_job", "batch", "batch_item", "api_key"} <= tables
    assert distance == 1.0


def test_redis_answers(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    client.set("p2p:smoke", "1")
    assert client.get("p2p:smoke") == b"1"
    client.delete("p2p:smoke")


def test_s3_round_trip(s3_store: S3ObjectStore) -> None:
    import hashlib

    data = b"hello s3"
    s3_store.put(
        "a/b.txt",
        io.BytesIO(data),
        size=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        content_type="text/plain",
    )
    assert s3_store.get_bytes("a/b.txt") == data
    assert list(s3_store.list("a/")) == ["a/b.txt"]
