"""``POST /v1/embed/texts`` and ``/v1/embed/images``.

Answers are JSON by default. A client that sends ``Accept: application/octet-stream`` gets the
vectors as raw bytes instead: ``count x dim`` float32 little-endian, row-major, rows in the order of
the JSON ``items``, with the JSON's other fields in headers (``X-Embedding-Count``,
``X-Embedding-Dim``, ``X-Embedding-Dtype: float32``, ``X-Model-Name``, ``X-Model-Version``,
``X-Model-Version-Id``, ``X-Embedding-Sources``: a JSON list, ASCII-escaped). That answer costs the
server no float formatting and the client no float parsing.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response
from pydantic_core import to_json
from starlette.datastructures import UploadFile as StarletteUpload

from p2p.embedding_api import service
from p2p.embedding_api.deps import ModelState, ModelStateDep, ReadPrincipal, RuntimeDep, get_model_state
from p2p.embedding_api.schemas import EmbedPublic, TextEmbedCreate
from p2p.shared.api import read_form
from p2p.shared.deps import get_runtime
from p2p.shared.errors import InvalidInput
from p2p.shared.settings import Settings

router = APIRouter(prefix="/v1/embed", tags=["embed"])

BINARY = "application/octet-stream"
_ANSWERS: dict[str | int, dict[str, Any]] = {
    200: {
        "content": {BINARY: {"schema": {"type": "string", "format": "binary"}}},
        "description": "JSON, or with `Accept: application/octet-stream` count x dim float32 "
        "little-endian rows (metadata in X-Embedding-* and X-Model-* headers).",
    }
}


def wants_binary(request: Request) -> bool:
    return BINARY in request.headers.get("accept", "")


def embed_response(
    request: Request, state: ModelState, sources: Sequence[str], vectors: np.ndarray
) -> Response:
    """The answer of both endpoints: JSON (``EmbedPublic``), or raw float32 rows when asked."""
    ref = service.model_ref(state)
    if wants_binary(request):
        body = np.ascontiguousarray(vectors, dtype="<f4").tobytes()
        headers = {
            "X-Embedding-Count": str(len(sources)),
            "X-Embedding-Dim": str(state.dim),
            "X-Embedding-Dtype": "float32",
            "X-Model-Name": ref.name,
            "X-Model-Version": ref.version or "",
            "X-Model-Version-Id": str(ref.version_id or ""),
            "X-Embedding-Sources": json.dumps(list(sources)),
        }
        return Response(content=body, media_type=BINARY, headers=headers)
    return Response(
        content=json_answer(vectors, sources, ref_json=ref.model_dump_json().encode()),
        media_type="application/json",
    )


def json_answer(vectors: np.ndarray, sources: Sequence[str], *, ref_json: bytes) -> bytes:
    """The ``EmbedPublic`` JSON, byte for byte as pydantic writes it, built without a model per row:
    the rows become Python floats in one ``tolist`` and are serialised in one ``to_json`` call."""
    rows = np.asarray(vectors).tolist()
    items = [{"source": s, "embedding": row} for s, row in zip(sources, rows, strict=True)]
    return b"".join(
        (
            b'{"model":',
            ref_json,
            b',"dim":',
            str(int(vectors.shape[1])).encode(),
            b',"items":',
            to_json(items, inf_nan_mode="null"),
            b"}",
        )
    )


@router.post("/texts", response_model=EmbedPublic, responses=_ANSWERS)
async def embed_texts(
    request: Request, body: TextEmbedCreate, runtime: RuntimeDep, state: ModelStateDep, _: ReadPrincipal
) -> Response:
    """L2-normalised text embeddings of the serving model, in the order sent."""
    texts = service.check_texts(body.texts, settings=runtime.settings)
    vectors = await state.batcher.embed_texts(texts)
    return embed_response(request, state, [f"text:{i}" for i in range(len(texts))], vectors)


def decode_upload(data: bytes, settings: Settings, name: str, model: Any) -> Any:
    """An upload as the model's input: checked and decoded, then resized by the model's own
    preprocessing where the model offers it (``prepare_image``)."""
    image = service.decode_image(data, settings=settings, name=name)
    prepare = getattr(model, "prepare_image", None)
    return prepare(image) if prepare is not None else image


def decode_uploads(blobs: Sequence[bytes], names: Sequence[str], settings: Settings, model: Any) -> list[Any]:
    """Every upload of a request as model input, in one call: one hand-off to the preparation pool
    per request instead of one per image (each hand-off is a GIL round trip and a wake-up of the
    event loop). The first bad image fails the request, its name in the message."""
    return [decode_upload(data, settings, name, model) for data, name in zip(blobs, names, strict=True)]


_IMAGES_BODY = {
    "requestBody": {
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "properties": {
                        "files": {
                            "type": "array",
                            "items": {"type": "string", "format": "binary"},
                            "description": "Images to embed.",
                        },
                        "object_ids": {
                            "type": "array",
                            "items": {"type": "string"},
                            "description": "Ids of stored figures, panels or regions: their images "
                            "(repeated fields or comma-separated).",
                        },
                    },
                }
            }
        }
    }
}


async def read_image_form(request: Request) -> tuple[list[tuple[str, bytes]], list[str]]:
    """The request's uploads (``files``: name and bytes, in order) and ``object_ids`` values, read
    from the form directly: declared as ``File``/``Form`` parameters, FastAPI re-validated them on
    every request, a third of the event loop's CPU per one-image request (bench/README.md)."""
    form = await read_form(request)
    try:
        uploads: list[tuple[str, bytes]] = []
        for part in form.getlist("files"):
            if not isinstance(part, StarletteUpload):
                raise InvalidInput("files must be file parts, not text fields", error_type="invalid_request")
            uploads.append((part.filename or "image", await part.read()))
        ids = [value for value in form.getlist("object_ids") if isinstance(value, str)]
        if len(ids) != len(form.getlist("object_ids")):
            raise InvalidInput("object_ids must be text fields, not files", error_type="invalid_id")
        return uploads, ids
    finally:
        await form.close()


