"""`p2p recover`: list the jobs and batches stuck without a live owner, and send them again."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from p2p.shared.jobs import KINDS

out = Console()


def recover(
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List what is stuck; change nothing.")] = False,
    older_than: Annotated[
        float | None,
        typer.Option(help="Seconds a queued job may wait before it counts as lost (default: settings)."),
    ] = None,
    kind: Annotated[list[str] | None, typer.Option(help=f"Only these kinds: {', '.join(KINDS)}.")] = None,
) -> None:
    """Jobs left "queued" (message lost) or "running" (worker gone) go back on their queue; a job
    whose worker was lost too often is failed with the reason. Safe to run at any time."""
    from p2p.cli.main import _runtime, _settings
    from p2p.shared.recovery import recover as run_recovery

    unknown = sorted(set(kind or []) - set(KINDS))
    if unknown:
        raise typer.BadParameter(f"unknown kinds {unknown}; known: {', '.join(KINDS)}")
    runtime = _runtime(_settings())
    try:
        found = run_recovery(runtime, dry_run=dry_run, requeue_after_s=older_than, kinds=kind or None)
    finally:
        runtime.close()
    table = Table(title=f"stuck jobs ({'dry run' if dry_run else 'recovered'})")
    for column in ("kind", "id", "state", "why", "action", "done"):
        table.add_column(column)
    for job in found:
        done = "-" if dry_run else ("yes" if job.done else "no")
        table.add_row(job.kind, str(job.job_id), job.phase.value, job.reason, job.action, done)
    out.print(table if found else "nothing stuck")
