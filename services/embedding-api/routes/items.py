from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import Response

from p2p.embedding_api import service
from p2p.embedding_api.deps import ReadPrincipal, RuntimeDep, SessionDep
from p2p.embedding_api.schemas import CorpusPublic, PanelItemPublic, RegionItemPublic
from p2p.shared.crops import CROP_RESPONSES, crop_response
from p2p.shared.schemas import FigurePublic

router = APIRouter(prefix="/v1", tags=["items"])


@router.get("/corpus", response_model=CorpusPublic)
def get_corpus(
    session: SessionDep,
    _: ReadPrincipal,
    limit: Annotated[int, Query(ge=1, le=100)] = 12,
    offset: Annotated[int, Query(ge=0)] = 0,
) -> CorpusPublic:
    """Counts of figures, panels, regions and articles, and a page of the newest figures."""
    return service.corpus_overview(session, limit=limit, offset=offset)


@router.get("/figures/{figure_id}", response_model=FigurePublic)
def get_figure(figure_id: uuid.UUID, session: SessionDep, _: ReadPrincipal) -> FigurePublic:
    """A figure with its article, panels and regions (boxes, crops, both text pathways, provenance)."""
    return service.figure_detail(session, figure_id)


@router.get("/panels/{panel_id}", response_model=PanelItemPublic)
def get_panel(panel_id: uuid.UUID, session: SessionDep, _: ReadPrincipal) -> PanelItemPublic:
    return service.panel_item(session, panel_id)


@router.get("/regions/{region_id}", response_model=RegionItemPublic)
def get_region(region_id: uuid.UUID, session: SessionDep, _: ReadPrincipal) -> RegionItemPublic:
    return service.region_item(session, region_id)


@router.get("/crops/{key:path}", response_model=None, responses=CROP_RESPONSES)
async def get_crop(key: str, runtime: RuntimeDep, session: SessionDep, _: ReadPrincipal) -> Response:
    """A figure image or a mined crop: streamed from the store, or a redirect to a presigned S3 URL."""
    return await crop_response(key=key, runtime=runtime, session=session)