@router.post("/images", response_model=EmbedPublic, responses=_ANSWERS, openapi_extra=_IMAGES_BODY)
async def embed_images(request: Request, _: ReadPrincipal) -> Response:
    """Image embeddings: uploaded files first, then stored items, in the order sent. Uploads are
    decoded and preprocessed on the batcher's preparation pool, beside the model."""
    # Read here, not declared: each dependency FastAPI resolves costs ~10 us of the event loop
    # per request (bench/README.md, embedding).
    runtime, state = await get_runtime(request), await get_model_state(request)
    uploads, object_ids = await read_image_form(request)
    ids = [part.strip() for raw in object_ids for part in raw.split(",") if part.strip()]
    limit = runtime.settings.embedding.max_images
    if not uploads and not ids:
        raise InvalidInput("send image files and/or object_ids", error_type="empty_input")
    if len(uploads) + len(ids) > limit:
        raise InvalidInput(
            f"{len(uploads) + len(ids)} images is more than the {limit} allowed per request",
            error_type="too_many_images",
        )
    try:
        item_ids = [uuid.UUID(value) for value in ids]
    except ValueError as exc:
        raise InvalidInput(f"object_ids must be UUIDs: {exc}", error_type="invalid_id") from exc
    names = [name for name, _ in uploads]
    blobs = [data for _, data in uploads]
    sources = [f"file:{name}" for name in names]
    images: list[Any] = (
        await state.batcher.prepare(decode_uploads, blobs, names, runtime.settings, state.model)
        if blobs
        else []
    )

    def load_items() -> list[tuple[str, Any]]:
        out = []
        with runtime.session() as session:
            for item_id in item_ids:
                level = service.resolve_level(session, item_id)
                out.append((f"{level}:{item_id}", service.load_item_image(runtime, session, item_id, level)))
        return out

    if item_ids:
        for source, image in await run_in_threadpool(load_items):
            sources.append(source)
            images.append(image)
    vectors = await state.batcher.embed_images(images)
    return embed_response(request, state, sources, vectors)
