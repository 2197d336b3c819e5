"""Alembic, driven from code so that the migrations ship inside the installed package."""

from __future__ import annotations

import threading
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, inspect

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"
# Alembic's `context` is one module-level proxy: two threads of a process migrating at once (two
# API servers starting together) would run in each other's context. Other processes wait on the
# database's advisory lock instead (migrations/env.py).
_alembic_lock = threading.Lock()


def alembic_config(url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    # ConfigParser interpolation would eat '%' in URL-quoted socket paths.
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def upgrade(url: str, revision: str = "head") -> None:
    with _alembic_lock:
        command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str) -> None:
    with _alembic_lock:
        command.downgrade(alembic_config(url), revision)


def current_revision(engine: Engine) -> str | None:
    if not inspect(engine).has_table("alembic_version"):
        return None
    with engine.connect() as conn:
        row = conn.exec_driver_sql("SELECT version_num FROM alembic_version").first()
    return row[0] if row else None
