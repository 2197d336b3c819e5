"""Ratio benchmarks that hold on any machine: product and reference interleaved A B B A.

Absolute speeds move with the CPU (an AVX2-only EPYC runs torch half as fast per CPU-second as an
AVX-512/AMX Xeon) and with whatever else runs on a shared machine; a ratio of two things measured
close together in time, on the same machine, moves much less. This module gives every ratio
benchmark the same method and the same record:

* the order: round ``i`` runs the product then the reference when ``i`` is even, the reference then
  the product when it is odd (``A B | B A | A B | B A ...``), so a load that rises or falls through
  the run slows both sides alike over every two rounds;
* per round, the ratio of the product's rate (items per wall-clock second) to the reference's;
  over the rounds, the median ratio and its spread (min, max, quartiles): a wide spread says the
  machine moved more than the code;
* CPU-seconds per item beside wall time, for this process (``time.process_time``) plus any server
  processes named by pid (psutil, their children included): a machine that is shared shows up as
  wall time that CPU time does not explain;
* the machine: CPU model, SIMD flags, cores (``lscpu``) and the load average before and after.

Use::

    from abba import interleave, machine_record

    def product() -> int:   # do one slice of work, return how many items it did
        ...
    def reference() -> int:
        ...
    result = interleave(product, reference, rounds=6, pids=lambda: [server_pid])
    report = {"machine": machine_record(), "service_vs_raw": result.as_dict()}
    print(result.median_ratio, result.spread)

A side may return ``(items, extra)`` to keep extra numbers of its slice (latency, errors: they are
kept per round in ``as_dict()``); ``extra["wall_s"]`` / ``extra["cpu_s"]``, when given, replace the
times measured around the call (for a side that times its own window, after a warm-up).

``result.median_ratio`` is product rate ÷ reference rate (above 1: the product does more per
second); a benchmark whose target is a cost (time ÷ time) reports ``result.median_cost``, the
median of the per-round inverses. ``between(round, side)`` runs before each slice, untimed.
Nothing here looks at a clock to decide anything but the numbers it reports, so the statistics
are unit-tested with fake sides and clocks (tests/test_bench_abba.py).
"""

from __future__ import annotations

import contextlib
import os
import re
import statistics
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

Side = Callable[[], "int | float | tuple[int | float, dict[str, Any]]"]
Clock = Callable[[], float]
# SIMD and matrix extensions that change how fast numeric code runs; the rest of lscpu's flags
# (virtualisation, mitigations...) say little about a benchmark.
SIMD_FLAGS = re.compile(r"^(sse4_2|avx|avx2|fma|f16c|avx512\w*|avx_vnni|amx\w*|neon|asimd\w*|sve\w*)$")


def order(rounds: int) -> list[tuple[str, str]]:
    """The run order, one pair per round: ``("product", "reference")`` on even rounds, reversed on
    odd ones (A B B A)."""
    if rounds < 1:
        raise ValueError("rounds must be at least 1")
    pairs = [("product", "reference"), ("reference", "product")]
    return [pairs[i % 2] for i in range(rounds)]


@dataclass(frozen=True)
class Slice:
    """One side's run in one round: items done, wall seconds, CPU seconds (ours and the servers')."""

    items: float
    wall_s: float
    cpu_s: float
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.items / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def cpu_per_item(self) -> float | None:
        return self.cpu_s / self.items if self.items else None


