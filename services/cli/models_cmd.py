"""`p2p models ...`: register, list, activate (with a progress bar) embedding model versions."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from sqlalchemy import select

from p2p.cli.common import open_runtime, settings_or_exit
from p2p.cli.consoles import make_console
from p2p.cli.progress import progress as progress_bar
from p2p.shared.db.models import EmbeddingSpace, ModelStatus, ModelVersion
from p2p.shared.errors import P2PError

models_app = typer.Typer(help="Embedding model versions.", no_args_is_help=True)
out = make_console()
err = make_console(stderr=True)


def _runtime() -> Any:
    return open_runtime(settings_or_exit())


def _fail(exc: Exception) -> typer.Exit:
    err.print(f"[red]{exc}[/red]")
    return typer.Exit(2)


@models_app.command("register")
def register_cmd(
    name: Annotated[str | None, typer.Option(help="Model name (default: the offline default model).")] = None,
    version: Annotated[str, typer.Option(help="Version label, unique per name.")] = "1",
    architecture: Annotated[str | None, typer.Option(help="open_clip model name, or 'custom'.")] = None,
    config: Annotated[Path | None, typer.Option(help="JSON open_clip model config (custom).")] = None,
    source: Annotated[
        str, typer.Option(help="random | local:PATH | s3:KEY | pretrained:TAG | hf-hub:ORG/NAME")
    ] = "random",
) -> None:
    """Register a model version (its weights are loaded once to check them)."""
    from p2p.embedding_api.indexing import register
    from p2p.models.modeling import ModelSpec, default_spec

    if name is None and architecture is None:
        base = default_spec()
        spec = ModelSpec(name=base.name, architecture=base.architecture, config=base.config, source=source)
    else:
        if not name or not architecture:
            raise _fail(ValueError("--name and --architecture go together"))
        cfg = json.loads(config.read_text()) if config else None
        spec = ModelSpec(name=name, architecture=architecture, config=cfg, source=source)
    runtime = _runtime()
    try:
        with runtime.session() as session:
            row = register(session, spec, version, store=runtime.store)
            out.print(f"registered {row.name} {row.version}: id {row.id}, {row.dim}-d")
    except P2PError as exc:
        raise _fail(exc) from exc
    finally:
        runtime.close()


@models_app.command("list")
def list_cmd() -> None:
    """Model versions, their status and re-index progress, and which space each serves."""

    runtime = _runtime()
    try:
        with runtime.session() as session:
            versions = list(session.scalars(select(ModelVersion).order_by(ModelVersion.created_at)))
            spaces = list(session.scalars(select(EmbeddingSpace)))
            table = Table(title="model versions")
            for col in ("id", "name", "version", "dim", "status", "progress", "serves"):
                table.add_column(col)
            for v in versions:
                serves = [s.name for s in spaces if s.active_version_id == v.id]
                pending = [f"{s.name} (pending)" for s in spaces if s.pending_version_id == v.id]
                progress = v.progress or {}
                done = f"{progress.get('done', '-')}/{progress.get('total', '-')}" if progress else ""
                table.add_row(
                    str(v.id), v.name, v.version, str(v.dim), v.status, done, ", ".join(serves + pending)
                )
    finally:
        runtime.close()
    out.print(table)


def follow_reindex(runtime: Any, version_id: uuid.UUID) -> tuple[Any, dict[str, Any], str | None]:
    """Re-index progress until the version is ready or failed: (status, progress, error)."""
    from p2p.shared.db.models import ModelStatus, ModelVersion

    columns = (
        TextColumn("re-index"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with progress_bar(err, *columns) as bar:
        task = bar.add_task("re-index", total=None)
        while True:
            with runtime.session() as session:
                row = session.get(ModelVersion, version_id)
                assert row is not None
                status, state, error = row.status, dict(row.progress or {}), row.error
            bar.update(task, total=state.get("total"), completed=state.get("done", 0))
            if status in (ModelStatus.READY, ModelStatus.FAILED):
                return status, state, error
            time.sleep(0.5)


@models_app.command("activate")
def activate_cmd(
    version_id: Annotated[str, typer.Argument(help="Model version id, or its first 8 or more characters.")],
    space: Annotated[str | None, typer.Option(help="Embedding space (default: the configured one).")] = None,
    wait: Annotated[bool, typer.Option("--wait/--no-wait", help="Follow the re-index to its end.")] = True,
) -> None:
    """Re-embed the corpus with a version; the space switches when it is complete."""
    from p2p.cli.ids import IdError, resolve_id
    from p2p.models.registry import activate

    runtime = _runtime()
    try:
        name = space or runtime.settings.embedding.space
        with runtime.session() as session:
            try:
                vid = resolve_id(session, ModelVersion, version_id, what="model version")
            except IdError as exc:
                raise _fail(exc) from exc
            try:
                activate(session, runtime.dispatcher, version_id=vid, space=name)
            except P2PError as exc:
                raise _fail(exc) from exc
        if not wait:
            out.print(f"re-index of {vid} for space {name} queued")
            return
        status, progress, error = follow_reindex(runtime, vid)
        if status is ModelStatus.FAILED:
            raise _fail(RuntimeError(f"re-index failed: {error}"))
        out.print(
            f"space {name} now serves {vid} ({progress.get('done')} items, {progress.get('seconds')} s)"
        )
    finally:
        runtime.close()
