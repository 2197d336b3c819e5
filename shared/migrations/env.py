from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, pool, text

from p2p.shared.db import models  # noqa: F401  (registers the tables)
from p2p.shared.db.base import Base, is_migrated_name

target_metadata = Base.metadata
# Servers sharing one database (the two APIs of `p2p demo`, replicas starting together) may migrate
# at once: one waits for the other's transaction, then finds the schema current.
MIGRATION_LOCK_KEY = 0x70327032


def run_migrations_offline() -> None:
    context.configure(
        url=context.config.get_main_option("sqlalchemy.url"),
        target_metadata=target_metadata,
        literal_binds=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    url = context.config.get_main_option("sqlalchemy.url")
    assert url is not None
    engine = create_engine(url, poolclass=pool.NullPool)
    with engine.connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            compare_type=True,
            include_name=is_migrated_name,
        )
        with context.begin_transaction():
            connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
