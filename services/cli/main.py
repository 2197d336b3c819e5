"""The `p2p` commands. Imports that load torch, the miners' models or the ingest sources stay inside
the commands that use them, so `p2p --help` and the light commands start without them."""

from __future__ import annotations

import json
import logging
import sys
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from sqlalchemy import func, select

from p2p.cli.common import open_runtime, settings_or_exit
from p2p.cli.eval_retrieval_cmd import eval_retrieval
from p2p.cli.ingest_paths import BatchSource, plan
from p2p.cli.mine_cmd import mine
from p2p.cli.models_cmd import models_app
from p2p.cli.recover_cmd import recover
from p2p.cli.train_cmd import follow, train_app
from p2p.mining import remine
from p2p.mining.costs import COUNTERS, aggregate_costs
from p2p.shared.auth import create_api_key, revoke_api_key
from p2p.shared.db import migrate
from p2p.shared.db.models import (
    ApiKey,
    Batch,
    BatchItemStatus,
    BatchKind,
    BatchStatus,
    Figure,
    MiningJob,
    ModelStatus,
    ModelVersion,
    Panel,
    Region,
    TrainingRun,
    TrainingRunStatus,
)
from p2p.shared.embedded import EmbeddedPostgres
from p2p.shared.errors import P2PError
from p2p.shared.queue import InProcessDispatcher
from p2p.shared.runtime import Runtime
from p2p.shared.schemas import FigureMetadata
from p2p.shared.settings import Settings
from p2p.training.schemas import TrainingRunCreate

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
eval_app.command("retrieval")(eval_retrieval)
app.command("mine")(mine)
app.command("recover")(recover)


def _register_synth() -> None:
    from p2p.mining.synth.cli import synth_command

    app.command("synth")(synth_command)


_register_synth()


console = Console(stderr=True)
out = Console()

DEMO_SYNTHETIC_FIGURES = 300
DEMO_TRAIN_STEPS = 240
DEMO_RUN_NAME = "demo"


_settings = settings_or_exit
_runtime = open_runtime


@app.callback()
def main(verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False) -> None:
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


@app.command()
def ingest(
    paths: Annotated[list[Path], typer.Argument(help="Images, folders, manifests, shards, PMC packages.")],
    caption: Annotated[str | None, typer.Option(help="Caption for loose images without a .txt/.json")] = None,
) -> None:
    """Ingest files, folders (manifest.jsonl, *.tar shards, *.tar.gz packages, images), manifests,
    WebDataset shards and PMC Open Access packages."""

    settings = _settings()
    try:
        planned = plan(paths)
    except (FileNotFoundError, ValueError) as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from exc
    runtime = _runtime(settings)
    totals = {"ingested": 0, "duplicate": 0, "failed": 0}
    try:
        with _progress() as progress:
            for entry in planned:
                if isinstance(entry, BatchSource):
                    counts = _ingest_batch(runtime, entry.kind, entry.path, progress)
                else:
                    counts = _ingest_loose(runtime, entry.path, entry.caption or caption or "", progress)
                for k, v in counts.items():
                    totals[k] += v
        _wait_in_process(runtime)
    finally:
        runtime.close()
    out.print(f"ingested {totals['ingested']}, duplicates {totals['duplicate']}, failed {totals['failed']}")
    if totals["failed"] and not (totals["ingested"] or totals["duplicate"]):
        raise typer.Exit(1)


def _progress() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )


def _ingest_batch(runtime: Runtime, kind: BatchKind, path: Path, progress: Progress) -> dict[str, int]:
    from p2p.ingest import batches
    from p2p.ingest.sources.base import ItemError, SourceItem

    source = str(path.resolve())
    task = progress.add_task(f"{kind.value} {path.name}", total=None)
    try:
        batches.check_source(kind, source, store=runtime.store, settings=runtime.settings, trusted=True)
    except P2PError as exc:
        progress.update(task, description=f"[red]{path.name}: {exc.error_type}: {exc.message}")
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
    progress.update(task, total=done.ingested + done.duplicates + done.failed)
    return {
        "ingested": done.ingested,
        "duplicate": done.duplicates,
        "failed": done.failed + (done.error is not None),
    }


