"""Ingest one figure: validate, store content-addressed, record, enqueue mining."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import BinaryIO

from sqlalchemy import select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value

from p2p.shared.db.base import new_id, utcnow
from p2p.shared.db.models import Article, Figure, FigureStatus, JobStatus, MiningJob
from p2p.shared.errors import InvalidInput, broker_unavailable
from p2p.shared.images import ImageInfo, digest_upload, inspect_image
from p2p.shared.jobs import MINING
from p2p.shared.licenses import license_group, normalize_license
from p2p.shared.queue import MINE_FIGURE_TASK, TaskDispatcher, mining_queue
from p2p.shared.recovery import resend_if_stalled
from p2p.shared.runtime import Runtime
from p2p.shared.schemas import ArticleIn, FigureMetadata
from p2p.shared.settings import Settings
from p2p.shared.storage import ObjectStore, content_key

log = logging.getLogger(__name__)


Recorder = Callable[[Session, Figure, bool], None]  # (session, figure, duplicate)


@dataclass(frozen=True)
class IngestOutcome:
    figure: Figure
    job: MiningJob
    duplicate: bool


def caption_digest(caption: str) -> str:
    return hashlib.sha256(caption.encode("utf-8")).hexdigest()


def validate_caption(caption: str, *, max_chars: int) -> str:
    if len(caption) > max_chars:
        raise InvalidInput(
            f"caption has {len(caption)} characters, over the {max_chars}-character limit",
            error_type="caption_too_long",
        )
    if "\x00" in caption:
        raise InvalidInput("caption contains a NUL character", error_type="invalid_caption")
    if looks_like_multipart(caption):
        raise InvalidInput(
            "the caption is a multipart body, not text: curl -F reads a value starting with '(' as a "
            "nested multipart part and one starting with '@' or '<' as a file; send the caption with "
            "--form-string caption=...",
            error_type="invalid_caption",
        )
    return caption.strip()


# A multipart delimiter line: "--" and a boundary of RFC 2046's characters, "--" after the last.
_DELIMITER = re.compile(r"--([0-9A-Za-z'()+_,./:=?-]{1,70}?)(--)?")


def looks_like_multipart(caption: str) -> bool:
    """True when the text is a (nested) multipart body: its first line is a delimiter and the
    matching close delimiter ends a line of it. curl sends `-F "caption=(A) ..."` as an empty
    nested multipart/mixed part, which a form parser hands on as that body."""
    lines = [line.rstrip() for line in caption.strip().splitlines()]
    match = _DELIMITER.fullmatch(lines[0]) if lines else None
    if match is None:
        return False
    if match.group(2):  # the body is one close delimiter: an empty multipart
        return len(lines) == 1
    return f"--{match.group(1)}--" in lines[1:]


def ingest_figure(
    *,
    session: Session,
    store: ObjectStore,
    dispatcher: TaskDispatcher,
    settings: Settings,
    image: BinaryIO,
    caption: str,
    metadata: FigureMetadata,
    source: str,
    record: Recorder | None = None,
) -> IngestOutcome:
    """Every check runs before the first write, so rejected input leaves no row and no object.

    ``record`` writes what the caller keeps about the figure (a batch item) in the figure's own
    transaction, so a process killed in between cannot leave one without the other."""
    caption = validate_caption(caption, max_chars=settings.ingest.max_caption_chars)
    # From here on ``image`` is the upload as hashed: its bytes in memory (the store sends them
    # without reading and hashing them again) unless it is too large to hold.
    digest, image = digest_upload(image, max_bytes=settings.ingest.max_upload_bytes)
    if digest.size == 0:
        raise InvalidInput("the image is empty", error_type="not_an_image")
    info = inspect_image(
        image, allowed_formats=settings.ingest.allowed_formats, max_pixels=settings.ingest.max_pixels
    )
    caption_sha = caption_digest(caption)

    existing = _find_figure(session, digest.sha256, caption_sha)
    if existing is not None:
        job = _ensure_job(session, existing, settings)
        if record is not None:
            record(session, existing, True)
        stamp = _stamp_unsent(job, dispatcher)
        session.commit()
        _dispatch(session, dispatcher, job, settings=settings, stamp=stamp)
        return _stored(IngestOutcome(figure=existing, job=job, duplicate=True))

    key = content_key(digest.sha256, info.extension)
    # Content-addressed: writing the same bytes to the same key again is harmless, so no HEAD first.
    # The upload runs beside the figure's INSERT; the commit waits for it, so no reader ever sees a
    # row whose object is not stored, and a failed upload rolls the rows back.
    put = PutInBackground(
        lambda: store.put(key, image, size=digest.size, sha256=digest.sha256, content_type=info.content_type)
    )
    try:
        article = _upsert_article(session, metadata.article) if metadata.article else None
        figure = _insert_figure(
            session,
            image_sha=digest.sha256,
            caption_sha=caption_sha,
            key=key,
            size=digest.size,
            info=info,
            caption=caption,
            metadata=metadata,
            article=article,
            source=source,
        )
        if figure is not None:
            # A figure created in this transaction cannot have a job yet: no lookup, no savepoint.
            # Its enqueued_at goes in with it: the commit that makes the job visible says it is
            # sent (a publish that fails clears it again, see _dispatch).
            job = MiningJob(figure_id=figure.id, backend=settings.mining.backend, status=JobStatus.QUEUED)
            stamp = _stamp_unsent(job, dispatcher)
            session.add(job)
            if record is not None:
                record(session, figure, False)
            session.flush()
    finally:
        failed = put.wait()  # the caller's stream is its own again only once the upload has read it
    if failed is not None:
        session.rollback()
        raise failed
    if figure is None:
        # Another request stored the same figure between our lookup and insert.
        raced = _find_figure(session, digest.sha256, caption_sha)
        assert raced is not None
        job = _ensure_job(session, raced, settings)
        if record is not None:
            record(session, raced, True)
        stamp = _stamp_unsent(job, dispatcher)
        session.commit()
        _dispatch(session, dispatcher, job, settings=settings, stamp=stamp)
        return _stored(IngestOutcome(figure=raced, job=job, duplicate=True))
    session.commit()
    _dispatch(session, dispatcher, job, settings=settings, stamp=stamp)
    return _stored(IngestOutcome(figure=figure, job=job, duplicate=False))


def ingest_one(
    *,
    runtime: Runtime,
    image: BinaryIO,
    caption: str,
    metadata: FigureMetadata,
    source: str,
    record: Recorder | None = None,
) -> IngestOutcome:
    """:func:`ingest_figure` in a session of its own (the rows stay readable after it closes:
    the session does not expire them on commit)."""
    with runtime.session() as session:
        return ingest_figure(
            session=session,
            store=runtime.store,
            dispatcher=runtime.dispatcher,
            settings=runtime.settings,
            image=image,
            caption=caption,
            metadata=metadata,
            source=source,
            record=record,
        )


def _stored(outcome: IngestOutcome) -> IngestOutcome:
    log.info(
        "figure %s %s; mining job %s %s",
        outcome.figure.id,
        "was stored before" if outcome.duplicate else "stored",
        outcome.job.id,
        outcome.job.status,
        extra={
            "figure_id": str(outcome.figure.id),
            "job_kind": MINING.name,
            "job_id": str(outcome.job.id),
            "outcome": "duplicate" if outcome.duplicate else "stored",
        },
    )
    return outcome


class PutInBackground:
    """An object store write on a thread of its own, started as soon as the object's key is known.
    A thread per upload (not a pool): nothing to rebuild in a forked worker, and its start-up is
    small beside a megabyte's upload."""

    def __init__(self, put: Callable[[], None]) -> None:
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(put,), name="p2p-ingest-put", daemon=True)
        self._thread.start()

    def _run(self, put: Callable[[], None]) -> None:
        try:
            put()
        except BaseException as exc:  # handed to the ingesting thread by wait()
            self._error = exc

    def wait(self) -> BaseException | None:
        """Block until the write is done; its exception, if it failed."""
        self._thread.join()
        return self._error


