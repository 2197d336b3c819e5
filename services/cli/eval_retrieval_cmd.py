"""`p2p eval retrieval`: Recall@k of embedding models on a held-out split of an exported snapshot."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from p2p.cli.common import open_runtime, settings_or_exit
from p2p.cli.consoles import make_console
from p2p.shared.db.models import ModelVersion
from p2p.shared.runtime import build_store

if TYPE_CHECKING:
    from p2p.models.modeling import ModelSpec
    from p2p.shared.runtime import Runtime
    from p2p.shared.storage import ObjectStore

out = make_console()
err = make_console(stderr=True)


def _fail(message: str) -> typer.Exit:
    err.print(f"[red]{message}[/red]")
    return typer.Exit(2)


def _runtime() -> Runtime:
    return open_runtime(settings_or_exit())


def _store() -> ObjectStore:
    """The object store alone, for runs that need no database."""
    return build_store(settings_or_exit())


def _local_spec(source: str, architecture: str | None, config: Path | None) -> ModelSpec:
    from p2p.models.modeling import ModelSpec

    cfg = json.loads(config.read_text()) if config is not None else None
    name = Path(source.partition(":")[2]).stem or source
    return ModelSpec(name=name, architecture=architecture or "custom", config=cfg, source=source)


def resolve_specs(
    models: list[str], architecture: str | None, config: Path | None, runtime: Runtime | None
) -> dict[str, ModelSpec]:
    """Model arguments to specs: ``default``, ``local:PATH`` (with --architecture/--config) or a
    model version id in the database (then ``runtime`` is needed)."""
    from p2p.models.modeling import default_spec

    specs: dict[str, ModelSpec] = {}
    for value in models or ["default"]:
        if value == "default":
            specs[value] = default_spec()
        elif value.startswith("local:"):
            specs[value] = _local_spec(value, architecture, config)
        else:
            try:
                vid = uuid.UUID(value)
            except ValueError as exc:
                raise _fail(f"not a model: {value!r} (a version id, 'default' or 'local:PATH')") from exc
            if runtime is None:
                raise _fail("model version ids need the database")
            from p2p.models.registry import spec_of

            with runtime.session() as session:
                row = session.get(ModelVersion, vid)
                if row is None:
                    raise _fail(f"no model version {vid}")
                specs[f"{row.name} {row.version}"] = spec_of(row)
    return specs


def _table(rows: list[dict[str, Any]], ks: list[int], split: str) -> Table:
    from p2p.training.evaluate import chance

    table = Table(title=f"retrieval on {split}")
    table.add_column("model")
    columns: list[str] = []
    for task in ("panel", "region", "figure"):
        for short in ("i2t", "t2i"):
            for k in ks:
                columns.append(f"{task} {short} R@{k}")
    columns.extend(["zero-shot acc", "zero-shot bal acc"])
    for col in columns:  # two-line headers keep the table narrow
        task, _, rest = col.partition(" ")
        table.add_column(f"{task}\n{rest}", justify="right")
    for row in rows:
        table.add_row(row["model"], *(f"{row[c]:.3f}" for c in columns))
    if rows:  # what random scores would get on these items
        levels = [chance(c, rows[0]) for c in columns]
        table.add_row("chance", *("" if v is None else f"{v:.3f}" for v in levels), style="dim")
    return table


def eval_retrieval(
    data: Annotated[str, typer.Argument(help="Object-store prefix of an export (holds manifest.json).")],
    split: Annotated[str, typer.Option(help="Split to evaluate on.")] = "test",
    model: Annotated[
        list[str] | None,
        typer.Option(help="Model version id, 'default' or 'local:/path.pt'; repeat for several."),
    ] = None,
    architecture: Annotated[
        str | None, typer.Option(help="open_clip model name or 'custom' for local: models.")
    ] = None,
    config: Annotated[
        Path | None, typer.Option(help="JSON open_clip model config for local: models.")
    ] = None,
    max_items: Annotated[int | None, typer.Option(help="Evaluate only the first N figures.")] = None,
    json_out: Annotated[
        Path | None, typer.Option("--json-out", help="Also write the reports as JSON.")
    ] = None,
) -> None:
    """Panel, region and figure Recall@1/5/10 (both directions) and zero-shot figure-type accuracy."""
    from p2p.models.modeling import ModelLoadError
    from p2p.training import evaluate
    from p2p.training.dataset import DatasetError, iter_samples

    models = list(model or [])
    needs_db = any(m != "default" and not m.startswith("local:") for m in models)
    runtime = _runtime() if needs_db else None
    try:
        specs = resolve_specs(models, architecture, config, runtime)
        store = runtime.store if runtime is not None else _store()
        try:
            records = iter_samples(store, data, split, shuffle_buffer=0, seed=0, epoch=0)
            rows = evaluate.compare_models(specs, records, max_items=max_items, loader=_load(store))
        except (DatasetError, ModelLoadError) as exc:
            raise _fail(str(exc)) from exc
    finally:
        if runtime is not None:
            runtime.close()
    ks = list(evaluate.DEFAULT_KS)
    out.print(_table(rows, ks, split))
    first = rows[0]["report"] if rows else {}
    counts = {t: first.get(t, {}).get("images", 0) for t in ("panel", "region", "figure")}
    out.print(
        f"{first.get('figures', 0)} figures; items: "
        + ", ".join(f"{t} {n}" for t, n in counts.items())
        + f", zero-shot {first.get('zero_shot', {}).get('panels', 0)}"
    )
    if json_out is not None:
        payload = {
            "data": data,
            "split": split,
            "models": [{"model": r["model"], "report": r["report"]} for r in rows],
        }
        json_out.write_text(json.dumps(payload, indent=2))
        out.print(f"wrote {json_out}")


def _load(store: ObjectStore) -> Any:
    def load(spec: ModelSpec) -> Any:
        from p2p.models.modeling import load_model

        return load_model(spec, store=store)

    return load
