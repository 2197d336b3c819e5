"""bench/abba.py: the interleaving order and the statistics, with fake sides and clocks."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from bench.abba import AbbaResult, Slice, interleave, order, parse_lscpu, quartiles, spread


class FakeClock:
    """A clock that a side advances by hand: wall and CPU time are whatever the test says."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_order_alternates_which_side_runs_first() -> None:
    assert order(4) == [
        ("product", "reference"),
        ("reference", "product"),
        ("product", "reference"),
        ("reference", "product"),
    ]
    with pytest.raises(ValueError):
        order(0)


def test_interleave_runs_the_sides_in_abba_order_and_times_each() -> None:
    wall, cpu = FakeClock(), FakeClock()
    calls: list[str] = []

    def side(name: str, seconds: float, items: int) -> int:
        calls.append(name)
        wall.now += seconds
        cpu.now += seconds / 2  # half a core
        return items

    result = interleave(
        lambda: side("p", 2.0, 10),
        lambda: side("r", 1.0, 10),
        rounds=3,
        wall=wall,
        cpu=cpu,
        server_cpu=lambda pids: 0.0,
    )
    assert calls == ["p", "r", "r", "p", "p", "r"]
    assert result.first == ["product", "reference", "product"]
    assert result.ratios == [0.5, 0.5, 0.5]
    assert result.median_cost == 2.0
    record = result.as_dict()
    assert record["product"]["cpu_s_per_item"] == 0.1
    assert record["reference"]["wall_s_per_item"] == 0.1
    assert record["product"]["cores_used"] == 0.5


def test_server_cpu_is_added_for_the_pids_named() -> None:
    wall, cpu = FakeClock(), FakeClock()
    server = {"cpu": 0.0}
    seen: list[list[int]] = []

    def server_cpu(pids: Iterable[int]) -> float:
        seen.append(list(pids))
        return server["cpu"]

    def side() -> tuple[int, dict[str, int]]:
        wall.now += 1.0
        server["cpu"] += 3.0
        return 4, {"errors": 0}

    result = interleave(side, side, rounds=1, pids=lambda: [42], wall=wall, cpu=cpu, server_cpu=server_cpu)
    assert result.product[0].cpu_s == 3.0
    assert result.product[0].extra == {"errors": 0}
    assert seen[0] == [42]
    assert result.as_dict()["reference"]["rounds"][0] == {
        "items": 4.0,
        "wall_s": 1.0,
        "cpu_s": 3.0,
        "errors": 0,
    }


def test_quartiles_interpolate_like_numpy() -> None:
    assert quartiles([1.0, 2.0, 3.0, 4.0]) == (1.75, 2.5, 3.25)
    assert quartiles([5.0]) == (5.0, 5.0, 5.0)
    stats = spread([0.9, 1.1, 1.0, 3.0, 1.2])
    assert stats["median"] == 1.1
    assert (stats["min"], stats["max"]) == (0.9, 3.0)
    assert stats["iqr"] == pytest.approx(0.2)
    with pytest.raises(ValueError):
        quartiles([])


def test_median_ratio_is_robust_to_one_disturbed_round() -> None:
    fast = Slice(items=10, wall_s=1.0, cpu_s=1.0)
    slow = Slice(items=10, wall_s=4.0, cpu_s=1.0)  # a round where other load stole the cores
    ref = Slice(items=10, wall_s=1.25, cpu_s=1.0)
    result = AbbaResult(product=[fast, fast, slow, fast], reference=[ref] * 4, first=["product"] * 4)
    assert result.median_ratio == pytest.approx(1.25)
    assert result.spread["min"] == pytest.approx(0.3125)


def test_parse_lscpu_keeps_model_and_simd_flags() -> None:
    text = (
        "Architecture:   x86_64\nCPU(s):   2\nVendor ID:   AuthenticAMD\n"
        "Model name:   AMD EPYC 7B13\nFlags:   fpu sse4_2 avx avx2 fma hypervisor avx512f amx_tile\n"
    )
    cpu = parse_lscpu(text)
    assert cpu["model"] == "AMD EPYC 7B13"
    assert cpu["cpus"] == 2
    assert cpu["simd_flags"] == ["sse4_2", "avx", "avx2", "fma", "avx512f", "amx_tile"]


def test_a_side_may_report_its_own_window() -> None:
    wall, cpu = FakeClock(), FakeClock()

    def warmed_up() -> tuple[int, dict[str, float]]:
        wall.now += 3.0  # 1 s of warm-up, then the 2-s window the side measured itself
        return 20, {"wall_s": 2.0, "cpu_s": 1.5, "p50_ms": 7.0}

    result = interleave(warmed_up, warmed_up, rounds=2, wall=wall, cpu=cpu, server_cpu=lambda pids: 0.0)
    assert result.product[0] == Slice(items=20, wall_s=2.0, cpu_s=1.5, extra={"p50_ms": 7.0})
    assert result.ratios == [1.0, 1.0]