def _insert_figure(
    session: Session,
    *,
    image_sha: str,
    caption_sha: str,
    key: str,
    size: int,
    info: ImageInfo,
    caption: str,
    metadata: FigureMetadata,
    article: Article | None,
    source: str,
) -> Figure | None:
    """INSERT the figure (sent now, committed by the caller); None when the same image and caption
    were stored by another request since the lookup."""
    return session.scalars(
        insert(Figure)
        .values(
            id=new_id(),
            image_sha256=image_sha,
            caption_sha256=caption_sha,
            object_key=key,
            byte_size=size,
            width=info.width,
            height=info.height,
            format=info.format,
            caption=caption,
            figure_label=metadata.figure_label,
            inline_references=list(metadata.inline_references),
            article_id=article.id if article is not None else None,
            source=source,
            source_ref=metadata.source_ref,
            status=FigureStatus.QUEUED,
        )
        .on_conflict_do_nothing(constraint="uq_figure_image_caption")
        .returning(Figure)
    ).first()


def _find_figure(session: Session, image_sha: str, caption_sha: str) -> Figure | None:
    return session.scalars(
        select(Figure).where(Figure.image_sha256 == image_sha, Figure.caption_sha256 == caption_sha)
    ).first()


def _find_job(session: Session, figure: Figure, backend: str) -> MiningJob | None:
    """The figure's job on ``backend`` whose rows stand (whatever miner version made them): an upload
    of a figure mined before is a duplicate; re-mining with a newer miner is ``p2p mine --stale``."""
    return session.scalars(
        select(MiningJob)
        .where(
            MiningJob.figure_id == figure.id,
            MiningJob.backend == backend,
            MiningJob.superseded_by_id.is_(None),
        )
        .order_by(MiningJob.created_at.desc())
    ).first()


