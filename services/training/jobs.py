"""Running one training run on a worker: export -> train (child process) -> evaluate -> register.

Idempotent by the durable-job claim (``p2p.shared.jobs``: an advisory lock on the run id and a
lease, held for the whole execution): a duplicate delivery (a broker re-delivering a long run, a
retried task) finds the lock taken and leaves; a run whose worker died is re-queued by the sweep. A run
whose worker died is re-delivered and resumes from its latest checkpoint (the trainer does that on
its own from ``{out_prefix}/latest.json``); a trainer killed by a signal is restarted the same way
up to ``max_restarts`` times. The run row carries the state, the progress and the reason of a failure.
"""

from __future__ import annotations

import contextlib
import json
import logging
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sqlalchemy import select

from p2p.models.modeling import ModelSpec, load_model
from p2p.models.registry import activate, register
from p2p.shared import jobs as durable
from p2p.shared.db.base import utcnow
from p2p.shared.db.models import ModelVersion, TrainingRun, TrainingRunStatus
from p2p.shared.runtime import Runtime
from p2p.training import evaluate
from p2p.training.config import load_config
from p2p.training.dataset import DatasetError, iter_samples, read_manifest, split_figures
from p2p.training.export import ExportFilters, export_corpus
from p2p.training.runner import check_data
from p2p.training.schemas import RunData, RunOptions
from p2p.training.trainer_process import TrainerProcess

log = logging.getLogger(__name__)

CANCEL_POLL_S = 1.0
STOP_GRACE_S = 300.0  # a trainer asked to stop finishes its step and writes a checkpoint first
HEARTBEAT_S = 30.0


class TrainingInterrupted(Exception):
    """The trainer stopped without a cancel request (the worker is shutting down): run it again."""


class _Run:
    """Reads and writes the run row in short transactions (the execution takes hours)."""

    def __init__(self, runtime: Runtime, run_id: uuid.UUID) -> None:
        self.runtime = runtime
        self.id = run_id
        # Wall seconds per phase (export, train, evaluate), kept in ``progress["phases"]`` so an
        # operator sees where a run's time went; a resumed run adds to what earlier attempts spent.
        self.phases: dict[str, float] = {}

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.monotonic()
        try:
            yield
        finally:
            self.phases[name] = round(self.phases.get(name, 0.0) + time.monotonic() - start, 3)
            self.update(progress=self.load().progress)  # ``update`` writes the phases into it

    def load(self) -> TrainingRun:
        with self.runtime.session() as session:
            run = session.get(TrainingRun, self.id)
            if run is None:
                raise LookupError(f"no training run {self.id}")
            session.expunge(run)
            return run

    def update(self, **values: Any) -> None:
        with self.runtime.session() as session:
            run = session.get(TrainingRun, self.id, with_for_update=True)
            if run is None:
                return
            if "progress" in values:
                values["progress"] = {**values["progress"], "phases": dict(self.phases)}
            for key, value in values.items():
                setattr(run, key, value)
            run.heartbeat_at = utcnow()
            session.commit()

    def cancel_requested(self) -> bool:
        with self.runtime.session() as session:
            return bool(session.scalar(select(TrainingRun.cancel_requested).where(TrainingRun.id == self.id)))

    def finish(self, status: TrainingRunStatus, error: str | None = None, **values: Any) -> None:
        self.update(status=status, error=error, finished_at=utcnow(), **values)
        event: durable.EventName = "succeeded" if status is TrainingRunStatus.COMPLETED else "failed"
        durable.emit(self.runtime, durable.JobEvent("training", self.id, event, reason=error))


def execute_run(runtime: Runtime, run_id: uuid.UUID) -> TrainingRunStatus | None:
    """Execute the run (or resume it); None when another worker holds it."""
    with durable.claim(runtime, durable.TRAINING, run_id) as lease:
        if lease is None:
            log.info("training run %s is being executed by another worker; leaving it", run_id)
            return None
        return _execute(runtime, _Run(runtime, run_id))


