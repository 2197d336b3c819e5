"""The ingest service function on its own: concurrency, article merging, image checks."""

from __future__ import annotations

import hashlib
import io
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, BinaryIO

import numpy as np
import pytest
from PIL import Image
from sqlalchemy import event

from p2p.ingest.service import ingest_one
from p2p.shared import images
from p2p.shared.errors import InvalidInput, PayloadTooLarge, UnsupportedMediaType
from p2p.shared.images import digest_stream, digest_upload, inspect_image
from p2p.shared.runtime import Runtime
from p2p.shared.schemas import ArticleIn, FigureMetadata
from p2p.shared.storage import HashedBytes, StorageError
from tests.helpers import Sha256Bytes, image_bytes, object_count, row_counts


def _ingest(
    runtime: Runtime, data: bytes, caption: str, metadata: FigureMetadata | None = None, record: Any = None
):  # type: ignore[no-untyped-def]
    return ingest_one(
        runtime=runtime,
        image=io.BytesIO(data),
        caption=caption,
        metadata=metadata or FigureMetadata(),
        source="test",
        record=record,
    )


@pytest.mark.parametrize("store_kind", ["local"], indirect=True)
def test_concurrent_identical_uploads_make_one_figure(runtime: Runtime) -> None:
    data = image_bytes("PNG", (400, 300), seed=90)
    meta = FigureMetadata(article=ArticleIn(pmcid="PMC42", title="t"))
    with ThreadPoolExecutor(8) as pool:
        outcomes = list(pool.map(lambda _: _ingest(runtime, data, "same caption", meta), range(8)))
    assert len({o.figure.id for o in outcomes}) == 1
    assert len({o.job.id for o in outcomes}) == 1
    assert sum(not o.duplicate for o in outcomes) == 1
    assert row_counts(runtime.engine) == {"figure": 1, "article": 1, "job": 1, "batch": 0}
    assert object_count(runtime.store) == 1


