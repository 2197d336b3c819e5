"""The APIs' request metrics (by route template, never the raw path) and their ``/metrics`` route."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

from fastapi import FastAPI
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Scope

from p2p.shared.api import edge_options
from p2p.shared.metrics import registry as m

UNMATCHED = "unmatched"  # 404s: one label value, whatever paths clients try


def route_template(scope: Scope) -> str:
    """The matched route's template (``/v1/figures/{figure_id}``), set by the router on the scope."""
    route = scope.get("route")
    path = getattr(route, "path", None)
    return path if isinstance(path, str) and path else UNMATCHED


class RequestMetrics:
    """Counts, times and sizes every HTTP request; told by the edge middleware
    (``p2p.shared.api.ApiEdge``), which sees every answer."""

    def __init__(self, service: str) -> None:
        self.service = service
        self.in_flight = m.HTTP_IN_FLIGHT.labels(service)

    def started(self) -> None:
        self.in_flight.inc()

    def finished(self, scope: Scope, status: int, received: int, seconds: float) -> None:
        self.in_flight.dec()
        route, method = route_template(scope), scope.get("method", "")
        labels = (self.service, method, route, str(status))
        m.HTTP_REQUESTS.labels(*labels).inc()
        m.HTTP_DURATION.labels(*labels).observe(seconds)
        if received:
            m.HTTP_BODY_BYTES.labels(self.service, route).observe(received)


def exposition(extra: CollectorRegistry | None = None) -> bytes:
    """This process's metrics (every process's when a multiprocess folder is set), then ``extra``."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        merged = CollectorRegistry()
        MultiProcessCollector(merged)  # type: ignore[no-untyped-call]
        body = generate_latest(merged)
    else:
        body = generate_latest(REGISTRY)
    return body + (generate_latest(extra) if extra is not None else b"")


def install_metrics(app: FastAPI, *, service: str, collectors: Callable[[FastAPI], list[Collector]]) -> None:
    """Request metrics on every route and ``GET /metrics``; ``collectors`` (built on the first
    scrape, once the app's runtime exists) add gauges read at scrape time."""
    scraped = CollectorRegistry(auto_describe=False)
    built: list[bool] = []
    lock = threading.Lock()

    def metrics_page(request: Request) -> Response:
        with lock:
            if not built:
                for collector in collectors(request.app):
                    scraped.register(collector)
                built.append(True)
        return Response(exposition(scraped), media_type=CONTENT_TYPE_LATEST)

    app.add_route("/metrics", metrics_page, methods=["GET"], include_in_schema=False)
    edge_options(app).metrics = RequestMetrics(service)


def api_collectors(app: FastAPI) -> list[Collector]:
    """The ingest API's scrape-time gauges: queues (with a broker) and jobs, with its runtime's engine."""
    from p2p.shared.metrics.backlog import backlog_collector

    runtime = app.state.runtime
    return [backlog_collector(runtime.settings, lambda: runtime.engine)]


def no_collectors(app: FastAPI) -> list[Collector]:
    return []