def _execute(runtime: Runtime, handle: _Run) -> TrainingRunStatus:
    run = handle.load()
    if run.status.finished:
        return run.status
    if run.cancel_requested:
        handle.finish(TrainingRunStatus.CANCELLED, "cancelled before it started")
        return TrainingRunStatus.CANCELLED
    options = RunOptions.model_validate({k: v for k, v in run.options.items() if k != "preset"})
    handle.phases = dict(run.progress.get("phases") or {})
    handle.update(attempts=run.attempts + 1, started_at=run.started_at or utcnow(), error=None)
    try:
        with handle.phase("export_s"):
            snapshot_prefix = run.snapshot_prefix or _export(runtime, handle, run)
            _check_data(runtime, snapshot_prefix, run)
    except (ValueError, DatasetError) as exc:  # ExportError, TrainConfigError; TrainingDataError
        handle.finish(TrainingRunStatus.FAILED, str(exc))
        return TrainingRunStatus.FAILED
    with handle.phase("train_s"):
        outcome = _train(runtime, handle, run, snapshot_prefix, options)
    if outcome is not TrainingRunStatus.EVALUATING:
        return outcome
    try:
        with handle.phase("evaluate_s"):
            version_id = _evaluate_and_register(runtime, handle, options)
    except Exception as exc:
        log.exception("training run %s: evaluation or registration failed", run.id)
        handle.finish(TrainingRunStatus.FAILED, f"trained, but {type(exc).__name__}: {exc}"[:2000])
        return TrainingRunStatus.FAILED
    handle.finish(TrainingRunStatus.COMPLETED, None, model_version_id=version_id)
    return TrainingRunStatus.COMPLETED


def _export(runtime: Runtime, handle: _Run, run: TrainingRun) -> str:
    data = RunData.model_validate(run.data)
    handle.update(status=TrainingRunStatus.EXPORTING)
    prefix = f"{run.out_prefix}/data"
    manifest = export_corpus(
        runtime,
        out_prefix=prefix,
        shard_size=data.shard_size,
        filters=ExportFilters(
            license_groups=tuple(data.license_groups) if data.license_groups is not None else None,
            figure_types=tuple(data.figure_types) if data.figure_types is not None else None,
            min_panels=data.min_panels,
        ),
        mix_plain_pairs=data.mix_plain_pairs,
        snapshot_name=f"training-run-{run.id}",
        overwrite=True,  # a resumed run may find a partial export of its own
    )
    handle.update(
        snapshot_prefix=prefix, snapshot={"name": manifest.snapshot_name, "counts": manifest.counts}
    )
    return prefix


def _check_data(runtime: Runtime, snapshot_prefix: str, run: TrainingRun) -> None:
    check_data(read_manifest(runtime.store, snapshot_prefix), "train", load_config(run.config))


def _progress_values(event: dict[str, Any], restarts: int, pid: int | None) -> dict[str, Any]:
    keep = ("step", "epoch", "total_steps", "resumed_from", "level", "loss", "losses", "parts", "lr")
    progress = {k: event.get(k) for k in keep if k in event}
    progress.update(
        samples_per_s=event.get("samples_per_s"),
        steps_per_s=event.get("steps_per_s"),
        eta_s=event.get("eta_s"),
        restarts=restarts,
        trainer_pid=pid,
        updated_at=utcnow().isoformat(),
    )
    return progress


