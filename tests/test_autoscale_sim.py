"""The core of bench/autoscale_sim.py: the HPA's replica calculation as KEDA drives it, the worker
pods, and the run as a whole (seeded, so every number here is exact)."""

from __future__ import annotations

from collections import deque
from dataclasses import replace
from itertools import pairwise

from bench.autoscale_sim import (
    DEFAULT_DOWN,
    DEFAULT_UP,
    Autoscaler,
    Cluster,
    Direction,
    Rule,
    WorkerModel,
    manifest_rules,
    reversals,
    simulate,
    summary,
)
from tests.k8s_manifests import named, render

QUEUE_RULE = Rule(
    name="test",
    list_length=10,
    min_replicas=1,
    max_replicas=10,
    up=Direction(0, (("Pods", 4, 60), ("Percent", 100, 60)), "Max"),
    down=Direction(900, (("Pods", 1, 300),), "Min"),
)


def _run(scaler: Autoscaler, metrics: list[tuple[float, float]], start: int) -> list[tuple[float, int]]:
    current, seen = start, []
    for t, metric in metrics:
        current = scaler.decide(t, current, waiting=metric)
        seen.append((t, current))
    return seen


def test_scale_up_is_bounded_by_the_faster_policy() -> None:
    scaler = Autoscaler(QUEUE_RULE)
    # 1000 waiting at target 10 asks for 100: +4 pods or +100 % a minute, whichever is more.
    assert scaler.decide(0, 1, waiting=1000) == 5
    assert scaler.decide(15, 5, waiting=1000) == 5  # the +4 of this minute are spent
    assert scaler.decide(61, 5, waiting=1000) == 10  # a new minute: +100 % of 5, capped by max


def test_scale_down_waits_for_the_window_then_goes_one_pod_per_period() -> None:
    scaler = Autoscaler(QUEUE_RULE)
    assert scaler.decide(0, 1, waiting=80) == 5
    seen = _run(scaler, [(float(t), 0.0) for t in range(15, 2400, 15)], 5)
    drops = [(t, n) for (t, n), (_, before) in zip(seen, [(0.0, 5), *seen], strict=False) if n < before]
    # Nothing before the 900 s window has passed since the last high proposal, then -1 per 300 s.
    assert [n for _, n in drops] == [4, 3, 2, 1]
    assert drops[0][0] > 900
    assert all(b - a >= 300 for (a, _), (b, _) in pairwise(drops))


def test_default_behaviour_drops_to_the_minimum_at_once() -> None:
    scaler = Autoscaler(replace(QUEUE_RULE, up=DEFAULT_UP, down=DEFAULT_DOWN))
    assert scaler.decide(0, 1, waiting=80) == 5  # +4 pods in 15 s (100 % of 1 is less)
    seen = _run(scaler, [(float(t), 0.0) for t in range(15, 600, 15)], 5)
    assert min(n for _, n in seen) == 1
    first_low = next(t for t, n in seen if n == 1)
    assert 300 <= first_low <= 315


def test_tolerance_keeps_the_count() -> None:
    scaler = Autoscaler(QUEUE_RULE)
    assert scaler.decide(0, 4, waiting=42) == 4  # 42 / (10 x 4) = 1.05: within 10 %
    assert scaler.decide(15, 4, waiting=46) == 5  # 1.15: ceil(46 / 10)


def test_cpu_rule_scales_on_utilisation() -> None:
    rule = replace(QUEUE_RULE, list_length=None, cpu_target=0.75)
    assert Autoscaler(rule).decide(0, 2, utilisation=1.5) == 4  # ceil(2 x 1.5 / 0.75)


def test_with_both_signals_the_larger_proposal_wins() -> None:
    both = replace(QUEUE_RULE, cpu_target=1.5)
    # An empty queue asks for the minimum; busy pods (150 % of their request) ask to stay.
    assert Autoscaler(both).proposal(waiting=0, utilisation=1.5, current=6) == 6
    assert Autoscaler(QUEUE_RULE).proposal(waiting=0, utilisation=1.5, current=6) == 0
    # A backlog asks for more than the CPU does.
    assert Autoscaler(both).proposal(waiting=200, utilisation=1.5, current=6) == 20


