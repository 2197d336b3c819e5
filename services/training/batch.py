"""The in-memory hierarchical batch: figures, their panels and the panels' regions.

:func:`collate` turns per-figure samples into a :class:`HierBatch`. Panel images are resized to the
model's square input *without cropping* so that region boxes (in panel pixels) map onto the patch
grid by a plain scale (``HierBatch.panel_sizes`` keeps each panel's original size). Figure and
region images use the same resize unless an ``augment`` transform is given for them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import torch
from PIL import Image

OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)


@dataclass
class RegionSample:
    image: Image.Image  # the region crop
    box_in_panel: tuple[float, float, float, float]  # (x0, y0, x1, y1) in panel pixels
    caption_text: str = ""  # grounded caption fragment
    description: str = ""  # crop description


@dataclass
class PanelSample:
    image: Image.Image
    subcaption: str = ""
    description: str = ""
    regions: list[RegionSample] = field(default_factory=list)


@dataclass
class FigureSample:
    figure_image: Image.Image
    caption: str
    panels: list[PanelSample] = field(default_factory=list)


@dataclass
class HierBatch:
    figure_images: torch.Tensor  # (F, 3, S, S)
    figure_texts: list[str]
    panel_images: torch.Tensor  # (P, 3, S, S)
    panel_texts: list[str]  # sub-caption, else the panel description
    panel_figure: torch.Tensor  # (P,) long: index into the figures
    panel_sizes: torch.Tensor  # (P, 2) float: original (width, height) in pixels
    region_images: torch.Tensor  # (R, 3, S, S)
    region_captions: list[str]  # grounded caption fragments ("" when missing)
    region_descriptions: list[str]  # crop descriptions ("" when missing)
    region_panel: torch.Tensor  # (R,) long: index into the panels
    region_boxes: torch.Tensor  # (R, 4) float: (x0, y0, x1, y1) in panel pixels

    @property
    def sizes(self) -> tuple[int, int, int]:
        return len(self.figure_texts), len(self.panel_texts), len(self.region_captions)

    @property
    def region_figure(self) -> torch.Tensor:
        return self.panel_figure[self.region_panel]

    def to(self, device: torch.device | str) -> HierBatch:
        return replace(
            self,
            **{
                name: getattr(self, name).to(device)
                for name in (
                    "figure_images",
                    "panel_images",
                    "panel_figure",
                    "panel_sizes",
                    "region_images",
                    "region_panel",
                    "region_boxes",
                )
            },
        )

    def region_texts(self, generator: torch.Generator | None = None) -> list[str]:
        """One text per region, each drawn at random from its two kinds (the other when one is empty)."""
        n = len(self.region_captions)
        if n == 0:
            return []
        picks = torch.rand(n, generator=generator) < 0.5
        out = []
        for caption, description, pick in zip(
            self.region_captions, self.region_descriptions, picks.tolist(), strict=True
        ):
            first, second = (caption, description) if pick else (description, caption)
            out.append(first or second)
        return out


def image_tensor(
    image: Image.Image, size: int, mean: Sequence[float] = OPENAI_MEAN, std: Sequence[float] = OPENAI_STD
) -> torch.Tensor:
    """RGB, squashed to ``size`` x ``size`` (no crop, so boxes scale exactly), normalised, (3, S, S)."""
    rgb = image.convert("RGB").resize((size, size), Image.Resampling.BICUBIC)
    pixels = torch.from_numpy(np.array(rgb, dtype=np.float32)).permute(2, 0, 1) / 255.0
    shape = (3, 1, 1)
    mean_t, std_t = torch.tensor(mean).reshape(shape), torch.tensor(std).reshape(shape)
    return ((pixels - mean_t) / std_t).contiguous()


def _stack(tensors: list[torch.Tensor], size: int) -> torch.Tensor:
    return torch.stack(tensors) if tensors else torch.zeros((0, 3, size, size))


def collate(
    samples: Sequence[FigureSample],
    *,
    image_size: int,
    mean: Sequence[float] = OPENAI_MEAN,
    std: Sequence[float] = OPENAI_STD,
    augment: Callable[[Image.Image], torch.Tensor] | None = None,
) -> HierBatch:
    """Flatten figures -> panels -> regions into one :class:`HierBatch` (indices keep the tree)."""

    def plain(im: Image.Image) -> torch.Tensor:
        return image_tensor(im, image_size, mean, std)

    other = augment or plain
    fig_imgs: list[torch.Tensor] = []
    pan_imgs: list[torch.Tensor] = []
    reg_imgs: list[torch.Tensor] = []
    fig_txt: list[str] = []
    pan_txt: list[str] = []
    reg_cap: list[str] = []
    reg_desc: list[str] = []
    pan_fig: list[int] = []
    reg_pan: list[int] = []
    pan_size: list[tuple[int, int]] = []
    reg_box: list[list[float]] = []
    for fi, figure in enumerate(samples):
        fig_imgs.append(other(figure.figure_image))
        fig_txt.append(figure.caption)
        for panel in figure.panels:
            pi = len(pan_txt)
            pan_imgs.append(plain(panel.image))
            pan_txt.append(panel.subcaption or panel.description)
            pan_fig.append(fi)
            pan_size.append(panel.image.size)
            for region in panel.regions:
                reg_imgs.append(other(region.image))
                reg_cap.append(region.caption_text)
                reg_desc.append(region.description)
                reg_pan.append(pi)
                reg_box.append([float(v) for v in region.box_in_panel])
    return HierBatch(
        figure_images=_stack(fig_imgs, image_size),
        figure_texts=fig_txt,
        panel_images=_stack(pan_imgs, image_size),
        panel_texts=pan_txt,
        panel_figure=torch.tensor(pan_fig, dtype=torch.long),
        panel_sizes=torch.tensor(pan_size, dtype=torch.float32).reshape(-1, 2),
        region_images=_stack(reg_imgs, image_size),
        region_captions=reg_cap,
        region_descriptions=reg_desc,
        region_panel=torch.tensor(reg_pan, dtype=torch.long),
        region_boxes=torch.tensor(reg_box, dtype=torch.float32).reshape(-1, 4),
    )
