"""`p2p mine`: `--stale` re-mines, through the mining queue, the figures an older miner version
produced; `IMAGE...` mines images here, with no server (``mine_local``)."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from p2p.cli.common import open_runtime, settings_or_exit
from p2p.cli.mine_local import mine_here
from p2p.mining import remine
from p2p.shared.db.models import JobStatus
from p2p.shared.runtime import Runtime

out = Console()
err = Console(stderr=True)
POLL_S = 0.5


def current_version(backend: str) -> str:
    """The version of the miner this installation runs for ``backend`` (what its workers run)."""
    # Lazy: building a miner loads its models (torch, weights), which only this command needs.
    from p2p.mining.tasks import get_miner

    return str(get_miner(backend).version)


def mine(
    images: Annotated[
        list[Path] | None, typer.Argument(help="Images or folders of images to mine here, with no server.")
    ] = None,
    caption: Annotated[
        str | None, typer.Option(help="Local mining: the caption, for every image given.")
    ] = None,
    caption_file: Annotated[
        Path | None, typer.Option("--caption-file", help="Local mining: a text file holding the caption.")
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Local mining: one JSON object per figure, one a line.")
    ] = False,
    draw_dir: Annotated[
        Path | None, typer.Option("--draw", help="Local mining: write each figure with its boxes drawn here.")
    ] = None,
    stale: Annotated[
        bool, typer.Option("--stale", help="Re-mine the figures whose results an older miner version made.")
    ] = False,
    backend: Annotated[str | None, typer.Option(help="Mining backend (default: the configured one).")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Only count the stale figures.")] = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask before queueing.")] = False,
    limit: Annotated[int | None, typer.Option(min=1, help="Re-mine at most this many figures.")] = None,
    wait: Annotated[bool, typer.Option(help="Follow the jobs with a progress bar until they finish.")] = True,
) -> None:
    """Mine figures. IMAGE...: mine those images (or the images in those folders) here with the CPU
    backend, no server: a table per figure, or --json lines, and --draw for the boxes.

    --stale: re-mine what an older miner produced: counts first, then queues one job per figure on
    the mining queue. Each figure keeps its results until its new ones are complete (then they
    replace them in one transaction); a re-mine that fails leaves the old ones. Ctrl-C stops
    watching, not the jobs."""
    if images:
        if stale:
            err.print("[red]give images to mine here, or --stale to re-mine stored figures, not both[/red]")
            raise typer.Exit(2)
        mine_here(images, caption=caption, caption_file=caption_file, as_json=as_json, draw_dir=draw_dir)
        return
    if not stale:
        err.print(
            "[red]say what to mine: IMAGE... (here, no server) or --stale (figures an older miner "
            "version produced)[/red]"
        )
        raise typer.Exit(2)
    settings = settings_or_exit()
    backend = backend or settings.mining.backend
    if backend not in ("cpu", "lvlm"):
        err.print(f"[red]unknown backend {backend!r}: cpu or lvlm[/red]")
        raise typer.Exit(2)
    version = current_version(backend)
    runtime = open_runtime(settings)
    try:
        with runtime.session() as session:
            counts = remine.count_stale(session, backend=backend, version=version)
        total = min(sum(counts.values()), limit) if limit is not None else sum(counts.values())
        _print_counts(counts, backend, version)
        if dry_run or total == 0:
            return
        if not yes:
            typer.confirm(f"re-mine {total} figures with {backend} {version}?", abort=True)
        queued = remine.queue_remine(runtime, backend=backend, version=version, limit=limit)
        if queued.error is not None:
            err.print(
                f"[red]the mining queue failed ({queued.error}); {len(queued.job_ids)} jobs wait in the "
                "database: run `p2p mine --stale` again once the broker answers[/red]"
            )
            raise typer.Exit(1)
        out.print(f"queued {len(queued.job_ids)} mining jobs of {backend} {version}")
        if queued.not_sent:
            out.print(f"[yellow]{queued.not_sent} jobs wait in the database: no worker here takes them")
        if wait:
            _follow(runtime, queued.job_ids)
    finally:
        runtime.close()


def _print_counts(counts: dict[str | None, int], backend: str, version: str) -> None:
    if not counts:
        out.print(f"every figure mined on {backend} is at {version}: nothing to re-mine")
        return
    table = Table(title=f"stale figures on {backend} (current version {version})")
    table.add_column("mined by")
    table.add_column("figures", justify="right")
    for old, n in sorted(counts.items(), key=lambda item: item[0] or ""):
        table.add_row(old or "(no version recorded)", str(n))
    out.print(table)


def _follow(runtime: Runtime, ids: list[uuid.UUID]) -> None:
    with Progress(
        TextColumn("re-mining"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[failed]} failed"),
        TimeElapsedColumn(),
        console=err,
    ) as bar:
        task = bar.add_task("re-mine", total=len(ids), failed=0)
        while True:
            with runtime.session() as session:
                counts = remine.progress(session, ids)
            done = counts[JobStatus.SUCCEEDED] + counts[JobStatus.FAILED]
            bar.update(task, completed=done, failed=counts[JobStatus.FAILED])
            if done >= len(ids):
                break
            time.sleep(POLL_S)
    if counts[JobStatus.FAILED]:
        err.print(
            f"[yellow]{counts[JobStatus.FAILED]} re-mines failed; those figures keep their older results "
            "(`GET /v1/jobs/{id}` says why)[/yellow]"
        )
