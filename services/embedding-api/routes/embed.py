from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, File, Form, UploadFile
from fastapi.concurrency import run_in_threadpool
from PIL import Image

from p2p.embedding_api import service
from p2p.embedding_api.deps import ModelStateDep, ReadPrincipal, RuntimeDep
from p2p.embedding_api.schemas import EmbeddingPublic, EmbedPublic, TextEmbedCreate
from p2p.shared.errors import InvalidInput

router = APIRouter(prefix="/v1/embed", tags=["embed"])


@router.post("/texts", response_model=EmbedPublic)
async def embed_texts(
    body: TextEmbedCreate, runtime: RuntimeDep, state: ModelStateDep, _: ReadPrincipal
) -> EmbedPublic:
    """L2-normalised text embeddings of the serving model, in the order sent."""
    texts = service.check_texts(body.texts, settings=runtime.settings)
    vectors = await state.batcher.embed_texts(texts)
    return EmbedPublic(
        model=service.model_ref(state),
        dim=state.dim,
        items=[EmbeddingPublic(source=f"text:{i}", embedding=v.tolist()) for i, v in enumerate(vectors)],
    )


@router.post("/images", response_model=EmbedPublic)
async def embed_images(
    runtime: RuntimeDep,
    state: ModelStateDep,
    _: ReadPrincipal,
    files: Annotated[list[UploadFile] | None, File(description="Images to embed.")] = None,
    object_ids: Annotated[
        list[str] | None, Form(description="Ids of stored figures, panels or regions: their images.")
    ] = None,
) -> EmbedPublic:
    """Image embeddings: uploaded files first, then stored items, in the order sent."""
    files = files or []
    ids = [part.strip() for raw in object_ids or [] for part in raw.split(",") if part.strip()]
    limit = runtime.settings.embedding.max_images
    if not files and not ids:
        raise InvalidInput("send image files and/or object_ids", error_type="empty_input")
    if len(files) + len(ids) > limit:
        raise InvalidInput(
            f"{len(files) + len(ids)} images is more than the {limit} allowed per request",
            error_type="too_many_images",
        )
    try:
        item_ids = [uuid.UUID(value) for value in ids]
    except ValueError as exc:
        raise InvalidInput(f"object_ids must be UUIDs: {exc}", error_type="invalid_id") from exc
    sources: list[str] = []
    images: list[Image.Image] = []
    for upload in files:
        name = upload.filename or "image"
        data = await upload.read()
        images.append(
            await run_in_threadpool(service.decode_image, data, settings=runtime.settings, name=name)
        )
        sources.append(f"file:{name}")

    def load_items() -> list[tuple[str, Image.Image]]:
        out = []
        with runtime.session() as session:
            for item_id in item_ids:
                level = service.resolve_level(session, item_id)
                out.append((f"{level}:{item_id}", service.load_item_image(runtime, session, item_id, level)))
        return out

    for source, image in await run_in_threadpool(load_items):
        sources.append(source)
        images.append(image)
    vectors = await state.batcher.embed_images(images)
    return EmbedPublic(
        model=service.model_ref(state),
        dim=state.dim,
        items=[
            EmbeddingPublic(source=s, embedding=v.tolist()) for s, v in zip(sources, vectors, strict=True)
        ],
    )