def _train(
    runtime: Runtime, handle: _Run, run: TrainingRun, snapshot_prefix: str, options: RunOptions
) -> TrainingRunStatus:

    handle.update(status=TrainingRunStatus.TRAINING)
    restarts = int(run.progress.get("restarts", 0))
    progress: dict[str, Any] = dict(run.progress)
    with tempfile.TemporaryDirectory(prefix="p2p-run-") as tmp:
        config_path = Path(tmp) / "config.json"
        config_path.write_text(json.dumps(run.config))
        while True:
            trainer = TrainerProcess(
                store=runtime.store,
                settings=runtime.settings,
                config_path=config_path,
                data_prefix=snapshot_prefix,
                out_prefix=run.out_prefix,
                checkpoint_every=options.checkpoint_every,
                keep_checkpoints=options.keep_checkpoints,
                progress_every=options.progress_every,
                shuffle_buffer=options.shuffle_buffer,
                threads=options.threads,
            )
            trainer.start()
            log.info("training run %s: trainer pid %s", run.id, trainer.pid)
            cancelled = False
            last_beat = time.monotonic()
            try:
                for event in trainer.events(CANCEL_POLL_S):
                    if event is not None and event.get("event") == "progress":
                        progress = _progress_values(event, restarts, trainer.pid)
                        handle.update(progress=progress, checkpoint=event.get("checkpoint"))
                        durable.emit(
                            runtime, durable.JobEvent("training", run.id, "progress", details=progress)
                        )
                        last_beat = time.monotonic()
                    elif time.monotonic() - last_beat > HEARTBEAT_S:
                        handle.update()
                        last_beat = time.monotonic()
                    if not cancelled and handle.cancel_requested():
                        log.info("training run %s: cancel requested, stopping the trainer", run.id)
                        cancelled = True
                        trainer.terminate()
                exit_ = trainer.wait(STOP_GRACE_S if cancelled else None)
            except BaseException:
                trainer.terminate()
                trainer.wait(STOP_GRACE_S)
                raise
            result = exit_.result or {}
            checkpoint = result.get("checkpoint") or progress.get("checkpoint") or handle.load().checkpoint
            if result:
                progress.update(
                    step=result.get("step"),
                    epoch=result.get("epoch"),
                    resumed_from=result.get("resumed_from"),
                    updated_at=utcnow().isoformat(),
                )
            status = result.get("status")
            if exit_.returncode == 0 and status == "completed":
                handle.update(
                    status=TrainingRunStatus.EVALUATING,
                    progress=progress,
                    checkpoint=checkpoint,
                    final_model=result.get("final_model"),
                )
                return TrainingRunStatus.EVALUATING
            if cancelled or (exit_.returncode == 0 and handle.cancel_requested()):
                handle.finish(
                    TrainingRunStatus.CANCELLED,
                    f"cancelled at step {progress.get('step')}; checkpoint {checkpoint} kept",
                    progress=progress,
                    checkpoint=checkpoint,
                )
                return TrainingRunStatus.CANCELLED
            if exit_.returncode == 0 and status == "stopped":
                handle.update(status=TrainingRunStatus.QUEUED, progress=progress, checkpoint=checkpoint)
                raise TrainingInterrupted(f"trainer of run {run.id} stopped at step {progress.get('step')}")
            if exit_.signal is not None and restarts < options.max_restarts:
                restarts += 1
                progress["restarts"] = restarts
                log.warning(
                    "training run %s: trainer killed by signal %d; restart %d/%d from %s",
                    run.id,
                    exit_.signal,
                    restarts,
                    options.max_restarts,
                    checkpoint,
                )
                handle.update(progress=progress, checkpoint=checkpoint)
                continue
            if exit_.signal is not None:
                reason = f"trainer killed by signal {exit_.signal} after {restarts} restart(s)"
            else:
                reason = (
                    result.get("reason") or exit_.error or f"trainer exited with status {exit_.returncode}"
                )
            handle.finish(
                TrainingRunStatus.FAILED,
                f"{reason}; last good checkpoint: {checkpoint or 'none'}",
                progress=progress,
                checkpoint=checkpoint,
            )
            return TrainingRunStatus.FAILED


def _evaluate_and_register(runtime: Runtime, handle: _Run, options: RunOptions) -> uuid.UUID | None:
    run = handle.load()
    assert run.final_model is not None and run.snapshot_prefix is not None
    config = load_config(run.config)
    start = config.model.to_spec()
    trained = ModelSpec(
        name=start.name, architecture=start.architecture, config=start.config, source=f"s3:{run.final_model}"
    )
    split: str = options.eval_split
    counts = (run.snapshot or {}).get("counts", {})
    if not split_figures(counts, split):
        split = {"test": "val", "val": "test"}.get(split, split)
    metrics: dict[str, Any] = {"split": split}
    if split_figures(counts, split):
        rows = evaluate.compare_models(
            {"untrained": start, "trained": trained},
            iter_samples(runtime.store, run.snapshot_prefix, split, shuffle_buffer=0, seed=0, epoch=0),
            max_items=options.eval_max_items,
            loader=lambda spec: load_model(spec, store=runtime.store),
        )
        for row in rows:
            metrics[row["model"]] = {k: v for k, v in row.items() if k not in ("model", "report")}
        metrics["improved"] = _improved(metrics["trained"], metrics["untrained"])
    else:
        metrics["skipped"] = "the snapshot has no held-out figures (test and val are empty)"
    handle.update(metrics=metrics)
    return _register(runtime, run, trained, metrics, options) if options.register_model else None


def _improved(trained: dict[str, Any], untrained: dict[str, Any]) -> dict[str, bool]:
    """Per metric (Recall@k and accuracy; not the item counts): did training raise it."""
    return {
        key: float(trained[key]) > float(untrained[key])
        for key in trained
        if not key.endswith(" n") and key in untrained
    }


def _register(
    runtime: Runtime, run: TrainingRun, spec: Any, metrics: dict[str, Any], options: RunOptions
) -> uuid.UUID:

    version_label = options.model_version or f"run-{run.id.hex[:8]}"
    with runtime.session() as session:
        existing = session.scalar(select(ModelVersion).where(ModelVersion.training_run_id == run.id))
        version = existing or register(session, spec, version_label, store=runtime.store)
        version.training_run_id = run.id
        version.metrics = metrics
        session.commit()
        if options.activate:
            space = options.space or runtime.settings.embedding.space
            activate(session, runtime.dispatcher, version_id=version.id, space=space)
        return version.id
