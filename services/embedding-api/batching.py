"""Micro-batching: concurrent embedding requests are merged into model batches.

Each kind (texts, images) has a queue and worker tasks. A worker takes the first waiting
request, then keeps collecting until it holds ``batch_size`` items or ``wait_ms`` have passed,
runs the model on the batcher's executor (the event loop never blocks), and hands every caller its
own rows. Texts have one worker. Images have ``image_workers``: with more than one, that many image
batches run at once, each on its own executor thread (the model is loaded with its intra-op
threads divided among them). A small model on a few cores gets more from batches side by side, each
on one core, than from one batch split over the cores, whose parallel regions wait on every core
and stall when the decoding and resizing beside the model take one of them. The executor has one
thread per image worker. Text batches run on a thread of their own (``text_thread_init`` sets its
intra-op threads), so a search query's text never waits behind image batches.

The wait is only for gathering a batch when the model was idle: requests that queued up while the
model was busy go into the next batch at once, so under load the model never idles for
``wait_ms``. A request larger than ``batch_size`` is split over several batches; its rows are
reassembled in order. When the model raises, every caller with items in that batch receives the
exception.

:meth:`MicroBatcher.prepare` runs per-request work that holds no model state (decoding an upload,
resizing it into the model's input) on a small pool of its own, so it runs beside the model
instead of on the event loop or inside the model's batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import numpy as np

log = logging.getLogger(__name__)

KINDS = ("texts", "images")
PREPARE_WORKERS = min(4, os.cpu_count() or 1)
T = TypeVar("T")


class Encoder(Protocol):
    dim: int

    def encode_texts(self, texts: list[str]) -> np.ndarray: ...

    def encode_images(self, images: list[Any]) -> np.ndarray: ...


class BatcherStopped(RuntimeError):
    pass


@dataclass
class BatchStats:
    batches: int = 0
    items: int = 0
    requests: int = 0
    errors: int = 0
    max_batch: int = 0

    @property
    def mean_batch_size(self) -> float:
        return self.items / self.batches if self.batches else 0.0

    def as_dict(self) -> dict[str, float]:
        return {
            "batches": self.batches,
            "items": self.items,
            "requests": self.requests,
            "errors": self.errors,
            "max_batch": self.max_batch,
            "mean_batch_size": round(self.mean_batch_size, 3),
        }


@dataclass
class _Request:
    items: Sequence[Any]
    future: asyncio.Future[np.ndarray]
    out: np.ndarray | None = None
    filled: int = 0

    @property
    def dead(self) -> bool:
        return self.future.done()


@dataclass
class _Segment:
    request: _Request
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


@dataclass
class _Lane:
    kind: str
    call: Callable[[list[Any]], np.ndarray]
    queue: asyncio.Queue[_Request] = field(default_factory=asyncio.Queue)
    carry: deque[_Segment] = field(default_factory=deque)
    stats: BatchStats = field(default_factory=BatchStats)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


class MicroBatcher:
    """Merges concurrent ``embed_texts`` / ``embed_images`` calls into batches of ``batch_size``."""

    def __init__(
        self,
        model: Encoder,
        *,
        batch_size: int = 32,
        wait_ms: float = 5.0,
        executor: ThreadPoolExecutor | None = None,
        prepare_workers: int = PREPARE_WORKERS,
        image_workers: int = 1,
        text_thread_init: Callable[[], object] | None = None,
        observe: Callable[[str, int, float], None] | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        if image_workers < 1:
            raise ValueError("image_workers must be at least 1")
        if wait_ms < 0:
            raise ValueError("wait_ms must not be negative")
        self.model = model
        self.batch_size = int(batch_size)
        self.wait_ms = float(wait_ms)
        self._own_executor = executor is None
        self._executor = executor
        self.prepare_workers = max(1, int(prepare_workers))
        self.image_workers = int(image_workers)
        self._prepare_pool: ThreadPoolExecutor | None = None
        self.text_thread_init = text_thread_init
        self._text_executor: ThreadPoolExecutor | None = None
        self._lanes: dict[str, _Lane] = {}
        self._running = False
        # Told (kind, items, model seconds) after each model call that worked: metrics plug in here.
        self.observe = observe

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._running

    def start(self) -> None:
        """Start the workers (needs a running event loop); idempotent."""
        if self._running:
            return
        if self._executor is None:
            self._executor = ThreadPoolExecutor(
                max_workers=self.image_workers, thread_name_prefix="p2p-embed"
            )
        if self._own_executor and self._text_executor is None:
            self._text_executor = ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="p2p-text", initializer=self.text_thread_init
            )
        previous = self._lanes
        self._lanes = {
            "texts": _Lane("texts", lambda items: self.model.encode_texts(list(items))),
            "images": _Lane("images", lambda items: self.model.encode_images(list(items))),
        }
        loop = asyncio.get_running_loop()
        for kind, lane in self._lanes.items():
            if kind in previous:
                lane.stats = previous[kind].stats
            workers = self.image_workers if kind == "images" else 1
            lane.tasks = [
                loop.create_task(self._worker(lane), name=f"batcher-{kind}-{i}") for i in range(workers)
            ]
        self._running = True

    async def stop(self) -> None:
        """Stop the workers; requests still waiting fail with :class:`BatcherStopped`."""
        if not self._running:
            return
        self._running = False
        lanes = list(self._lanes.values())
        for lane in lanes:
            for task in lane.tasks:
                task.cancel()
        for lane in lanes:
            for task in lane.tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            error = BatcherStopped("the embedding batcher was stopped")
            for segment in lane.carry:
                self._fail(segment.request, error)
            lane.carry.clear()
            while not lane.queue.empty():
                self._fail(lane.queue.get_nowait(), error)
        if self._own_executor and self._executor is not None:
            self._executor.shutdown(wait=False)  # a running batch finishes on its own
            self._executor = None
        if self._text_executor is not None:
            self._text_executor.shutdown(wait=False)
            self._text_executor = None
        if self._prepare_pool is not None:
            self._prepare_pool.shutdown(wait=False)
            self._prepare_pool = None

    async def __aenter__(self) -> MicroBatcher:
        self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- requests ----------------------------------------------------------------------------

    async def embed_texts(self, texts: Sequence[str]) -> np.ndarray:
        return await self._submit("texts", list(texts))

    async def embed_images(self, images: Sequence[Any]) -> np.ndarray:
        """Embeddings of PIL images (or of whatever the model's ``encode_images`` accepts, such as
        the tensors of ``EmbeddingModel.prepare_image``)."""
        return await self._submit("images", list(images))

    async def prepare(self, fn: Callable[..., T], /, *args: Any) -> T:
        """``fn(*args)`` on the batcher's preparation pool (never the model's thread): decoding and
        resizing uploads, which release the GIL, run there in parallel with the model."""
        if self._prepare_pool is None:
            self._prepare_pool = ThreadPoolExecutor(
                max_workers=self.prepare_workers, thread_name_prefix="p2p-prepare"
            )
        return await asyncio.get_running_loop().run_in_executor(self._prepare_pool, fn, *args)

    async def _submit(self, kind: str, items: list[Any]) -> np.ndarray:
        if not items:
            return np.zeros((0, int(getattr(self.model, "dim", 0))), dtype=np.float32)
        if not self._running:
            self.start()
        lane = self._lanes[kind]
        future: asyncio.Future[np.ndarray] = asyncio.get_running_loop().create_future()
        lane.stats.requests += 1
        await lane.queue.put(_Request(items=items, future=future))
        return await future

    # -- statistics --------------------------------------------------------------------------

    def stats_for(self, kind: str) -> BatchStats:
        lane = self._lanes.get(kind)
        return lane.stats if lane is not None else BatchStats()

    @property
    def stats(self) -> dict[str, Any]:
        """Totals (batches, items, mean batch size) and the same per kind."""
        total = BatchStats()
        per_kind: dict[str, Any] = {}
        for kind in KINDS:
            s = self.stats_for(kind)
            per_kind[kind] = s.as_dict()
            total.batches += s.batches
            total.items += s.items
            total.requests += s.requests
            total.errors += s.errors
            total.max_batch = max(total.max_batch, s.max_batch)
        return {**total.as_dict(), **per_kind}

    # -- the worker --------------------------------------------------------------------------

    def _take(self, lane: _Lane, batch: list[_Segment], room: int, request: _Request) -> int:
        """Put up to ``room`` items of a new request in the batch, the rest in the carry-over."""
        take = min(room, len(request.items))
        batch.append(_Segment(request, 0, take))
        if take < len(request.items):
            lane.carry.append(_Segment(request, take, len(request.items)))
        return take

    async def _collect(self, lane: _Lane) -> list[_Segment]:
        loop = asyncio.get_running_loop()
        batch: list[_Segment] = []
        count = 0
        # Requests that queued while the model was busy: batch them now, waiting for no more.
        backlog = bool(lane.carry) or not lane.queue.empty()
        # leftovers of split requests first, in order
        while lane.carry and count < self.batch_size:
            segment = lane.carry.popleft()
            if segment.request.dead:
                continue
            room = self.batch_size - count
            if segment.size > room:
                lane.carry.appendleft(_Segment(segment.request, segment.start + room, segment.end))
                segment = _Segment(segment.request, segment.start, segment.start + room)
            batch.append(segment)
            count += segment.size
        if not batch:
            while True:
                request = await lane.queue.get()
                if not request.dead:
                    break
            count += self._take(lane, batch, self.batch_size, request)
        deadline = loop.time() + (0.0 if backlog else self.wait_ms / 1000.0)
        while count < self.batch_size:
            remaining = deadline - loop.time()
            try:
                if remaining <= 0:
                    request = lane.queue.get_nowait()
                else:
                    request = await asyncio.wait_for(lane.queue.get(), remaining)
            except (asyncio.QueueEmpty, TimeoutError):
                break
            if request.dead:
                continue
            count += self._take(lane, batch, self.batch_size - count, request)
        return batch

    async def _worker(self, lane: _Lane) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = await self._collect(lane)
            batch = [s for s in batch if not s.request.dead]
            if not batch:
                continue
            items = [item for s in batch for item in s.request.items[s.start : s.end]]
            try:
                executor = self._text_executor if lane.kind == "texts" else None
                called = time.perf_counter()
                vectors = await loop.run_in_executor(executor or self._executor, lane.call, items)
                model_s = time.perf_counter() - called
                vectors = np.asarray(vectors, dtype=np.float32)
                if vectors.ndim != 2 or vectors.shape[0] != len(items):
                    raise RuntimeError(
                        f"the model returned {vectors.shape} for a batch of {len(items)} {lane.kind}"
                    )
            except asyncio.CancelledError:
                error = BatcherStopped("the embedding batcher was stopped")
                for segment in batch:
                    self._fail(segment.request, error)
                raise
            except Exception as exc:
                lane.stats.errors += 1
                log.warning("embedding batch of %d %s failed: %s", len(items), lane.kind, exc)
                for segment in batch:
                    self._fail(segment.request, exc)
                continue
            lane.stats.batches += 1
            lane.stats.items += len(items)
            lane.stats.max_batch = max(lane.stats.max_batch, len(items))
            if self.observe is not None:
                self.observe(lane.kind, len(items), model_s)
            offset = 0
            for segment in batch:
                rows = vectors[offset : offset + segment.size]
                offset += segment.size
                self._deliver(segment, rows)

    @staticmethod
    def _deliver(segment: _Segment, rows: np.ndarray) -> None:
        request = segment.request
        if request.dead:
            return
        if request.out is None:
            if segment.start == 0 and segment.end == len(request.items):
                request.future.set_result(np.ascontiguousarray(rows))
                return
            request.out = np.empty((len(request.items), rows.shape[1]), dtype=np.float32)
        request.out[segment.start : segment.end] = rows
        request.filled += segment.size
        if request.filled == len(request.items):
            request.future.set_result(request.out)

    @staticmethod
    def _fail(request: _Request, error: BaseException) -> None:
        if not request.future.done():
            request.future.set_exception(error)
