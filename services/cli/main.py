from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import Progress, TaskID
from rich.table import Table
from sqlalchemy import func, select

from p2p.cli.common import open_runtime, settings_or_exit
from p2p.cli.consoles import make_console
from p2p.cli.demo_cmd import demo
from p2p.cli.eval_retrieval_cmd import eval_retrieval
from p2p.cli.jobs_cmd import jobs_app
from p2p.cli.mine_cmd import mine
from p2p.cli.models_cmd import models_app
from p2p.cli.progress import LineProgress, progress
from p2p.cli.queues_cmd import queues
from p2p.cli.recover_cmd import recover
from p2p.cli.train_cmd import train_app
from p2p.mining import remine
from p2p.shared.db.models import BatchKind
from p2p.shared.runtime import Runtime
from p2p.shared.settings import Settings, get_settings

app = typer.Typer(
    help="Panel2Patch: mine biomedical figures into figure/panel/region image-text pairs.",
    no_args_is_help=True,
)
keys_app = typer.Typer(help="API keys.", no_args_is_help=True)
db_app = typer.Typer(help="Database schema.", no_args_is_help=True)
serve_app = typer.Typer(help="Run a service.", no_args_is_help=True)
app.add_typer(keys_app, name="keys")
app.add_typer(db_app, name="db")
app.add_typer(serve_app, name="serve")
eval_app = typer.Typer(help="Evaluate mining and retrieval.", no_args_is_help=True)
app.add_typer(eval_app, name="eval")
app.add_typer(models_app, name="models")
app.add_typer(train_app, name="train")
app.add_typer(jobs_app, name="jobs")
eval_app.command("retrieval")(eval_retrieval)
app.command("mine")(mine)
app.command("recover")(recover)
app.command("queues")(queues)
app.command("demo")(demo)


def _register_synth() -> None:
    from p2p.mining.lab.synth.cli import synth_command

    app.command("synth")(synth_command)


_register_synth()


console = make_console(stderr=True)
out = make_console()


_settings = settings_or_exit
_runtime = open_runtime


@app.callback()
def main(ctx: typer.Context, verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False) -> None:
    from p2p.shared import logs

    try:
        settings: Settings | None = get_settings()
    except Exception:  # told by the command that needs the settings (settings_or_exit)
        settings = None
    logs.configure_logging(settings, service="cli", level=logging.INFO if verbose else logging.WARNING)
    # One id per command: the jobs it creates carry it, as an API request's carry the request's.
    token = logs.bind(request_id=f"cli-{logs.new_request_id()}")
    ctx.call_on_close(lambda: logs.unbind(token))


@app.command()
def ingest(
    paths: Annotated[list[Path], typer.Argument(help="Images, folders, manifests, shards, PMC packages.")],
    caption: Annotated[str | None, typer.Option(help="Caption for loose images without a .txt/.json")] = None,
) -> None:
    """Ingest files, folders (manifest.jsonl, *.tar shards, *.tar.gz packages, images), manifests,
    WebDataset shards and PMC Open Access packages."""
    from p2p.cli.ingest_paths import BatchSource, plan

    settings = _settings()
    try:
        planned = plan(paths)
    except (FileNotFoundError, ValueError) as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from exc
    runtime = _runtime(settings)
    totals = {"ingested": 0, "duplicate": 0, "failed": 0}
    try:
        # One bar for the whole call: loose images count up to a known total; a batch source's size
        # is known only once it has been read.
        loose = sum(not isinstance(entry, BatchSource) for entry in planned)
        with progress(console) as bar:
            task = bar.add_task("ingest", total=loose if loose == len(planned) else None)
            for entry in planned:
                if isinstance(entry, BatchSource):
                    bar.update(task, description=f"ingest {entry.kind.value} {entry.path.name}")
                    counts = _ingest_batch(runtime, entry.kind, entry.path, bar, task)
                else:
                    bar.update(task, description=f"ingest {entry.path.name}")
                    counts = _ingest_loose(runtime, entry.path, entry.caption or caption or "", bar, task)
                for k, v in counts.items():
                    totals[k] += v
            bar.update(task, description="ingest", total=sum(totals.values()), completed=sum(totals.values()))
        _wait_for_mining(runtime)
    finally:
        runtime.close()
    out.print(f"ingested {totals['ingested']}, duplicates {totals['duplicate']}, failed {totals['failed']}")
    if totals["failed"] and not (totals["ingested"] or totals["duplicate"]):
        raise typer.Exit(1)


