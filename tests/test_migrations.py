from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Engine, inspect

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
        from alembic.script import ScriptDirectory

        head = ScriptDirectory.from_config(migrate.alembic_config(url)).get_current_head()
        assert migrate.current_revision(engine) == head
    finally:
        engine.dispose()
