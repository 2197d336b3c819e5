"""One optimisation step: forward at a level, finite-loss guard, backward, clipping, update."""

from __future__ import annotations

import contextlib
import math
import random
from typing import Any

import numpy as np
import torch

from p2p.training.batch import HierBatch
from p2p.training.config import TrainConfig
from p2p.training.hierarchy import HierarchicalCLIP


class NonFiniteLoss(FloatingPointError):
    """The loss or the gradient norm of a step is NaN/Inf; the parameters were left unchanged."""

    def __init__(self, message: str, parts: dict[str, float] | None = None) -> None:
        super().__init__(message)
        self.parts = parts or {}


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def autocast(cfg: TrainConfig) -> contextlib.AbstractContextManager[Any]:
    """bf16 autocast on the config's device type for ``precision="bf16"``, else nothing."""
    if cfg.precision == "bf16":
        return torch.autocast(device_type=torch.device(cfg.device).type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _grad_norm(params: list[torch.nn.Parameter]) -> torch.Tensor:
    grads = [p.grad.detach().float().norm() for p in params if p.grad is not None]
    return torch.linalg.vector_norm(torch.stack(grads)) if grads else torch.zeros(())


def train_step(
    model: HierarchicalCLIP,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    batch: HierBatch,
    level: str,
    cfg: TrainConfig,
    scaler: Any = None,
) -> dict[str, Any]:
    """Train one step; returns ``{"level", "loss", "losses": {part: value}, "grad_norm", "lr"}``.

    Raises :class:`NonFiniteLoss` (before any parameter changes) when the loss or the gradient norm is
    not finite. ``scaler`` is an optional ``torch.amp.GradScaler`` (fp16 on GPU); it skips inf steps
    on its own, so only a non-finite loss raises with it.
    """
    model.train()
    optimizer.zero_grad(set_to_none=True)
    lrs = {str(g.get("name", i)): float(g["lr"]) for i, g in enumerate(optimizer.param_groups)}
    with autocast(cfg):
        total, parts = model.loss(batch, level, cfg)
    if not math.isfinite(parts["total"]) or not all(math.isfinite(v) for v in parts.values()):
        bad = ", ".join(f"{k}={v}" for k, v in parts.items() if not math.isfinite(v))
        raise NonFiniteLoss(f"non-finite loss at level {level!r}: {bad}; the step was skipped", parts)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if scaler is not None:
        scaler.scale(total).backward()
        scaler.unscale_(optimizer)
    else:
        total.backward()  # type: ignore[no-untyped-call]  # torch leaves Tensor.backward unannotated
    if cfg.grad_clip_norm is not None:
        norm = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip_norm, error_if_nonfinite=False)
    else:
        norm = _grad_norm(params)
    grad_norm = float(norm)
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        if not math.isfinite(grad_norm):
            optimizer.zero_grad(set_to_none=True)
            raise NonFiniteLoss(f"non-finite gradient norm at level {level!r}; the step was skipped", parts)
        optimizer.step()
    if scheduler is not None:
        scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return {
        "level": level,
        "loss": parts["total"],
        "losses": {k: v for k, v in parts.items() if k != "total"},
        "grad_norm": grad_norm,
        "lr": lrs,  # the rates this step used
    }
