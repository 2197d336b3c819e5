"""`p2p train ...`: start a training run (and watch it), list, show, cancel; run the ablations."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, TaskProgressColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from p2p.cli.common import open_runtime, settings_or_exit
from p2p.cli.consoles import make_console
from p2p.cli.progress import progress
from p2p.shared.errors import NotFound, P2PError
from p2p.shared.queue import InProcessDispatcher
from p2p.shared.runtime import Runtime
from p2p.training.schemas import TrainingRunCreate

train_app = typer.Typer(help="Hierarchical CLIP training runs.", no_args_is_help=True)
out = make_console()
err = make_console(stderr=True)
POLL_S = 0.5


def _runtime() -> Runtime:
    return open_runtime(settings_or_exit())


def _fail(message: str) -> typer.Exit:
    err.print(f"[red]{message}[/red]")
    return typer.Exit(2)


def _run_id(runtime: Runtime, text: str) -> uuid.UUID:
    """A full run id or a prefix of one (tables print the first 8 characters)."""
    from p2p.cli.ids import IdError, resolve_id
    from p2p.shared.db.models import TrainingRun

    with runtime.session() as session:
        try:
            return resolve_id(session, TrainingRun, text, what="training run")
        except IdError as exc:
            raise _fail(str(exc)) from exc


def config_overrides(
    *,
    config_file: Path | None,
    assignments: list[str],
    levels: str | None,
    schedule: str | None,
    seed: int | None,
    max_steps: int | None,
    epochs: int | None,
) -> dict[str, Any]:
    """The run's config keys: a JSON file, then ``--set KEY=VALUE``, then the named options."""
    from p2p.training.presets import merge, overrides_from_assignments

    config: dict[str, Any] = json.loads(config_file.read_text()) if config_file else {}
    config = merge(config, overrides_from_assignments(assignments))
    named = {"levels": levels, "schedule": schedule, "seed": seed, "max_steps": max_steps, "epochs": epochs}
    return merge(config, {k: v for k, v in named.items() if v is not None})


@train_app.command("start")
def start_cmd(
    preset: Annotated[str | None, typer.Option(help="Config preset: small (CPU, default) or paper.")] = None,
    config: Annotated[
        Path | None, typer.Option(help="JSON file of TrainConfig keys over the preset.")
    ] = None,
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="KEY=VALUE over the config, e.g. lr.shared=1e-4.")
    ] = None,
    levels: Annotated[str | None, typer.Option(help="panel | region | all (ablations).")] = None,
    schedule: Annotated[str | None, typer.Option(help="alternating | mixed.")] = None,
    seed: Annotated[int | None, typer.Option()] = None,
    max_steps: Annotated[int | None, typer.Option()] = None,
    epochs: Annotated[int | None, typer.Option()] = None,
    snapshot: Annotated[str | None, typer.Option(help="Train on this export; default: export now.")] = None,
    license_group: Annotated[list[str] | None, typer.Option(help="Export only these license groups.")] = None,
    figure_type: Annotated[list[str] | None, typer.Option(help="Export only panels of these types.")] = None,
    name: Annotated[str | None, typer.Option(help="A label for the run.")] = None,
    activate: Annotated[bool, typer.Option(help="Activate the trained model when done.")] = False,
    register_model: Annotated[bool, typer.Option("--register/--no-register")] = True,
    checkpoint_every: Annotated[int, typer.Option(min=1)] = 50,
    wait: Annotated[bool, typer.Option("--wait/--no-wait", help="Show progress until the run ends.")] = True,
) -> None:
    """Queue a training run on the training queue (exports the mined corpus unless --snapshot)."""
    from p2p.training import runs
    from p2p.training.config import TrainConfigError

    try:
        overrides = config_overrides(
            config_file=config,
            assignments=list(set_ or []),
            levels=levels,
            schedule=schedule,
            seed=seed,
            max_steps=max_steps,
            epochs=epochs,
        )
        data: dict[str, Any] = {"snapshot": snapshot}
        if license_group:
            data["license_groups"] = license_group
        if figure_type:
            data["figure_types"] = figure_type
        body = TrainingRunCreate.model_validate(
            {
                "name": name,
                "preset": preset,
                "config": overrides,
                "data": data,
                "options": {
                    "activate": activate,
                    "register_model": register_model,
                    "checkpoint_every": checkpoint_every,
                },
            }
        )
    except (OSError, json.JSONDecodeError, TrainConfigError, ValueError) as exc:
        raise _fail(str(exc)) from exc
    runtime = _runtime()
    try:
        with runtime.session() as session:
            try:
                run = runs.create_run(session, runtime.dispatcher, runtime.store, body=body)
            except P2PError as exc:
                raise _fail(exc.message) from exc
            run_id = run.id
        out.print(f"training run {run_id} queued (checkpoints under {run.out_prefix}/)")
        if wait or _in_process(runtime):
            status = follow(runtime, run_id)
            if status != "completed":
                raise typer.Exit(1)
        else:
            out.print(f"`p2p train show {run_id}` shows its progress")
    finally:
        runtime.close()


