"""Where an image embed's time goes outside the model: each step of ``POST /v1/embed/images``
timed alone, in this process, one thread, on the bench's ~224-px PNG panel crops.

    .venv/bin/python bench/embed_steps.py [--images 64] [--repeat 200] [--out bench/results/embed-steps.json]

Steps (ms per image, wall and this thread's CPU): the multipart parse of a 1-image and an 8-image
request (Starlette + python-multipart, what FastAPI runs before the route), the upload checks and
PNG decode (``service.decode_image``), the model's resize (``prepare_image``), the model on
prepared inputs (batch 16, one torch thread: the service's ``image_workers`` default gives each
batch one), a thread-pool hand-off (``run_in_executor`` round trip from the event loop), and the
JSON answer: as the route built it before (``tolist`` per row, pydantic) and as now
(``embed_response``). The model's own time is the yardstick: every other step is a share of it.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from abba import machine_record
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
SEED = 913_377


def crops(count: int) -> list[bytes]:
    """~224-px PNG crops of synthetic figures (the size the embed bench posts)."""
    from p2p.mining.lab.synth import write_dataset

    out: list[bytes] = []
    with tempfile.TemporaryDirectory() as tmp:
        for path in write_dataset(Path(tmp), max(1, count // 6), SEED):
            with Image.open(path) as img:
                figure = img.convert("RGB")
            w, h = figure.size
            for x0, y0 in ((0, 0), (w // 2, 0), (0, h // 2), (w // 2, h // 2), (w // 4, h // 4), (0, h // 3)):
                tile = figure.crop((x0, y0, x0 + w // 2, y0 + h // 2))
                scale = 224 / max(tile.size)
                tile = tile.resize((max(16, round(tile.width * scale)), max(16, round(tile.height * scale))))
                buf = io.BytesIO()
                tile.save(buf, format="PNG")
                out.append(buf.getvalue())
    return out[:count]


def timed(fn: Callable[[], Any], repeat: int, per: int = 1) -> dict[str, float]:
    fn()
    w0, c0 = time.perf_counter(), time.thread_time()
    for _ in range(repeat):
        fn()
    wall, cpu = time.perf_counter() - w0, time.thread_time() - c0
    return {"wall_ms": round(wall / repeat / per * 1000, 3), "cpu_ms": round(cpu / repeat / per * 1000, 3)}


def multipart_body(blobs: list[bytes]) -> tuple[bytes, str]:
    boundary = "benchboundary0123456789"
    parts = []
    for i, data in enumerate(blobs):
        parts.append(
            f'--{boundary}\r\nContent-Disposition: form-data; name="files"; filename="c{i}.png"\r\n'
            "Content-Type: image/png\r\n\r\n".encode()
        )
        parts.append(data + b"\r\n")
    parts.append(f"--{boundary}--\r\n".encode())
    return b"".join(parts), f"multipart/form-data; boundary={boundary}"


def parse_form(loop: asyncio.AbstractEventLoop, blobs: list[bytes]) -> Callable[[], Any]:
    from starlette.requests import Request

    body, ctype = multipart_body(blobs)

    async def once() -> None:
        sent = False

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if sent:
                return {"type": "http.disconnect"}
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        scope = {"type": "http", "method": "POST", "headers": [(b"content-type", ctype.encode())]}
        form = await Request(scope, receive).form()
        for upload in form.getlist("files"):
            await upload.read()  # type: ignore[union-attr]
        await form.close()

    return lambda: loop.run_until_complete(once())


def old_json(vectors: np.ndarray) -> bytes:
    from p2p.embedding_api.schemas import EmbeddingPublic, EmbedPublic, ModelRef

    ref = ModelRef(name="m", version=None, version_id=None, dim=int(vectors.shape[1]), space="s")
    answer = EmbedPublic.model_construct(
        model=ref,
        dim=vectors.shape[1],
        items=[
            EmbeddingPublic.model_construct(source=f"file:c{i}.png", embedding=v.tolist())
            for i, v in enumerate(vectors)
        ],
    )
    return answer.model_dump_json().encode()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--images", type=int, default=48)
    parser.add_argument("--repeat", type=int, default=100)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "embed-steps.json")
    args = parser.parse_args()

    import torch

    from p2p.embedding_api import service
    from p2p.embedding_api.routes.embed import json_answer
    from p2p.models.modeling import default_spec, load_model
    from p2p.shared.settings import Settings

    settings = Settings()
    blobs = crops(args.images)
    model = load_model(default_spec(), store=None, threads=1)
    torch.set_num_threads(1)
    decoded = [service.decode_image(b, settings=settings) for b in blobs]
    prepared = [model.prepare_image(im) for im in decoded]
    loop = asyncio.new_event_loop()
    pool = ThreadPoolExecutor(1)
    vectors1 = model.encode_images(prepared[:1])
    vectors8 = model.encode_images(prepared[:8])
    it = iter(range(10**9))

    def next_blob() -> bytes:
        return blobs[next(it) % len(blobs)]

    r = args.repeat
    steps = {
        "multipart parse, 1 image/request": timed(parse_form(loop, blobs[:1]), r),
        "multipart parse, 8 images/request (per image)": timed(parse_form(loop, blobs[:8]), r, 8),
        "checks + PNG decode (decode_image)": timed(
            lambda: service.decode_image(next_blob(), settings=settings), r
        ),
        "resize to model input (prepare_image)": timed(
            lambda: model.prepare_image(decoded[next(it) % len(decoded)]), r
        ),
        "model, batch 16, 1 torch thread (per image)": timed(
            lambda: model.encode_images(prepared[:16]), max(5, r // 10), 16
        ),
        "thread-pool hand-off (run_in_executor round trip)": timed(
            lambda: loop.run_until_complete(loop.run_in_executor(pool, int)), r
        ),
        "JSON answer before (tolist per row + pydantic), 1 row": timed(lambda: old_json(vectors1), r),
        "JSON answer before, 8 rows (per image)": timed(lambda: old_json(vectors8), r, 8),
        "JSON answer now, 1 row": timed(
            lambda: json_answer(vectors1, ["file:c0.png"], ref_json=b'{"name":"m"}'), r
        ),
        "JSON answer now, 8 rows (per image)": timed(
            lambda: json_answer(vectors8, [f"file:c{i}.png" for i in range(8)], ref_json=b'{"name":"m"}'),
            r,
            8,
        ),
    }
    pool.shutdown()
    loop.close()
    model_ms = steps["model, batch 16, 1 torch thread (per image)"]["cpu_ms"]
    for name, row in steps.items():
        row["share_of_model_cpu"] = round(row["cpu_ms"] / model_ms, 3)
        print(
            f"{name:60s} wall {row['wall_ms']:7.3f} ms  CPU {row['cpu_ms']:7.3f} ms",
            f"({row['share_of_model_cpu']:.2f} x model)",
        )
    report = {
        "benchmark": "embed_steps",
        "machine": machine_record(),
        "images": len(blobs),
        "mean_png_bytes": int(np.mean([len(b) for b in blobs])),
        "steps_ms_per_image": steps,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