def _ingest_loose(runtime: Runtime, path: Path, caption: str, progress: Progress) -> dict[str, int]:
    from p2p.ingest.service import ingest_figure

    task = progress.add_task(path.name, total=1)
    try:
        with runtime.session() as session, path.open("rb") as fh:
            outcome = ingest_figure(
                session=session,
                store=runtime.store,
                dispatcher=runtime.dispatcher,
                settings=runtime.settings,
                image=fh,
                caption=caption,
                metadata=FigureMetadata(source_ref=str(path)),
                source="cli",
            )
    except P2PError as exc:
        progress.update(task, advance=1, description=f"[red]{path.name}: {exc.error_type}: {exc.message}")
        return {"ingested": 0, "duplicate": 0, "failed": 1}
    progress.advance(task)
    return {"ingested": int(not outcome.duplicate), "duplicate": int(outcome.duplicate), "failed": 0}


def _wait_in_process(runtime: Runtime) -> None:
    if isinstance(runtime.dispatcher, InProcessDispatcher):
        runtime.dispatcher.wait_idle()


@app.command()
def status() -> None:
    """Counts of figures, mining jobs and recent batches."""

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
            recent = list(session.scalars(select(Batch).order_by(Batch.created_at.desc()).limit(10)))
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


@app.command()
def cost(
    backend: Annotated[str | None, typer.Option(help="Only this mining backend (cpu, lvlm).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Mining cost: LVLM requests, tokens, retries and fallbacks per figure and per stage."""

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
        version = row["version"] or "(no version recorded)"
        table = Table(title=f"{row['backend']} {version}: {row['figures']} figures")
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


@keys_app.command("create")
def keys_create(
    name: Annotated[str, typer.Option(help="Who or what uses the key.")],
    scope: Annotated[list[str], typer.Option(help="ingest, read or admin; repeat for several.")],
) -> None:
    """Create an API key; the secret is printed once and stored only as a hash."""

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


def _serve(create_app: Callable[[Settings], Any], host: str | None, port: int | None) -> None:
    """Run one service API with uvicorn; without API keys only on a loopback address."""
    import uvicorn

    settings = _settings()
    host = host or settings.server.host
    port = port if port is not None else settings.server.port
    _refuse_open_bind_without_keys(settings, host)
    logging.getLogger().setLevel(settings.log_level)
    uvicorn.run(create_app(settings), host=host, port=port, log_level=settings.log_level.lower())


@serve_app.command("ingest")
def serve_ingest(
    host: Annotated[str | None, typer.Option()] = None,
    port: Annotated[int | None, typer.Option()] = None,
) -> None:
    """Serve the ingest API (OpenAPI docs at /docs)."""
    from p2p.apps.ingest import ingest_app

    _serve(ingest_app, host, port)


@serve_app.command("embedding-api")
def serve_embedding_api(
    host: Annotated[str | None, typer.Option()] = None,
    port: Annotated[int | None, typer.Option()] = None,
) -> None:
    """Serve the embedding and retrieval API and its web viewer (at /)."""
    from p2p.apps.embedding import embedding_app  # lazy: it loads torch, which `p2p --help` need not wait for

    _serve(embedding_app, host, port)


@eval_app.command("mining")
def eval_mining(
    folder: Annotated[
        Path | None, typer.Option("--dir", help="Images + annotations.json (real or synthetic).")
    ] = None,
    captions: Annotated[
        Path | None, typer.Option(help="Caption-only mode: a caption-splitting .jsonl set.")
    ] = None,
    out: Annotated[Path, typer.Option(help="Where the JSON report goes.")] = Path("mining-eval.json"),
    reference: Annotated[
        bool, typer.Option(help="Also score the naive XY-cut reference in the same run.")
    ] = True,
    limit: Annotated[int | None, typer.Option(help="Score only the first N figures.")] = None,
) -> None:
    """Panel P/R/F1 at IoU 0.5/0.75/0.9, mean IoU, labels, subcaptions, marker recall, types, time."""

    if (folder is None) == (captions is None):
        console.print("[red]give exactly one of --dir or --captions[/red]")
        raise typer.Exit(2)
    report: dict[str, object] = {}
    if captions is not None:
        from p2p.mining.eval_captions import evaluate_prostate

        report["captions"] = evaluate_prostate(captions)
        out.write_text(json.dumps(report, indent=2))
        _print_json(report["captions"])
        return
    assert folder is not None
    from p2p.mining.evaluate import cpu_miner, evaluate_folder, naive_reference

    if not (folder / "annotations.json").is_file():
        console.print(f"[red]{folder} has no annotations.json[/red]")
        raise typer.Exit(2)
    report["cpu"] = evaluate_folder(folder, cpu_miner(), limit=limit)
    if reference:
        report["naive_xycut"] = evaluate_folder(folder, naive_reference, limit=limit)
    out.write_text(json.dumps(report, indent=2))
    _print_mining_table(report)
    console.print(f"report written to {out}")


def _print_json(data: object) -> None:
    out.print_json(json.dumps(data))


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
    for key in (
        "mean_iou",
        "label_accuracy",
        "subcaption_exact",
        "subcaption_token_f1",
        "marker_target_recall",
        "figure_type_accuracy",
        "figures_per_second",
        "figures",
    ):
        rows.append((key, [r.get(key) for r in runs]))
    for name, values in rows:
        table.add_row(name, *(cell(v) for v in values))
    out.print(table)
    first = runs[0] if runs else {}
    stages = first.get("stage_seconds_per_figure", {}) if isinstance(first, dict) else {}
    if stages:
        out.print(
            "seconds per figure by stage: " + ", ".join(f"{k} {v * 1000:.1f} ms" for k, v in stages.items())
        )


@app.command()
def demo(
    serve: Annotated[bool, typer.Option("--serve/--no-serve", help="Serve the API after ingesting.")] = True,
    port: Annotated[int | None, typer.Option()] = None,
    synthetic: Annotated[
        int, typer.Option(min=0, help="Synthetic compound figures added to the corpus to train on.")
    ] = DEMO_SYNTHETIC_FIGURES,
    train_steps: Annotated[
        int, typer.Option(min=0, help="Steps of the demo training run (0: no training).")
    ] = DEMO_TRAIN_STEPS,
) -> None:
    """Make sample figures, ingest and mine them, train the small model on them and activate it,
    then serve the APIs and the search viewer."""
    from p2p.ingest.samples import write_manifest_folder, write_pmc_package

    settings = _settings()
    samples = settings.data_dir / "samples"
    manifest = write_manifest_folder(samples / "figures", count=8)
    package = write_pmc_package(samples / "PMC9000001.tar.gz")
    out.print(
        f"[bold]Panel2Patch demo[/bold] ({settings.profile} profile, data in {settings.data_dir.resolve()})"
    )
    out.print(f"made 8 sample figures with a manifest at {manifest} and a PMC package at {package}")
    ingest([manifest.parent, package], caption=None)
    if synthetic:
        ingest([_synthetic_corpus(samples / "synthetic", synthetic)], caption=None)
    status()
    out.print(
        "each figure was mined on the CPU backend: GET /v1/figures/{id} shows its panels (boxes, labels, "
        "subcaptions, types) and marker regions; `p2p eval mining --dir DIR` scores the miner."
    )
    trained = _demo_training(settings, train_steps) if train_steps else None
    _demo_embedding(settings, trained)
    if serve:
        p = port if port is not None else settings.server.port
        out.print(
            f"serving the ingest API on http://{settings.server.host}:{p} (docs: /docs) and the search "
            f"viewer and embedding API on http://{settings.server.host}:{p + 1}/; Ctrl-C stops both"
        )
        serve_demo(settings, p)


def _synthetic_corpus(folder: Path, count: int) -> Path:
    """``count`` synthetic compound figures (deterministic) with a manifest of their captions."""

    from p2p.mining.synth.dataset import write_dataset

    manifest = folder / "manifest.jsonl"
    if manifest.is_file() and sum(1 for _ in manifest.open()) == count:
        return folder
    with console.status(f"drawing {count} synthetic compound figures..."):
        paths = write_dataset(folder, count, seed=2026, size=(800, 640))
    lines = []
    for path in paths:
        truth = json.loads(path.with_suffix(".json").read_text(encoding="utf-8"))
        lines.append(json.dumps({"image": path.name, "caption": truth["caption"]}))
    manifest.write_text("\n".join(lines) + "\n")
    out.print(f"drew {count} synthetic compound figures with captions in {folder}")
    return folder


def _demo_training(settings: Settings, steps: int) -> uuid.UUID | None:
    """Train the small preset on the corpus (once) and activate it; its model version, or None."""
    from p2p.training import runs

    runtime = _runtime(settings)
    try:
        with runtime.session() as session:
            done = session.scalar(
                select(TrainingRun)
                .where(TrainingRun.name == DEMO_RUN_NAME, TrainingRun.status == TrainingRunStatus.COMPLETED)
                .order_by(TrainingRun.created_at.desc())
            )
            if done is not None and done.model_version_id is not None:
                out.print(f"the demo model was trained before (run {done.id}); skipping training")
                return done.model_version_id
            body = TrainingRunCreate.model_validate(
                {
                    "name": DEMO_RUN_NAME,
                    "preset": "small",
                    "config": {"max_steps": steps},
                    # The demo's test split alone holds ~20 figures: score on both held-out splits.
                    "options": {
                        "checkpoint_every": max(steps // 4, 1),
                        "activate": False,
                        "eval_split": "val+test",
                    },
                }
            )
            try:
                run = runs.create_run(session, runtime.dispatcher, runtime.store, body=body)
            except P2PError as exc:
                out.print(f"[yellow]no demo training: {exc.message}[/yellow]")
                return None
            run_id = run.id
        out.print(f"training the small hierarchical CLIP model for {steps} steps (run {run_id})")
        if follow(runtime, run_id) != "completed":
            return None
        with runtime.session() as session:
            finished = session.get(TrainingRun, run_id)
            return finished.model_version_id if finished is not None else None
    finally:
        runtime.close()


def _demo_embedding(settings: Settings, version_id: uuid.UUID | None) -> None:
    """Index the corpus with ``version_id`` (the demo's trained model; else the default model,
    registered once), then show one search."""
    from p2p.embedding_api import vectors
    from p2p.embedding_api.indexing import register
    from p2p.models.modeling import DEFAULT_MODEL_NAME, default_spec, load_model
    from p2p.models.registry import activate, get_space, spec_of

    runtime = _runtime(settings)
    try:
        space = settings.embedding.space
        with runtime.session() as session:
            version = session.get(ModelVersion, version_id) if version_id is not None else None
            if version is None:
                version = session.scalar(
                    select(ModelVersion)
                    .where(ModelVersion.name == DEFAULT_MODEL_NAME, ModelVersion.training_run_id.is_(None))
                    .order_by(ModelVersion.created_at.desc())
                )
            if version is None:
                version = register(session, default_spec(), "1", store=runtime.store)
                out.print(f"registered the default embedding model {version.name} {version.version}")
            row = get_space(session, space)
            if row is None or row.active_version_id != version.id or version.status is not ModelStatus.READY:
                activate(session, runtime.dispatcher, version_id=version.id, space=space)
            version_id = version.id
            spec = spec_of(version)
            trained = version.training_run_id is not None
        if isinstance(runtime.dispatcher, InProcessDispatcher):
            runtime.dispatcher.wait_idle(900)
        with runtime.session() as session:
            ready = session.get(ModelVersion, version_id)
            assert ready is not None
            state, progress = ready.status, dict(ready.progress or {})
        if state is not ModelStatus.READY:
            out.print(f"embedding index not ready ({state}): `p2p models list` shows its progress")
            return
        what = "trained by the demo run" if trained else "its vision tower is untrained until a training run"
        out.print(
            f"embedded {progress.get('done')} figures, panels and regions with {spec.name} {ready.version} "
            f"({progress.get('items_per_s')} items/s); {what}"
        )
        model = load_model(spec, store=runtime.store, threads=settings.embedding.torch_threads)
        query = "fluorescence micrograph of cells"
        with runtime.engine.connect() as conn:
            hits = vectors.search(conn, version_id, model.encode_texts([query])[0], level="panel", k=3)
        out.print(f"search '{query}' (panels): " + ", ".join(f"{h.item_id} ({h.score:.3f})" for h in hits))
    finally:
        runtime.close()


def serve_demo(settings: Settings, port: int) -> None:
    """Serve the ingest API on ``port`` and the embedding API with the viewer on ``port + 1`` from one
    runtime (one embedded database, one task pool) until interrupted."""

    import uvicorn

    from p2p.apps.embedding import embedding_app
    from p2p.apps.ingest import ingest_app

    _refuse_open_bind_without_keys(settings, settings.server.host)
    runtime = _runtime(settings)
    try:
        embedding = uvicorn.Server(
            uvicorn.Config(
                embedding_app(runtime=runtime),
                host=settings.server.host,
                port=port + 1,
                log_level="warning",
            )
        )
        thread = threading.Thread(target=embedding.run, name="embedding-api", daemon=True)
        thread.start()
        try:
            uvicorn.run(
                ingest_app(runtime=runtime),
                host=settings.server.host,
                port=port,
                log_level=settings.log_level.lower(),
            )
        finally:
            embedding.should_exit = True
            thread.join(timeout=30)
    finally:
        runtime.close()


if __name__ == "__main__":
    sys.exit(app())
