"""The training library on real (tiny) open_clip models: config, freezing, optimizer, steps.

The tiny model is a ViT (width 64, 2 layers, 64 px, patch 16) with a 1-layer text transformer; one
test loads the default MiniLM + ViT spec to check the freezing of the Hugging Face text tower.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from PIL import Image, ImageDraw
from pydantic import ValidationError

from p2p.models.modeling import default_spec
from p2p.training.batch import FigureSample, HierBatch, PanelSample, RegionSample, collate
from p2p.training.config import TrainConfig, TrainConfigError, load_config
from p2p.training.hierarchy import HierarchicalCLIP, build_model
from p2p.training.optim import build_optimizer, build_scheduler, cosine_lambda, param_groups
from p2p.training.step import NonFiniteLoss, train_step

TINY = {
    "embed_dim": 32,
    "vision_cfg": {"image_size": 64, "patch_size": 16, "width": 64, "layers": 2, "head_width": 32},
    "text_cfg": {"context_length": 32, "vocab_size": 49408, "width": 64, "heads": 2, "layers": 1},
}
FAST_LR = {"shared": 1e-3, "bbox_head": 1e-3, "fine": 1e-3, "coarse": 1e-3}
COLOURS = {
    "red": (220, 30, 30),
    "green": (30, 200, 30),
    "blue": (30, 30, 220),
    "yellow": (230, 230, 20),
    "purple": (150, 30, 160),
    "orange": (250, 140, 0),
}


def tiny_cfg(**kw: Any) -> TrainConfig:
    base: dict[str, Any] = {"model": {"name": "tiny", "config": TINY}, "warmup_steps": 0, "lr": FAST_LR}
    return TrainConfig.model_validate({**base, **kw})


def samples(n_figures: int = 4) -> list[FigureSample]:
    """Figures of two 96x64 panels, each with two coloured boxes as regions."""
    names = list(COLOURS)
    out = []
    for f in range(n_figures):
        panels = []
        for p in range(2):
            image = Image.new("RGB", (96, 64), "white")
            draw = ImageDraw.Draw(image)
            regions = []
            for r in range(2):
                colour = names[(f * 4 + p * 2 + r) % len(names)]
                box = (8 + r * 44, 10 + p * 4, 44 + r * 44, 50)
                draw.rectangle(box, fill=COLOURS[colour])
                regions.append(RegionSample(image.crop(box), box, f"a {colour} box", f"{colour} square crop"))
            sub = f"panel {p}: " + " and ".join(rg.caption_text for rg in regions)
            panels.append(PanelSample(image, sub, f"panel with {len(regions)} boxes", regions))
        figure = Image.new("RGB", (200, 80), "white")
        for i, panel in enumerate(panels):
            figure.paste(panel.image, (i * 100, 8))
        out.append(FigureSample(figure, f"figure {f}. " + "; ".join(p.subcaption for p in panels), panels))
    return out


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """Tiny models run faster (and time more steadily) on one thread, above all on a loaded machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def batch() -> HierBatch:
    return collate(samples(4), image_size=64)


def snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


# --- config ------------------------------------------------------------------------------------


def test_unknown_config_keys_are_a_clear_error():
    with pytest.raises(
        TrainConfigError, match=r"unknown training config key\(s\): lrs.*known keys:.*lr\.shared"
    ):
        load_config({"lrs": 1e-4})
    with pytest.raises(TrainConfigError, match=r"lr\.sharde"):
        load_config({"lr": {"sharde": 1e-4}})
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        TrainConfig.model_validate({"objectives": {"mgl": True}})
    with pytest.raises(TrainConfigError, match="precision"):
        load_config(precision="fp8")
    with pytest.raises(TrainConfigError, match="no batches"):
        load_config(levels="panel", ratios={"panel": 0})


def test_config_defaults_and_alternating_cycle():
    cfg = TrainConfig()
    assert (cfg.lr.shared, cfg.lr.bbox_head, cfg.lr.fine, cfg.lr.coarse) == (1e-5, 5e-6, 1e-5, 1e-5)
    assert cfg.warmup_steps == 1000 and cfg.betas == (0.9, 0.95) and cfg.weight_decay == 0.05
    assert cfg.freeze_text and cfg.train_last_vision_blocks == 5
    cfg = load_config(ratios={"region": 2, "panel": 1, "figure": 1})
    assert [cfg.level_for_step(i) for i in range(6)] == [
        "region",
        "region",
        "panel",
        "figure",
        "region",
        "region",
    ]
    assert load_config(levels="panel").level_cycle() == ["panel"]
    assert load_config(schedule="mixed").level_for_step(3) == "mixed"


