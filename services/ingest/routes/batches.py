from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, File, Form, Response, UploadFile, status
from fastapi.concurrency import run_in_threadpool

from p2p.ingest import batches as batch_service
from p2p.ingest.deps import IngestPrincipal, ReadPrincipal, RuntimeDep, SessionDep
from p2p.shared.db.models import Batch, BatchKind
from p2p.shared.errors import InvalidInput
from p2p.shared.images import digest_stream
from p2p.shared.schemas import BatchCreate, BatchItemPublic, BatchPublic
from p2p.shared.storage import validate_key

router = APIRouter(prefix="/v1/batches", tags=["batches"])

UPLOAD_SUFFIXES = {BatchKind.PMC: (".tar.gz", ".tgz"), BatchKind.WEBDATASET: (".tar",)}


def to_public(batch: Batch, failures: list[BatchItemPublic] | None = None) -> BatchPublic:
    public = BatchPublic.model_validate(
        {
            **{
                c: getattr(batch, c)
                for c in BatchPublic.model_fields
                if hasattr(batch, c) and c != "failures"
            },
            "processed": batch.ingested + batch.duplicates + batch.failed,
        }
    )
    public.failures = failures or []
    return public


@router.post("", status_code=status.HTTP_202_ACCEPTED, response_model=BatchPublic)
async def post_batch(
    body: BatchCreate, response: Response, runtime: RuntimeDep, session: SessionDep, _: IngestPrincipal
) -> BatchPublic:
    """Ingest a server-side source: a folder or S3 prefix with manifest.jsonl, WebDataset shards, or a
    PMC Open Access package. The source is checked before the batch is recorded."""
    await run_in_threadpool(
        batch_service.check_source, body.kind, body.source, store=runtime.store, settings=runtime.settings
    )
    batch = batch_service.create_batch(session, kind=body.kind, source=body.source)
    await run_in_threadpool(batch_service.enqueue_batch, runtime, batch)
    response.headers["Location"] = f"/v1/batches/{batch.id}"
    return to_public(batch)


@router.post("/upload", status_code=status.HTTP_202_ACCEPTED, response_model=BatchPublic)
async def upload_batch(
    response: Response,
    runtime: RuntimeDep,
    session: SessionDep,
    _: IngestPrincipal,
    kind: Annotated[BatchKind, Form(description="pmc (a .tar.gz package) or webdataset (a .tar shard)")],
    file: Annotated[UploadFile, File()],
) -> BatchPublic:
    """Upload one PMC package or WebDataset shard; it is validated before anything is stored."""
    suffixes = UPLOAD_SUFFIXES.get(kind)
    name = (file.filename or "").rsplit("/", 1)[-1]
    if suffixes is None or not name.endswith(suffixes):
        raise InvalidInput(
            "upload a .tar.gz PMC package (kind=pmc) or a .tar shard (kind=webdataset), "
            f"not {name!r} as {kind}",
            error_type="invalid_source",
        )
    settings = runtime.settings

    def store_upload() -> Batch:
        cap = settings.ingest.max_package_upload_bytes
        digest = digest_stream(file.file, max_bytes=cap)
        key = validate_key(f"uploads/{digest.sha256}/{name}")
        # Check against a scratch copy first so a refused package leaves no object behind.
        batch_service.check_upload(kind, file.file, name, settings=settings)
        if not runtime.store.exists(key):
            runtime.store.put(
                key,
                file.file,
                size=digest.size,
                sha256=digest.sha256,
                content_type="application/octet-stream",
            )
        return batch_service.create_batch(session, kind=kind, source=f"{batch_service.UPLOAD_SCHEME}{key}")

    batch = await run_in_threadpool(store_upload)
    await run_in_threadpool(batch_service.enqueue_batch, runtime, batch)
    response.headers["Location"] = f"/v1/batches/{batch.id}"
    return to_public(batch)


@router.get("/{batch_id}", response_model=BatchPublic)
def get_batch(batch_id: uuid.UUID, session: SessionDep, _: ReadPrincipal) -> BatchPublic:
    batch = batch_service.get_batch(session, batch_id)
    failures = [BatchItemPublic.model_validate(i) for i in batch_service.batch_failures(session, batch_id)]
    return to_public(batch, failures)
