"""Server-side bulk ingestion: validate a source, record a Batch, and run it item by item.

A batch run is resumable and idempotent: every item is recorded under a unique (batch, item key),
so a re-delivered task skips what it already did, and figures themselves are deduplicated.
"""

from __future__ import annotations

import io
import logging
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, BinaryIO

from sqlalchemy import func, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from p2p.ingest.service import ingest_figure
from p2p.ingest.sources.base import ItemError, SourceError, SourceItem
from p2p.ingest.sources.files import FileTooLarge, LocalFiles, S3Files, SourceFiles
from p2p.ingest.sources.manifest import iter_manifest
from p2p.ingest.sources.pmc import iter_pmc_package
from p2p.ingest.sources.webdataset import ShardLimits, check_shard, iter_webdataset
from p2p.shared import jobs as durable
from p2p.shared.db.models import Batch, BatchItem, BatchItemStatus, BatchKind, BatchStatus
from p2p.shared.errors import Forbidden, InvalidInput, NotFound, P2PError, broker_unavailable
from p2p.shared.runtime import Runtime
from p2p.shared.settings import Settings
from p2p.shared.storage import ObjectStore, S3ObjectStore

log = logging.getLogger(__name__)

UPLOAD_SCHEME = "upload:"
MANIFEST_NAME = "manifest.jsonl"
PMC_SUFFIXES = (".tar.gz", ".tgz")


def _source_files(
    source: str, runtime_store: ObjectStore, settings: Settings, *, trusted: bool = False
) -> tuple[SourceFiles, str]:
    """Map a source string to readable files and the name inside them.

    ``s3://bucket/prefix/name`` (same credentials as the object store), ``upload:<key>`` (an object we
    stored from a client upload), or a server path inside one of the configured batch roots.
    """
    if source.startswith("s3://"):
        if not isinstance(runtime_store, S3ObjectStore):
            raise InvalidInput("s3:// sources need the S3 object store", error_type="source_not_allowed")
        bucket, _, rest = source[5:].partition("/")
        prefix, _, name = rest.rpartition("/")
        return S3Files(runtime_store.client, bucket, prefix), name
    if source.startswith(UPLOAD_SCHEME):
        key = source[len(UPLOAD_SCHEME) :]
        prefix, _, name = key.rpartition("/")
        return _StoreFiles(runtime_store, prefix), name
    if not trusted and source.startswith("~"):
        # A home folder is the server user's business, not a client's ("~user" may not even exist).
        raise InvalidInput(f"{source}: give server paths in full, without ~", error_type="invalid_source")
    try:
        path = Path(source).expanduser().resolve()
    except RuntimeError as exc:  # "~nosuchuser"
        raise InvalidInput(f"{source}: {exc}", error_type="source_not_found") from exc
    roots = [root.expanduser().resolve() for root in settings.ingest.batch_roots]
    if not trusted and not any(path == root or root in path.parents for root in roots):
        raise Forbidden(
            f"{source} is outside the folders this server reads batches from (P2P_INGEST__BATCH_ROOTS)",
            error_type="source_not_allowed",
        )
    if not path.exists():
        raise InvalidInput(f"{source} does not exist", error_type="source_not_found")
    if path.is_dir():
        return LocalFiles(path), ""
    return LocalFiles(path.parent), path.name


class _StoreFiles:
    """Read-only view of uploaded objects under one prefix of our own store."""

    def __init__(self, store: ObjectStore, prefix: str) -> None:
        self.store, self.prefix = store, prefix.strip("/")
        self.describe = f"{store.description}/{self.prefix}"

    def _key(self, rel: str) -> str:
        return f"{self.prefix}/{rel}" if self.prefix else rel

    def list(self, suffixes: tuple[str, ...]) -> list[str]:
        start = len(self.prefix) + 1 if self.prefix else 0
        return sorted(k[start:] for k in self.store.list(self.prefix + "/") if k.endswith(suffixes))

    def exists(self, rel: str) -> bool:
        return self.store.exists(self._key(rel))

    def size(self, rel: str) -> int:
        return self.store.size(self._key(rel))

    def open(self, rel: str) -> BinaryIO:
        return self.store.open(self._key(rel))

    def read_bytes(self, rel: str, max_bytes: int) -> bytes:
        size = self.store.size(self._key(rel))
        if size > max_bytes:
            raise FileTooLarge(rel, size, max_bytes)
        return self.store.get_bytes(self._key(rel))

    def download(self, rel: str, fileobj: BinaryIO) -> None:
        fileobj.write(self.store.get_bytes(self._key(rel)))


