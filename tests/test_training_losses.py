"""The training objectives and ROI pooling as pure tensor functions (no model)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from p2p.training import losses as L
from p2p.training.hierarchy import boxes_to_grid, roi_pool_tokens


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_clip_loss_is_log_b_for_random_and_zero_for_aligned():
    b = 8
    a, t = torch.randn(b, 512, generator=_gen(1)), torch.randn(b, 512, generator=_gen(2))
    assert float(L.clip_loss(a, t, 1.0)) == pytest.approx(math.log(b), abs=0.05)
    aligned = torch.eye(b, 16)
    assert float(L.clip_loss(aligned, aligned * 3.0, 100.0)) < 1e-3
    with pytest.raises(ValueError, match="paired rows"):
        L.clip_loss(a, t[:3], 1.0)


def test_clip_loss_is_symmetric_infonce():
    a, t = torch.randn(5, 8, generator=_gen(3)), torch.randn(5, 8, generator=_gen(4))
    logits = 7.0 * F.normalize(a) @ F.normalize(t).T
    target = torch.arange(5)
    expected = 0.5 * (F.cross_entropy(logits, target) + F.cross_entropy(logits.T, target))
    assert float(L.clip_loss(a, t, torch.tensor(7.0))) == pytest.approx(float(expected), rel=1e-5)


def test_empty_losses_are_zero_and_backpropagate():
    x = torch.zeros((0, 4), requires_grad=True)
    for loss in (L.clip_loss(x, x, 1.0), L.inter_level_loss(x, x, torch.zeros(0, dtype=torch.long), 1.0)):
        assert float(loss.detach()) == 0.0
        loss.backward()


def test_soft_targets_sum_to_one_and_mgll_equals_clip_with_one_positive():
    pos = L.hierarchy_positives(3, torch.tensor([0, 0, 2, 1]))
    assert pos.shape == (3, 7)
    assert pos.sum(dim=0).tolist() == [1] * 7  # every text has exactly one positive image
    assert pos[0].tolist() == [True, False, False, True, True, False, False]
    targets = L.soft_targets(pos)
    torch.testing.assert_close(targets.sum(dim=1), torch.ones(3))
    assert targets[0, 3].item() == pytest.approx(1 / 3)
    a, t = torch.randn(6, 16, generator=_gen(5)), torch.randn(6, 16, generator=_gen(6))
    one = torch.eye(6, dtype=torch.bool)
    torch.testing.assert_close(L.multi_positive_loss(a, t, one, 10.0), L.clip_loss(a, t, 10.0))


def test_mgll_spreads_the_target_over_all_positives():
    images = torch.eye(2, 4)
    texts = torch.stack([torch.eye(4)[0], torch.eye(4)[1], torch.eye(4)[0]])  # texts 0 and 2 describe image 0
    pos = L.hierarchy_positives(2, torch.tensor([0]))
    multi = L.multi_positive_loss(images, texts, pos, 50.0)
    logits = 50.0 * images @ texts.T
    i2t = -(L.soft_targets(pos) * F.log_softmax(logits, 1)).sum(1).mean()
    t2i = -(L.soft_targets(pos.T) * F.log_softmax(logits.T, 1)).sum(1).mean()
    assert float(multi) == pytest.approx(float(0.5 * (i2t + t2i)), rel=1e-5)
    assert float(i2t) == pytest.approx(math.log(2) / 2, abs=1e-3)  # image 0: half on each


def test_group_mean_and_inter_level_use_the_right_indices():
    x = torch.tensor([[1.0, 0.0], [0.0, 2.0], [3.0, 0.0], [0.0, 4.0]])
    means, counts = L.group_mean(x, torch.tensor([2, 0, 2, 0]), 4)
    torch.testing.assert_close(means, torch.tensor([[0.0, 3.0], [0.0, 0.0], [2.0, 0.0], [0.0, 0.0]]))
    assert counts.tolist() == [2, 0, 2, 0]
    parents = torch.randn(3, 8, generator=_gen(7))
    children = torch.randn(5, 8, generator=_gen(8))
    index = torch.tensor([2, 0, 2, 0, 0])  # parent 1 has no children and is left out
    got = L.inter_level_loss(parents, children, index, 5.0)
    n = F.normalize(children)
    expected = L.clip_loss(parents[[0, 2]], torch.stack([n[[1, 3, 4]].mean(0), n[[0, 2]].mean(0)]), 5.0)
    assert float(got) == pytest.approx(float(expected), rel=1e-5)
    # children that average exactly onto their parent: ~0
    basis = torch.eye(3, 8)
    kids = torch.cat([basis, basis])
    assert float(L.inter_level_loss(basis, kids, torch.tensor([0, 1, 2, 0, 1, 2]), 100.0)) < 1e-3


def test_granularity_kl_is_zero_when_children_agree_with_their_parent():
    parent = torch.randn(3, 5, generator=_gen(9))
    index = torch.tensor([0, 0, 1, 2])
    assert float(L.granularity_kl(parent, parent[index], index, temperature=2.0)) == pytest.approx(
        0.0, abs=1e-6
    )
    other = torch.randn(4, 5, generator=_gen(10)) * 4
    assert float(L.granularity_kl(parent, other, index)) > 0.01


def test_boxes_map_from_panel_pixels_to_the_patch_grid():
    sizes = torch.tensor([[128.0, 64.0], [64.0, 64.0]])  # non-square panel squashed to a 4x4 grid
    boxes = torch.tensor([[64.0, 16.0, 128.0, 48.0], [0.0, 0.0, 16.0, 32.0], [10.0, 10.0, 500.0, 5.0]])
    grid = boxes_to_grid(boxes, sizes, torch.tensor([0, 1, 1]), (4, 4))
    torch.testing.assert_close(grid[:2], torch.tensor([[2.0, 1.0, 4.0, 3.0], [0.0, 0.0, 1.0, 2.0]]))
    assert grid[2].tolist() == pytest.approx([0.625, 0.3125, 4.0, 0.625])  # sorted corners, clamped


def test_roi_pooling_picks_the_tokens_inside_the_box():
    # each of the 4x4 cells carries a one-hot channel: pooled mass shows which tokens were read
    onehot = torch.eye(16).T.reshape(16, 4, 4)
    token_map = torch.stack([onehot, onehot.flip(-1)])  # panel 1 is mirrored left-right
    sizes = torch.tensor([[128.0, 64.0], [128.0, 64.0]])
    box = torch.tensor([[64.0, 16.0, 128.0, 48.0], [64.0, 16.0, 128.0, 48.0]])  # cols 2-3, rows 1-2
    pooled = roi_pool_tokens(token_map, box, torch.tensor([0, 1]), sizes, output_size=2)
    assert pooled.shape == (2, 16)
    torch.testing.assert_close(pooled.sum(1), torch.ones(2))
    inside0 = [r * 4 + c for r in (1, 2) for c in (2, 3)]
    inside1 = [r * 4 + c for r in (1, 2) for c in (0, 1)]  # the same pixels read the mirrored cells
    assert pooled[0, inside0].sum() > 0.75 and pooled[1, inside1].sum() > 0.75
    assert set(pooled[0].topk(4).indices.tolist()) == set(inside0)
    # a hot region: a box on it pools ~1, a box elsewhere ~0
    hot = torch.zeros(1, 3, 4, 4)
    hot[0, :, 1:3, 2:4] = 1.0
    two = roi_pool_tokens(
        hot,
        torch.tensor([[64.0, 16.0, 128.0, 48.0], [0.0, 32.0, 32.0, 64.0]]),
        torch.tensor([0, 0]),
        sizes[:1],
        output_size=2,
    )
    assert two[0].min() > 0.75 and two[1].max() < 0.1
