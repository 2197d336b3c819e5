"""Figure images and mined crops, served the same way by every API (``GET /v1/crops/{key}``)."""

from __future__ import annotations

import mimetypes
from collections.abc import Iterator

from fastapi.concurrency import run_in_threadpool
from fastapi.responses import RedirectResponse, Response, StreamingResponse
from sqlalchemy import select, union_all
from sqlalchemy.orm import Session

from p2p.shared.db.models import Figure, Panel, Region
from p2p.shared.errors import NotFound
from p2p.shared.runtime import Runtime
from p2p.shared.storage import CHUNK, ObjectNotFound, ObjectStore, StorageError, validate_key

CROP_RESPONSES: dict[int | str, dict[str, str]] = {307: {"description": "S3: presigned URL"}}


def served_key(session: Session, key: str) -> bool:
    """Only figure images and mined crops are served, never other objects of the store."""
    query = union_all(
        select(Figure.id).where(Figure.object_key == key).limit(1),
        select(Panel.id).where(Panel.crop_key == key).limit(1),
        select(Region.id).where(Region.crop_key == key).limit(1),
    )
    return session.execute(query).first() is not None


def presigned_url(store: ObjectStore, key: str, *, ttl_s: int) -> str | None:
    presign = getattr(store, "presigned_url", None)
    if presign is None:
        return None
    try:
        return str(presign(key, expires_s=ttl_s))
    except StorageError:
        return None


async def crop_response(*, key: str, runtime: Runtime, session: Session) -> Response:
    """The object streamed from the store, or a redirect to a presigned S3 URL."""
    try:
        key = validate_key(key)
    except StorageError as exc:
        raise NotFound(f"no crop {key!r}") from exc
    if not await run_in_threadpool(served_key, session, key):
        raise NotFound(f"no crop {key!r}")
    ttl = runtime.settings.embedding.crop_url_ttl_s
    url = await run_in_threadpool(presigned_url, runtime.store, key, ttl_s=ttl)
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