def test_pods_start_late_and_stopping_pods_finish_without_taking_more() -> None:
    model = WorkerModel(concurrency=1, startup_s=30)
    cluster = Cluster(model)
    cluster.scale_to(1, 0.0)
    queue: deque[float] = deque([0.0, 0.0, 0.0])
    lags: list[float] = []
    service = iter([5.0] * 10)
    for t in range(30):
        cluster.step(float(t), 1.0, queue, service, lags)
    assert lags == [] and len(queue) == 3  # not ready yet
    cluster.step(30.0, 1.0, queue, service, lags)
    assert lags == [30.0] and len(queue) == 2
    cluster.scale_to(0, 31.0)
    for t in range(31, 40):
        cluster.step(float(t), 1.0, queue, service, lags)
    # It finished its figure (4 s left) and took no other; then it was gone.
    assert len(queue) == 2 and cluster.pods == []


def test_slots_take_figures_back_to_back_within_a_step() -> None:
    cluster = Cluster(WorkerModel(concurrency=1, startup_s=0))
    cluster.scale_to(1, 0.0)
    queue: deque[float] = deque([0.0] * 4)
    lags: list[float] = []
    busy = cluster.step(0.0, 1.0, queue, iter([0.25] * 4), lags)
    assert lags == [0.0, 0.25, 0.5, 0.75] and busy == 1.0


def test_reversals_count_quick_changes_of_direction() -> None:
    changes = [(0.0, 5), (100.0, 4), (200.0, 6), (2000.0, 5), (2100.0, 4)]
    assert reversals(changes, 600, 1) == 2  # up->down at 100 s, down->up at 200 s


def test_the_simulation_reads_the_rendered_manifests() -> None:
    keda, queue_only, _, cpu = manifest_rules()
    scaled = named(render("autoscale-keda"), "ScaledObject", "mining-worker")
    triggers = {t["type"]: t["metadata"] for t in scaled["spec"]["triggers"]}
    assert keda.list_length == float(triggers["redis"]["listLength"])
    assert keda.cpu_target is not None and keda.cpu_target * 100 == float(triggers["cpu"]["value"])
    assert queue_only.cpu_target is None
    assert keda.max_replicas == scaled["spec"]["maxReplicaCount"]
    behavior = scaled["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert keda.down.stabilization_s == behavior["scaleDown"]["stabilizationWindowSeconds"]
    hpa = named(render("autoscale-cpu"), "HorizontalPodAutoscaler", "mining-worker")
    assert cpu.cpu_target is not None and cpu.list_length is None
    assert cpu.cpu_target * 100 == hpa["spec"]["metrics"][0]["resource"]["target"]["averageUtilization"]


SHORT_DAY = ((10, 1, 1), (2, 30, 30), (20, 1, 12), (40, 12, 12), (20, 0, 0))


def test_a_seeded_run_repeats_exactly_and_the_chosen_rule_does_not_flap() -> None:
    keda, queue_only, default_behaviour, _ = manifest_rules()
    model = WorkerModel()
    first = summary(simulate(keda, SHORT_DAY, model, 7), keda)
    assert summary(simulate(keda, SHORT_DAY, model, 7), keda) == first
    alone = summary(simulate(queue_only, SHORT_DAY, model, 7), queue_only)
    naive = summary(simulate(default_behaviour, SHORT_DAY, model, 7), default_behaviour)
    assert first["figures"] == naive["figures"] > 0  # the same offered load
    assert (
        first["reversals_within_10min"] <= alone["reversals_within_10min"] < naive["reversals_within_10min"]
    )
    assert (
        first["replica_changes_per_hour"]
        < alone["replica_changes_per_hour"]
        < naive["replica_changes_per_hour"]
    )
    # The burst (60 s x 30 figures/s beyond one pod) drains within minutes, not hours.
    assert first["max_lag_s"] < 600
