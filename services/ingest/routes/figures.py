from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response, status
from fastapi.concurrency import run_in_threadpool
from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.orm import selectinload
from starlette.datastructures import FormData, UploadFile

from p2p.ingest.deps import IngestPrincipal, ReadPrincipal, SessionDep, get_runtime
from p2p.ingest.service import ingest_one
from p2p.shared.api import read_form
from p2p.shared.db.models import Figure, FigureStatus, Panel
from p2p.shared.errors import InvalidInput, NotFound, PayloadTooLarge
from p2p.shared.schemas import MAX_OFFSET, FigureAccepted, FigureMetadata, FigurePublic

router = APIRouter(prefix="/v1/figures", tags=["figures"])

FORM_FIELDS = {"image", "caption", "metadata"}


def parse_metadata(raw: str | None, *, max_bytes: int) -> FigureMetadata:
    if raw is None or not raw.strip():
        return FigureMetadata()
    if len(raw.encode()) > max_bytes:
        raise PayloadTooLarge(
            f"metadata is larger than the {max_bytes}-byte limit", error_type="metadata_too_large"
        )
    try:
        return FigureMetadata.model_validate_json(raw)
    except ValidationError as exc:
        errors = exc.errors()
        kinds = {e["type"] for e in errors}
        if "json_invalid" in kinds or "json_type" in kinds:
            error_type = "malformed_metadata"
        elif "extra_forbidden" in kinds:
            error_type = "unknown_field"
        else:
            error_type = "invalid_metadata"
        detail = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'metadata'}: {e['msg']}" for e in errors[:5]
        )
        raise InvalidInput(f"metadata: {detail}", error_type=error_type) from exc


_FIGURE_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "title": "FigureUpload",
                    "type": "object",
                    "required": ["image"],
                    "properties": {
                        "image": {
                            "type": "string",
                            "format": "binary",
                            "description": "The figure image (JPEG, PNG, TIFF, GIF, BMP, WEBP).",
                        },
                        "caption": {"type": "string", "default": "", "description": "The figure caption."},
                        "metadata": {
                            "type": "string",
                            "description": "JSON: article ids, title, abstract, license, "
                            "inline_references...",
                        },
                    },
                }
            }
        },
    }
}


@dataclass(frozen=True)
class FigureForm:
    image: UploadFile
    caption: str
    metadata: str | None


def _text(form: FormData, name: str) -> str | None:
    values = form.getlist(name)
    if any(not isinstance(value, str) for value in values):
        raise InvalidInput(f"{name}: send a text field, not a file", error_type="validation_error")
    return str(values[-1]) if values else None


def check_figure_form(form: FormData) -> FigureForm:
    """The upload's parts, checked as FastAPI's ``File``/``Form`` parameters were (same errors),
    without its per-request validation machinery (bench/README.md, ingest)."""
    images = form.getlist("image")
    if not images:
        raise InvalidInput("image: Field required", error_type="validation_error")
    if any(not isinstance(image, UploadFile) for image in images):
        raise InvalidInput("image: send a file part, not a text field", error_type="validation_error")
    caption, metadata = _text(form, "caption"), _text(form, "metadata")
    unknown = sorted(set(form.keys()) - FORM_FIELDS)
    if unknown:
        raise InvalidInput(f"unknown form fields: {', '.join(unknown)}", error_type="unknown_field")
    if len(images) != 1:
        raise InvalidInput("send exactly one image", error_type="invalid_request")
    if len(form.getlist("caption")) > 1:
        raise InvalidInput("send one caption", error_type="invalid_caption")
    image = images[0]
    assert isinstance(image, UploadFile)
    return FigureForm(image=image, caption=caption or "", metadata=metadata)


@router.post(
    "",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=FigureAccepted,
    responses={200: {"model": FigureAccepted, "description": "The same image and caption already exist."}},
    openapi_extra=_FIGURE_BODY,
)
async def post_figure(request: Request, response: Response, _: IngestPrincipal) -> FigureAccepted:
    # The key is checked before the body is read; the session is opened on the thread that ingests.
    # The runtime is read here, not declared: each dependency FastAPI resolves costs ~10 us of the
    # event loop per request (bench/README.md, embedding).
    runtime = await get_runtime(request)
    form = await read_form(request)
    try:
        upload = check_figure_form(form)
        settings = runtime.settings
        parsed = parse_metadata(upload.metadata, max_bytes=settings.ingest.max_metadata_bytes)
        outcome = await run_in_threadpool(
            lambda: ingest_one(
                runtime=runtime,
                image=upload.image.file,
                caption=upload.caption,
                metadata=parsed,
                source="api",
            )
        )
    finally:
        await form.close()
    if outcome.duplicate:
        response.status_code = status.HTTP_200_OK
    response.headers["Location"] = f"/v1/figures/{outcome.figure.id}"
    return FigureAccepted(
        figure_id=outcome.figure.id,
        job_id=outcome.job.id,
        status=outcome.figure.status,
        duplicate=outcome.duplicate,
    )


@router.get("/{figure_id}", response_model=FigurePublic)
def get_figure(figure_id: uuid.UUID, session: SessionDep, _: ReadPrincipal) -> Figure:
    figure = session.scalars(
        select(Figure)
        .where(Figure.id == figure_id)
        .options(
            selectinload(Figure.article),
            selectinload(Figure.jobs),
            selectinload(Figure.panels).selectinload(Panel.regions),
        )
    ).first()
    if figure is None:
        raise NotFound(f"no figure {figure_id}")
    return figure


@router.get("", response_model=list[FigurePublic])
def list_figures(
    session: SessionDep,
    _: ReadPrincipal,
    status_: Annotated[FigureStatus | None, Query(alias="status")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
) -> list[Figure]:
    query = select(Figure).options(
        selectinload(Figure.article),
        selectinload(Figure.jobs),
        selectinload(Figure.panels).selectinload(Panel.regions),
    )
    if status_ is not None:
        query = query.where(Figure.status == status_)
    return list(
        session.scalars(query.order_by(Figure.created_at.desc(), Figure.id).limit(limit).offset(offset))
    )
