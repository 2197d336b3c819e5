"""The cost of structured logging and request ids, against the work they describe.

Two questions (issue 22 caps metrics and logging overhead at 3 %):

* one log line: the JSON line (context and extras) against the plain line the CLI wrote before,
  both through a real StreamHandler to /dev/null, in CPU microseconds per line;
* one request: the edge middleware (``ApiEdge``: the request id, and with it the security
  headers and the catch-all) around a one-route FastAPI
  app against the same app without it, driven as ASGI calls (no sockets, so the middleware is
  not hidden in HTTP cost).

Rounds alternate product and reference (ABBA); the ratios use medians over rounds. Run:
``.venv/bin/python bench/log_bench.py [--lines 20000] [--requests 4000] [--rounds 8]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI

from p2p.shared import logs
from p2p.shared.api import edge_options

EVENT = {"job_kind": "mining", "job_id": "1c0e4b7e", "outcome": "succeeded", "attempt": 1, "running_s": 0.84}


def _logger(formatter: logging.Formatter, stream: Any) -> logging.Logger:
    logger = logging.getLogger(f"bench.{id(formatter)}")
    logger.handlers.clear()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter)
    logger.addHandler(handler)
    logger.propagate = False
    logger.setLevel(logging.INFO)
    return logger


def _lines(logger: logging.Logger, count: int) -> float:
    """CPU seconds for ``count`` job-event lines written in a task's context."""
    with logs.bound(request_id="upload-7f3a", task_name="p2p.mining.mine_figure", queue="mining"):
        start = time.process_time()
        for _ in range(count):
            logger.info("job %s %s %s", "mining", "1c0e4b7e", "succeeded", extra=EVENT)
        return time.process_time() - start


def _app(with_ids: bool) -> Any:
    app = FastAPI()

    @app.get("/v1/jobs/x")
    async def job() -> dict[str, str]:
        return {"status": "queued"}

    if with_ids:
        edge_options(app)  # installs ApiEdge, which gives every request its id
    return app


async def _requests(app: Any, count: int) -> float:
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "path": "/v1/jobs/x",
        "raw_path": b"/v1/jobs/x",
        "query_string": b"",
        "headers": [(b"host", b"bench"), (b"x-request-id", b"upload-7f3a")],
        "client": ("127.0.0.1", 5000),
        "server": ("127.0.0.1", 8000),
        "scheme": "http",
        "root_path": "",
    }

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        return None

    start = time.process_time()
    for _ in range(count):
        await app(dict(scope), receive, send)
    return time.process_time() - start


def _abba(rounds: int, product: Callable[[], float], reference: Callable[[], float]) -> dict[str, Any]:
    times: dict[str, list[float]] = {"product": [], "reference": []}
    for i in range(rounds):
        order = ("product", "reference") if i % 2 == 0 else ("reference", "product")
        for name in order:
            times[name].append(product() if name == "product" else reference())
    medians = {k: statistics.median(v) for k, v in times.items()}
    return {"median_cpu_s": medians, "ratio": medians["product"] / medians["reference"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--lines", type=int, default=20000)
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    with open(os.devnull, "w") as devnull:
        json_logger = _logger(logs.JsonFormatter(service="worker"), devnull)
        text_logger = _logger(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"), devnull)
        lines = _abba(
            args.rounds, lambda: _lines(json_logger, args.lines), lambda: _lines(text_logger, args.lines)
        )
    loop = asyncio.new_event_loop()
    with_ids, without = _app(True), _app(False)
    requests = _abba(
        args.rounds,
        lambda: loop.run_until_complete(_requests(with_ids, args.requests)),
        lambda: loop.run_until_complete(_requests(without, args.requests)),
    )
    loop.close()
    report = {
        "lines": args.lines,
        "requests": args.requests,
        "rounds": args.rounds,
        "json_line_us": 1e6 * lines["median_cpu_s"]["product"] / args.lines,
        "plain_line_us": 1e6 * lines["median_cpu_s"]["reference"] / args.lines,
        "json_over_plain": lines["ratio"],
        "request_with_ids_us": 1e6 * requests["median_cpu_s"]["product"] / args.requests,
        "request_without_us": 1e6 * requests["median_cpu_s"]["reference"] / args.requests,
        "with_ids_over_without": requests["ratio"],
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
