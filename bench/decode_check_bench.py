"""Should ingest decode every image in full? The cost of a full decode against the structural check
ingest does now, per figure, on the ingest benchmark's own ~1 MB JPEG figures and on PNG figures.

Both checks run on the same bytes, interleaved A B B A per round so that load from other work on
the machine falls on both alike; the result is CPU milliseconds per figure (thread CPU time) and
the ratio to the ingest API's whole server CPU per figure (bench/README.md, ingest_bench).

    .venv/bin/python bench/decode_check_bench.py [--rounds 12] [--figures 12]
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ingest_bench import FigureFactory

from p2p.ingest.samples import make_figure
from p2p.shared.images import inspect_image

FORMATS = ("JPEG", "PNG", "TIFF", "GIF", "BMP", "WEBP")


def structural(data: bytes) -> None:
    inspect_image(io.BytesIO(data), allowed_formats=FORMATS, max_pixels=90_000_000)


def full_decode(data: bytes) -> None:
    structural(data)
    with Image.open(io.BytesIO(data)) as image:
        image.load()


def cpu_ms(check: Callable[[bytes], None], figures: list[bytes]) -> float:
    start = time.thread_time()
    for data in figures:
        check(data)
    return (time.thread_time() - start) * 1000 / len(figures)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--figures", type=int, default=12)
    args = parser.parse_args(argv)
    factory = FigureFactory()
    jpegs = [factory.bases[i % len(factory.bases)] for i in range(args.figures)]
    pngs = [make_figure(seed).image for seed in range(1, args.figures + 1)]
    for name, figures in (
        ("JPEG ~1 MB (ingest_bench figures)", jpegs),
        ("PNG (sample compound figures)", pngs),
    ):
        a: list[float] = []
        b: list[float] = []
        for _ in range(args.rounds):  # A B B A
            a.append(cpu_ms(structural, figures))
            b.append(cpu_ms(full_decode, figures))
            b.append(cpu_ms(full_decode, figures))
            a.append(cpu_ms(structural, figures))
        mean_kb = statistics.fmean(len(f) for f in figures) / 1024
        sa, sb = statistics.median(a), statistics.median(b)
        print(
            f"{name}: {mean_kb:.0f} KiB mean; structural check {sa:.2f} ms CPU/figure, "
            f"with full decode {sb:.2f} ms (+{sb - sa:.2f} ms, x{sb / sa:.1f})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
