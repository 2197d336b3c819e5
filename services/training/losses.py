"""The training objectives as pure functions on tensors.

Embeddings are L2-normalised inside every loss; ``logit_scale`` is the multiplier applied to the
cosine similarities (``exp`` of the learnable log-scale, already clamped by the caller).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _zero(*like: torch.Tensor) -> torch.Tensor:
    """A zero that stays connected to the graph of ``like`` (so ``backward`` never fails)."""
    out = torch.zeros((), dtype=torch.float32, device=like[0].device)
    for t in like:
        out = out + t.float().sum() * 0.0
    return out


def similarity(a: torch.Tensor, b: torch.Tensor, logit_scale: torch.Tensor | float) -> torch.Tensor:
    """``logit_scale * cos(a_i, b_j)`` as an (len(a), len(b)) float32 matrix."""
    a = F.normalize(a.float(), dim=-1)
    b = F.normalize(b.float(), dim=-1)
    return logit_scale * (a @ b.T)


def clip_loss(a: torch.Tensor, b: torch.Tensor, logit_scale: torch.Tensor | float) -> torch.Tensor:
    """Symmetric InfoNCE between paired rows of ``a`` and ``b`` (row i of a matches row i of b)."""
    if a.shape[0] != b.shape[0]:
        raise ValueError(f"clip_loss needs paired rows, got {a.shape[0]} and {b.shape[0]}")
    if a.shape[0] == 0:
        return _zero(a, b)
    logits = similarity(a, b, logit_scale)
    target = torch.arange(a.shape[0], device=a.device)
    return 0.5 * (F.cross_entropy(logits, target) + F.cross_entropy(logits.T, target))


def soft_targets(positives: torch.Tensor) -> torch.Tensor:
    """Each row of a boolean positive mask spread uniformly over its positives (rows sum to 1).

    Rows without any positive stay all-zero (they contribute nothing to the loss).
    """
    pos = positives.float()
    return pos / pos.sum(dim=1, keepdim=True).clamp_min(1.0)


def _soft_ce(logits: torch.Tensor, positives: torch.Tensor) -> torch.Tensor:
    keep = positives.any(dim=1)
    if not bool(keep.any()):
        return _zero(logits)
    targets = soft_targets(positives[keep])
    return -(targets * F.log_softmax(logits[keep], dim=1)).sum(dim=1).mean()


def multi_positive_loss(
    images: torch.Tensor, texts: torch.Tensor, positives: torch.Tensor, logit_scale: torch.Tensor | float
) -> torch.Tensor:
    """MGLL-style soft-label contrastive loss: symmetric cross-entropy against soft targets.

    ``positives[i, j]`` says text j is a positive of image i (e.g. a panel's sub-caption is a positive
    of its figure). With one positive per row and column (the identity) this equals :func:`clip_loss`.
    """
    if positives.shape != (images.shape[0], texts.shape[0]):
        raise ValueError(
            f"positives is {tuple(positives.shape)}, expected ({images.shape[0]}, {texts.shape[0]})"
        )
    if images.shape[0] == 0 or texts.shape[0] == 0:
        return _zero(images, texts)
    logits = similarity(images, texts, logit_scale)
    positives = positives.to(device=logits.device, dtype=torch.bool)
    return 0.5 * (_soft_ce(logits, positives) + _soft_ce(logits.T, positives.T))


def hierarchy_positives(n_parents: int, child_parent: torch.Tensor) -> torch.Tensor:
    """Positives of parent images over [parent texts, child texts]: own text + its children's texts.

    Shape (n_parents, n_parents + n_children); every text column has exactly one positive image.
    """
    own = torch.eye(n_parents, dtype=torch.bool, device=child_parent.device)
    children = (
        F.one_hot(child_parent.long(), n_parents).bool().T
        if child_parent.numel()
        else (torch.zeros((n_parents, 0), dtype=torch.bool, device=child_parent.device))
    )
    return torch.cat([own, children], dim=1)


def group_mean(x: torch.Tensor, index: torch.Tensor, n_groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean of the rows of ``x`` per group ``index[i]``: (means (n_groups, D), counts (n_groups,)).

    Groups without members get a zero mean and count 0.
    """
    index = index.long().to(x.device)
    sums = torch.zeros((n_groups, x.shape[1]), dtype=x.dtype, device=x.device).index_add(0, index, x)
    counts = torch.bincount(index, minlength=n_groups)[:n_groups]
    return sums / counts.clamp_min(1).unsqueeze(1).to(x.dtype), counts


def inter_level_loss(
    parents: torch.Tensor,
    children: torch.Tensor,
    child_parent: torch.Tensor,
    logit_scale: torch.Tensor | float,
) -> torch.Tensor:
    """Contrastive loss between each parent embedding and the mean of its (normalised) children.

    Parents without children are left out; the other parents of the batch are the negatives.
    """
    if parents.shape[0] == 0 or children.shape[0] == 0:
        return _zero(parents, children)
    means, counts = group_mean(F.normalize(children.float(), dim=-1), child_parent, parents.shape[0])
    keep = counts > 0
    return clip_loss(parents[keep], means[keep], logit_scale)


def granularity_kl(
    parent_logits: torch.Tensor,
    child_logits: torch.Tensor,
    child_parent: torch.Tensor,
    temperature: float = 1.0,
) -> torch.Tensor:
    """Smooth KL across granularities: KL(p_parent || mean of its children's p), averaged over parents.

    Both logit matrices score the same candidate set (e.g. all figure captions of the batch); each
    child should predict what its parent predicts. ``temperature`` > 1 softens both distributions.
    """
    if parent_logits.shape[0] == 0 or child_logits.shape[0] == 0:
        return _zero(parent_logits, child_logits)
    p = F.softmax(parent_logits.float() / temperature, dim=1)
    q = F.softmax(child_logits.float() / temperature, dim=1)
    q_mean, counts = group_mean(q, child_parent, parent_logits.shape[0])
    keep = counts > 0
    if not bool(keep.any()):
        return _zero(parent_logits, child_logits)
    p, q_mean = p[keep], q_mean[keep]
    kl = (p * (torch.log(p.clamp_min(1e-12)) - torch.log(q_mean.clamp_min(1e-12)))).sum(dim=1)
    return kl.mean()