# --- batches ------------------------------------------------------------------------------------


def test_collate_keeps_the_tree(batch: HierBatch):
    assert batch.sizes == (4, 8, 16)
    assert batch.panel_images.shape == (8, 3, 64, 64) and batch.region_images.shape == (16, 3, 64, 64)
    assert batch.panel_figure.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert batch.region_panel.tolist() == [i // 2 for i in range(16)]
    assert batch.region_figure.tolist() == [i // 4 for i in range(16)]
    assert batch.panel_sizes[0].tolist() == [96.0, 64.0]
    assert batch.region_boxes[3].tolist() == [52.0, 14.0, 88.0, 50.0]
    texts = batch.region_texts(torch.Generator().manual_seed(0))
    kinds = {t in batch.region_captions for t in texts}
    assert kinds == {True, False}  # both kinds are drawn
    only = HierBatch(**{**batch.__dict__, "region_descriptions": [""] * 16})
    assert only.region_texts() == only.region_captions  # the other kind when one is missing


# --- model, freezing, optimizer ---------------------------------------------------------------------


def test_tiny_freezing_and_param_groups():
    model = build_model(tiny_cfg(train_last_vision_blocks=1))
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert not any(
        n.startswith("clip.transformer.") or n.startswith("clip.token_embedding") for n in trainable
    )
    assert "clip.text_projection" not in trainable
    assert all(n.startswith("clip.visual.transformer.resblocks.1.") for n in trainable if ".resblocks." in n)
    assert {"clip.visual.proj", "clip.visual.ln_post.weight", "clip.logit_scale"} <= trainable
    assert "clip.visual.conv1.weight" not in trainable and "clip.visual.positional_embedding" not in trainable
    assert {n for n in trainable if n.startswith("roi_head.")} == {
        "roi_head.norm.weight",
        "roi_head.norm.bias",
        "roi_head.proj.weight",
        "roi_head.proj.bias",
    }
    groups = {g["name"]: g for g in param_groups(model, TrainConfig())}
    assert set(groups) == {
        "shared",
        "shared/no_decay",
        "bbox_head",
        "bbox_head/no_decay",
        "fine/no_decay",
        "coarse/no_decay",
    }
    assert groups["bbox_head"]["lr"] == 5e-6 and groups["shared"]["lr"] == 1e-5
    assert groups["shared"]["weight_decay"] == 0.05 and groups["shared/no_decay"]["weight_decay"] == 0.0
    ids = {id(p): n for n, p in model.named_parameters()}
    names = {k: {ids[id(p)] for p in g["params"]} for k, g in groups.items()}
    assert names["fine/no_decay"] == {"logit_scales.region", "logit_scales.fine", "logit_scales.panel_region"}
    assert names["coarse/no_decay"] == {
        "clip.logit_scale",
        "logit_scales.figure",
        "logit_scales.figure_panel",
    }
    assert names["bbox_head"] == {"roi_head.proj.weight"}
    assert "clip.visual.proj" in names["shared"] and "clip.visual.ln_post.bias" in names["shared/no_decay"]
    assert all(p.ndim < 2 for k in names if k.endswith("no_decay") for p in groups[k]["params"])
    assert sorted(n for s in names.values() for n in s) == sorted(trainable)  # each exactly once
    everything = build_model(tiny_cfg(train_last_vision_blocks=-1, freeze_text=False))
    assert all(p.requires_grad for p in everything.parameters())


def test_more_trainable_blocks_than_the_tower_has_trains_every_block():
    # The paper's N=5 on a 2-block tower: every block trains, not only the last one.
    model = build_model(tiny_cfg(train_last_vision_blocks=5))
    blocks = model.clip.visual.transformer.resblocks  # type: ignore[union-attr]
    assert len(blocks) == 2
    assert all(p.requires_grad for block in blocks for p in block.parameters())
    assert not model.clip.visual.conv1.weight.requires_grad  # type: ignore[union-attr]


def test_new_texts_are_encoded_in_chunks_of_similar_length(monkeypatch: pytest.MonkeyPatch) -> None:
    from p2p.training import hierarchy

    monkeypatch.setattr(hierarchy, "TEXT_ENCODE_CHUNK", 3)
    model = build_model(TrainConfig(), default_spec())  # a Hugging Face tower that masks padding
    widths: list[int] = []
    model.clip.text.register_forward_pre_hook(  # type: ignore[union-attr]
        lambda _module, args: widths.append(int(args[0].shape[-1]))
    )
    caption = "Immunohistochemistry of the resected tumour with arrows at the invasive margin " * 3
    out = model.encode_texts(["cells", caption, "nuclei", "stroma"])
    # the three short texts are one chunk, the caption pays its own width alone
    assert len(widths) == 2 and widths[0] < 8 and widths[1] > 40, widths
    alone = model.clip.encode_text(model.tokenizer([caption]))  # type: ignore[operator]
    assert torch.allclose(out[1], alone[0], atol=1e-5)


def test_default_minilm_spec_freezes_the_text_tower():
    cfg = TrainConfig(train_last_vision_blocks=2)
    model = build_model(cfg, default_spec())
    clip: Any = model.clip
    assert clip.text.__class__.__name__ == "HFTextEncoder"
    assert not any(p.requires_grad for p in clip.text.parameters())
    blocks = clip.visual.transformer.resblocks
    assert len(blocks) == 4
    assert [all(p.requires_grad for p in b.parameters()) for b in blocks] == [False, False, True, True]
    model.train()
    assert not clip.text.training and clip.visual.training  # frozen tower: no dropout
    optimizer = build_optimizer(model, cfg)
    in_opt = {id(p) for g in optimizer.param_groups for p in g["params"]}
    assert not any(id(p) in in_opt for p in clip.text.parameters())


def test_cosine_schedule_with_warmup():
    f = cosine_lambda(10, 110, 0.0)
    assert f(0) == pytest.approx(0.1) and f(4) == pytest.approx(0.5) and f(9) == pytest.approx(1.0)
    assert f(10) == pytest.approx(1.0) and f(60) == pytest.approx(0.5) and f(110) == pytest.approx(0.0)
    assert f(500) == pytest.approx(0.0)
    assert cosine_lambda(0, 100, 0.1)(50) == pytest.approx(0.55)
    param = torch.nn.Parameter(torch.zeros(2, 2))
    opt = torch.optim.AdamW([{"params": [param], "lr": 2e-5}])
    sched = build_scheduler(opt, load_config(warmup_steps=4), total_steps=8)
    lrs = []
    for _ in range(8):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[:4] == pytest.approx([5e-6, 1e-5, 1.5e-5, 2e-5])
    assert lrs[6] == pytest.approx(1e-5)


# --- forward and steps -------------------------------------------------------------------------


def test_forward_levels_return_the_needed_embeddings(batch: HierBatch):
    cfg = tiny_cfg()
    model = build_model(cfg)
    region = model.forward_level(batch, "region", cfg)
    assert set(region) == {"region_image", "region_text", "panel_image", "panel_tokens", "roi"}
    assert region["roi"].shape == (16, 32) and region["panel_tokens"].shape == (8, 64, 4, 4)
    assert set(model.forward_level(batch, "figure", cfg)) == {
        "figure_image",
        "figure_text",
        "panel_image",
        "panel_text",
    }
    only_panel = tiny_cfg(levels="panel")
    assert set(model.forward_level(batch, "panel", only_panel)) == {"panel_image", "panel_text"}
    model.eval()
    with torch.no_grad():
        feats, _ = model.encode_images(batch.panel_images)
        torch.testing.assert_close(feats, model.clip.encode_image(batch.panel_images))  # type: ignore[operator]
    _, parts = model.loss(batch, "mixed", tiny_cfg(objectives={"mgll": True}))
    assert {"kl_figure_panel", "kl_panel_region", "figure_panel", "panel_region", "fine"} <= set(parts)


def test_train_steps_reduce_the_loss(batch: HierBatch):
    cfg = tiny_cfg(schedule="mixed")
    torch.manual_seed(0)
    model = build_model(cfg)
    optimizer = build_optimizer(model, cfg)
    scheduler = build_scheduler(optimizer, cfg, total_steps=100)
    results = [train_step(model, optimizer, scheduler, batch, "mixed", cfg) for _ in range(8)]
    losses = [r["loss"] for r in results]
    assert losses[-1] < 0.9 * losses[0], losses
    first = results[0]
    assert set(first["losses"]) == {"figure", "panel", "region", "fine", "figure_panel", "panel_region"}
    assert first["grad_norm"] > 0 and first["lr"]["bbox_head"] == pytest.approx(1e-3)
    alt = tiny_cfg(ratios={"region": 1, "panel": 1, "figure": 1})
    for step in range(3):
        level = alt.level_for_step(step)
        out = train_step(model, optimizer, None, batch, level, alt)
        assert out["level"] == level and math.isfinite(out["loss"])
    bf16 = tiny_cfg(precision="bf16", objectives={"mgll": True})
    assert math.isfinite(train_step(model, optimizer, None, batch, "mixed", bf16)["loss"])


def test_nan_loss_raises_and_leaves_parameters_unchanged(batch: HierBatch):
    cfg = tiny_cfg(schedule="mixed")
    model = build_model(cfg)
    optimizer = build_optimizer(model, cfg)
    train_step(model, optimizer, None, batch, "mixed", cfg)  # optimizer state exists
    before = snapshot(model)
    state_before = {k: v["step"].clone() for k, v in optimizer.state.items() if "step" in v}
    broken = HierBatch(**{**batch.__dict__, "figure_images": batch.figure_images.clone()})
    broken.figure_images[0] = float("nan")
    with pytest.raises(NonFiniteLoss, match=r"non-finite loss at level 'mixed'.*figure=nan") as info:
        train_step(model, optimizer, None, broken, "mixed", cfg)
    assert math.isnan(info.value.parts["figure"])
    after = snapshot(model)
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert {k: v["step"] for k, v in optimizer.state.items() if "step" in v} == state_before
    assert all(p.grad is None for p in model.parameters())


def test_model_requires_a_vit():
    with pytest.raises(TypeError, match="VisionTransformer"):
        HierarchicalCLIP(torch.nn.Linear(2, 2), tokenizer=None)


def test_a_frozen_text_tower_encodes_each_text_once_and_a_trainable_one_every_time() -> None:
    model = build_model(tiny_cfg())  # freeze_text defaults to True
    calls = {"n": 0}

    def count(*_: Any) -> None:
        calls["n"] += 1

    model.clip.token_embedding.register_forward_hook(count)  # type: ignore[union-attr]
    texts = ["a red box", "a blue box", "a red box"]
    first = model.encode_texts(texts)
    assert calls["n"] == 1  # the distinct new texts of a batch: one encode together
    alone = model.clip.encode_text(model.tokenizer(["a blue box"]))  # type: ignore[operator]
    assert torch.allclose(first[1], alone[0], atol=1e-5) and torch.equal(first[0], first[2])
    again = model.encode_texts(["a blue box", "a red box", "a green box"])
    assert calls["n"] == 3  # the 2nd was the direct encode above; only "a green box" was new
    assert torch.equal(again[0], first[1]) and torch.equal(again[1], first[0])
    assert not first.requires_grad
    # The cache travels with a checkpoint: a fresh model given it encodes nothing it already holds.
    state = model.text_cache_state()
    assert state is not None and state["texts"] == ["a blue box", "a red box", "a green box"]  # LRU order
    restored = build_model(tiny_cfg())
    restored.load_text_cache(state)
    restored.clip.token_embedding.register_forward_hook(count)  # type: ignore[union-attr]
    calls["n"] = 0
    assert torch.equal(restored.encode_texts(["a green box", "a red box"]), again[[2, 1]])
    assert calls["n"] == 0
    trainable = build_model(tiny_cfg(freeze_text=False))
    trainable.clip.token_embedding.register_forward_hook(count)  # type: ignore[union-attr]
    calls["n"] = 0
    out = trainable.encode_texts(texts)
    trainable.encode_texts(texts)
    assert calls["n"] == 2 and out.requires_grad  # one batched encode per call, with gradients
