"""bench/embed_bench.py: the reference from PNG bytes and its ratios, with fake slices."""

from __future__ import annotations

import io
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from PIL import Image

from bench.abba import AbbaResult, Slice

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.fixture
def embed_bench(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCH))  # the bench scripts import their siblings by name
    import embed_bench as module

    return module


def slice_of(items: float, wall_s: float, **extra: Any) -> Slice:
    return Slice(items=items, wall_s=wall_s, cpu_s=wall_s, extra=extra)


def test_from_bytes_ratios_pair_each_service_slice_with_its_rounds_from_bytes_slice(
    embed_bench: ModuleType,
) -> None:
    product = [slice_of(100, 1.0), slice_of(300, 2.0), slice_of(50, 1.0)]
    reference = [
        slice_of(400, 2.0, from_bytes={"images": 200, "wall_s": 1.0, "cpu_s": 2.0}),
        slice_of(400, 2.0, from_bytes={"images": 100, "wall_s": 1.0, "cpu_s": 1.0}),
        slice_of(400, 2.0, from_bytes={"images": 100, "wall_s": 2.0, "cpu_s": 1.0}),
    ]
    result = AbbaResult(product=product, reference=reference, first=["product", "reference", "product"])
    ratios = embed_bench.from_bytes_ratios(result)
    # per round: 100/200, 150/100, 50/50
    assert ratios["ratio_over_raw_from_bytes"] == 1.0
    assert ratios["ratio_over_raw_from_bytes_min_max"] == [0.5, 1.5]
    assert ratios["raw_from_bytes_images_per_s"] == 100.0  # 400 images in 4 s
    assert ratios["raw_from_bytes_cpu_ms_per_image"] == 10.0  # 4 CPU-s for 400 images


def test_from_bytes_ratios_are_empty_without_that_reference(embed_bench: ModuleType) -> None:
    result = AbbaResult(product=[slice_of(1, 1.0)], reference=[slice_of(1, 1.0)], first=["product"])
    assert embed_bench.from_bytes_ratios(result) == {}


def test_the_raw_loop_from_bytes_decodes_what_the_service_receives(embed_bench: ModuleType) -> None:
    pixels = np.random.default_rng(3).integers(0, 255, (20, 30, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).convert("RGBA").save(buffer, format="PNG")
    decoded = embed_bench.decode_png(buffer.getvalue())
    assert decoded.mode == "RGB" and np.array_equal(np.asarray(decoded), pixels)

    class Model:
        def __init__(self) -> None:
            self.seen: list[Any] = []

        def encode_images(self, images: list[Any]) -> None:
            self.seen.extend(images)

    model = Model()
    run = embed_bench.raw_throughput(model, [buffer.getvalue()] * 2, 2, 0.0, from_bytes=True)
    assert run["images"] == 2 and all(isinstance(im, Image.Image) for im in model.seen)
