from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response

from p2p.ingest.deps import ReadPrincipal, RuntimeDep, SessionDep
from p2p.shared.crops import CROP_RESPONSES, crop_response

router = APIRouter(prefix="/v1", tags=["figures"])


@router.get("/crops/{key:path}", response_model=None, responses=CROP_RESPONSES)
async def get_crop(key: str, runtime: RuntimeDep, session: SessionDep, _: ReadPrincipal) -> Response:
    """A figure image or a mined crop (the crop_url of GET /v1/figures/{id}): streamed from the
    store, or a redirect to a presigned S3 URL."""
    return await crop_response(key=key, runtime=runtime, session=session)