@contextmanager
def open_items(
    kind: BatchKind, source: str, *, store: ObjectStore, settings: Settings, trusted: bool = False
) -> Iterator[Iterator[SourceItem | ItemError]]:
    """Items of a source; raises SourceError (or a P2PError) when the source cannot be read at all.

    ``trusted`` lifts the batch-root restriction on server paths: the CLI reads its user's own files.
    """
    files, name = _source_files(source, store, settings, trusted=trusted)
    cap = settings.ingest.max_upload_bytes
    with ExitStack() as stack:
        if kind is BatchKind.MANIFEST:
            manifest = name or MANIFEST_NAME
            if not manifest.endswith(".jsonl"):
                raise InvalidInput(
                    f"a manifest source names a folder or a .jsonl file, not {source}",
                    error_type="invalid_source",
                )
            yield iter_manifest(files, manifest, max_image_bytes=cap)
        elif kind is BatchKind.WEBDATASET:
            shard_names = [name] if name else files.list((".tar",))
            if not shard_names:
                raise SourceError("no_shards", f"no .tar shards in {source}")
            yield _iter_shards(files, shard_names, stack, settings)
        else:
            if not name.endswith(PMC_SUFFIXES):
                raise InvalidInput(
                    f"a PMC package is a .tar.gz file, not {source}", error_type="invalid_source"
                )
            spool = stack.enter_context(tempfile.TemporaryFile())
            files.download(name, spool)
            spool.seek(0)
            yield pmc_items(spool, name, settings)


def pmc_items(stream: BinaryIO, name: str, settings: Settings) -> Iterator[SourceItem | ItemError]:
    return iter_pmc_package(
        stream,
        name,
        max_image_bytes=settings.ingest.max_upload_bytes,
        max_members=settings.ingest.max_package_members,
        max_total_bytes=settings.ingest.max_package_bytes,
    )


def shard_limits(settings: Settings) -> ShardLimits:
    return ShardLimits(
        max_members=settings.ingest.max_package_members, max_total_bytes=settings.ingest.max_package_bytes
    )


def _iter_shards(
    files: SourceFiles, names: list[str], stack: ExitStack, settings: Settings
) -> Iterator[SourceItem | ItemError]:
    cap = settings.ingest.max_upload_bytes

    def shards() -> Iterator[tuple[str, BinaryIO]]:
        for shard in names:
            handle = stack.enter_context(files.open(shard))
            yield shard, handle

    yield from iter_webdataset(shards(), max_image_bytes=cap, limits=shard_limits(settings))


def check_source(
    kind: BatchKind, source: str, *, store: ObjectStore, settings: Settings, trusted: bool = False
) -> None:
    """Refuse an unusable source before a batch is recorded (first item parsed, nothing stored)."""
    try:
        with open_items(kind, source, store=store, settings=settings, trusted=trusted) as items:
            next(items, None)
    except SourceError as exc:
        raise InvalidInput(exc.message, error_type=exc.error_type) from exc
    except FileNotFoundError as exc:
        raise InvalidInput(f"{source}: {exc}", error_type="source_not_found") from exc


def check_upload(kind: BatchKind, stream: BinaryIO, name: str, *, settings: Settings) -> None:
    """Refuse an uploaded package or shard before it is stored (first item parsed; a shard's
    headers all walked within its limits)."""
    stream.seek(0)
    try:
        if kind is BatchKind.PMC:
            items = pmc_items(stream, name, settings)
        else:
            check_shard(name, stream, shard_limits(settings))
            stream.seek(0)
            items = iter_webdataset(
                [(name, stream)],
                max_image_bytes=settings.ingest.max_upload_bytes,
                limits=shard_limits(settings),
            )
        next(items, None)
    except SourceError as exc:
        raise InvalidInput(exc.message, error_type=exc.error_type) from exc
    finally:
        stream.seek(0)