class UploadWhenRowSent:
    """A store whose put waits until the figure's INSERT has reached the database (so the test fails
    if the upload and the row write do not overlap), looks from a second session, then fails or
    stores as told."""

    def __init__(self, runtime: Runtime, *, fail: bool) -> None:
        self.inner, self.runtime, self.fail = runtime.store, runtime, fail
        self.row_sent = threading.Event()
        self.seen_by_reader: int | None = None

        @event.listens_for(runtime.engine, "after_cursor_execute")
        def sent(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
            if statement.lstrip().upper().startswith("INSERT INTO FIGURE"):
                self.row_sent.set()

    def put(self, key: str, stream: BinaryIO, **kwargs: Any) -> None:
        assert self.row_sent.wait(timeout=30), "the upload ran alone, not beside the row write"
        self.seen_by_reader = row_counts(self.runtime.engine)["figure"]
        if self.fail:
            raise StorageError("the object store refused the upload")
        self.inner.put(key, stream, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@pytest.mark.parametrize("store_kind", ["local"], indirect=True)
@pytest.mark.parametrize("fail", [True, False])
def test_upload_and_row_write_overlap_and_readers_never_see_a_row_before_its_object(
    runtime: Runtime, fail: bool
) -> None:
    store = UploadWhenRowSent(runtime, fail=fail)
    runtime.store = store  # type: ignore[assignment]
    data = image_bytes("PNG", (300, 200), seed=91)
    if fail:
        with pytest.raises(StorageError):
            _ingest(runtime, data, "a caption")
        assert row_counts(runtime.engine) == {"figure": 0, "article": 0, "job": 0, "batch": 0}
        assert object_count(store.inner) == 0
    else:
        outcome = _ingest(runtime, data, "a caption")
        assert not outcome.duplicate
        assert row_counts(runtime.engine)["figure"] == 1
        assert store.inner.get_bytes(outcome.figure.object_key) == data
    assert store.seen_by_reader == 0  # the row was sent, not committed, while the upload ran


@pytest.mark.parametrize("store_kind", ["local"], indirect=True)
def test_a_failed_row_write_waits_for_the_upload_and_a_retry_stores_the_figure(runtime: Runtime) -> None:
    data = image_bytes("PNG", (300, 200), seed=92)

    def broken_record(session: Any, figure: Any, duplicate: bool) -> None:
        raise RuntimeError("the batch item could not be written")

    with pytest.raises(RuntimeError):
        _ingest(runtime, data, "c", record=broken_record)
    # No row; the upload had finished before the error was raised (the stream was not read after
    # the caller got it back). The object it left is content-addressed: no row points at it, and
    # the retry writes the same key.
    assert row_counts(runtime.engine) == {"figure": 0, "article": 0, "job": 0, "batch": 0}
    assert object_count(runtime.store) == 1
    outcome = _ingest(runtime, data, "c")
    assert not outcome.duplicate and runtime.store.get_bytes(outcome.figure.object_key) == data
    assert object_count(runtime.store) == 1


@pytest.mark.parametrize("store_kind", ["local"], indirect=True)
def test_article_found_by_any_id_and_completed(runtime: Runtime) -> None:
    first = _ingest(runtime, image_bytes(seed=91), "a", FigureMetadata(article=ArticleIn(doi="10.1/x")))
    second = _ingest(
        runtime,
        image_bytes(seed=92),
        "b",
        FigureMetadata(article=ArticleIn(doi="10.1/x", pmcid="PMC5", license="CC BY-SA 4.0")),
    )
    assert first.figure.article_id == second.figure.article_id
    with runtime.session() as session:
        from p2p.shared.db.models import Article

        article = session.get(Article, first.figure.article_id)
        assert article is not None
        assert article.pmcid == "PMC5" and article.license == "CC BY-SA 4.0"
        assert article.license_group.value == "commercial"


def test_digest_refuses_past_the_cap_without_reading_on() -> None:
    class Counting(io.BytesIO):
        read_bytes = 0

        def read(self, size: int | None = -1) -> bytes:
            chunk = super().read(size)
            Counting.read_bytes += len(chunk)
            return chunk

    stream = Counting(b"x" * (10 * 1024 * 1024))
    with pytest.raises(PayloadTooLarge):
        digest_stream(stream, max_bytes=1024 * 1024)
    assert Counting.read_bytes <= 2 * 1024 * 1024


def test_an_upload_that_fits_in_memory_is_hashed_into_bytes_the_store_sends_as_they_are() -> None:
    data = b"x" * 5000
    digest, body = digest_upload(io.BytesIO(data), max_bytes=5000)
    assert isinstance(body, HashedBytes) and body.data == data
    assert (digest.sha256, digest.size) == (hashlib.sha256(data).hexdigest(), 5000) == (body.sha256, 5000)
    with pytest.raises(PayloadTooLarge):
        digest_upload(io.BytesIO(data), max_bytes=4999)


def test_an_upload_too_large_to_hold_is_hashed_in_chunks_and_handed_back_rewound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(images, "IN_MEMORY_BYTES", 1000)
    data = bytes(range(256)) * 20
    stream = io.BytesIO(data)
    digest, body = digest_upload(stream, max_bytes=len(data))
    assert body is stream and stream.tell() == 0
    assert (digest.sha256, digest.size) == (hashlib.sha256(data).hexdigest(), len(data))
    for cap in (len(data) - 1, 1000):  # over the cap in the chunks, and right past the first read
        with pytest.raises(PayloadTooLarge):
            digest_upload(io.BytesIO(data), max_bytes=cap)


@pytest.mark.parametrize("store_kind", ["s3", "local"], indirect=True)
def test_a_new_figure_is_hashed_once_from_upload_to_store(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bytes hashed on arrival are the bytes the store sends: no second sha256 of the upload."""
    noise = np.random.default_rng(91).integers(0, 256, (300, 400, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(noise).save(out, format="PNG")
    data = out.getvalue()  # ~360 kB: far more than what else is hashed on the way
    hashed = Sha256Bytes().install(monkeypatch)
    outcome = _ingest(runtime, data, "hashed once")
    assert not outcome.duplicate
    # One pass over the upload; the rest is the caption's hash and the request's signature.
    assert len(data) <= hashed.total < len(data) + 4096
    assert runtime.store.get_bytes(outcome.figure.object_key) == data


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "TIFF", "GIF", "BMP", "WEBP"])
def test_allowed_formats_are_inspected(fmt: str) -> None:
    data = image_bytes(fmt, (33, 21), seed=3)
    info = inspect_image(
        io.BytesIO(data), allowed_formats=("JPEG", "PNG", "TIFF", "GIF", "BMP", "WEBP"), max_pixels=10_000
    )
    assert (info.format, info.width, info.height) == (fmt, 33, 21)


def test_pixel_cap_is_checked_before_decoding() -> None:
    buffer = io.BytesIO()
    Image.new("L", (200, 200)).save(buffer, format="PNG")
    with pytest.raises(InvalidInput) as err:
        inspect_image(buffer, allowed_formats=("PNG",), max_pixels=39_999)
    assert err.value.error_type == "image_too_many_pixels"


def test_format_allow_list_is_explicit() -> None:
    with pytest.raises(UnsupportedMediaType):
        inspect_image(io.BytesIO(image_bytes("GIF")), allowed_formats=("PNG",), max_pixels=10**6)


def _jpeg(**options: object) -> bytes:
    buffer = io.BytesIO()
    rng = np.random.default_rng(1)
    Image.fromarray((rng.random((120, 160, 3)) * 255).astype(np.uint8)).save(buffer, format="JPEG", **options)
    return buffer.getvalue()


ALL = ("JPEG", "PNG", "TIFF", "GIF", "BMP", "WEBP")


@pytest.mark.parametrize(
    "options", [{}, {"progressive": True}, {"restart_marker_blocks": 2}, {"quality": 100, "subsampling": 0}]
)
def test_complete_jpeg_variants_pass(options: dict[str, object]) -> None:
    data = _jpeg(**options)
    assert inspect_image(io.BytesIO(data), allowed_formats=ALL, max_pixels=10**6).format == "JPEG"
    # Bytes after the end-of-image marker (common in the wild) are tolerated.
    inspect_image(io.BytesIO(data + b"\x00trailing"), allowed_formats=ALL, max_pixels=10**6)


@pytest.mark.parametrize("cut", [0.2, 0.5, 0.99])
def test_truncated_jpeg_at_any_point_is_corrupt(cut: float) -> None:
    data = _jpeg(progressive=True)
    with pytest.raises(InvalidInput) as err:
        inspect_image(io.BytesIO(data[: int(len(data) * cut)]), allowed_formats=ALL, max_pixels=10**6)
    assert err.value.error_type == "corrupt_image"


def test_jpeg_scan_ends_only_at_a_real_marker() -> None:
    """Fill bytes (0xFF runs) may precede the end-of-image marker; a stuffed 0xFF 0x00 or a lone
    0xFF at the very end is scan data, so the image is cut off."""
    data = _jpeg()
    assert data.endswith(b"\xff\xd9")
    filled = data[:-2] + b"\xff\xff\xff\xd9"
    inspect_image(io.BytesIO(filled), allowed_formats=ALL, max_pixels=10**6)
    for tail in (b"\xff\x00", b"\xff", b"\xff\xff", b"\xff\xd3"):
        with pytest.raises(InvalidInput) as err:
            inspect_image(io.BytesIO(data[:-2] + tail), allowed_formats=ALL, max_pixels=10**6)
        assert err.value.error_type == "corrupt_image"


def test_jpeg_with_broken_segment_length_is_corrupt() -> None:
    data = bytearray(_jpeg())
    dqt = data.index(b"\xff\xdb")
    data[dqt + 2 : dqt + 4] = (0xFFFF).to_bytes(2, "big")
    with pytest.raises(InvalidInput):
        inspect_image(io.BytesIO(bytes(data)), allowed_formats=ALL, max_pixels=10**6)


def test_png_with_a_flipped_byte_fails_its_crc() -> None:
    data = bytearray(image_bytes("PNG", (80, 60), seed=5))
    idat = data.index(b"IDAT")
    data[idat + 10] ^= 0x55
    with pytest.raises(InvalidInput) as err:
        inspect_image(io.BytesIO(bytes(data)), allowed_formats=ALL, max_pixels=10**6)
    assert "CRC" in err.value.message


class LookingDispatcher:
    """A dispatcher that reads the job's row from a connection of its own when asked to send it
    (what a worker would find), then accepts, refuses (False) or fails as told."""

    def __init__(self, runtime: Runtime, *, answer: bool | Exception = True, takes: bool = True) -> None:
        self.runtime, self.answer, self.takes = runtime, answer, takes  # takes: what accepts() says
        self.sent: list[str] = []
        self.seen_enqueued_at: list[object] = []

    def send(self, task_name: str, *, args: list[Any], queue: str) -> bool:
        from sqlalchemy import text

        with self.runtime.engine.connect() as conn:
            self.seen_enqueued_at.append(
                conn.scalar(text("SELECT enqueued_at FROM mining_job WHERE id = :id"), {"id": args[0]})
            )
        if isinstance(self.answer, Exception):
            raise self.answer
        if self.answer:
            self.sent.append(args[0])
        return self.answer

    def accepts(self, task_name: str, queue: str) -> bool:
        return self.takes

    def ping(self) -> None: ...

    def close(self) -> None: ...


@pytest.fixture
def own_dispatcher(runtime: Runtime) -> Iterator[Runtime]:
    """The runtime, its dispatcher put back after the test (the test swaps in its own)."""
    original = runtime.dispatcher
    try:
        yield runtime
    finally:
        runtime.dispatcher = original


def _enqueued_at(runtime: Runtime, job_id: Any) -> Any:
    from p2p.shared.db.models import MiningJob

    with runtime.session() as session:
        job = session.get(MiningJob, job_id)
        assert job is not None
        return job.enqueued_at


@pytest.mark.parametrize("store_kind", ["local"], indirect=True)
def test_a_new_figure_is_one_commit_and_its_job_is_stamped_sent_before_the_publish(
    own_dispatcher: Runtime,
) -> None:
    runtime = own_dispatcher
    looking = LookingDispatcher(runtime)
    runtime.dispatcher = looking  # type: ignore[assignment]
    commits: list[int] = []
    listener = lambda _conn: commits.append(1)  # noqa: E731
    event.listen(runtime.engine, "commit", listener)
    try:
        outcome = _ingest(runtime, image_bytes("PNG", (300, 200), seed=91), "one commit")
    finally:
        event.remove(runtime.engine, "commit", listener)
    assert not outcome.duplicate and looking.sent == [str(outcome.job.id)]
    assert len(commits) == 1  # the figure, its job and the job's enqueued_at together
    assert looking.seen_enqueued_at[0] is not None  # a worker finds the job already marked sent
    assert _enqueued_at(runtime, outcome.job.id) == outcome.job.enqueued_at
    # The same upload again sends nothing: the job was sent.
    again = _ingest(runtime, image_bytes("PNG", (300, 200), seed=91), "one commit")
    assert again.duplicate and looking.sent == [str(outcome.job.id)]


@pytest.mark.parametrize("store_kind", ["local"], indirect=True)
@pytest.mark.parametrize(
    ("answer", "takes"),
    [(False, True), (ConnectionError("broker down"), True), (False, False)],
    ids=["refused", "down", "not-served-here"],
)
def test_a_job_the_broker_did_not_take_reads_as_never_sent_and_the_next_upload_sends_it(
    own_dispatcher: Runtime, answer: bool | Exception, takes: bool
) -> None:
    from p2p.shared.errors import P2PError

    runtime = own_dispatcher
    data = image_bytes("PNG", (300, 200), seed=92)
    runtime.dispatcher = LookingDispatcher(runtime, answer=answer, takes=takes)  # type: ignore[assignment]
    commits: list[int] = []
    listener = lambda _conn: commits.append(1)  # noqa: E731
    event.listen(runtime.engine, "commit", listener)
    try:
        if isinstance(answer, Exception):
            with pytest.raises(P2PError) as refused:
                _ingest(runtime, data, "not taken")
            assert refused.value.status_code == 503 and refused.value.error_type == "broker_unavailable"
        else:
            assert _ingest(runtime, data, "not taken").job.enqueued_at is None
    finally:
        event.remove(runtime.engine, "commit", listener)
    # A dispatcher that says beforehand it will not take the job (an in-process queue that does not
    # serve mining) costs no stamp to clear: one commit. Otherwise the stamp is cleared in a second.
    assert len(commits) == (2 if takes else 1)
    with runtime.session() as session:
        from p2p.shared.db.models import MiningJob

        (job,) = session.query(MiningJob).all()
        assert job.enqueued_at is None  # the stamp committed with the figure is cleared again
    live = LookingDispatcher(runtime)
    runtime.dispatcher = live  # type: ignore[assignment]
    again = _ingest(runtime, data, "not taken")
    assert again.duplicate and live.sent == [str(job.id)]
    assert _enqueued_at(runtime, job.id) is not None


def test_the_in_process_dispatcher_accepts_what_it_would_send() -> None:
    from p2p.shared.queue import MINE_FIGURE_TASK, InProcessDispatcher, celery_app, mining_queue

    queue = mining_queue("cpu")
    for queues, expected in ((None, True), ([queue], True), (["ingest"], False)):
        dispatcher = InProcessDispatcher(celery_app, workers=1, queues=queues)
        try:
            assert dispatcher.accepts(MINE_FIGURE_TASK, queue) is expected
            assert dispatcher.accepts("p2p.no.such_task", queue) is False
            assert dispatcher.send("p2p.no.such_task", args=[], queue=queue) is False
        finally:
            dispatcher.close()
