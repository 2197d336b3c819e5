from __future__ import annotations

import mimetypes
import uuid
from collections.abc import Iterator

from fastapi import APIRouter
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import RedirectResponse, Response, StreamingResponse

from p2p.embedding_api import service
from p2p.embedding_api.deps import ReadPrincipal, RuntimeDep, SessionDep
from p2p.embedding_api.schemas import FigureDetailPublic, PanelItemPublic, RegionItemPublic
from p2p.shared.errors import NotFound
from p2p.shared.storage import CHUNK, ObjectNotFound, StorageError, validate_key

router = APIRouter(prefix="/v1", tags=["items"])


@router.get("/figures/{figure_id}", response_model=FigureDetailPublic)
def get_figure(figure_id: uuid.UUID, session: SessionDep, _: ReadPrincipal) -> FigureDetailPublic:
    """A figure with its article, panels and regions (boxes, crops, both text pathways, provenance)."""
    return service.figure_detail(session, figure_id)


@router.get("/panels/{panel_id}", response_model=PanelItemPublic)
def get_panel(panel_id: uuid.UUID, session: SessionDep, _: ReadPrincipal) -> PanelItemPublic:
    return service.panel_item(session, panel_id)


@router.get("/regions/{region_id}", response_model=RegionItemPublic)
def get_region(region_id: uuid.UUID, session: SessionDep, _: ReadPrincipal) -> RegionItemPublic:
    return service.region_item(session, region_id)


@router.get("/crops/{key:path}", response_model=None, responses={307: {"description": "S3: presigned URL"}})
async def get_crop(key: str, runtime: RuntimeDep, session: SessionDep, _: ReadPrincipal) -> Response:
    """A figure image or a mined crop: streamed from the store, or a redirect to a presigned S3 URL."""
    try:
        key = validate_key(key)
    except StorageError as exc:
        raise NotFound(f"no crop {key!r}") from exc
    if not await run_in_threadpool(service.served_key, session, key):
        raise NotFound(f"no crop {key!r}")
    ttl = runtime.settings.embedding.crop_url_ttl_s
    url = await run_in_threadpool(service.presigned_url, runtime.store, key, ttl_s=ttl)
    if url is not None:
        return RedirectResponse(url, status_code=307)
    try:
        stream = await run_in_threadpool(runtime.store.open, key)
    except ObjectNotFound as exc:
        raise NotFound(f"crop {key!r} is missing from the store") from exc

    def chunks() -> Iterator[bytes]:
        try:
            while chunk := stream.read(CHUNK):
                yield chunk
        finally:
            stream.close()

    media_type = mimetypes.guess_type(key)[0] or "application/octet-stream"
    headers = {"Cache-Control": "private, max-age=3600"}
    return StreamingResponse(chunks(), media_type=media_type, headers=headers)