def create_batch(session: Session, *, kind: BatchKind, source: str) -> Batch:
    """A new batch, or the one the same request left unsent (the broker was down): sending the
    request again completes that batch instead of recording a second one."""
    unsent = session.scalars(
        select(Batch)
        .where(
            Batch.kind == kind,
            Batch.source == source,
            Batch.status == BatchStatus.QUEUED,
            Batch.enqueued_at.is_(None),
        )
        .order_by(Batch.created_at)
        .limit(1)
    ).first()
    if unsent is not None:
        return unsent
    batch = Batch(kind=kind, source=source, status=BatchStatus.QUEUED)
    session.add(batch)
    session.commit()
    return batch


def enqueue_batch(runtime: Runtime, batch: Batch) -> None:
    """Send the batch to the ingest queue; a broker that cannot take it is a 503 naming the batch."""
    try:
        with runtime.session() as session:
            row = get_batch(session, batch.id)
            durable.send(runtime, durable.INGEST_BATCH, row)
            session.commit()
            batch.enqueued_at = row.enqueued_at
    except P2PError:
        raise
    except Exception as exc:
        log.warning("could not queue batch %s: %s", batch.id, exc)
        raise broker_unavailable(
            f"batch {batch.id} is recorded but", exc, location=f"/v1/batches/{batch.id}"
        ) from exc


def get_batch(session: Session, batch_id: uuid.UUID) -> Batch:
    batch = session.get(Batch, batch_id)
    if batch is None:
        raise NotFound(f"no batch {batch_id}")
    return batch


def batch_failures(session: Session, batch_id: uuid.UUID, limit: int = 100) -> list[BatchItem]:
    return list(
        session.scalars(
            select(BatchItem)
            .where(BatchItem.batch_id == batch_id, BatchItem.status == BatchItemStatus.FAILED)
            .order_by(BatchItem.created_at)
            .limit(limit)
        )
    )


ItemCallback = Callable[[SourceItem | ItemError, BatchItemStatus], None]


def run_batch(
    runtime: Runtime, batch_id: uuid.UUID, *, trusted: bool = False, on_item: ItemCallback | None = None
) -> Batch:
    """Run (or resume) a batch under its durable-job claim; another worker's batch is left alone."""
    with durable.claim(runtime, durable.INGEST_BATCH, batch_id) as lease:
        if lease is None:
            with runtime.session() as session:
                return get_batch(session, batch_id)
        return _run_claimed(runtime, lease, trusted=trusted, on_item=on_item)


def _run_claimed(
    runtime: Runtime, lease: durable.Lease, *, trusted: bool, on_item: ItemCallback | None
) -> Batch:
    batch_id = lease.job_id
    with runtime.session() as session:
        batch = get_batch(session, batch_id)
        if batch.status in (BatchStatus.SUCCEEDED, BatchStatus.COMPLETED_WITH_ERRORS, BatchStatus.FAILED):
            return batch
        durable.start(session, lease, batch)
        session.commit()
        durable.flush_events(runtime, session)
        done = set(session.scalars(select(BatchItem.item_key).where(BatchItem.batch_id == batch_id)))
        kind, source = batch.kind, batch.source

    seen = len(done)
    try:
        with open_items(
            kind, source, store=runtime.store, settings=runtime.settings, trusted=trusted
        ) as items:
            for item in items:
                if item.key in done:
                    continue
                seen += 1
                status = _process_item(runtime, batch_id, item)
                if on_item is not None:
                    on_item(item, status)
    except (SourceError, P2PError, OSError) as exc:
        error_type = getattr(exc, "error_type", type(exc).__name__)
        message = getattr(exc, "message", str(exc))
        log.warning("batch %s failed: %s: %s", batch_id, error_type, message)
        return _finish(runtime, lease, error=f"{error_type}: {message}")
    return _finish(runtime, lease, total=seen)


