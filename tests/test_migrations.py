from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, inspect, text

from p2p.shared.db import migrate
from p2p.shared.db.base import Base, is_migrated_name
from p2p.shared.db.engine import make_engine
from tests.servers import PostgresHandle


def test_models_and_migrations_agree(db: Engine) -> None:
    with db.connect() as conn:
        context = MigrationContext.configure(
            conn, opts={"compare_type": True, "include_name": is_migrated_name}
        )
        diff = compare_metadata(context, Base.metadata)
    assert diff == [], f"models differ from migrations; write a migration: {diff}"


def _head(url: str) -> str | None:
    return ScriptDirectory.from_config(migrate.alembic_config(url)).get_current_head()


def test_upgrade_downgrade_round_trip(postgres: PostgresHandle) -> None:
    if postgres.embedded is None:
        pytest.skip("needs the embedded test server to create a scratch database")
    postgres.embedded.ensure_database("p2p_roundtrip")
    url = postgres.embedded.url("p2p_roundtrip")
    engine = make_engine(url)
    try:
        migrate.upgrade(url)
        assert "figure" in inspect(engine).get_table_names()
        migrate.downgrade(url, "base")
        assert "figure" not in inspect(engine).get_table_names()
        migrate.upgrade(url)
        assert migrate.current_revision(engine) == _head(url)
    finally:
        engine.dispose()


def test_miner_version_migration_keeps_what_mined_each_job(postgres: PostgresHandle) -> None:
    """Jobs mined before 0005 get their version from params or their panels' provenance; the way
    back restores the one-job-per-figure-and-backend key."""
    if postgres.embedded is None:
        pytest.skip("needs the embedded test server to create a scratch database")
    postgres.embedded.ensure_database("p2p_miner_version")
    url = postgres.embedded.url("p2p_miner_version")
    engine = make_engine(url)
    try:
        if migrate.current_revision(engine) is not None:  # a database left by an earlier run
            migrate.downgrade(url, "base")
        migrate.upgrade(url, "0004")
        with engine.begin() as conn:
            for n, params in ((1, '{"miner_version": "cpu-1"}'), (2, "{}"), (3, "{}")):
                conn.execute(
                    text(
                        "INSERT INTO figure (id, image_sha256, caption_sha256, object_key, byte_size, width, "
                        "height, format, caption, inline_references, source, status, created_at) "
                        "VALUES (:id, :sha, :sha, 'k', 1, 1, 1, 'PNG', '', '[]', 'test', 'mined', now())"
                    ),
                    {"id": f"00000000-0000-0000-0000-00000000000{n}", "sha": str(n) * 64},
                )
                conn.execute(
                    text(
                        "INSERT INTO mining_job (id, figure_id, backend, backend_version, params, status, "
                        "attempts, stage_timings, cost, notes, created_at) VALUES (:id, :fig, "
                        "'cpu', '1', CAST(:params AS jsonb), :status, 1, '{}', '{}', '[]', now())"
                    ),
                    {
                        "id": f"10000000-0000-0000-0000-00000000000{n}",
                        "fig": f"00000000-0000-0000-0000-00000000000{n}",
                        "params": params,
                        "status": "queued" if n == 3 else "succeeded",
                    },
                )
            conn.execute(
                text(
                    "INSERT INTO panel (id, figure_id, mining_job_id, ordinal, box, provenance, created_at) "
                    "VALUES ('20000000-0000-0000-0000-000000000002', "
                    "'00000000-0000-0000-0000-000000000002', '10000000-0000-0000-0000-000000000002', 0, "
                    '\'{0,0,1,1}\', \'{"backend": "cpu", "version": "cpu-0"}\', now())'
                )
            )
        migrate.upgrade(url)
        with engine.connect() as conn:
            versions = dict(conn.execute(text("SELECT figure_id::text, miner_version FROM mining_job")).all())
            provenance = conn.execute(text("SELECT provenance FROM panel")).scalar_one()
        assert versions == {
            "00000000-0000-0000-0000-000000000001": "cpu-1",  # from params
            "00000000-0000-0000-0000-000000000002": "cpu-0",  # from its panel's provenance
            "00000000-0000-0000-0000-000000000003": None,  # not mined yet
        }
        assert provenance == {"backend": "cpu", "miner_version": "cpu-0"}
        with engine.begin() as conn:  # a newer miner's job for figure 1 beside the old one
            conn.execute(
                text(
                    "INSERT INTO mining_job (id, figure_id, backend, miner_version, params, status, "
                    "attempts, stage_timings, cost, notes, created_at) VALUES "
                    "('10000000-0000-0000-0000-000000000009', '00000000-0000-0000-0000-000000000001', 'cpu', "
                    "'cpu-2', '{}', 'succeeded', 1, '{}', '{}', '[]', now() + interval '1 hour')"
                )
            )
            conn.execute(
                text(
                    "UPDATE mining_job SET superseded_by_id = '10000000-0000-0000-0000-000000000009' "
                    "WHERE id = '10000000-0000-0000-0000-000000000001'"
                )
            )
        migrate.downgrade(url, "0004")
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT id::text, backend_version FROM mining_job ORDER BY id")).all()
            provenance = conn.execute(text("SELECT provenance FROM panel")).scalar_one()
        assert [r[0][-1] for r in rows] == ["2", "3", "9"] and {r[1] for r in rows} == {"1"}
        assert provenance == {"backend": "cpu", "version": "cpu-0"}
    finally:
        engine.dispose()
