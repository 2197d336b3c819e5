"""Freezing, parameter groups, AdamW and the cosine-with-warmup schedule.

Parameter groups (each split into a decay and a no-decay half):

``shared``     the trainable weights of the open_clip encoders: the last N vision blocks, ``ln_post``
               and ``proj`` (the whole vision tower with ``train_last_vision_blocks=-1``) and the text
               tower when it is not frozen;
``bbox_head``  the ROI head (``roi_head.*``) that projects ROI-pooled patch tokens;
``fine``       the logit scales of the fine levels: region CLIP, ROI alignment, panel<->region;
``coarse``     the logit scales of the coarse levels: figure CLIP, panel CLIP (the open_clip model's
               ``logit_scale``/``logit_bias``), figure<->panel.

No weight decay on biases, norms and other 1-d tensors, logit scales/biases and the positional and
class embeddings; frozen parameters are left out of the optimizer.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
from torch.optim.lr_scheduler import LambdaLR

from p2p.training.config import TrainConfig

if TYPE_CHECKING:  # pragma: no cover
    from p2p.training.hierarchy import HierarchicalCLIP

GROUPS = ("shared", "bbox_head", "fine", "coarse")
FINE_PARAMS = {"logit_scales.region", "logit_scales.fine", "logit_scales.panel_region"}
COARSE_PARAMS = {"clip.logit_scale", "clip.logit_bias", "logit_scales.figure", "logit_scales.figure_panel"}
NO_DECAY_NAMES = ("positional_embedding", "class_embedding", "logit_scale", "logit_bias")


def apply_freezing(model: HierarchicalCLIP, cfg: TrainConfig) -> None:
    """Text tower frozen (``freeze_text``); vision: only the last N blocks + ln_post + proj train."""
    clip: Any = model.clip
    for name, param in clip.named_parameters():
        if not name.startswith("visual.") and name not in ("logit_scale", "logit_bias"):
            param.requires_grad = not cfg.freeze_text
    model.text_frozen = cfg.freeze_text
    visual = clip.visual
    n = cfg.train_last_vision_blocks
    for param in visual.parameters():
        param.requires_grad = n < 0
    if n >= 0:
        blocks = list(visual.transformer.resblocks)
        # n larger than the tower means all of it; a plain negative slice start would keep only the tail.
        trainable: list[Any] = blocks[max(0, len(blocks) - n) :] if n else []
        trainable += [visual.ln_post, visual.proj]
        for item in trainable:
            params = [item] if isinstance(item, torch.nn.Parameter) else list(item.parameters())
            for param in params:
                param.requires_grad = True
    for param in [*model.roi_head.parameters(), *model.logit_scales.parameters()]:
        param.requires_grad = True
    for name in ("logit_scale", "logit_bias"):
        param = getattr(clip, name, None)
        if isinstance(param, torch.nn.Parameter):
            param.requires_grad = True
    model.train(model.training)


def group_of(name: str) -> str:
    if name.startswith("roi_head."):
        return "bbox_head"
    if name in FINE_PARAMS:
        return "fine"
    if name in COARSE_PARAMS:
        return "coarse"
    return "shared"


def no_decay(name: str, param: torch.Tensor) -> bool:
    return param.ndim < 2 or any(name.endswith(key) for key in NO_DECAY_NAMES)


def param_groups(model: torch.nn.Module, cfg: TrainConfig) -> list[dict[str, Any]]:
    """AdamW groups named ``<group>`` / ``<group>/no_decay`` with their learning rates."""
    buckets: dict[tuple[str, bool], list[torch.nn.Parameter]] = {}
    for name, param in model.named_parameters():
        if param.requires_grad:
            buckets.setdefault((group_of(name), no_decay(name, param)), []).append(param)
    groups = []
    for group in GROUPS:
        for nd in (False, True):
            params = buckets.get((group, nd))
            if params:
                groups.append(
                    {
                        "name": f"{group}/no_decay" if nd else group,
                        "params": params,
                        "lr": float(getattr(cfg.lr, group)),
                        "weight_decay": 0.0 if nd else cfg.weight_decay,
                    }
                )
    return groups


def build_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    groups = param_groups(model, cfg)
    if not groups:
        raise ValueError("no trainable parameters: everything is frozen")
    return torch.optim.AdamW(groups, betas=cfg.betas, eps=cfg.eps)


def cosine_lambda(warmup_steps: int, total_steps: int, min_ratio: float = 0.0) -> Any:
    """LR multiplier: linear warmup (step+1)/warmup, then cosine from 1 down to ``min_ratio``."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        span = max(total_steps - warmup_steps, 1)
        progress = min((step - warmup_steps) / span, 1.0)
        return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: TrainConfig, total_steps: int) -> LambdaLR:
    """Cosine with linear warmup over ``total_steps`` (``cfg.max_steps`` when set), every group alike."""
    total = cfg.max_steps or total_steps
    return LambdaLR(optimizer, cosine_lambda(cfg.warmup_steps, total, cfg.min_lr_ratio))
