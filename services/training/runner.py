"""The training run: shards in the object store -> hierarchical CLIP steps -> checkpoints -> final model.

:func:`run_training` streams the train split of an exported snapshot (``dataset.iter_samples``, with
the shuffle buffer), groups the figures into one batch per step at the level the schedule gives
(``TrainConfig.level_for_step``: alternating R -> P -> M by ratios, or mixed) and trains until
``max_steps`` or ``epochs``. Each level fills its batch with its own unit: figures
(``batch_sizes.figure``), panels (``batch_sizes.panel``) or regions (``batch_sizes.region``); figures
without anything for the level are passed over, and an epoch's last incomplete batch is dropped.

Checkpoints (see :mod:`p2p.training.checkpoints`) record the step, the epoch and how many samples of
that epoch's stream were used, so a resumed run rebuilds the same stream, skips those samples and
continues with the same batches, RNG states, optimizer and scheduler: an interrupted and resumed run
ends with the same weights as an uninterrupted one.

Under ``torchrun`` (a process group initialised by the entry point) each rank reads its part of the
shards and the gradients are averaged across ranks before clipping; rank 0 writes the checkpoints.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from p2p.shared.storage import ObjectStore
from p2p.training import checkpoints as ckpt
from p2p.training.batch import FigureSample, PanelSample, RegionSample, collate
from p2p.training.config import TrainConfig
from p2p.training.dataset import DatasetError, FigureRecord, iter_samples, read_manifest, split_shards
from p2p.training.hierarchy import HierarchicalCLIP, build_model
from p2p.training.optim import build_optimizer, build_scheduler
from p2p.training.step import NonFiniteLoss, seed_everything, train_step

log = logging.getLogger(__name__)

Status = Literal["completed", "stopped", "failed"]


class TrainingDataError(DatasetError):
    """The snapshot cannot feed this configuration (empty split, too few items for one batch...)."""


@dataclass
class RunResult:
    status: Status
    step: int  # optimisation steps done (including those of earlier, resumed runs)
    epoch: int
    steps_run: int  # steps done by this call
    resumed_from: int | None = None  # the step of the checkpoint this call resumed from
    reason: str | None = None  # why the run failed
    checkpoint: str | None = None  # the latest committed checkpoint
    final_model: str | None = None  # the embedding-API checkpoint (completed runs)
    last_loss: float | None = None
    last_losses: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status != "failed"


# ----------------------------------------------------------------------------------------- data


def to_sample(record: FigureRecord) -> FigureSample:
    return FigureSample(
        figure_image=record.figure_image,
        caption=record.caption,
        panels=[
            PanelSample(
                image=p.image,
                subcaption=p.subcaption,
                description=p.description,
                regions=[
                    RegionSample(r.image, r.box_in_panel, r.caption_text, r.description) for r in p.regions
                ],
            )
            for p in record.panels
        ],
    )


def required_levels(config: TrainConfig) -> set[str]:
    """The levels some step trains (mixed steps train every active level)."""
    if config.schedule == "mixed":
        return set(config.active_levels)
    return set(config.level_cycle())


def _with_children(config: TrainConfig, child: str) -> bool:
    return child in config.active_levels and (config.objectives.inter_level or config.objectives.mgll)


class Batcher:
    """Cuts one epoch's stream of records into per-level batches; ``consumed`` counts records used."""

    def __init__(self, records: Iterator[FigureRecord], config: TrainConfig) -> None:
        self.records = records
        self.config = config
        self.consumed = 0
        self.exhausted = False

    def skip(self, n: int) -> None:
        for _ in range(n):
            if next(self.records, None) is None:
                raise TrainingDataError(
                    f"the checkpoint used {n} samples of this epoch but the stream ends after {self.consumed}"
                    " (the snapshot changed?)"
                )
            self.consumed += 1

    def _next(self) -> FigureRecord | None:
        if self.exhausted:
            return None
        record = next(self.records, None)
        if record is None:
            self.exhausted = True
            return None
        self.consumed += 1
        return record

    def _shape(self, sample: FigureSample, level: str) -> FigureSample | None:
        """The part of a figure a step at ``level`` uses (None: nothing for that level)."""
        if level == "mixed":
            return sample
        if level == "figure":
            if not _with_children(self.config, "panel"):
                sample.panels = []
            for panel in sample.panels:
                panel.regions = []
            return sample
        if level == "panel":
            if not sample.panels:
                return None
            if not _with_children(self.config, "region"):
                for panel in sample.panels:
                    panel.regions = []
            return sample
        sample.panels = [p for p in sample.panels if p.regions]
        return sample if sample.panels else None

    def take(self, level: str) -> list[FigureSample] | None:
        """The next full batch for ``level``; None when the epoch's stream cannot fill one."""
        sizes = self.config.batch_sizes
        quota = {"figure": sizes.figure, "mixed": sizes.figure, "panel": sizes.panel, "region": sizes.region}
        need = quota[level]
        batch: list[FigureSample] = []
        while need > 0:
            record = self._next()
            if record is None:
                return None
            sample = self._shape(to_sample(record), level)
            if sample is None:
                continue
            if level == "panel":
                sample.panels = sample.panels[:need]
                need -= len(sample.panels)
            elif level == "region":
                kept: list[PanelSample] = []
                for panel in sample.panels:
                    if need <= 0:
                        break
                    panel.regions = panel.regions[:need]
                    need -= len(panel.regions)
                    kept.append(panel)
                sample.panels = kept
            else:
                need -= 1
            batch.append(sample)
        return batch


