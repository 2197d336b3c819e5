"""Retrieval evaluation of embedding models on a held-out split (the paper's protocol, in miniature).

Tasks, each scored in both directions with Recall@k (exact cosine similarity, numpy):

* ``panel``: panel crop <-> panel subcaption (short-context retrieval);
* ``region``: region crop <-> region text (its caption text, else its description);
* ``figure``: whole multi-panel figure <-> figure caption;
* ``zero_shot``: accuracy of classifying panel crops among the figure types present in the split.

Identical texts are one target: the texts of a task are de-duplicated, an image is right when it
retrieves its text, and a text query is right when it retrieves any image carrying that text. Score
ties are counted against the query (a constant model scores 0, not 1). Items without text are left
out of a task.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
from PIL import Image

from p2p.models.modeling import load_model
from p2p.models.taxonomy import zero_shot
from p2p.training.dataset import FigureRecord

DEFAULT_KS: tuple[int, ...] = (1, 5, 10)
RETRIEVAL_TASKS: tuple[str, ...] = ("panel", "region", "figure")
CHUNK = 1024  # query rows scored at a time: bounds the similarity matrix's memory

# Zero-shot prompts for the panel types the miners assign, worded the way captions describe such
# panels (a bare "a plot" sits far from "Box plots of ..." for a sentence encoder); others get "a <type>".
TYPE_PHRASES: dict[str, str] = {
    "image": "a micrograph, photograph or medical image",
    "photo": "a photograph",
    "plot": "a bar graph, box plot, line plot or scatter plot",
    "chart": "a chart or graph",
    "schematic": "a schematic or flow chart",
    "diagram": "a diagram",
    "table": "a table of values",
}
ZERO_SHOT_TEMPLATES: tuple[str, ...] = (
    "{label}",
    "a biomedical figure panel showing {label}.",
    "a scientific figure with {label}.",
)


class Encoder(Protocol):
    def encode_texts(self, texts: Sequence[str]) -> np.ndarray: ...

    def encode_images(self, images: Sequence[Image.Image]) -> np.ndarray: ...


def type_phrase(figure_type: str) -> str:
    return TYPE_PHRASES.get(figure_type, f"a {figure_type.replace('_', ' ')}")


@dataclass
class Pairs:
    """One retrieval task's items: an image and its (non-empty) text each."""

    images: list[Image.Image] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)

    def add(self, image: Image.Image, text: str) -> None:
        text = text.strip()
        if text:
            self.images.append(image)
            self.texts.append(text)


@dataclass
class EvalSet:
    """What the tasks score, collected once from the records and shared by every model."""

    figures: int = 0
    tasks: dict[str, Pairs] = field(default_factory=lambda: {t: Pairs() for t in RETRIEVAL_TASKS})
    typed_panels: list[Image.Image] = field(default_factory=list)
    panel_types: list[str] = field(default_factory=list)


def collect(records: Iterable[FigureRecord], *, max_items: int | None = None) -> EvalSet:
    """The evaluation items of at most ``max_items`` figures (all of them when None)."""
    data = EvalSet()
    for record in records:
        if max_items is not None and data.figures >= max_items:
            break
        data.figures += 1
        data.tasks["figure"].add(record.figure_image, record.caption)
        for panel in record.panels:
            data.tasks["panel"].add(panel.image, panel.subcaption)
            if panel.figure_type:
                data.typed_panels.append(panel.image)
                data.panel_types.append(panel.figure_type)
            for region in panel.regions:
                data.tasks["region"].add(region.image, region.caption_text.strip() or region.description)
    return data


def _normalised(vectors: np.ndarray) -> np.ndarray:
    array = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(array, axis=1, keepdims=True)
    return np.asarray(array / np.maximum(norms, 1e-12), dtype=np.float32)


