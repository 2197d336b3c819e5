"""`p2p jobs`: the durable jobs of every kind (ingest batches, mining, re-index, training) in one
lifecycle vocabulary; one job's timings; failed jobs sent again."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from datetime import timedelta
from typing import Annotated, Any

import typer
from rich.table import Table

from p2p.cli.common import console, open_runtime, settings_or_exit
from p2p.cli.consoles import make_console
from p2p.shared.jobs import KINDS, Phase

out = make_console()

jobs_app = typer.Typer(
    help="Durable jobs: list (filters below), `show KIND ID`, `retry` failed ones.",
    invoke_without_command=True,
    no_args_is_help=False,
)

KIND_HELP = f"Only this kind (repeat for several): {', '.join(KINDS)}."
STATUS_HELP = f"Only this status (repeat for several): {', '.join(p.value for p in Phase)}."
KindOption = Annotated[list[str] | None, typer.Option("--kind", help=KIND_HELP)]
OlderOption = Annotated[
    str | None, typer.Option("--older-than", help="Only jobs created longer ago than this: 90s, 15m, 1h, 2d.")
]
RequestOption = Annotated[str | None, typer.Option("--request-id", help="Only jobs created by this request.")]
LimitOption = Annotated[
    int, typer.Option("--limit", min=1, max=10000, help="At most this many, newest first.")
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


def _bad_input(message: str) -> typer.Exit:
    console.print(f"[red]{message}[/red]")
    return typer.Exit(2)


def _filters(kinds: Sequence[str] | None, statuses: Sequence[str] | None, older_than: str | None) -> Any:
    from p2p.shared.job_report import parse_duration, parse_kinds, parse_phases

    try:
        age: timedelta | None = parse_duration(older_than) if older_than is not None else None
        return parse_kinds(kinds), parse_phases(statuses), age
    except ValueError as exc:
        raise _bad_input(str(exc)) from exc


def _find(
    *,
    kinds: list[str],
    phases: list[Phase],
    age: timedelta | None,
    request_id: str | None,
    limit: int,
) -> list[Any]:
    from p2p.shared.job_report import list_jobs

    runtime = open_runtime(settings_or_exit())
    try:
        return list_jobs(
            runtime, kinds=kinds, phases=phases, older_than=age, request_id=request_id, limit=limit
        )
    finally:
        runtime.close()


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _print_list(found: list[Any], *, as_json: bool, title: str) -> None:
    if as_json:
        typer.echo(json.dumps([info.as_dict() for info in found], indent=2))
        return
    if not found:
        out.print("no jobs match")
        return
    table = Table(title=title)
    for column in ("kind", "id", "status", "created", "queued s", "running s", "attempts", "error"):
        table.add_column(column)
    for info in found:
        created = f"{info.created_at:%Y-%m-%d %H:%M:%S}" if info.created_at else "-"
        error = (info.error or "")[:60]
        table.add_row(
            info.kind,
            str(info.job_id),
            info.phase.value,
            created,
            _seconds(info.queued_s),
            _seconds(info.running_s),
            str(info.attempts),
            error,
        )
    out.print(table)


@jobs_app.callback()
def jobs_list(
    ctx: typer.Context,
    status: Annotated[list[str] | None, typer.Option("--status", help=STATUS_HELP)] = None,
    kind: KindOption = None,
    older_than: OlderOption = None,
    request_id: RequestOption = None,
    limit: LimitOption = 50,
    as_json: JsonOption = False,
) -> None:
    """List jobs of every kind, newest first: `p2p jobs --status failed --kind mining --older-than 1h`."""
    if ctx.invoked_subcommand is not None:
        return
    kinds, phases, age = _filters(kind, status, older_than)
    found = _find(kinds=kinds, phases=phases, age=age, request_id=request_id, limit=limit)
    _print_list(found, as_json=as_json, title="jobs")


def _job_id(text: str) -> uuid.UUID:
    try:
        return uuid.UUID(text)
    except ValueError as exc:
        raise _bad_input(f"bad job id {text!r}: a UUID") from exc


def _load_job(kind: str, job_id: str) -> Any:
    """The job, or exit: 2 for a bad kind or id, 1 when there is no such job."""
    from p2p.shared.job_report import get_job

    kinds, _, _ = _filters([kind], None, None)
    parsed = _job_id(job_id)
    runtime = open_runtime(settings_or_exit())
    try:
        info = get_job(runtime, kinds[0], parsed)
    finally:
        runtime.close()
    if info is None:
        console.print(f"[red]no {kind} job {job_id}[/red]")
        raise typer.Exit(1)
    return info


@jobs_app.command("show")
def jobs_show(
    kind: Annotated[str, typer.Argument(help=KIND_HELP)],
    job_id: Annotated[str, typer.Argument(help="The job's id.")],
    as_json: JsonOption = False,
) -> None:
    """One job: its status, timings (queued, started, finished, time in queue, time running),
    attempts, failure reason and the request that created it."""
    data = _load_job(kind, job_id).as_dict()
    if as_json:
        typer.echo(json.dumps(data, indent=2))
        return
    table = Table(title=f"{kind} job {job_id}", show_header=False)
    table.add_column("field")
    table.add_column("value")
    for field, value in data.items():
        table.add_row(field, "-" if value is None else str(value))
    out.print(table)


@jobs_app.command("retry")
def jobs_retry(
    kind_arg: Annotated[
        str | None, typer.Argument(metavar="[KIND]", help="With ID: retry this one job.")
    ] = None,
    job_id: Annotated[str | None, typer.Argument(metavar="[ID]", help="The failed job's id.")] = None,
    kind: KindOption = None,
    older_than: OlderOption = None,
    request_id: RequestOption = None,
    limit: LimitOption = 100,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="List what would be retried; change nothing.")
    ] = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    as_json: JsonOption = False,
) -> None:
    """Send failed jobs to their queue again: one (`retry mining ID`) or every failed job matching
    the filters (`retry --kind mining --older-than 1h`). Asks before it changes anything."""
    targets = _retry_targets(
        kind_arg, job_id, kind=kind, older_than=older_than, request_id=request_id, limit=limit
    )
    if dry_run or not targets:
        _print_list(targets, as_json=as_json, title="failed jobs to retry (dry run)" if dry_run else "jobs")
        return
    _print_list(targets, as_json=as_json, title="failed jobs to retry")
    if not yes and not typer.confirm(f"retry {len(targets)} failed job(s)?", default=False, err=True):
        console.print("nothing retried")
        raise typer.Exit(1)
    retried = _retry(targets)
    console.print(f"retried {retried} of {len(targets)} job(s)")


def _retry_targets(
    kind_arg: str | None,
    job_id: str | None,
    *,
    kind: list[str] | None,
    older_than: str | None,
    request_id: str | None,
    limit: int,
) -> list[Any]:
    if kind_arg is None:
        kinds, phases, age = _filters(kind, [Phase.FAILED.value], older_than)
        return _find(kinds=kinds, phases=phases, age=age, request_id=request_id, limit=limit)
    if job_id is None or kind or older_than or request_id:
        raise _bad_input("give KIND and ID for one job, or filters (--kind, --older-than...) for several")
    info = _load_job(kind_arg, job_id)
    if info.phase is not Phase.FAILED:
        console.print(
            f"[red]{kind_arg} job {job_id} is {info.phase.value}, not failed: nothing to retry[/red]"
        )
        raise typer.Exit(1)
    return [info]


def _retry(targets: list[Any]) -> int:
    from p2p.shared.jobs import retry_failed

    runtime = open_runtime(settings_or_exit())
    try:
        return sum(
            retry_failed(
                runtime, KINDS[info.kind], info.job_id, reason="retried by an operator (p2p jobs retry)"
            )
            for info in targets
        )
    finally:
        runtime.close()