def check_data(
    manifest: dict[str, Any], split: str, config: TrainConfig, world_size: int = 1
) -> dict[str, int]:
    """Raise :class:`TrainingDataError` before training when the split cannot fill one batch per level."""
    try:
        split_shards(manifest, split)
    except DatasetError as exc:
        raise TrainingDataError(f"cannot train: {exc}") from exc
    counts = {k: int(v) for k, v in manifest["counts"][split].items()}
    name = manifest.get("snapshot_name")
    needs = required_levels(config)
    if config.schedule == "mixed":
        needs.add("figure")
    per_rank = {k: v // world_size for k, v in counts.items()}
    unit = {"figure": "figures", "panel": "panels", "region": "regions"}
    if "region" in needs and counts.get("regions", 0) == 0:
        raise TrainingDataError(
            f"cannot train: split {split} of snapshot {name} has no regions but the config trains the "
            f"region level (levels={config.levels!r}); use levels='panel' or a snapshot with regions"
        )
    for level in sorted(needs):
        have, batch = per_rank.get(unit[level], 0), getattr(config.batch_sizes, level)
        if have < batch:
            raise TrainingDataError(
                f"cannot train: split {split} of snapshot {name} has {counts.get(unit[level], 0)} "
                f"{unit[level]} ({have} per rank for {world_size} rank(s)), fewer than one {level} "
                f"batch (batch_sizes.{level}={batch})"
            )
    return counts


def _steps_per_epoch(counts: dict[str, int], config: TrainConfig, world_size: int) -> int:
    """An estimate of the steps one epoch gives (the cosine horizon when ``max_steps`` is not set)."""
    figures = max(counts.get("figures", 0) // world_size, 1)
    sizes = config.batch_sizes
    per_figure = {
        "figure": 1.0,
        "mixed": 1.0,
        "panel": max(counts.get("panels", 0), 1) / figures / world_size,
        "region": max(counts.get("regions", 0), 1) / figures / world_size,
    }
    cycle: list[str] = ["mixed"] if config.schedule == "mixed" else list(config.level_cycle())
    figures_per_step = sum(
        getattr(sizes, "figure" if lv == "mixed" else lv) / per_figure[lv] for lv in cycle
    ) / len(cycle)
    return max(int(figures / figures_per_step), 1)


# ------------------------------------------------------------------------------------ multi-rank


def _dist() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


class _GradAverager:
    """Passed to ``train_step`` as its ``scaler``: averages the gradients across ranks before clipping.

    One coalesced all-reduce per step; a parameter without a gradient on some ranks gets zeros there
    (so every rank sends the same tensors), one without a gradient anywhere stays untouched.
    """

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return loss

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        dist = torch.distributed
        params = [p for group in optimizer.param_groups for p in group["params"]]
        mask = torch.tensor([float(p.grad is not None) for p in params], device=params[0].device)
        dist.all_reduce(mask, op=dist.ReduceOp.MAX)
        used = [p for p, m in zip(params, mask.tolist(), strict=True) if m > 0]
        for p in used:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        if not used:
            return
        flat = torch.cat([p.grad.reshape(-1) for p in used if p.grad is not None])
        dist.all_reduce(flat)
        flat /= self.world_size
        offset = 0
        for p in used:
            assert p.grad is not None
            n = p.grad.numel()
            p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
            offset += n

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        if any(not bool(torch.isfinite(g).all()) for g in grads):
            optimizer.zero_grad(set_to_none=True)
            raise NonFiniteLoss("non-finite gradient after averaging across ranks; the step was skipped")
        optimizer.step()

    def update(self) -> None:
        return None


def _all_ranks(flag: bool, world_size: int, device: torch.device, *, any_rank: bool) -> bool:
    """``flag`` agreed across ranks: true on any rank (``any_rank``) or on every rank."""
    if world_size == 1:
        return flag
    dist = torch.distributed
    value = torch.tensor([float(flag)], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX if any_rank else dist.ReduceOp.MIN)
    return bool(value.item() > 0)


def _barrier(world_size: int) -> None:
    if world_size > 1:
        torch.distributed.barrier()


# ---------------------------------------------------------------------------------------- runner


class _Window:
    """Per-level loss sums and throughput since the last progress report (reset on each report)."""

    def __init__(self) -> None:
        self.reset(time.monotonic())

    def reset(self, now: float) -> None:
        self.started, self.samples, self.steps = now, 0, 0
        self.sums: dict[str, float] = {}
        self.counts: dict[str, int] = {}

    def add(self, level: str, loss: float, samples: int) -> None:
        self.sums[level] = self.sums.get(level, 0.0) + loss
        self.counts[level] = self.counts.get(level, 0) + 1
        self.samples += samples
        self.steps += 1


def run_training(
    *,
    store: ObjectStore,
    data_prefix: str,
    out_prefix: str,
    config: TrainConfig,
    progress: Callable[[dict[str, Any]], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    checkpoint_every: int = 1000,
    keep_checkpoints: int = 3,
    progress_every: int = 10,
    shuffle_buffer: int = 1000,
    split: str = "train",
) -> RunResult:
    """Train ``config`` on the ``split`` of the snapshot at ``data_prefix``; checkpoints go to ``out_prefix``.

    Resumes from ``{out_prefix}/latest.json`` when it exists (a checkpoint of another config or
    snapshot raises :class:`~p2p.training.checkpoints.CheckpointMismatch` before training). Data
    problems raise :class:`TrainingDataError` before training. A non-finite loss ends the run with
    ``status="failed"`` and its reason; the last good checkpoint stays the latest.
    """
    if checkpoint_every < 1 or keep_checkpoints < 1 or progress_every < 1:
        raise ValueError("checkpoint_every, keep_checkpoints and progress_every must be at least 1")
    rank, world_size = _dist()
    manifest = read_manifest(store, data_prefix)
    snapshot = str(manifest.get("snapshot_name") or data_prefix)
    counts = check_data(manifest, split, config, world_size)
    state = ckpt.load_latest(store, out_prefix)
    if state is not None:
        ckpt.check_compatible(state, config, snapshot)

    seed_everything(config.seed)
    model = build_model(config, store=store)
    optimizer = build_optimizer(model, config)
    horizon = config.max_steps or config.epochs * _steps_per_epoch(counts, config, world_size)
    scheduler = build_scheduler(optimizer, config, horizon)
    step, epoch, consumed = 0, 0, 0
    resumed_from: int | None = None
    last_key: str | None = None
    if state is not None:
        ckpt.load_model_state(model, state)
        try:
            optimizer.load_state_dict(state.optimizer)
            scheduler.load_state_dict(state.scheduler)
        except (ValueError, KeyError) as exc:
            raise ckpt.CheckpointMismatch(
                f"checkpoint {state.key}: the optimizer state does not fit this model ({exc})"
            ) from exc
        ckpt.restore_rng(state.rng, model.generator)
        model.load_text_cache(state.text_cache)
        step, epoch, consumed = state.step, state.epoch, state.consumed
        resumed_from, last_key = state.step, state.key
        log.info("resuming from %s (step %d, epoch %d)", state.key, step, epoch)
        del state  # the loaded tensors are in the model and optimizer now

    device = torch.device(config.device)
    scaler = _GradAverager(world_size) if world_size > 1 else None
    max_steps = config.max_steps if config.max_steps is not None else math.inf
    start_step, saved_step = step, step if resumed_from is not None else -1
    window = _Window()
    run_started = time.monotonic()
    last: dict[str, Any] = {}

    def save() -> str | None:
        nonlocal saved_step, last_key
        if saved_step == step:
            return last_key
        if rank == 0:
            last_key = ckpt.save_checkpoint(
                store,
                out_prefix,
                ckpt.TrainState(
                    step=step,
                    epoch=epoch,
                    consumed=consumed,
                    model=_unwrap(model).state_dict(),
                    optimizer=optimizer.state_dict(),
                    scheduler=scheduler.state_dict(),
                    rng=ckpt.rng_state(model.generator),
                    config=ckpt.config_dict(config),
                    snapshot=snapshot,
                    text_cache=_unwrap(model).text_cache_state(),
                ),
                keep=keep_checkpoints,
            )
        else:
            last_key = ckpt.step_key(out_prefix, step)
        _barrier(world_size)
        saved_step = step
        return last_key

    def result(status: Status, reason: str | None = None, final: str | None = None) -> RunResult:
        return RunResult(
            status=status,
            step=step,
            epoch=epoch,
            steps_run=step - start_step,
            resumed_from=resumed_from,
            reason=reason,
            checkpoint=last_key,
            final_model=final,
            last_loss=last.get("loss"),
            last_losses=dict(last.get("losses", {})),
        )

    def report(level: str) -> None:
        now = time.monotonic()
        elapsed = max(now - window.started, 1e-9)
        done = step - start_step
        total = max_steps if max_steps != math.inf else horizon
        rate = done / max(now - run_started, 1e-9)
        info = {
            "step": step,
            "epoch": epoch,
            "level": level,
            "loss": last.get("loss"),
            "losses": {lv: window.sums[lv] / window.counts[lv] for lv in window.sums},
            "parts": dict(last.get("losses", {})),
            "lr": dict(last.get("lr", {})),
            "samples_per_s": window.samples / elapsed,
            "steps_per_s": window.steps / elapsed,
            "eta_s": max(total - step, 0) / rate if rate > 0 else None,
            "total_steps": int(total),
            "resumed_from": resumed_from,
            "checkpoint": last_key,
        }
        window.reset(now)
        if rank != 0:
            return
        if progress is not None:
            progress(info)
        else:
            log.info("step %d epoch %d loss %s %s", step, epoch, info["loss"], info["losses"])

    stop_requested = False
    while step < max_steps and epoch < config.epochs:
        batcher = Batcher(
            iter_samples(
                store,
                data_prefix,
                split,
                shuffle_buffer=shuffle_buffer,
                seed=config.seed,
                epoch=epoch,
                rank=rank,
                world_size=world_size,
            ),
            config,
        )
        batcher.skip(consumed)
        stepped = consumed > 0
        while step < max_steps:
            level = config.level_for_step(step)
            before = batcher.consumed
            samples = batcher.take(level)
            if not _all_ranks(samples is not None, world_size, device, any_rank=False):
                break
            assert samples is not None
            batch = collate(samples, image_size=model.image_size).to(device)
            del samples
            try:
                out = train_step(model, optimizer, scheduler, batch, level, config, scaler=scaler)
            except NonFiniteLoss as exc:
                log.error("step %d failed: %s", step + 1, exc)
                _barrier(world_size)
                return result("failed", reason=str(exc))
            del batch
            step += 1
            stepped = True
            consumed = batcher.consumed
            last = out
            window.add(level, float(out["loss"]), consumed - before)
            if step % progress_every == 0:
                report(level)
            if step % checkpoint_every == 0:
                save()
            stop = should_stop is not None and bool(should_stop())
            if _all_ranks(stop, world_size, device, any_rank=True):
                stop_requested = True
                break
        if stop_requested:
            break
        if not stepped:
            raise TrainingDataError(
                f"epoch {epoch} of split {split} gave no complete batch: the data is too small for "
                f"the batch sizes {config.batch_sizes.model_dump()}"
            )
        if step >= max_steps:
            break
        epoch, consumed = epoch + 1, 0

    if window.steps:
        report(str(last.get("level", "")))
    save()
    if stop_requested:
        log.info("stopped at step %d; checkpoint %s", step, last_key)
        return result("stopped")
    final = None
    if rank == 0:
        final = ckpt.export_final_model(store, out_prefix, _unwrap(model).clip, config)
    _barrier(world_size)
    return result("completed", final=final or ckpt.final_model_key(out_prefix))


def _unwrap(model: torch.nn.Module) -> HierarchicalCLIP:
    inner = getattr(model, "module", model)
    assert isinstance(inner, HierarchicalCLIP)
    return inner


__all__ = ["Batcher", "RunResult", "TrainingDataError", "check_data", "run_training", "to_sample"]
