"""`p2p queues`: what waits in each queue of the broker, how old its oldest message is, who consumes
it and whether it grows or drains (the same reading as the workers' queue gauges)."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from p2p.shared.metrics import broker

out = Console()


@dataclass(frozen=True)
class QueueRow:
    queue: str
    messages: int
    oldest_age_s: float | None
    oldest_task: str | None
    consumers: int | None  # None: no worker answered the inspection (or it was skipped)
    rate_per_s: float  # change of the depth per second over the sampling window: > 0 grows


def consumers_by_queue(app: Any, timeout_s: float) -> dict[str, int]:
    """Workers consuming each queue, from Celery's remote inspection (workers that answer in time)."""
    answers = app.control.inspect(timeout=timeout_s).active_queues() or {}
    counts: dict[str, int] = {}
    for queues in answers.values():
        for queue in queues or []:
            counts[queue["name"]] = counts.get(queue["name"], 0) + 1
    return counts


def queue_report(client: Any, *, interval_s: float, consumers: dict[str, int] | None) -> list[QueueRow]:
    """Two readings ``interval_s`` apart: depths and ages from the second, the rate from both."""
    first = {state.name: state.depth for state in broker.read_queues(client)}
    started = time.monotonic()
    time.sleep(interval_s)
    second = broker.read_queues(client)
    elapsed = max(time.monotonic() - started, 1e-9)
    return [
        QueueRow(
            queue=state.name,
            messages=state.depth,
            oldest_age_s=None if state.oldest_age_s is None else round(state.oldest_age_s, 1),
            oldest_task=state.oldest_task,
            consumers=None if consumers is None else consumers.get(state.name, 0),
            rate_per_s=round((state.depth - first.get(state.name, 0)) / elapsed, 2),
        )
        for state in second
    ]


def _table(rows: list[QueueRow]) -> Table:
    table = Table(title="queues")
    for column in ("queue", "messages", "oldest (s)", "oldest task", "consumers", "change/s"):
        table.add_column(column)
    for row in rows:
        table.add_row(
            row.queue,
            str(row.messages),
            "-" if row.oldest_age_s is None else f"{row.oldest_age_s:.1f}",
            row.oldest_task or "-",
            "?" if row.consumers is None else str(row.consumers),
            f"{row.rate_per_s:+.2f}",
        )
    return table


def queues(
    interval: Annotated[float, typer.Option(min=0.0, help="Seconds between the two depth readings.")] = 1.0,
    inspect: Annotated[
        bool, typer.Option("--inspect/--no-inspect", help="Ask the workers which queues they consume.")
    ] = True,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document instead of a table.")] = False,
) -> None:
    """Depth, oldest message, consumers and rate of every queue, read from the broker (Redis)."""
    from p2p.cli.common import settings_or_exit
    from p2p.shared.queue import configure_celery

    settings = settings_or_exit()
    if not settings.redis.url:
        out.print("no broker: the embedded profile queues tasks in-process (set P2P_REDIS__URL)")
        raise typer.Exit(1)
    consumers = consumers_by_queue(configure_celery(settings), 1.0) if inspect else None
    client = broker.open_client(settings.redis.url)
    try:
        rows = queue_report(client, interval_s=interval, consumers=consumers)
    finally:
        client.close()
    if as_json:
        typer.echo(json.dumps([asdict(row) for row in rows]))
    else:
        out.print(_table(rows))
