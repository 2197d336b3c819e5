from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from PIL import Image
from pydantic import BaseModel, ValidationError
from starlette.datastructures import UploadFile

from p2p.embedding_api import service
from p2p.embedding_api.deps import ModelStateDep, ReadPrincipal, RuntimeDep
from p2p.embedding_api.schemas import SearchCreate, SearchPublic
from p2p.shared.api import read_form
from p2p.shared.errors import InvalidInput, UnsupportedMediaType

router = APIRouter(prefix="/v1", tags=["search"])

FORM_TYPES = ("multipart/form-data", "application/x-www-form-urlencoded")
FORM_FIELDS = {"image", "box", "level", "k", "offset", "filters", "exact", "text"}


def inline_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The model's JSON schema with its ``$defs`` written in place: the ``#/$defs/...`` references
    of pydantic's schema point nowhere inside an OpenAPI document."""
    schema = model.model_json_schema()
    defs = schema.pop("$defs", {})

    def resolve(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                return resolve(defs[ref.removeprefix("#/$defs/")])
            return {key: resolve(value) for key, value in node.items()}
        if isinstance(node, list):
            return [resolve(value) for value in node]
        return node

    return dict(resolve(schema))


_OPENAPI = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": inline_schema(SearchCreate)},
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["image"],
                    "properties": {
                        "image": {"type": "string", "format": "binary"},
                        "box": {"type": "string", "description": "x0,y0,x1,y1 in image pixels"},
                        "level": {"type": "string", "enum": ["figure", "panel", "region"]},
                        "k": {"type": "integer"},
                        "offset": {"type": "integer"},
                        "filters": {
                            "type": "string",
                            "description": "JSON object of filters: figure_type, license_group, year_min, "
                            "year_max, journal, article_id, figure_id",
                        },
                        "exact": {"type": "boolean"},
                    },
                }
            },
        },
    }
}


def _validation_error(exc: ValidationError) -> InvalidInput:
    errors = exc.errors()
    unknown = [e for e in errors if e["type"] == "extra_forbidden"]
    detail = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in errors[:5])
    if unknown:
        fields = ", ".join(".".join(str(p) for p in e["loc"]) for e in unknown)
        return InvalidInput(f"unknown fields: {fields}", error_type="unknown_field")
    kinds = {e["type"] for e in errors}
    error_type = "malformed_json" if kinds & {"json_invalid", "json_type"} else "validation_error"
    return InvalidInput(detail, error_type=error_type)


async def _from_form(request: Request) -> tuple[dict[str, Any], UploadFile]:
    form = await read_form(request)
    unknown = sorted(set(form.keys()) - FORM_FIELDS)
    if unknown:
        raise InvalidInput(f"unknown form fields: {', '.join(unknown)}", error_type="unknown_field")
    images = form.getlist("image")
    if len(images) != 1 or isinstance(images[0], str):
        raise InvalidInput("send exactly one image file as 'image'", error_type="invalid_request")
    fields: dict[str, Any] = {
        name: value for name in ("level", "k", "offset", "exact") if isinstance(value := form.get(name), str)
    }
    filters, box = form.get("filters"), form.get("box")
    fields["filters"] = service.filters_from_form(filters if isinstance(filters, str) else None)
    if isinstance(box, str):
        fields["box"] = box
    upload = images[0]
    assert isinstance(upload, UploadFile)
    return fields, upload


@router.post("/search", response_model=SearchPublic, openapi_extra=_OPENAPI)
async def search(
    request: Request, runtime: RuntimeDep, state: ModelStateDep, _: ReadPrincipal
) -> SearchPublic:
    """Nearest figures, panels or regions of the active model version, each with its context.

    JSON: ``{"text": ...}`` or ``{"item": {"id": ..., "level": ...}}`` with ``level``, ``k``,
    ``offset``, ``filters``, ``exact``. Multipart: an ``image`` file, optional ``box``
    (``x0,y0,x1,y1`` in image pixels) and the same options as form fields (``filters`` as JSON)."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    image: Image.Image | None = None
    box = None
    if content_type == "application/json":
        raw = await request.body()
        try:
            body = SearchCreate.model_validate_json(raw or b"{}")
        except ValidationError as exc:
            raise _validation_error(exc) from exc
    elif content_type in FORM_TYPES:
        fields, upload = await _from_form(request)
        box = service.parse_box(fields.pop("box", None))
        try:
            body = SearchCreate.model_validate(fields)
        except ValidationError as exc:
            raise _validation_error(exc) from exc
        data = await upload.read()
        name = upload.filename or "image"
        image = await run_in_threadpool(service.decode_image, data, settings=runtime.settings, name=name)
    else:
        raise UnsupportedMediaType(
            f"send application/json (text or item queries) or multipart/form-data (image queries), "
            f"not {content_type or 'no content type'}",
            error_type="unsupported_media_type",
        )
    return await service.search(runtime=runtime, state=state, body=body, image=image, box=box)