def _in_process(runtime: Runtime) -> bool:
    return isinstance(runtime.dispatcher, InProcessDispatcher)


def _load(runtime: Runtime, run_id: uuid.UUID) -> Any:
    from p2p.training import runs

    with runtime.session() as session:
        run = runs.get_run(session, run_id)
        session.expunge(run)
        return run


def follow(runtime: Runtime, run_id: uuid.UUID) -> str:
    """A progress bar until the run ends; Ctrl-C cancels it when this process runs it (embedded
    profile), else leaves it running. Prints the outcome and the evaluation table."""
    from p2p.training import runs

    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
    )
    run = _load(runtime, run_id)
    try:
        with progress(out, *columns) as bar:
            task = bar.add_task(run.status.value, total=None, info="")
            while not run.status.finished:
                state = run.progress or {}
                bar.update(
                    task,
                    description=run.status.value,
                    completed=state.get("step") or 0,
                    total=state.get("total_steps"),
                    info=progress_line(state),
                )
                time.sleep(POLL_S)
                run = _load(runtime, run_id)
            bar.update(task, description=run.status.value, completed=(run.progress or {}).get("step") or 0)
    except KeyboardInterrupt:
        if not _in_process(runtime):
            out.print(f"left run {run_id} running; `p2p train cancel {run_id}` stops it")
            return "detached"
        out.print("cancelling (the trainer writes a checkpoint first)...")
        with runtime.session() as session:
            runs.cancel_run(session, run_id)
        while not run.status.finished:
            time.sleep(POLL_S)
            run = _load(runtime, run_id)
    show_run(run)
    return str(run.status.value)


def progress_line(progress: dict[str, Any]) -> str:
    parts = []
    if progress.get("epoch") is not None:
        parts.append(f"epoch {progress['epoch']}")
    losses = progress.get("losses") or {}
    if losses:
        parts.append("loss " + " ".join(f"{k[0].upper()} {v:.3f}" for k, v in sorted(losses.items())))
    if progress.get("samples_per_s"):
        parts.append(f"{progress['samples_per_s']:.1f} samples/s")
    if progress.get("eta_s") is not None:
        parts.append(f"ETA {progress['eta_s']:.0f} s")
    if progress.get("restarts"):
        parts.append(f"restarts {progress['restarts']}")
    return ", ".join(parts)


def metrics_table(metrics: dict[str, Any]) -> Table | None:
    """Trained against untrained, in R@1/5/10 order, with each metric's item count and the score
    random ranking would get (chance)."""
    from p2p.training.evaluate import chance, ordered_metrics

    if "trained" not in metrics:
        return None
    trained, untrained = metrics["trained"], metrics["untrained"]
    table = Table(title=f"evaluation on the {metrics.get('split')} split")
    for column in ("metric", "n", "chance", "untrained", "trained", ""):
        table.add_column(column, justify="left" if column == "metric" else "right")
    improved = metrics.get("improved", {})
    for key in ordered_metrics(trained):
        task = "zero-shot" if key.startswith("zero-shot") else key.partition(" ")[0]
        n = trained.get(f"{task} n")
        level = chance(key, trained)
        table.add_row(
            key,
            "" if n is None else str(n),
            "" if level is None else f"{level:.3f}",
            f"{untrained[key]:.3f}",
            f"{trained[key]:.3f}",
            "better" if improved.get(key) else "not better",
        )
    return table


def show_run(run: Any) -> None:
    colour = {"completed": "green", "failed": "red", "cancelled": "yellow"}.get(run.status.value, "white")
    out.print(
        f"run {run.id}: [{colour}]{run.status.value}[/{colour}]" + (f" — {run.error}" if run.error else "")
    )
    if run.progress:
        step, total = run.progress.get("step"), run.progress.get("total_steps")
        out.print(f"step {step} of {total}; {progress_line(run.progress)}")
        phases = run.progress.get("phases") or {}
        if phases:
            order = [p for p in ("export_s", "train_s", "evaluate_s") if p in phases]
            out.print("time: " + ", ".join(f"{p.removesuffix('_s')} {phases[p]:.0f} s" for p in order))
    if run.checkpoint:
        out.print(f"latest checkpoint: {run.checkpoint}")
    table = metrics_table(run.metrics or {})
    if table is not None:
        out.print(table)
        better = sum(bool(v) for v in run.metrics.get("improved", {}).values())
        out.print(f"trained beats untrained on {better} of {len(run.metrics.get('improved', {}))} metrics")
    if run.model_version_id:
        out.print(f"registered as model version {run.model_version_id} (`p2p models list`)")


