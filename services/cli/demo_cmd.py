"""`p2p demo`: sample figures in, mined, a short training run, the corpus indexed, both APIs served.

Every phase says how long it took, so the README's times can be checked on any machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from sqlalchemy import select

from p2p.cli.consoles import make_console
from p2p.shared.settings import Settings

out = make_console()

DEMO_SYNTHETIC_FIGURES = 60
DEMO_TRAIN_STEPS = 40
DEMO_RUN_NAME = "demo"
DEMO_QUERY = "fluorescence micrograph of cells"


@contextmanager
def phase(name: str, times: dict[str, float]) -> Iterator[None]:
    start = time.perf_counter()
    try:
        yield
    finally:
        times[name] = time.perf_counter() - start
        out.print(f"[dim]{name}: {times[name]:.0f} s[/dim]")


def demo(
    serve: Annotated[bool, typer.Option("--serve/--no-serve", help="Serve the APIs after the run.")] = True,
    port: Annotated[
        int | None,
        typer.Option(
            help="Port of the ingest API (default P2P_SERVER__PORT, 8000); the viewer and embedding API "
            "take the next one."
        ),
    ] = None,
    synthetic: Annotated[
        int, typer.Option(min=0, help="Synthetic compound figures added to the corpus to train on.")
    ] = DEMO_SYNTHETIC_FIGURES,
    train_steps: Annotated[
        int, typer.Option(min=0, help="Steps of the demo training run (0: no training, the untrained model).")
    ] = DEMO_TRAIN_STEPS,
) -> None:
    """Make sample figures, ingest and mine them, train the small model on them and activate it,
    then serve the APIs and the search viewer."""
    from p2p.cli.main import _settings, ingest, status
    from p2p.ingest.samples import write_manifest_folder, write_pmc_package

    settings = _settings()
    times: dict[str, float] = {}
    samples = settings.data_dir / "samples"
    out.print(
        f"[bold]Panel2Patch demo[/bold] ({settings.profile} profile, data in {settings.data_dir.resolve()})"
    )
    with phase("ingest and mining", times):
        manifest = write_manifest_folder(samples / "figures", count=8)
        package = write_pmc_package(samples / "PMC9000001.tar.gz")
        out.print(f"made 8 sample figures with a manifest at {manifest} and a PMC package at {package}")
        ingest([manifest.parent, package], caption=None)
        if synthetic:
            ingest([_synthetic_corpus(samples / "synthetic", synthetic)], caption=None)
    status()
    out.print(
        "each figure was mined on the CPU backend: GET /v1/figures/{id} shows its panels (boxes, labels, "
        "subcaptions, types) and marker regions; `p2p eval mining --dir DIR` scores the miner."
    )
    with phase("training", times):
        trained = _demo_training(settings, train_steps) if train_steps else None
    with phase("re-index", times):
        _demo_embedding(settings, trained)
    out.print("demo phases: " + ", ".join(f"{name} {seconds:.0f} s" for name, seconds in times.items()))
    if serve:
        p = port if port is not None else settings.server.port
        if not serve_both(settings, host=settings.server.host, port=p):
            raise typer.Exit(1)


def _synthetic_corpus(folder: Path, count: int) -> Path:
    """``count`` synthetic compound figures (deterministic) with a manifest of their captions."""
    import json

    from p2p.cli.main import console
    from p2p.mining.lab.synth.dataset import write_dataset

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
    from p2p.cli.main import _runtime
    from p2p.cli.train_cmd import follow
    from p2p.shared.db.models import TrainingRun, TrainingRunStatus
    from p2p.shared.errors import P2PError
    from p2p.training import runs
    from p2p.training.schemas import TrainingRunCreate

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
    from p2p.cli.main import _runtime
    from p2p.cli.models_cmd import follow_reindex
    from p2p.embedding_api.indexing import register
    from p2p.models.modeling import DEFAULT_MODEL_NAME, default_spec
    from p2p.models.registry import activate, get_space, spec_of
    from p2p.shared.db.models import ModelStatus, ModelVersion

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
        state, progress, _ = follow_reindex(runtime, version_id)
        if state is not ModelStatus.READY:
            out.print(f"embedding index not ready ({state}): `p2p models list` shows its progress")
            return
        what = "trained by the demo run" if trained else "its vision tower is untrained until a training run"
        out.print(
            f"embedded {progress.get('done')} figures, panels and regions with {spec.name} "
            f"({progress.get('items_per_s')} items/s); {what}"
        )
        _show_search(runtime, spec, version_id)
    finally:
        runtime.close()


def _show_search(runtime: Any, spec: Any, version_id: uuid.UUID) -> None:
    """One text search, printed as a reader would want it: level, label, text and score."""
    from p2p.embedding_api import vectors
    from p2p.embedding_api.service import enrich
    from p2p.models.modeling import load_model

    model = load_model(spec, store=runtime.store, threads=runtime.settings.embedding.torch_threads)
    with runtime.engine.connect() as conn:
        hits = vectors.search(conn, version_id, model.encode_texts([DEMO_QUERY])[0], level="panel", k=3)
    with runtime.session() as session:
        found = enrich(session, hits)
    lines = [f"search '{DEMO_QUERY}' (panels), best {len(found)}:"]
    for hit in found:
        label = hit.panel.label if hit.panel is not None and hit.panel.label else "-"
        text = " ".join((hit.text or "").split())
        lines.append(f"  {hit.score:.3f}  {hit.level} {label}  {text[:90]}{'...' if len(text) > 90 else ''}")
    # one write: the embedded workers' log lines, on the same terminal, never land inside the block
    out.print("\n".join(lines), highlight=False, soft_wrap=True)


def serve_both(settings: Settings, *, host: str, port: int) -> bool:
    """Serve the ingest API on ``port`` and the embedding API with the viewer on ``port + 1`` in one
    event loop until Ctrl-C (or SIGTERM) stops both; False when either could not start."""
    import uvicorn

    from p2p.apps.embedding import embedding_app  # lazy: it loads torch, which `p2p --help` need not wait for
    from p2p.apps.ingest import ingest_app
    from p2p.cli.main import _refuse_open_bind_without_keys, _runtime
    from p2p.shared.logs import clear as clear_log_context
    from p2p.shared.logs import configure_logging

    _refuse_open_bind_without_keys(settings, host)
    configure_logging(settings, service="demo")
    clear_log_context()  # a server's lines carry each request's id, not the command's
    level = settings.log_level.lower()
    # One runtime for both: one embedded database handle, one task pool.
    runtime = _runtime(settings)
    servers = [
        uvicorn.Server(
            uvicorn.Config(
                ingest_app(runtime=runtime), host=host, port=port, log_level=level, log_config=None
            )
        ),
        uvicorn.Server(
            uvicorn.Config(
                embedding_app(runtime=runtime), host=host, port=port + 1, log_level=level, log_config=None
            )
        ),
    ]
    out.print(
        f"serving the ingest API on http://{host}:{port} (docs: /docs) and the search viewer and "
        f"embedding API on http://{host}:{port + 1}/ (docs: /docs); Ctrl-C stops both"
    )

    async def run_all() -> None:
        tasks = [asyncio.create_task(server.serve()) for server in servers]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for server in servers:  # one stopped (Ctrl-C, or a failed start): stop the other too
            server.should_exit = True
        await asyncio.gather(*tasks, return_exceptions=True)

    try:  # uvicorn raises the Ctrl-C it handled again once its server is down
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(run_all())
    finally:
        runtime.close()
    started = all(server.started for server in servers)
    if not started:
        out.print("[red]the demo could not start both APIs; see the errors above[/red]")
    return started