def _ensure_job(session: Session, figure: Figure, settings: Settings) -> MiningJob:
    backend = settings.mining.backend
    job = _find_job(session, figure, backend)
    if job is not None:
        return job
    # No miner version yet: the worker that mines it records its own.
    job = MiningJob(figure_id=figure.id, backend=backend, status=JobStatus.QUEUED)
    try:
        with session.begin_nested():
            session.add(job)
    except IntegrityError:
        raced = _find_job(session, figure, backend)
        if raced is None:
            raise
        job = raced
    return job


def _send_job(dispatcher: TaskDispatcher, job: MiningJob) -> bool:
    """Publish the job's mining task; False when the dispatcher does not take it here."""
    return dispatcher.send(MINE_FIGURE_TASK, args=[str(job.id)], queue=mining_queue(job.backend))


def _job_accepted(dispatcher: TaskDispatcher, job: MiningJob) -> bool:
    """Whether :func:`_send_job` would hand the job over, without sending it."""
    return dispatcher.accepts(MINE_FIGURE_TASK, mining_queue(job.backend))


def _stamp_unsent(job: MiningJob, dispatcher: TaskDispatcher) -> datetime | None:
    """Marks a queued job never sent as sent now, to go in with the caller's commit (the publish
    follows the commit: the worker that takes the job must find it); None when it was sent before,
    or when this process's dispatcher would not take it (an in-process queue that does not serve
    mining: the job stays queued, never sent, with no stamp to clear)."""
    if job.enqueued_at is not None or job.status != JobStatus.QUEUED:
        return None
    if not _job_accepted(dispatcher, job):
        return None
    job.enqueued_at = utcnow()
    return job.enqueued_at


def _dispatch(
    session: Session,
    dispatcher: TaskDispatcher,
    job: MiningJob,
    *,
    settings: Settings,
    stamp: datetime | None,
) -> None:
    """Hand the job to the mining queue once; the same upload again re-sends a job never sent, and
    one stalled (its message lost, its worker gone).

    ``stamp``: the job's ``enqueued_at`` as committed just before (:func:`_stamp_unsent`), so it
    is sent now. One commit per upload instead of two: the stamp goes in with the figure's rows.
    When the broker refuses or cannot be reached, the stamp is cleared in a commit of its own, so
    the job reads as never sent (a re-upload sends it at once). Until then (and if that commit
    fails too) the recovery sweep finds a queued job whose message is on no queue and sends it once
    ``requeue_after_s`` has passed (``p2p.shared.recovery``)."""
    try:
        if stamp is not None:
            if _send_job(dispatcher, job):
                return
            _unstamp(session, job, stamp)
            return
        if job.enqueued_at is None and job.status == JobStatus.QUEUED:
            # Never sent, and the dispatcher said it would not take it: it says so again (and logs
            # that the job stays queued); should it take it after all, the stamp follows.
            if _send_job(dispatcher, job):
                job.enqueued_at = utcnow()
                session.commit()
            return
        reason = resend_if_stalled(session, dispatcher=dispatcher, settings=settings, kind=MINING, row=job)
        if reason is not None:
            log.warning("mining job %s was stalled (%s): sent again", job.id, reason)
            session.commit()
    except Exception as exc:
        log.warning("could not enqueue mining job %s: %s", job.id, exc)
        if stamp is not None:
            with contextlib.suppress(Exception):
                _unstamp(session, job, stamp)
        raise broker_unavailable(
            f"figure {job.figure_id} is stored but its mining job {job.id}", exc
        ) from exc


def _unstamp(session: Session, job: MiningJob, stamp: datetime) -> None:
    """The job was not sent after all: back to never sent, unless a worker or a sweep has moved it."""
    session.execute(
        update(MiningJob)
        .where(MiningJob.id == job.id, MiningJob.enqueued_at == stamp, MiningJob.status == JobStatus.QUEUED)
        .values(enqueued_at=None)
        .execution_options(synchronize_session=False)
    )
    session.commit()
    set_committed_value(job, "enqueued_at", None)


def _upsert_article(session: Session, data: ArticleIn) -> Article | None:
    if not data.has_identity():
        return None
    article = _find_article(session, data)
    if article is None:
        article = Article()
        _fill_article(article, data)
        try:
            with session.begin_nested():
                session.add(article)
        except IntegrityError:
            article = _find_article(session, data)
            if article is None:
                raise
    else:
        _fill_article(article, data, only_missing=True)
    return article


def _find_article(session: Session, data: ArticleIn) -> Article | None:
    for column, value in ((Article.pmcid, data.pmcid), (Article.pmid, data.pmid), (Article.doi, data.doi)):
        if value:
            found = session.scalars(select(Article).where(column == value)).first()
            if found is not None:
                return found
    return None


def _fill_article(article: Article, data: ArticleIn, *, only_missing: bool = False) -> None:
    for field in ("pmcid", "pmid", "doi", "title", "abstract", "journal", "year"):
        value = getattr(data, field)
        if value is not None and (not only_missing or getattr(article, field) is None):
            setattr(article, field, value)
    if data.license and (not only_missing or article.license is None):
        article.license = normalize_license(data.license)
        article.license_group = license_group(data.license)