def _record_item(
    session: Session,
    *,
    batch_id: uuid.UUID,
    key: str,
    status: BatchItemStatus,
    figure_id: uuid.UUID | None = None,
    error_type: str | None = None,
    error_message: str | None = None,
) -> None:
    """The item's row and its batch counter, in the caller's transaction (the figure's own)."""
    counter = {
        BatchItemStatus.INGESTED: Batch.ingested,
        BatchItemStatus.DUPLICATE: Batch.duplicates,
        BatchItemStatus.FAILED: Batch.failed,
    }[status]
    inserted = session.execute(
        insert(BatchItem)
        .values(
            id=uuid.uuid4(),
            batch_id=batch_id,
            item_key=key,
            status=status,
            figure_id=figure_id,
            error_type=error_type,
            error_message=error_message,
        )
        .on_conflict_do_nothing(constraint="uq_batch_item_key")
        .returning(BatchItem.id)
    ).first()
    if inserted is not None:
        session.execute(update(Batch).where(Batch.id == batch_id).values({counter: counter + 1}))


def _process_item(runtime: Runtime, batch_id: uuid.UUID, item: SourceItem | ItemError) -> BatchItemStatus:
    if not isinstance(item, ItemError):
        recorded: list[BatchItemStatus] = []

        def record(session: Session, figure: Any, duplicate: bool) -> None:
            status = BatchItemStatus.DUPLICATE if duplicate else BatchItemStatus.INGESTED
            _record_item(session, batch_id=batch_id, key=item.key, status=status, figure_id=figure.id)
            recorded.append(status)

        try:
            with runtime.session() as session:
                ingest_figure(
                    session=session,
                    store=runtime.store,
                    dispatcher=runtime.dispatcher,
                    settings=runtime.settings,
                    image=io.BytesIO(item.image),
                    caption=item.caption,
                    metadata=item.metadata,
                    source="batch",
                    record=record,
                )
            return recorded[-1]
        except P2PError as exc:
            if recorded:  # stored with its item; only queueing its mining failed (the sweep sends it)
                log.warning("batch %s item %s: %s", batch_id, item.key, exc.message)
                return recorded[-1]
            item = ItemError(item.key, exc.error_type, exc.message)
    with runtime.session() as session:
        _record_item(
            session,
            batch_id=batch_id,
            key=item.key,
            status=BatchItemStatus.FAILED,
            error_type=item.error_type,
            error_message=item.message,
        )
        session.commit()
    return BatchItemStatus.FAILED


def _finish(
    runtime: Runtime, lease: durable.Lease, *, total: int | None = None, error: str | None = None
) -> Batch:
    batch_id = lease.job_id
    with runtime.session() as session:
        batch = get_batch(session, batch_id)
        counts = dict(
            session.execute(
                select(BatchItem.status, func.count())
                .where(BatchItem.batch_id == batch_id)
                .group_by(BatchItem.status)
            ).all()
        )
        batch.ingested = counts.get(BatchItemStatus.INGESTED, 0)
        batch.duplicates = counts.get(BatchItemStatus.DUPLICATE, 0)
        batch.failed = counts.get(BatchItemStatus.FAILED, 0)
        if error is not None:
            batch.error = error
            durable.finish(session, lease, batch, status=BatchStatus.FAILED, phase=durable.Phase.FAILED)
        else:
            batch.total = total
            status = BatchStatus.COMPLETED_WITH_ERRORS if batch.failed else BatchStatus.SUCCEEDED
            durable.finish(session, lease, batch, status=status)
        session.commit()
        durable.flush_events(runtime, session)
    _clean_upload(runtime, batch)
    return batch


def _clean_upload(runtime: Runtime, batch: Batch) -> None:
    """An uploaded package is only the batch's input: gone once the batch ended, unless another
    batch of the same upload (the same bytes, content-addressed) still needs it."""
    if not batch.source.startswith(UPLOAD_SCHEME):
        return
    with runtime.session() as session:
        others = session.scalar(
            select(func.count())
            .select_from(Batch)
            .where(
                Batch.source == batch.source,
                Batch.id != batch.id,
                Batch.status.in_((BatchStatus.QUEUED, BatchStatus.RUNNING)),
            )
        )
    if others:
        return
    try:
        runtime.store.delete(batch.source[len(UPLOAD_SCHEME) :])
    except Exception as exc:  # the batch's result stands; the orphan is only space
        log.warning("could not delete the upload of batch %s: %s", batch.id, exc)
