"""The ingest API process: its routers are the ingest service's own (``p2p.ingest.app``).

Kept apart from ``p2p.apps.embedding``: the ingest image installs no ML libraries.
"""

from __future__ import annotations

from fastapi import FastAPI

from p2p.apps.tasks import register_tasks
from p2p.ingest import app as ingest_app_module
from p2p.shared.runtime import Runtime
from p2p.shared.settings import Settings


def ingest_app(settings: Settings | None = None, runtime: Runtime | None = None) -> FastAPI:
    register_tasks()  # the embedded profile mines (and embeds) on the API's in-process pool
    return ingest_app_module.create_app(settings, runtime)
