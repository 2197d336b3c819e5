"""Training configuration: every knob of the hierarchical (figure -> panel -> region) CLIP training.

:class:`TrainConfig` is a strict pydantic model (``extra="forbid"`` at every level), so a misspelt
key is an error instead of a silently ignored setting; :func:`load_config` turns that error into a
:class:`TrainConfigError` naming the unknown keys and the known ones.

Ablation switches: ``levels`` picks which granularities train ("panel": panel CLIP only, "region":
region CLIP + fine-grained ROI alignment only, "all": figure, panel and region levels plus the
inter-level losses); ``objectives`` turns the fine-grained, inter-level and MGLL objectives on or
off; ``schedule`` is "alternating" (one level per step, cycling R -> P -> M by ``ratios``) or "mixed"
(every active level in every step).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from p2p.models.modeling import ModelSpec, default_config
from p2p.shared.schemas import StrictModel

Level = Literal["figure", "panel", "region"]
LEVEL_ORDER: tuple[Level, ...] = ("region", "panel", "figure")  # the alternating cycle R -> P -> M


class TrainConfigError(ValueError):
    """A training configuration is invalid (the message names the offending keys)."""


class _Strict(StrictModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelSection(_Strict):
    """The open_clip model to start from (see ``p2p.models.modeling.ModelSpec``)."""

    name: str = "p2p-minilm-vit"
    architecture: str = "custom"
    config: dict[str, Any] | None = None  # None with architecture "custom": the default MiniLM + ViT
    source: str = "random"

    def to_spec(self) -> ModelSpec:
        config = self.config
        if config is None and self.architecture == "custom":
            config = default_config()
        return ModelSpec(name=self.name, architecture=self.architecture, config=config, source=self.source)


class LevelRatios(_Strict):
    """Batches of each level per cycle of the alternating schedule (0 skips a level)."""

    region: int = Field(default=1, ge=0)
    panel: int = Field(default=1, ge=0)
    figure: int = Field(default=1, ge=0)


class Objectives(_Strict):
    fine: bool = True  # ROI-pooled panel tokens <-> region crop embedding and region text
    inter_level: bool = True  # M<->P and P<->R (needs levels="all")
    mgll: bool = False  # multi-positive soft-label intra-level loss + cross-granularity KL
    kl_temperature: float = Field(default=2.0, gt=0)  # softens both distributions of the MGLL KL


class LossWeights(_Strict):
    intra: float = Field(default=1.0, ge=0)
    fine: float = Field(default=1.0, ge=0)
    inter: float = Field(default=1.0, ge=0)
    kl: float = Field(default=0.1, ge=0)


class BatchSizes(_Strict):
    """Items per batch of each level (figures, panels, regions); ``figure`` also sizes mixed batches."""

    figure: int = Field(default=16, ge=1)
    panel: int = Field(default=64, ge=1)
    region: int = Field(default=128, ge=1)


class LearningRates(_Strict):
    """Per parameter group (see ``optim.param_groups`` for which parameters each group holds)."""

    shared: float = Field(
        default=1e-5, ge=0
    )  # trainable encoder weights (vision blocks, ln_post, proj, text)
    bbox_head: float = Field(default=5e-6, ge=0)  # the ROI head projecting pooled patch tokens
    fine: float = Field(default=1e-5, ge=0)  # region / ROI / panel<->region logit scales
    coarse: float = Field(default=1e-5, ge=0)  # figure / panel / figure<->panel logit scales


class TrainConfig(_Strict):
    model: ModelSection = ModelSection()
    levels: Literal["panel", "region", "all"] = "all"
    schedule: Literal["alternating", "mixed"] = "alternating"
    ratios: LevelRatios = LevelRatios()
    objectives: Objectives = Objectives()
    weights: LossWeights = LossWeights()
    seed: int = 0
    batch_sizes: BatchSizes = BatchSizes()
    epochs: int = Field(default=1, ge=1)
    max_steps: int | None = Field(default=None, ge=1)  # caps the run (and sets the cosine horizon) when given
    warmup_steps: int = Field(default=1000, ge=0)
    min_lr_ratio: float = Field(default=0.0, ge=0, le=1)  # cosine floor as a fraction of each group's lr
    lr: LearningRates = LearningRates()
    weight_decay: float = Field(default=0.05, ge=0)
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = Field(default=1e-8, gt=0)
    grad_clip_norm: float | None = Field(default=1.0, gt=0)  # None: no clipping (the norm is still reported)
    precision: Literal["fp32", "bf16"] = "fp32"
    freeze_text: bool = True
    train_last_vision_blocks: int = Field(default=5, ge=-1)  # -1: the whole vision tower
    roi_output_size: int = Field(default=2, ge=1)
    init_logit_scale: float = math.log(1 / 0.07)
    max_logit_scale: float = Field(default=100.0, gt=0)
    device: str = "cpu"

    @model_validator(mode="after")
    def _check(self) -> TrainConfig:
        if not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"betas must lie in [0, 1): {self.betas}")
        if self.schedule == "alternating" and not any(
            getattr(self.ratios, level) > 0 for level in self.active_levels
        ):
            raise ValueError(f"ratios give no batches to the active levels {list(self.active_levels)}")
        return self

    @property
    def active_levels(self) -> tuple[Level, ...]:
        if self.levels == "panel":
            return ("panel",)
        if self.levels == "region":
            return ("region",)
        return LEVEL_ORDER

    def level_cycle(self) -> list[Level]:
        """One cycle of the alternating schedule, e.g. ratios 2/1/1 -> [region, region, panel, figure]."""
        return [lvl for lvl in self.active_levels for _ in range(getattr(self.ratios, lvl))]

    def level_for_step(self, step: int) -> Level | Literal["mixed"]:
        """What step ``step`` (0-based) trains: a level (alternating) or ``"mixed"``."""
        if self.schedule == "mixed":
            return "mixed"
        cycle = self.level_cycle()
        return cycle[step % len(cycle)]


def _known_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    keys = []
    for name, field in model.model_fields.items():
        keys.append(prefix + name)
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            keys.extend(_known_keys(ann, prefix + name + "."))
    return keys


def load_config(data: Mapping[str, Any] | None = None, **overrides: Any) -> TrainConfig:
    """A validated :class:`TrainConfig`; unknown keys and bad values raise :class:`TrainConfigError`."""
    merged = {**dict(data or {}), **overrides}
    try:
        return TrainConfig.model_validate(merged)
    except ValidationError as exc:
        unknown = [".".join(str(p) for p in e["loc"]) for e in exc.errors() if e["type"] == "extra_forbidden"]
        if unknown:
            known = ", ".join(_known_keys(TrainConfig))
            raise TrainConfigError(
                f"unknown training config key(s): {', '.join(unknown)} (known keys: {known})"
            ) from exc
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'config'}: {e['msg']}" for e in exc.errors()
        )
        raise TrainConfigError(f"invalid training config: {problems}") from exc
