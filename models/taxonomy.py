"""Zero-shot figure-type classification: a default taxonomy of biomedical figure types.

Each label is turned into text prompts (several templates, averaged as in CLIP's prompt
ensembling); an image's probabilities over the labels are the softmax of its cosine similarities
to the label embeddings at CLIP's temperature (logit scale 100).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

FIGURE_TYPES: list[str] = [
    # microscopy
    "light microscopy",
    "histology slide stained with hematoxylin and eosin",
    "immunohistochemistry",
    "fluorescence microscopy",
    "confocal microscopy",
    "electron microscopy",
    # radiology
    "computed tomography (CT) scan",
    "magnetic resonance imaging (MRI) scan",
    "X-ray radiograph",
    "ultrasound image",
    "PET or nuclear medicine scan",
    "angiography",
    # photographs
    "clinical photograph of a patient",
    "gross pathology specimen photograph",
    "dermatology photograph of skin",
    "fundus photograph of the retina",
    "endoscopy image",
    # charts and plots
    "bar chart",
    "line plot",
    "scatter plot",
    "box plot",
    "Kaplan-Meier survival curve",
    "forest plot",
    "heatmap",
    # other graphics
    "diagram or schematic illustration",
    "flowchart",
    "table",
    "gel electrophoresis or western blot",
    "molecular structure",
    "electrocardiogram (ECG) trace",
]

TEMPLATES: list[str] = [
    "a biomedical figure showing {label}.",
    "a {label}.",
    "a scientific figure panel with a {label}.",
]

LOGIT_SCALE = 100.0


class TextEmbedder(Protocol):
    def encode_texts(self, texts: list[str]) -> np.ndarray: ...


def prompt_for(label: str) -> str:
    """The main prompt of a label."""
    return TEMPLATES[0].format(label=label)


def prompts_for(label: str, templates: Sequence[str] = TEMPLATES) -> list[str]:
    return [t.format(label=label) for t in templates]


def label_embeddings(
    model: TextEmbedder, labels: Sequence[str], templates: Sequence[str] = TEMPLATES
) -> np.ndarray:
    """One unit vector per label: the normalised mean of its prompts' embeddings."""
    if not labels:
        raise ValueError("zero-shot classification needs at least one label")
    if not templates:
        raise ValueError("zero-shot classification needs at least one prompt template")
    prompts = [p for label in labels for p in prompts_for(label, templates)]
    vectors = np.asarray(model.encode_texts(prompts), dtype=np.float32)
    vectors = vectors.reshape(len(labels), len(templates), -1).mean(axis=1)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return np.asarray(vectors / np.maximum(norms, 1e-12), dtype=np.float32)


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=1, keepdims=True)
    exp = np.exp(shifted)
    return np.asarray(exp / exp.sum(axis=1, keepdims=True), dtype=np.float32)


def zero_shot(
    model: TextEmbedder,
    image_embeddings: np.ndarray,
    labels: Sequence[str] | None = None,
    *,
    templates: Sequence[str] = TEMPLATES,
    logit_scale: float = LOGIT_SCALE,
) -> np.ndarray:
    """Probabilities (n_images, n_labels), each row summing to 1; labels default to FIGURE_TYPES."""
    labels = list(FIGURE_TYPES if labels is None else labels)
    images = np.asarray(image_embeddings, dtype=np.float32)
    if images.ndim == 1:
        images = images[None, :]
    text = label_embeddings(model, labels, templates)
    if images.shape[1] != text.shape[1]:
        raise ValueError(
            f"image embeddings are {images.shape[1]}-d but the model's text embeddings are {text.shape[1]}-d"
        )
    norms = np.linalg.norm(images, axis=1, keepdims=True)
    images = images / np.maximum(norms, 1e-12)
    return softmax(logit_scale * images @ text.T)


def top_labels(probabilities: np.ndarray, labels: Sequence[str], k: int = 3) -> list[list[tuple[str, float]]]:
    """The k most probable labels per image, best first."""
    out: list[list[tuple[str, float]]] = []
    for row in np.asarray(probabilities):
        order = np.argsort(-row)[:k]
        out.append([(labels[i], float(row[i])) for i in order])
    return out