@train_app.command("show")
def show_cmd(
    run_id: str,
    follow_: Annotated[bool, typer.Option("--follow", "-f", help="Watch until it ends.")] = False,
) -> None:
    """A run's status, progress, checkpoint, evaluation and model version."""

    runtime = _runtime()
    try:
        try:
            run = _load(runtime, _run_id(runtime, run_id))
        except NotFound as exc:
            raise _fail(exc.message) from exc
        if follow_ and not run.status.finished:
            follow(runtime, run.id)
        else:
            show_run(run)
    finally:
        runtime.close()


@train_app.command("list")
def list_cmd(limit: Annotated[int, typer.Option(min=1, max=500)] = 20) -> None:
    """Recent runs."""
    from p2p.training import runs

    runtime = _runtime()
    try:
        with runtime.session() as session:
            found = runs.list_runs(session, limit=limit)
            table = Table(title="training runs")
            table.add_column("id", no_wrap=True, min_width=36)
            for column in ("name", "status", "step", "created", "model version"):
                table.add_column(column)
            for run in found:
                progress = run.progress or {}
                table.add_row(
                    str(run.id),
                    run.name or "",
                    run.status.value,
                    f"{progress.get('step', 0)}/{progress.get('total_steps', '?')}",
                    run.created_at.strftime("%Y-%m-%d %H:%M"),
                    str(run.model_version_id or ""),
                )
        out.print(table)
    finally:
        runtime.close()


@train_app.command("cancel")
def cancel_cmd(run_id: str) -> None:
    """Cancel a run: a queued one at once, a running one after its current step."""
    from p2p.training import runs

    runtime = _runtime()
    try:
        target = _run_id(runtime, run_id)
        with runtime.session() as session:
            try:
                run = runs.cancel_run(session, target)
            except P2PError as exc:
                raise _fail(exc.message) from exc
            out.print(
                f"run {run.id}: {run.status.value}" + (" (stop requested)" if not run.status.finished else "")
            )
    finally:
        runtime.close()


@train_app.command("ablate")
def ablate_cmd(
    snapshot: Annotated[str, typer.Option(help="Export prefix to train and evaluate on.")],
    seeds: Annotated[str, typer.Option(help="Comma-separated seeds.")] = "0,1,2",
    variants: Annotated[
        str, typer.Option(help="Comma-separated: panel-only, region-only, all-alternating, all-mixed.")
    ] = "panel-only,region-only,all-alternating,all-mixed",
    preset: Annotated[str | None, typer.Option(help="Config preset (default small).")] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help="KEY=VALUE over the preset.")] = None,
    max_steps: Annotated[int | None, typer.Option(help="Steps per run (default: the preset's).")] = None,
    out_prefix: Annotated[str, typer.Option(help="Where the runs' checkpoints go.")] = "ablations",
    eval_split: Annotated[str, typer.Option(help="test, val, or val+test (both held-out splits).")] = "test",
    max_items: Annotated[int | None, typer.Option(help="Evaluate on the first N figures.")] = None,
    json_out: Annotated[
        Path | None, typer.Option("--json-out", help="Write rows and summary as JSON.")
    ] = None,
    markdown_out: Annotated[
        Path | None, typer.Option("--markdown-out", help="Write the summary table.")
    ] = None,
) -> None:
    """Panel-only, region-only, all levels alternating and mixed, over several seeds: one table."""
    from p2p.training.ablations import markdown_table, run_ablations, summarize
    from p2p.training.config import TrainConfigError
    from p2p.training.dataset import DatasetError
    from p2p.training.presets import merge, overrides_from_assignments

    try:
        seed_list = [int(s) for s in seeds.split(",") if s.strip()]
        overrides = overrides_from_assignments(list(set_ or []))
        if max_steps is not None:
            overrides = merge(overrides, {"max_steps": max_steps})
    except (ValueError, TrainConfigError) as exc:
        raise _fail(str(exc)) from exc
    runtime = _runtime()

    def report(row: dict[str, Any]) -> None:
        seed = "" if row["seed"] is None else f" seed {row['seed']}"
        out.print(
            f"{row['variant']}{seed}: {row['status']}, {row['steps']} steps in {row['seconds']:.0f} s; "
            f"region R@10 i2t {row.get('region i2t R@10', float('nan')):.3f}, "
            f"panel R@10 i2t {row.get('panel i2t R@10', float('nan')):.3f}"
        )

    try:
        rows = run_ablations(
            store=runtime.store,
            snapshot=snapshot,
            out_prefix=out_prefix,
            seeds=seed_list,
            variants=[v.strip() for v in variants.split(",") if v.strip()],
            preset=preset,
            overrides=overrides,
            eval_split=eval_split,
            eval_max_items=max_items,
            on_row=report,
        )
    except (ValueError, TrainConfigError, DatasetError) as exc:
        raise _fail(str(exc)) from exc
    finally:
        runtime.close()
    summary = summarize(rows)
    table = markdown_table(summary)
    out.print(table)
    if json_out is not None:
        json_out.write_text(json.dumps({"snapshot": snapshot, "rows": rows, "summary": summary}, indent=2))
    if markdown_out is not None:
        markdown_out.write_text(table + "\n")