def _ingest_batch(
    runtime: Runtime, kind: BatchKind, path: Path, progress: Progress | LineProgress, task: TaskID
) -> dict[str, int]:
    from p2p.ingest import batches
    from p2p.ingest.sources.base import ItemError, SourceItem
    from p2p.shared.db.models import BatchItemStatus, BatchStatus
    from p2p.shared.errors import P2PError

    source = str(path.resolve())
    try:
        batches.check_source(kind, source, store=runtime.store, settings=runtime.settings, trusted=True)
    except P2PError as exc:
        progress.console.print(f"[red]{path.name}: {exc.error_type}: {exc.message}")
        progress.advance(task)
        return {"ingested": 0, "duplicate": 0, "failed": 1}
    with runtime.session() as session:
        batch = batches.create_batch(session, kind=kind, source=source)

    def on_item(item: SourceItem | ItemError, status: BatchItemStatus) -> None:
        progress.advance(task)
        if isinstance(item, ItemError):
            progress.console.print(f"[yellow]skipped {item.key}: {item.error_type}: {item.message}")

    done = batches.run_batch(runtime, batch.id, trusted=True, on_item=on_item)
    if done.status is BatchStatus.FAILED:
        progress.console.print(f"[red]{path.name}: {done.error}")
    with runtime.session() as session:
        for failure in batches.batch_failures(session, done.id):
            if failure.error_type and not failure.error_type.startswith("missing"):
                progress.console.print(
                    f"[yellow]{failure.item_key}: {failure.error_type}: {failure.error_message}"
                )
    return {
        "ingested": done.ingested,
        "duplicate": done.duplicates,
        "failed": done.failed + (done.error is not None),
    }


def _ingest_loose(
    runtime: Runtime, path: Path, caption: str, progress: Progress | LineProgress, task: TaskID
) -> dict[str, int]:
    from p2p.ingest.service import ingest_one
    from p2p.shared.errors import P2PError
    from p2p.shared.schemas import FigureMetadata

    try:
        with path.open("rb") as fh:
            outcome = ingest_one(
                runtime=runtime,
                image=fh,
                caption=caption,
                metadata=FigureMetadata(source_ref=str(path)),
                source="cli",
            )
    except P2PError as exc:
        progress.console.print(f"[red]{path.name}: {exc.error_type}: {exc.message}")
        progress.advance(task)
        return {"ingested": 0, "duplicate": 0, "failed": 1}
    progress.advance(task)
    return {"ingested": int(not outcome.duplicate), "duplicate": int(outcome.duplicate), "failed": 0}


def _wait_for_mining(runtime: Runtime) -> None:
    """In the embedded profile the figures are mined in this process: wait, with progress."""
    from p2p.shared.db.models import JobStatus, MiningJob
    from p2p.shared.queue import InProcessDispatcher

    if not isinstance(runtime.dispatcher, InProcessDispatcher):
        return
    open_jobs = select(func.count()).where(MiningJob.status.in_([JobStatus.QUEUED, JobStatus.RUNNING]))
    with runtime.session() as session:
        total = session.scalar(open_jobs) or 0
    if not total:
        runtime.dispatcher.wait_idle()
        return
    with progress(console) as bar:
        task = bar.add_task("mining", total=total)
        while not runtime.dispatcher.wait_idle(1.0):
            with runtime.session() as session:
                bar.update(task, completed=total - (session.scalar(open_jobs) or 0))
        bar.update(task, completed=total)


@app.command()
def status() -> None:
    """Counts of figures, mining jobs and recent batches."""
    from p2p.shared.db.models import Batch, Figure, MiningJob, Panel, Region

    settings = _settings()
    runtime = _runtime(settings)
    try:
        with runtime.session() as session:
            figures = dict(session.execute(select(Figure.status, func.count()).group_by(Figure.status)).all())
            jobs = dict(
                session.execute(select(MiningJob.status, func.count()).group_by(MiningJob.status)).all()
            )
            panels = session.scalar(select(func.count()).select_from(Panel))
            regions = session.scalar(select(func.count()).select_from(Region))
            # Re-runs that found only duplicates (a second demo, a retried folder) are folded into a
            # count: the table lists batches that added or failed something.
            rerun = (Batch.ingested == 0) & (Batch.failed == 0) & (Batch.duplicates > 0)
            recent = list(
                session.scalars(select(Batch).where(~rerun).order_by(Batch.created_at.desc()).limit(10))
            )
            reruns = session.scalar(select(func.count()).select_from(Batch).where(rerun)) or 0
            versions = remine.figures_per_version(session)
    finally:
        runtime.close()
    table = Table(title="Panel2Patch")
    table.add_column("what")
    table.add_column("count", justify="right")
    table.add_row("figures", str(sum(figures.values())))
    for figure_status, count in sorted(figures.items()):
        table.add_row(f"  figures {figure_status}", str(count))
    for job_status, count in sorted(jobs.items()):
        table.add_row(f"  mining jobs {job_status}", str(count))
    for backend, version, count in versions:
        table.add_row(f"  figures mined by {backend} {version or '(no version recorded)'}", str(count))
    table.add_row("panels", str(panels))
    table.add_row("regions", str(regions))
    out.print(table)
    if recent:
        batches = Table(title="recent batches")
        for col in ("id", "kind", "status", "ingested", "duplicates", "failed", "source"):
            batches.add_column(col)
        for b in recent:
            batches.add_row(
                str(b.id)[:8],
                b.kind,
                b.status,
                str(b.ingested),
                str(b.duplicates),
                str(b.failed),
                b.source[-60:],
            )
        out.print(batches)
    if reruns:
        out.print(f"and {reruns} re-run batches that found only figures already stored (not listed)")


