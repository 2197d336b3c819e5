"""A lean HTTP/1.1 load generator for the benchmarks.

The clients of a throughput benchmark on this 2-core machine share the cores with the server they
measure. httpx in threads costs about 1 ms of CPU per request (building the multipart body,
parsing headers, the GIL hand-offs of 16 threads), which is a third of what the embedding
service itself spends on a one-image request: the benchmark then measured its own clients. Here
every request is built once, as bytes, before the clock starts; ``clients`` coroutines on one
asyncio loop send them on keep-alive connections and read each answer by its Content-Length.
What is left per request is a socket write and read and a short header parse.

    parts = [("files", "a.png", png, "image/png")]
    requests = [multipart_request("127.0.0.1", port, "/v1/embed/images", parts)]
    result = run_load("127.0.0.1", port, requests, check, clients=16, warmup=1.0, duration=5.0)
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field

# (status, lower-cased headers, body) -> None when the answer is right, else why it is not
Check = Callable[[int, dict[str, str], bytes], str | None]


def multipart_request(
    host: str,
    port: int,
    path: str,
    parts: Sequence[tuple[str, str, bytes, str]],
    headers: dict[str, str] | None = None,
) -> bytes:
    """A complete POST with a multipart/form-data body of ``(field, filename, data, content type)``."""
    boundary = uuid.uuid4().hex
    chunks = []
    for name, filename, data, ctype in parts:
        chunks.append(
            f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; filename="{filename}"\r\n'
            f"Content-Type: {ctype}\r\n\r\n".encode()
        )
        chunks.append(data)
        chunks.append(b"\r\n")
    chunks.append(f"--{boundary}--\r\n".encode())
    body = b"".join(chunks)
    head = {
        "Host": f"{host}:{port}",
        "Content-Type": f"multipart/form-data; boundary={boundary}",
        "Content-Length": str(len(body)),
        "Connection": "keep-alive",
        **(headers or {}),
    }
    lines = [f"POST {path} HTTP/1.1", *(f"{k}: {v}" for k, v in head.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


@dataclass
class LoadResult:
    requests: int  # answered correctly inside the measured window
    seconds: float
    latencies: list[float]  # of those requests
    errors: list[str] = field(default_factory=list)  # anywhere in the run, warm-up included


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    status_line, *header_lines = head[:-4].decode("latin-1").split("\r\n")
    status = int(status_line.split(" ", 2)[1])
    headers = {}
    for line in header_lines:
        key, _, value = line.partition(":")
        headers[key.strip().lower()] = value.strip()
    if "content-length" not in headers:
        raise ValueError(f"answer without Content-Length: {status_line}")
    body = await reader.readexactly(int(headers["content-length"]))
    return status, headers, body


def run_load(
    host: str,
    port: int,
    requests: Sequence[bytes],
    check: Check,
    *,
    clients: int,
    warmup: float,
    duration: float,
    meter: AbstractContextManager[object] | None = None,
) -> LoadResult:
    """``clients`` connections send ``requests`` round-robin for ``warmup + duration`` seconds;
    the answers that end inside the last ``duration`` seconds count (``meter`` runs over those)."""
    finished: list[tuple[float, float]] = []  # (end, latency) of correct answers
    errors: list[str] = []

    async def client(k: int, stop: asyncio.Event) -> None:
        reader, writer = await asyncio.open_connection(host, port)
        i = k
        try:
            while not stop.is_set():
                t0 = time.perf_counter()
                writer.write(requests[i % len(requests)])
                i += clients
                try:
                    status, headers, body = await read_response(reader)
                except (asyncio.IncompleteReadError, ConnectionError, ValueError) as exc:
                    errors.append(f"{type(exc).__name__}: {exc}")
                    writer.close()
                    reader, writer = await asyncio.open_connection(host, port)
                    continue
                t1 = time.perf_counter()
                problem = check(status, headers, body)
                if problem is None:
                    finished.append((t1, t1 - t0))
                else:
                    errors.append(problem)
        finally:
            writer.close()

    async def main() -> tuple[float, float]:
        stop = asyncio.Event()
        tasks = [asyncio.create_task(client(k, stop)) for k in range(clients)]
        await asyncio.sleep(warmup)
        start = time.perf_counter()
        with meter or nullcontext():
            await asyncio.sleep(duration)
            end = time.perf_counter()
        stop.set()
        await asyncio.gather(*tasks)
        return start, end

    start, end = asyncio.run(main())
    inside = [lat for t, lat in finished if start <= t <= end]
    return LoadResult(requests=len(inside), seconds=end - start, latencies=inside, errors=errors)
