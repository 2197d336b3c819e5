from __future__ import annotations

import asyncio
import json
import uuid

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from PIL import Image
from pydantic import ValidationError
from starlette.datastructures import UploadFile

from p2p.embedding_api import service
from p2p.embedding_api.deps import ModelStateDep, ReadPrincipal, RuntimeDep
from p2p.embedding_api.schemas import ClassifyCreate, ClassifyPublic, LabelScore
from p2p.models.taxonomy import FIGURE_TYPES, zero_shot
from p2p.shared.api import read_form
from p2p.shared.errors import InvalidInput, UnsupportedMediaType

router = APIRouter(prefix="/v1", tags=["classify"])

FORM_TYPES = ("multipart/form-data", "application/x-www-form-urlencoded")
FORM_FIELDS = {"image", "panel_id", "labels"}


def _labels_from_form(values: list[str]) -> list[str] | None:
    if len(values) == 1 and values[0].strip().startswith("["):
        try:
            parsed = json.loads(values[0])
        except ValueError as exc:
            raise InvalidInput(f"labels: {exc}", error_type="invalid_labels") from exc
        if not isinstance(parsed, list) or not all(isinstance(v, str) for v in parsed):
            raise InvalidInput("labels must be a JSON list of strings", error_type="invalid_labels")
        return parsed
    return values or None


async def _parse(request: Request) -> tuple[UploadFile | None, uuid.UUID | None, list[str] | None]:
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type == "application/json":
        try:
            body = ClassifyCreate.model_validate_json(await request.body())
        except ValidationError as exc:
            detail = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()[:5])
            extra = any(e["type"] == "extra_forbidden" for e in exc.errors())
            raise InvalidInput(detail, error_type="unknown_field" if extra else "validation_error") from exc
        return None, body.panel_id, body.labels
    if content_type not in FORM_TYPES:
        raise UnsupportedMediaType(
            "send multipart/form-data (image or panel_id, labels) or application/json (panel_id, labels)",
            error_type="unsupported_media_type",
        )
    form = await read_form(request)
    unknown = sorted(set(form.keys()) - FORM_FIELDS)
    if unknown:
        raise InvalidInput(f"unknown form fields: {', '.join(unknown)}", error_type="unknown_field")
    images = [v for v in form.getlist("image") if not isinstance(v, str)]
    panel = form.get("panel_id")
    if len(images) + (1 if isinstance(panel, str) and panel.strip() else 0) != 1:
        raise InvalidInput("send exactly one of: an image file, a panel_id", error_type="invalid_request")
    labels = _labels_from_form([v for v in form.getlist("labels") if isinstance(v, str)])
    if images:
        upload = images[0]
        assert isinstance(upload, UploadFile)
        return upload, None, labels
    try:
        return None, uuid.UUID(str(panel).strip()), labels
    except ValueError as exc:
        raise InvalidInput(f"panel_id is not a UUID: {panel!r}", error_type="invalid_id") from exc


@router.post("/classify", response_model=ClassifyPublic)
async def classify(
    request: Request, runtime: RuntimeDep, state: ModelStateDep, _: ReadPrincipal
) -> ClassifyPublic:
    """Zero-shot probabilities of an uploaded image or a stored panel over ``labels`` (default: the
    figure-type taxonomy), most probable first."""

    upload, panel_id, raw_labels = await _parse(request)
    labels = service.check_labels(raw_labels, settings=runtime.settings, default=FIGURE_TYPES)
    image: Image.Image
    if upload is not None:
        source = f"file:{upload.filename or 'image'}"
        data = await upload.read()
        image = await run_in_threadpool(service.decode_image, data, settings=runtime.settings)
    else:
        assert panel_id is not None
        source = f"panel:{panel_id}"

        def load() -> Image.Image:
            with runtime.session() as session:
                return service.load_item_image(runtime, session, panel_id, "panel")

        image = await run_in_threadpool(load)
    embedding = await state.batcher.embed_images([image])
    probabilities = (await asyncio.to_thread(zero_shot, state.model, embedding, labels))[0]
    ranked = sorted(zip(labels, probabilities.tolist(), strict=True), key=lambda pair: -pair[1])
    return ClassifyPublic(
        model=service.model_ref(state),
        source=source,
        labels=[LabelScore(label=label, probability=round(p, 6)) for label, p in ranked],
    )