@app.command()
def cost(
    backend: Annotated[str | None, typer.Option(help="Only this mining backend (cpu, lvlm).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Mining cost: LVLM requests, tokens, retries and fallbacks per figure and per stage; for the
    CPU backend, the time of each stage."""
    import json

    from p2p.mining.costs import COUNTERS, aggregate_costs

    runtime = _runtime(_settings())
    try:
        with runtime.session() as session:
            rows = aggregate_costs(session, backend=backend)
    finally:
        runtime.close()
    if as_json:
        out.print_json(json.dumps(rows))
        return
    if not rows:
        out.print("no finished mining jobs")
        return
    for row in rows:
        if not row["requests"]:  # the CPU backend (or LVLM jobs that all fell back): time, not tokens
            out.print(_stage_time_table(row))
            continue
        table = Table(title=f"{row['backend']} {row['version']}: {row['figures']} figures")
        table.add_column("stage")
        for key in COUNTERS:
            table.add_column(key, justify="right")
        for stage, values in sorted(row["stages"].items()):
            table.add_row(stage, *(str(values[k]) for k in COUNTERS))
        table.add_row("total", *(str(row[k]) for k in COUNTERS))
        per = row["per_figure"]
        table.caption = (
            f"per figure: {per['requests']} requests, {per['prompt_tokens']} prompt tokens, "
            f"{per['completion_tokens']} completion tokens, {per['seconds']} s; "
            f"{row['fallback_figures']} figures with a CPU fallback"
        )
        out.print(table)


def _stage_time_table(row: dict[str, Any]) -> Table:
    figures = max(int(row["figures"]), 1)
    seconds = row.get("stage_seconds") or {}
    table = Table(title=f"{row['backend']} {row['version']}: {row['figures']} figures")
    for column, justify in (("stage", "left"), ("total s", "right"), ("per figure ms", "right")):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for stage, value in sorted(seconds.items(), key=lambda item: -item[1]):
        table.add_row(stage, f"{value:.1f}", f"{1000 * value / figures:.1f}")
    total = sum(seconds.values())
    table.add_row("total", f"{total:.1f}", f"{1000 * total / figures:.1f}")
    table.caption = "no model server, no requests, no model tokens: the cost is the CPU time of each stage"
    return table


@keys_app.command("create")
def keys_create(
    name: Annotated[str, typer.Option(help="Who or what uses the key.")],
    scope: Annotated[list[str], typer.Option(help="ingest, read or admin; repeat for several.")],
) -> None:
    """Create an API key; the secret is printed once and stored only as a hash."""
    from p2p.shared.auth import create_api_key
    from p2p.shared.errors import P2PError

    runtime = _runtime(_settings())
    try:
        with runtime.session() as session:
            key, token = create_api_key(session, name=name, scopes=scope)
    except P2PError as exc:
        console.print(f"[red]{exc.message}[/red]")
        raise typer.Exit(2) from exc
    finally:
        runtime.close()
    console.print(
        f"created key {key.prefix} ({name}) with scopes {', '.join(key.scopes)}; it is shown only once:"
    )
    out.print(token)


@keys_app.command("list")
def keys_list() -> None:
    from p2p.shared.db.models import ApiKey

    runtime = _runtime(_settings())
    try:
        with runtime.session() as session:
            rows = list(session.scalars(select(ApiKey).order_by(ApiKey.created_at)))
    finally:
        runtime.close()
    table = Table()
    for col in ("prefix", "name", "scopes", "created", "revoked"):
        table.add_column(col)
    for k in rows:
        table.add_row(
            k.prefix,
            k.name,
            ",".join(k.scopes),
            f"{k.created_at:%Y-%m-%d}",
            f"{k.revoked_at:%Y-%m-%d}" if k.revoked_at else "",
        )
    out.print(table)


@keys_app.command("revoke")
def keys_revoke(prefix: str) -> None:
    from p2p.shared.auth import revoke_api_key

    runtime = _runtime(_settings())
    try:
        with runtime.session() as session:
            revoked = revoke_api_key(session, prefix)
    finally:
        runtime.close()
    if not revoked:
        console.print(f"[red]no active key {prefix}[/red]")
        raise typer.Exit(1)
    out.print(f"revoked {prefix}")


@db_app.command("upgrade")
def db_upgrade(revision: str = "head") -> None:
    """Apply migrations (the embedded database is started for it)."""
    from p2p.shared.db import migrate
    from p2p.shared.embedded import EmbeddedPostgres

    settings = _settings()
    embedded = None
    url = settings.db.url
    if not url:
        embedded = EmbeddedPostgres(settings.data_dir / "pg")
        url = embedded.start()
    try:
        migrate.upgrade(url, revision)
    finally:
        if embedded is not None:
            embedded.stop()
    out.print(f"database at {revision}")


def _refuse_open_bind_without_keys(settings: Settings, host: str) -> None:
    if not settings.auth_required and host not in ("127.0.0.1", "localhost", "::1"):
        console.print(
            "[red]refusing to serve without API keys on a non-loopback address; "
            "set P2P_AUTH__REQUIRED=true or bind 127.0.0.1[/red]"
        )
        raise typer.Exit(2)


def _serve(
    create_app: Callable[[Settings], Any], host: str | None, port: int | None, *, service: str
) -> None:
    """Run one service API with uvicorn; without API keys only on a loopback address."""
    import uvicorn

    settings = _settings()
    host = host or settings.server.host
    port = port if port is not None else settings.server.port
    _refuse_open_bind_without_keys(settings, host)
    from p2p.shared import logs

    logs.configure_logging(settings, service=service)
    logs.clear()  # a server's lines carry each request's id, not the command's
    # log_config=None: uvicorn's access and error lines go through the process's handler and format.
    uvicorn.run(
        create_app(settings), host=host, port=port, log_level=settings.log_level.lower(), log_config=None
    )


@serve_app.command("ingest")
def serve_ingest(
    host: Annotated[str | None, typer.Option(help="Address to bind (default P2P_SERVER__HOST).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default P2P_SERVER__PORT, 8000).")] = None,
) -> None:
    """Serve the ingest API (OpenAPI docs at /docs)."""
    from p2p.apps.ingest import ingest_app  # lazy, as the other commands' heavier imports

    _serve(ingest_app, host, port, service="ingest-api")


@serve_app.command("embedding-api")
def serve_embedding_api(
    host: Annotated[str | None, typer.Option(help="Address to bind (default P2P_SERVER__HOST).")] = None,
    port: Annotated[
        int | None, typer.Option(help="Port (default P2P_SERVER__PORT, 8000; compose: 8001).")
    ] = None,
) -> None:
    """Serve the embedding and retrieval API and its web viewer (at /)."""
    from p2p.apps.embedding import embedding_app  # lazy: it loads torch, which `p2p --help` need not wait for

    _serve(embedding_app, host, port, service="embedding-api")


@eval_app.command("mining")
def eval_mining(
    folder: Annotated[
        Path | None, typer.Option("--dir", help="Images + annotations.json (real or synthetic).")
    ] = None,
    captions: Annotated[
        Path | None,
        typer.Option(
            help="Caption-only mode: a caption-splitting .jsonl set, or an annotations.json "
            "(split with the true panel labels; --split picks a split of the splits.json beside it)."
        ),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(help="Where the JSON report goes (default: a new mining-eval-<UTC time>.json)."),
    ] = None,
    split: Annotated[
        str | None,
        typer.Option(help="Only the figures of this split in the folder's splits.json (tune, check)."),
    ] = None,
    reference: Annotated[
        bool, typer.Option(help="Also score the naive XY-cut reference in the same run.")
    ] = True,
    limit: Annotated[int | None, typer.Option(help="Score only the first N figures.")] = None,
    shrink_to: Annotated[
        int | None,
        typer.Option(
            min=8,
            help="Mine copies shrunk to this longest side (px), as small web copies are; boxes are "
            "mapped back and scored against the full-size truth.",
        ),
    ] = None,
) -> None:
    """Panel P/R/F1 at IoU 0.5/0.75/0.9, COCO AP, panel counts, misses by cause, mean IoU, labels,
    subcaptions, marker recall, types, time."""
    import json as json_lib
    from datetime import UTC, datetime

    if out is None:
        out = Path(f"mining-eval-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}.json")

    if (folder is None) == (captions is None):
        console.print("[red]give exactly one of --dir or --captions[/red]")
        raise typer.Exit(2)
    report: dict[str, object] = {}
    if captions is not None:
        from p2p.mining.lab.eval_captions import evaluate_prostate, evaluate_real_figures

        if captions.suffix == ".json":
            try:
                report["captions"] = evaluate_real_figures(captions, split=split)
            except ValueError as exc:
                console.print(f"[red]{exc}[/red]")
                raise typer.Exit(2) from exc
        else:
            report["captions"] = evaluate_prostate(captions)
        out.write_text(json_lib.dumps(report, indent=2))
        _print_json(report["captions"])
        return
    assert folder is not None
    if not (folder / "annotations.json").is_file():
        console.print(f"[red]{folder} has no annotations.json[/red]")
        raise typer.Exit(2)
    try:
        report.update(
            _evaluate_mining(folder, limit=limit, split=split, reference=reference, shrink_to=shrink_to)
        )
    except ValueError as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from exc
    out.write_text(json_lib.dumps(report, indent=2))
    _print_mining_table(report)
    console.print(f"report written to {out}")


def _evaluate_mining(
    folder: Path, *, limit: int | None, split: str | None, reference: bool, shrink_to: int | None
) -> dict[str, dict[str, object]]:
    """The CPU miner's report (and the naive XY-cut's), each on copies shrunk to ``shrink_to``."""
    from p2p.mining.lab.evaluate import Miner, cpu_miner, evaluate_folder, naive_reference, shrunk

    def sized(miner: Miner) -> Miner:
        return miner if shrink_to is None else shrunk(miner, shrink_to)

    runs: dict[str, dict[str, object]] = {
        "cpu": evaluate_folder(folder, sized(cpu_miner()), limit=limit, split=split)
    }
    if reference:
        runs["naive_xycut"] = evaluate_folder(folder, sized(naive_reference), limit=limit, split=split)
    for run in runs.values():
        run["shrink_to"] = shrink_to
    return runs


def _print_json(data: object) -> None:
    import json as json_lib

    out.print_json(json_lib.dumps(data))


def _print_mining_table(report: dict[str, object]) -> None:
    table = Table(title="mining evaluation")
    table.add_column("metric")
    for name in report:
        table.add_column(name, justify="right")

    def cell(value: object) -> str:
        return "-" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)

    rows: list[tuple[str, list[object]]] = []
    runs = [r for r in report.values() if isinstance(r, dict)]
    for level in ("0.5", "0.75", "0.9"):
        rows.append((f"panel F1@{level}", [r["panels"][level]["f1"] for r in runs]))
        rows.append((f"  precision@{level}", [r["panels"][level]["precision"] for r in runs]))
        rows.append((f"  recall@{level}", [r["panels"][level]["recall"] for r in runs]))
    for key in ("panels_ap50", "panels_ap50_95", "labels_ap50", "labels_ap50_95"):
        rows.append((key, [r.get("coco", {}).get(key) for r in runs]))
    for key in ("exact", "too_many", "too_few"):
        rows.append((f"figures {key.replace('_', ' ')}", [r.get("counts", {}).get(key) for r in runs]))
    for key in (
        "mean_iou",
        "label_accuracy",
        "subcaption_exact",
        "subcaption_token_f1",
        "marker_target_recall",
        "marker_precision",
        "figure_type_accuracy",
        "figures_per_second",
        "figures",
    ):
        rows.append((key, [r.get(key) for r in runs]))
    for name, values in rows:
        table.add_row(name, *(cell(v) for v in values))
    out.print(table)
    first = runs[0] if runs else {}
    buckets = first.get("buckets", {}).get("counts", {}) if isinstance(first, dict) else {}
    if buckets:
        out.print("misses by cause: " + ", ".join(f"{k} {v}" for k, v in buckets.items()))
    stages = first.get("stage_seconds_per_figure", {}) if isinstance(first, dict) else {}
    if stages:
        out.print(
            "seconds per figure by stage: " + ", ".join(f"{k} {v * 1000:.1f} ms" for k, v in stages.items())
        )


if __name__ == "__main__":
    sys.exit(app())
