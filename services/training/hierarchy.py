"""The hierarchical CLIP wrapper: one open_clip model trained at figure, panel and region level.

:class:`HierarchicalCLIP` holds the open_clip model (``clip``), its tokenizer, the ROI ("bbox")
head and one learnable logit scale per objective (the panel level uses the open_clip model's own
``logit_scale``, so an exported checkpoint carries a meaningful one).

Which losses a step computes (``level`` is one of :data:`STEP_LEVELS`):

``region``  region CLIP (crop <-> sampled region text) + fine-grained alignment (ROI-pooled panel
            tokens <-> region crop embedding and <-> region text);
``panel``   panel CLIP + P<->R inter-level (panel vs mean of its regions, image and text side);
``figure``  figure CLIP + M<->P inter-level (figure vs mean of its panels);
``mixed``   all of the above for the active levels, every tower run once;
``flat``    baseline: one plain CLIP loss over all image-text pairs of the batch.

Inter-level losses need the child level to be active (``levels="all"``). With MGLL on, the panel and
figure CLIP losses become multi-positive (the children's texts are positives of the parent image)
and a cross-granularity KL asks children to score the parent-level texts like their parent does.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Any, Literal, cast

import torch
from torch import nn
from torchvision.ops import roi_align

from p2p.models.modeling import ModelSpec, load_model, masked_pad_id, trim_padding
from p2p.shared.storage import ObjectStore
from p2p.training import losses as L
from p2p.training.batch import HierBatch
from p2p.training.config import TrainConfig
from p2p.training.optim import apply_freezing

StepLevel = Literal["figure", "panel", "region", "mixed", "flat"]
STEP_LEVELS: tuple[str, ...] = ("figure", "panel", "region", "mixed", "flat")
SCALE_NAMES = ("figure", "region", "fine", "figure_panel", "panel_region")  # "panel": clip.logit_scale
CHILD = {"figure": "panel", "panel": "region"}
INTER_SCALE = {"figure": "figure_panel", "panel": "panel_region"}
TEXT_ENCODE_CHUNK = 32  # new texts encoded together by the frozen tower
TEXT_CACHE_MAX = 50_000  # frozen-tower text embeddings kept (384 floats each for MiniLM: ~75 MB)


def boxes_to_grid(
    boxes_px: torch.Tensor, panel_sizes: torch.Tensor, region_panel: torch.Tensor, grid_hw: tuple[int, int]
) -> torch.Tensor:
    """(x0, y0, x1, y1) in panel pixels -> the same box in patch-grid units (cell i spans [i, i+1))."""
    sizes = panel_sizes.to(boxes_px)[region_panel.long()]  # (R, 2) width, height
    gh, gw = grid_hw
    scale = torch.stack([gw / sizes[:, 0], gh / sizes[:, 1], gw / sizes[:, 0], gh / sizes[:, 1]], dim=1)
    grid = boxes_px.float() * scale
    x0, x1 = torch.minimum(grid[:, 0], grid[:, 2]), torch.maximum(grid[:, 0], grid[:, 2])
    y0, y1 = torch.minimum(grid[:, 1], grid[:, 3]), torch.maximum(grid[:, 1], grid[:, 3])
    return torch.stack([x0.clamp(0, gw), y0.clamp(0, gh), x1.clamp(0, gw), y1.clamp(0, gh)], dim=1)


def roi_pool_tokens(
    token_map: torch.Tensor,
    boxes_px: torch.Tensor,
    region_panel: torch.Tensor,
    panel_sizes: torch.Tensor,
    output_size: int = 2,
) -> torch.Tensor:
    """Average of ``roi_align`` over each region's box on its panel's (P, C, Gh, Gw) token map: (R, C)."""
    if boxes_px.shape[0] == 0:
        return token_map.new_zeros((0, token_map.shape[1]))
    grid = boxes_to_grid(boxes_px, panel_sizes, region_panel, (token_map.shape[2], token_map.shape[3]))
    rois = torch.cat([region_panel.to(grid).unsqueeze(1), grid], dim=1)
    pooled = roi_align(
        token_map.float(), rois, output_size=output_size, spatial_scale=1.0, sampling_ratio=2, aligned=True
    )
    return cast(torch.Tensor, pooled.mean(dim=(2, 3)))  # roi_align is untyped


class RoiHead(nn.Module):
    """The box head: ROI-pooled patch tokens (width) -> the joint embedding space (dim).

    Initialised from the vision projection so that, at the start, a box embedding is the projection
    of its pooled tokens, like the image embedding is the projection of the pooled class token.
    """

    def __init__(self, width: int, dim: int, output_size: int = 2, init_proj: torch.Tensor | None = None):
        super().__init__()
        self.output_size = output_size
        self.norm = nn.LayerNorm(width)
        self.proj = nn.Linear(width, dim)
        if init_proj is not None and tuple(init_proj.shape) == (width, dim):
            with torch.no_grad():
                self.proj.weight.copy_(init_proj.detach().T)
                self.proj.bias.zero_()

    def forward(
        self,
        token_map: torch.Tensor,
        boxes_px: torch.Tensor,
        region_panel: torch.Tensor,
        panel_sizes: torch.Tensor,
    ) -> torch.Tensor:
        pooled = roi_pool_tokens(token_map, boxes_px, region_panel, panel_sizes, self.output_size)
        return cast(torch.Tensor, self.proj(self.norm(pooled.to(self.proj.weight.dtype))))


class HierarchicalCLIP(nn.Module):
    def __init__(
        self,
        clip: nn.Module,
        tokenizer: Any,
        *,
        roi_output_size: int = 2,
        init_logit_scale: float = math.log(1 / 0.07),
        max_logit_scale: float = 100.0,
        seed: int = 0,
    ) -> None:
        super().__init__()
        visual = getattr(clip, "visual", None)
        if (
            visual is None
            or not hasattr(visual, "forward_intermediates")
            or not hasattr(visual, "transformer")
        ):
            raise TypeError("HierarchicalCLIP needs an open_clip model with a VisionTransformer image tower")
        self.clip = clip
        self.tokenizer = tokenizer
        width = int(visual.transformer.width)
        self.dim = int(visual.output_dim)
        self.roi_head = RoiHead(width, self.dim, roi_output_size, init_proj=getattr(visual, "proj", None))
        self.logit_scales = nn.ParameterDict(
            {name: nn.Parameter(torch.tensor(float(init_logit_scale))) for name in SCALE_NAMES}
        )
        self.max_log_scale = math.log(max_logit_scale)
        self.text_frozen = False
        self._text_cache: OrderedDict[str, torch.Tensor] = OrderedDict()
        self.generator = torch.Generator().manual_seed(seed)

    # ---------------------------------------------------------------------------------- towers

    @property
    def image_size(self) -> int:
        size = cast(Any, self.clip).visual.image_size
        return int(size[0] if isinstance(size, tuple | list) else size)

    def text_modules(self) -> list[nn.Module]:
        clip = cast(Any, self.clip)
        if hasattr(clip, "text"):
            return [clip.text]
        return [
            m for m in (clip.transformer, clip.token_embedding, clip.ln_final) if isinstance(m, nn.Module)
        ]

    def train(self, mode: bool = True) -> HierarchicalCLIP:
        super().train(mode)
        if self.text_frozen:  # a frozen tower stays deterministic (no dropout)
            for module in self.text_modules():
                module.eval()
        return self

    def logit_scale(self, name: str) -> torch.Tensor:
        raw = cast(torch.Tensor, self.clip.logit_scale) if name == "panel" else self.logit_scales[name]
        return raw.float().clamp(max=self.max_log_scale).exp().reshape(())

    def encode_images(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Image embeddings (N, D) and the final patch-token map after ln_post (N, width, Gh, Gw)."""
        out = cast(Any, self.clip).visual.forward_intermediates(
            images, indices=1, normalize_intermediates=True, output_fmt="NCHW"
        )
        return out["image_features"], out["image_intermediates"][-1]

    def encode_texts(self, texts: list[str]) -> torch.Tensor:
        device = self.logit_scales["figure"].device
        clip = cast(Any, self.clip)
        frozen = not any(p.requires_grad for m in self.text_modules() for p in m.parameters())
        if not frozen:
            return cast(torch.Tensor, clip.encode_text(trim_padding(clip, self.tokenizer(texts).to(device))))
        # A frozen tower gives every text the same embedding in every epoch: each text is encoded
        # once, together with the other texts its batch brings for the first time, and reused from
        # then on. Which texts are new in a batch follows from the data order and the cache alone,
        # and the cache is part of the checkpoint (``text_cache_state``), so a resumed run encodes
        # every later text in the same company as the uninterrupted run and computes the same numbers.
        with torch.no_grad():
            new: list[str] = []
            for text in dict.fromkeys(texts):
                if text in self._text_cache:
                    self._text_cache.move_to_end(text)
                else:
                    new.append(text)
            if new:
                tokens = self.tokenizer(new).to(device)
                # Short region texts padded to a long caption's length would cost the caption's
                # time each: encode the new texts in chunks of similar length.
                pad_id = masked_pad_id(clip)
                lengths = (tokens != pad_id).sum(dim=-1) if pad_id is not None else torch.zeros(len(new))
                order = torch.argsort(lengths, stable=True)
                for chunk in torch.split(order, TEXT_ENCODE_CHUNK):
                    vectors = clip.encode_text(trim_padding(clip, tokens[chunk]))
                    for index, vector in zip(chunk.tolist(), vectors, strict=True):
                        self._text_cache[new[index]] = vector.clone()
                while len(self._text_cache) > max(TEXT_CACHE_MAX, len(new)):
                    self._text_cache.popitem(last=False)
            return torch.stack([self._text_cache[t] for t in texts])

    def text_cache_state(self) -> dict[str, Any] | None:
        """The frozen-tower text cache in its LRU order, for a checkpoint (None when empty)."""
        if not self._text_cache:
            return None
        return {"texts": list(self._text_cache), "embeddings": torch.stack(list(self._text_cache.values()))}

    def load_text_cache(self, state: dict[str, Any] | None) -> None:
        self._text_cache.clear()
        if state:
            device = self.logit_scales["figure"].device
            for text, vector in zip(state["texts"], state["embeddings"].to(device), strict=True):
                self._text_cache[text] = vector

    # ------------------------------------------------------------------------------- embeddings

    def _needs(self, level: str, cfg: TrainConfig) -> set[str]:
        active = set(cfg.active_levels)
        obj = cfg.objectives
        if level == "flat":
            return {f"{lv}_{kind}" for lv in active for kind in ("image", "text")}
        if level == "mixed":
            return set().union(*(self._needs(lv, cfg) for lv in cfg.active_levels))
        needs = {f"{level}_image", f"{level}_text"}
        if level == "region" and obj.fine:
            needs |= {"panel_tokens", "roi"}
        child = CHILD.get(level)
        if child in active and (obj.inter_level or obj.mgll):
            needs |= {f"{child}_image", f"{child}_text"}
        return needs

    def forward_level(
        self, batch: HierBatch, level: str, cfg: TrainConfig | None = None
    ) -> dict[str, torch.Tensor]:
        """The embeddings the losses of ``level`` need: ``{figure,panel,region}_{image,text}``, ``roi``."""
        if level not in STEP_LEVELS:
            raise ValueError(f"unknown level {level!r}; expected one of {', '.join(STEP_LEVELS)}")
        cfg = cfg or TrainConfig()
        needs = self._needs(level, cfg)
        if "panel_tokens" in needs:
            needs.add("panel_image")
        images = {"figure": batch.figure_images, "panel": batch.panel_images, "region": batch.region_images}
        texts = {"figure": batch.figure_texts, "panel": batch.panel_texts}
        if "region_text" in needs:
            texts["region"] = batch.region_texts(self.generator)
        out: dict[str, torch.Tensor] = {}
        img_levels = [
            lv for lv in ("figure", "panel", "region") if f"{lv}_image" in needs and len(images[lv])
        ]
        if img_levels:
            stacked = torch.cat([images[lv] for lv in img_levels])
            if level == "flat":
                feats, tokens = cast(Any, self.clip).encode_image(stacked), None
            else:
                feats, tokens = self.encode_images(stacked)
            start = 0
            for lv in img_levels:
                n = len(images[lv])
                out[f"{lv}_image"] = feats[start : start + n]
                if lv == "panel" and tokens is not None and "panel_tokens" in needs:
                    out["panel_tokens"] = tokens[start : start + n]
                start += n
        txt_levels = [lv for lv in ("figure", "panel", "region") if f"{lv}_text" in needs and texts.get(lv)]
        if txt_levels:
            feats = self.encode_texts([t for lv in txt_levels for t in texts[lv]])
            start = 0
            for lv in txt_levels:
                out[f"{lv}_text"] = feats[start : start + len(texts[lv])]
                start += len(texts[lv])
        if "roi" in needs and "panel_tokens" in out and len(batch.region_boxes):
            out["roi"] = self.roi_head(
                out["panel_tokens"], batch.region_boxes, batch.region_panel, batch.panel_sizes
            )
        return out

    # ----------------------------------------------------------------------------------- losses

    def _level_losses(
        self, emb: dict[str, torch.Tensor], batch: HierBatch, level: str, cfg: TrainConfig
    ) -> dict[str, tuple[float, torch.Tensor]]:
        w, obj = cfg.weights, cfg.objectives
        parts: dict[str, tuple[float, torch.Tensor]] = {}
        img, txt = emb.get(f"{level}_image"), emb.get(f"{level}_text")
        if img is None or txt is None:
            return parts
        scale = self.logit_scale(level)
        child = CHILD.get(level)
        index = {"panel": batch.panel_figure, "region": batch.region_panel}.get(child or "")
        child_img = emb.get(f"{child}_image") if child else None
        child_txt = emb.get(f"{child}_text") if child else None
        if obj.mgll and child_txt is not None and index is not None:
            positives = L.hierarchy_positives(img.shape[0], index.to(img.device))
            parts[level] = (
                w.intra,
                L.multi_positive_loss(img, torch.cat([txt, child_txt]), positives, scale),
            )
        else:
            parts[level] = (w.intra, L.clip_loss(img, txt, scale))
        if obj.mgll and child_img is not None and index is not None:
            parent_logits = L.similarity(img, txt, scale)
            child_logits = L.similarity(child_img, txt, scale)
            kl = L.granularity_kl(parent_logits, child_logits, index, obj.kl_temperature)
            parts[f"kl_{level}_{child}"] = (w.kl, kl)
        if obj.inter_level and child_img is not None and child_txt is not None and index is not None:
            s = self.logit_scale(INTER_SCALE[level])
            inter = 0.5 * (
                L.inter_level_loss(img, child_img, index, s) + L.inter_level_loss(txt, child_txt, index, s)
            )
            parts[INTER_SCALE[level]] = (w.inter, inter)
        if level == "region" and "roi" in emb:
            s = self.logit_scale("fine")
            fine = 0.5 * (L.clip_loss(emb["roi"], img, s) + L.clip_loss(emb["roi"], txt, s))
            parts["fine"] = (w.fine, fine)
        return parts

    def loss(self, batch: HierBatch, level: str, cfg: TrainConfig) -> tuple[torch.Tensor, dict[str, float]]:
        """Weighted total loss of a step at ``level`` and its unweighted parts (plus ``total``)."""
        emb = self.forward_level(batch, level, cfg)
        parts: dict[str, tuple[float, torch.Tensor]] = {}
        if level == "flat":
            levels = [
                lv for lv in ("figure", "panel", "region") if f"{lv}_image" in emb and f"{lv}_text" in emb
            ]
            if levels:
                imgs = torch.cat([emb[f"{lv}_image"] for lv in levels])
                txts = torch.cat([emb[f"{lv}_text"] for lv in levels])
                parts["flat"] = (1.0, L.clip_loss(imgs, txts, self.logit_scale("panel")))
        else:
            for lv in cfg.active_levels if level == "mixed" else (level,):
                parts.update(self._level_losses(emb, batch, lv, cfg))
        if not parts:
            raise ValueError(f"batch {batch.sizes} has nothing to train at level {level!r}")
        first = next(iter(parts.values()))[1]
        total = sum((weight * value for weight, value in parts.values()), start=first.new_zeros(()))
        floats = {name: float(value.detach()) for name, (_, value) in parts.items()}
        floats["total"] = float(total.detach())
        return total, floats


def build_model(
    cfg: TrainConfig, spec: ModelSpec | None = None, *, store: ObjectStore | None = None
) -> HierarchicalCLIP:
    """Load the open_clip model of ``spec`` (default: the config's; ``s3:`` weights from ``store``),
    wrap it and apply the freezing."""

    torch.manual_seed(cfg.seed)
    embedding = load_model(spec or cfg.model.to_spec(), store=store)
    model = HierarchicalCLIP(
        embedding.model,
        embedding.tokenizer,
        roi_output_size=cfg.roi_output_size,
        init_logit_scale=cfg.init_logit_scale,
        max_logit_scale=cfg.max_logit_scale,
        seed=cfg.seed,
    )
    apply_freezing(model, cfg)
    return model.to(cfg.device).train()


__all__ = [
    "STEP_LEVELS",
    "HierarchicalCLIP",
    "RoiHead",
    "boxes_to_grid",
    "build_model",
    "roi_pool_tokens",
]