def quartiles(values: Sequence[float]) -> tuple[float, float, float]:
    """(first quartile, median, third quartile), linear interpolation between order statistics
    (numpy's default), defined for any non-empty sample."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)

    def at(q: float) -> float:
        pos = q * (len(ordered) - 1)
        low = int(pos)
        high = min(low + 1, len(ordered) - 1)
        return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)

    return at(0.25), at(0.5), at(0.75)


def spread(values: Sequence[float]) -> dict[str, float]:
    """Median, min, max and interquartile range of a sample (rounded for reports)."""
    q1, median, q3 = quartiles(values)
    return {
        "median": round(median, 4),
        "min": round(min(values), 4),
        "max": round(max(values), 4),
        "q1": round(q1, 4),
        "q3": round(q3, 4),
        "iqr": round(q3 - q1, 4),
    }


@dataclass
class AbbaResult:
    """Every slice of an interleaved run, and its statistics."""

    product: list[Slice]
    reference: list[Slice]
    first: list[str]  # which side ran first in each round

    @property
    def ratios(self) -> list[float]:
        """Per round: product rate ÷ reference rate."""
        return [
            p.rate / r.rate if r.rate else float("inf")
            for p, r in zip(self.product, self.reference, strict=True)
        ]

    @property
    def median_ratio(self) -> float:
        return statistics.median(self.ratios)

    @property
    def median_cost(self) -> float:
        """Per round reference rate ÷ product rate (how many times the reference's time per item the
        product takes), median over rounds."""
        return statistics.median(1.0 / x if x else float("inf") for x in self.ratios)

    @property
    def spread(self) -> dict[str, float]:
        return spread(self.ratios)

    @staticmethod
    def _side(slices: list[Slice]) -> dict[str, Any]:
        items = sum(s.items for s in slices)
        wall = sum(s.wall_s for s in slices)
        cpu = sum(s.cpu_s for s in slices)
        return {
            "items": items,
            "wall_s": round(wall, 3),
            "cpu_s": round(cpu, 3),
            "items_per_s": round(items / wall, 3) if wall else None,
            "wall_s_per_item": round(wall / items, 6) if items else None,
            "cpu_s_per_item": round(cpu / items, 6) if items else None,
            "cores_used": round(cpu / wall, 3) if wall else None,
            "rounds": [
                {"items": s.items, "wall_s": round(s.wall_s, 3), "cpu_s": round(s.cpu_s, 3), **s.extra}
                for s in slices
            ],
        }

    def as_dict(self) -> dict[str, Any]:
        """The record a benchmark writes to its JSON."""
        costs = [1.0 / x if x else float("inf") for x in self.ratios]
        return {
            "method": "ABBA: product and reference alternate, the first side swapping every round",
            "rounds": len(self.ratios),
            "first": self.first,
            "ratio_product_over_reference": spread(self.ratios),
            "cost_product_over_reference": spread(costs),
            "round_ratios": [round(x, 4) for x in self.ratios],
            "product": self._side(self.product),
            "reference": self._side(self.reference),
        }


def _pid_cpu(pids: Iterable[int]) -> float:
    """User + system CPU seconds of processes and their children (psutil); gone processes count 0."""
    import psutil

    total = 0.0
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(pid)
            for p in [proc, *proc.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    t = p.cpu_times()
                    total += t.user + t.system
    return total


def measure(
    side: Side,
    *,
    pids: Callable[[], Iterable[int]] = tuple,
    wall: Clock = time.perf_counter,
    cpu: Clock = time.process_time,
    server_cpu: Callable[[Iterable[int]], float] = _pid_cpu,
) -> Slice:
    """Run one side once: its items, wall time, and CPU time of this process plus ``pids()``'s."""
    watched = list(pids())
    server0 = server_cpu(watched)
    cpu0, wall0 = cpu(), wall()
    out = side()
    wall1, cpu1 = wall(), cpu()
    server1 = server_cpu(watched)
    items, extra = out if isinstance(out, tuple) else (out, {})
    extra = dict(extra)
    # A side that timed its own window (a load run measures after a warm-up) says so.
    wall_s = float(extra.pop("wall_s", wall1 - wall0))
    cpu_s = float(extra.pop("cpu_s", (cpu1 - cpu0) + (server1 - server0)))
    return Slice(float(items), wall_s, cpu_s, extra)


def interleave(
    product: Side,
    reference: Side,
    *,
    rounds: int,
    pids: Callable[[], Iterable[int]] = tuple,
    wall: Clock = time.perf_counter,
    cpu: Clock = time.process_time,
    server_cpu: Callable[[Iterable[int]], float] = _pid_cpu,
    between: Callable[[int, str], None] | None = None,
) -> AbbaResult:
    """``rounds`` rounds of both sides in A B B A order (see :func:`order`). ``between(round,
    side)`` runs before each slice, outside the timing (to restart a server, print progress...)."""
    sides = {"product": product, "reference": reference}
    taken: dict[str, list[Slice]] = {"product": [], "reference": []}
    first = []
    for i, pair in enumerate(order(rounds)):
        first.append(pair[0])
        for name in pair:
            if between is not None:
                between(i, name)
            taken[name].append(measure(sides[name], pids=pids, wall=wall, cpu=cpu, server_cpu=server_cpu))
    return AbbaResult(product=taken["product"], reference=taken["reference"], first=first)


def parse_lscpu(text: str) -> dict[str, Any]:
    """CPU model, vendor, cores and SIMD flags from ``lscpu`` output."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() not in fields:
            fields[key.strip()] = value.strip()
    flags = fields.get("Flags", "").split()
    return {
        "model": fields.get("Model name", ""),
        "vendor": fields.get("Vendor ID", ""),
        "cpus": int(fields["CPU(s)"]) if fields.get("CPU(s)", "").isdigit() else os.cpu_count(),
        "simd_flags": [f for f in flags if SIMD_FLAGS.match(f)],
        "hypervisor": fields.get("Hypervisor vendor", ""),
    }


def machine_record() -> dict[str, Any]:
    """What a result needs to be read on another machine: the CPU and how loaded the machine was."""
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        text = ""
    return {
        "cpu": parse_lscpu(text),
        "load_avg": [round(x, 2) for x in os.getloadavg()],
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def summary_line(name: str, result: AbbaResult, *, cost: bool = False) -> str:
    """One line for a log: the median ratio (or cost), its range and CPU per item on both sides."""
    stats = spread([1.0 / x for x in result.ratios] if cost else result.ratios)
    d = result.as_dict()
    label = "cost" if cost else "ratio"
    return (
        f"{name}: {label} {stats['median']:.3f} (min {stats['min']:.3f}, max {stats['max']:.3f}, "
        f"{len(result.ratios)} rounds); CPU s/item product {d['product']['cpu_s_per_item']}, "
        f"reference {d['reference']['cpu_s_per_item']}"
    )