def image_to_text_ranks(images: np.ndarray, texts: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Per image, how many texts score at least as high as its own (0 = retrieved first).

    ``texts`` are the unique texts' embeddings, ``targets[i]`` the index of image i's text.
    """
    ranks = np.empty(len(images), dtype=np.int64)
    for start in range(0, len(images), CHUNK):
        sims = images[start : start + CHUNK] @ texts.T
        rows = np.arange(sims.shape[0])
        own = sims[rows, targets[start : start + CHUNK]]
        ranks[start : start + CHUNK] = (sims >= own[:, None]).sum(axis=1) - 1
    return ranks


def text_to_image_ranks(texts: np.ndarray, images: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Per unique text, how many images with another text score at least as high as its best image."""
    ranks = np.empty(len(texts), dtype=np.int64)
    for start in range(0, len(texts), CHUNK):
        sims = texts[start : start + CHUNK] @ images.T  # (queries, images)
        queries = np.arange(start, start + sims.shape[0])
        correct = targets[None, :] == queries[:, None]
        best = np.where(correct, sims, -np.inf).max(axis=1)
        ranks[start : start + CHUNK] = ((sims >= best[:, None]) & ~correct).sum(axis=1)
    return ranks


def recalls(ranks: np.ndarray, ks: Sequence[int]) -> dict[str, float]:
    if len(ranks) == 0:
        return {f"R@{k}": 0.0 for k in ks}
    return {f"R@{k}": float(np.mean(ranks < k)) for k in ks}


def _retrieval(model: Encoder, pairs: Pairs, ks: Sequence[int]) -> dict[str, Any]:
    unique: dict[str, int] = {}
    targets = np.array([unique.setdefault(t, len(unique)) for t in pairs.texts], dtype=np.int64)
    result: dict[str, Any] = {"images": len(pairs.images), "texts": len(unique)}
    if not pairs.images:
        result.update(image_to_text=recalls(np.empty(0), ks), text_to_image=recalls(np.empty(0), ks))
        return result
    images = _normalised(model.encode_images(pairs.images))
    texts = _normalised(model.encode_texts(list(unique)))
    result["image_to_text"] = recalls(image_to_text_ranks(images, texts, targets), ks)
    result["text_to_image"] = recalls(text_to_image_ranks(texts, images, targets), ks)
    return result


def _zero_shot(model: Encoder, data: EvalSet) -> dict[str, Any]:
    labels = sorted(set(data.panel_types))
    result: dict[str, Any] = {
        "panels": len(data.panel_types),
        "labels": labels,
        "accuracy": 0.0,
        "balanced_accuracy": 0.0,
    }
    if not labels:
        return result
    images = _normalised(model.encode_images(data.typed_panels))
    probabilities = zero_shot(model, images, [type_phrase(t) for t in labels], templates=ZERO_SHOT_TEMPLATES)
    truth = np.array([labels.index(t) for t in data.panel_types])
    predicted = probabilities.argmax(axis=1)
    result["accuracy"] = float(np.mean(predicted == truth))
    result["per_type"] = {
        label: {"panels": int((truth == i).sum()), "accuracy": float(np.mean(predicted[truth == i] == i))}
        for i, label in enumerate(labels)
    }
    # The mean of the per-type accuracies: a model that answers one type for every panel scores
    # 1/len(labels) here, whatever the share of the majority type (which plain accuracy rewards).
    result["balanced_accuracy"] = float(np.mean([v["accuracy"] for v in result["per_type"].values()]))
    return result


def evaluate_set(model: Encoder, data: EvalSet, *, ks: Sequence[int] = DEFAULT_KS) -> dict[str, Any]:
    if not ks or any(k < 1 for k in ks):
        raise ValueError(f"recall cut-offs must be positive: {list(ks)}")
    report: dict[str, Any] = {"figures": data.figures, "ks": list(ks)}
    for task in RETRIEVAL_TASKS:
        report[task] = _retrieval(model, data.tasks[task], ks)
    report["zero_shot"] = _zero_shot(model, data)
    return report


def evaluate_retrieval(
    model: Encoder,
    records: Iterable[FigureRecord],
    *,
    ks: Sequence[int] = DEFAULT_KS,
    max_items: int | None = None,
) -> dict[str, Any]:
    """Recall@k of the three retrieval tasks (both directions), zero-shot accuracy and item counts.

    ``max_items`` caps the number of figures read from ``records``.
    """
    return evaluate_set(model, collect(records, max_items=max_items), ks=ks)


def flatten(report: Mapping[str, Any]) -> dict[str, float | int]:
    """One table row: ``panel i2t R@1``, ..., ``zero-shot acc`` and the item counts."""
    row: dict[str, float | int] = {}
    for task in RETRIEVAL_TASKS:
        part = report[task]
        for direction, short in (("image_to_text", "i2t"), ("text_to_image", "t2i")):
            for name, value in part[direction].items():
                row[f"{task} {short} {name}"] = value
    row["zero-shot acc"] = report["zero_shot"]["accuracy"]
    row["zero-shot bal acc"] = report["zero_shot"]["balanced_accuracy"]
    for task in RETRIEVAL_TASKS:
        row[f"{task} n"] = report[task]["images"]
    row["zero-shot n"] = report["zero_shot"]["panels"]
    row["zero-shot classes n"] = len(report["zero_shot"].get("labels", []))
    return row


def chance(metric: str, row: Mapping[str, Any]) -> float | None:
    """What random scores would give on ``metric`` of a flattened row: R@k with n candidates is
    min(k, n)/n (one right answer among n), balanced accuracy over L classes 1/L."""
    task, _, rest = metric.partition(" ")
    if rest.rpartition(" ")[2].startswith("R@"):
        n = int(row.get(f"{task} n") or 0)
        k = int(rest.rpartition("R@")[2])
        return min(k, n) / n if n else None
    if metric == "zero-shot bal acc":
        classes = int(row.get("zero-shot classes n") or 0)
        return 1 / classes if classes else None
    return None


def ordered_metrics(row: Mapping[str, Any], ks: Sequence[int] = DEFAULT_KS) -> list[str]:
    """The metrics of a flattened row in reading order: task, direction, then R@1, R@5, R@10."""
    order = [
        f"{task} {short} R@{k}" for task in RETRIEVAL_TASKS for short in ("i2t", "t2i") for k in sorted(ks)
    ] + ["zero-shot acc", "zero-shot bal acc"]
    known = [key for key in order if key in row]
    rest = sorted(key for key in row if key not in order and not key.endswith(" n"))
    return known + rest


def compare_models(
    models: Mapping[str, Any],
    records: Iterable[FigureRecord],
    *,
    ks: Sequence[int] = DEFAULT_KS,
    max_items: int | None = None,
    loader: Callable[[Any], Encoder] | None = None,
) -> list[dict[str, Any]]:
    """Evaluate several models on the same items; one row per model (``model``, ``report`` and the
    flattened metrics). A value of ``models`` is an encoder, or a spec that ``loader`` turns into
    one (default: :func:`p2p.models.modeling.load_model`); models are loaded one at a time."""
    data = collect(records, max_items=max_items)
    rows: list[dict[str, Any]] = []
    for name, value in models.items():
        if hasattr(value, "encode_images") and hasattr(value, "encode_texts"):
            encoder: Encoder = value
        else:
            encoder = load_model(value) if loader is None else loader(value)
        report = evaluate_set(encoder, data, ks=ks)
        del encoder
        rows.append({"model": name, **flatten(report), "report": report})
    return rows
