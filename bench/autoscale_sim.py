"""Autoscaling of the CPU mining workers, simulated: does the rule in k8s/overlays keep the queue's
lag bounded without flapping?

The simulation steps one second at a time through a day-like load (a bulk-ingest burst, a ramp to
a plateau, a ramp down, idle). A producer puts figures on the `mining` queue; pods of
`--concurrency` slots each take them after a start-up delay and hold each for a service time
drawn from the CPU miner's measured times (bench/README.md: real-dev figures, one thread,
median 0.408 s and p90 1.331 s CPU per figure; a lognormal through those two, capped at 1.5x
the largest measured 2.32 s, plus a fixed overhead per task for loading the figure and writing
the results). The scaler is the HPA algorithm as KEDA drives it: every sync period the
desired count is ceil(waiting / listLength) for a redis trigger (the list holds only waiting
figures) and ceil(replicas x utilisation / target) for a CPU one, each within a 10 % tolerance,
the larger of the two when both are set, then the stabilization windows and rate policies of
`behavior`, then min/max. Scale-down
stops the newest pods; a stopping pod takes no new figure and finishes the ones it runs
(its grace period outlasts the longest task, see tests/test_k8s_autoscaling.py).

The rules are read from the rendered manifests (k8s/overlays/autoscale-keda/scaledobjects.yaml,
k8s/overlays/autoscale-cpu/hpa.yaml), with two variants of the KEDA one: its redis trigger
alone, and that alone with the HPA's default behaviour (a ScaledObject without `advanced`).

    .venv/bin/python bench/autoscale_sim.py --out bench/results/2026-11-27-autoscale-sim
"""

from __future__ import annotations

import argparse
import json
import math
from collections import deque
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
KEDA_FILE = ROOT / "k8s" / "overlays" / "autoscale-keda" / "scaledobjects.yaml"
CPU_FILE = ROOT / "k8s" / "overlays" / "autoscale-cpu" / "hpa.yaml"
WORKLOAD = "mining-worker"

# bench/README.md, `realdev_bench.py`: CPU seconds per figure, one thread, this tree.
REALDEV_MEDIAN_S = 0.408
REALDEV_P90_S = 1.331
REALDEV_MAX_S = 2.320
Z90 = 1.2815515655446004


# --------------------------------------------------------------------------- the scaler


@dataclass(frozen=True)
class Direction:
    """One direction of an HPA `behavior`: stabilization window, rate policies, how to pick one."""

    stabilization_s: int
    policies: tuple[tuple[str, int, int], ...]  # (Pods | Percent, value, periodSeconds)
    select: str = "Max"


# The HPA's defaults when `behavior` leaves a direction out (autoscaling/v2).
DEFAULT_UP = Direction(0, (("Pods", 4, 15), ("Percent", 100, 15)), "Max")
DEFAULT_DOWN = Direction(300, (("Percent", 100, 15),), "Max")


@dataclass(frozen=True)
class Rule:
    """An autoscaler's signals and behaviour. With both signals the HPA takes the larger proposal
    (a ScaledObject with a redis and a cpu trigger)."""

    name: str
    min_replicas: int
    max_replicas: int
    list_length: float | None = None  # redis trigger: waiting figures per replica
    cpu_target: float | None = None  # utilisation of the CPU request, 1.5 = 150 %
    up: Direction = DEFAULT_UP
    down: Direction = DEFAULT_DOWN
    sync_s: int = 15  # the HPA controller's period; KEDA answers it with a fresh LLEN
    tolerance: float = 0.1


def _direction(spec: dict[str, Any] | None, default: Direction) -> Direction:
    if spec is None:
        return default
    policies = tuple((p["type"], int(p["value"]), int(p["periodSeconds"])) for p in spec.get("policies", []))
    return Direction(
        stabilization_s=int(spec.get("stabilizationWindowSeconds", default.stabilization_s)),
        policies=policies or default.policies,
        select=spec.get("selectPolicy", "Max"),
    )


def _manifest(path: Path, kind: str, name: str) -> dict[str, Any]:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    (doc,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def _trigger_value(spec: dict[str, Any], kind: str, key: str) -> float | None:
    values = [float(t["metadata"][key]) for t in spec["triggers"] if t["type"] == kind]
    assert len(values) <= 1, f"more than one {kind} trigger"
    return values[0] if values else None


def rule_from_scaled_object(doc: dict[str, Any], name: str) -> Rule:
    spec = doc["spec"]
    behavior = spec.get("advanced", {}).get("horizontalPodAutoscalerConfig", {}).get("behavior", {})
    cpu = _trigger_value(spec, "cpu", "value")
    return Rule(
        name=name,
        list_length=_trigger_value(spec, "redis", "listLength"),
        cpu_target=cpu / 100 if cpu is not None else None,
        min_replicas=int(spec.get("minReplicaCount", 0)),
        max_replicas=int(spec.get("maxReplicaCount", 100)),
        up=_direction(behavior.get("scaleUp"), DEFAULT_UP),
        down=_direction(behavior.get("scaleDown"), DEFAULT_DOWN),
    )


def rule_from_hpa(doc: dict[str, Any], name: str) -> Rule:
    spec = doc["spec"]
    (cpu,) = [m for m in spec["metrics"] if m["type"] == "Resource" and m["resource"]["name"] == "cpu"]
    behavior = spec.get("behavior", {})
    return Rule(
        name=name,
        cpu_target=cpu["resource"]["target"]["averageUtilization"] / 100.0,
        min_replicas=int(spec.get("minReplicas", 1)),
        max_replicas=int(spec["maxReplicas"]),
        up=_direction(behavior.get("scaleUp"), DEFAULT_UP),
        down=_direction(behavior.get("scaleDown"), DEFAULT_DOWN),
    )


def manifest_rules() -> list[Rule]:
    """The overlays' rules and two variants: without the cpu trigger, and without `behavior`."""
    keda = rule_from_scaled_object(
        _manifest(KEDA_FILE, "ScaledObject", WORKLOAD), "KEDA queue + CPU (autoscale-keda)"
    )
    queue_only = replace(keda, name="KEDA queue depth alone", cpu_target=None)
    no_behavior = replace(
        queue_only, name="KEDA queue alone, default behaviour", up=DEFAULT_UP, down=DEFAULT_DOWN
    )
    cpu = rule_from_hpa(
        _manifest(CPU_FILE, "HorizontalPodAutoscaler", WORKLOAD), "CPU fallback (autoscale-cpu)"
    )
    return [keda, queue_only, no_behavior, cpu]


@dataclass
class Autoscaler:
    """The HPA's replica calculation for one target (pkg/controller/podautoscaler, simplified to
    one metric): raw proposal, tolerance, stabilization, rate limits, bounds."""

    rule: Rule
    recommendations: deque[tuple[float, int]] = field(default_factory=deque)
    events: deque[tuple[float, int]] = field(default_factory=deque)

    def proposal(self, waiting: float, utilisation: float, current: int) -> int:
        """The largest count any signal asks for; a signal within the tolerance asks for `current`."""
        proposals = []
        if self.rule.list_length is not None:
            ratio = waiting / (self.rule.list_length * max(current, 1))
            within = abs(ratio - 1.0) <= self.rule.tolerance
            proposals.append(current if within else math.ceil(waiting / self.rule.list_length))
        if self.rule.cpu_target is not None:
            ratio = utilisation / self.rule.cpu_target
            within = abs(ratio - 1.0) <= self.rule.tolerance
            proposals.append(current if within else math.ceil(ratio * current))
        return max(proposals)

    def _stabilized(self, t: float, proposal: int, current: int) -> int:
        self.recommendations.append((t, proposal))
        horizon = max(self.rule.up.stabilization_s, self.rule.down.stabilization_s)
        while self.recommendations and self.recommendations[0][0] < t - horizon:
            self.recommendations.popleft()
        up_window = [r for when, r in self.recommendations if when >= t - self.rule.up.stabilization_s]
        down_window = [r for when, r in self.recommendations if when >= t - self.rule.down.stabilization_s]
        # Scale up only to what every recent proposal wanted, down only to what none exceeded.
        return min(max(current, min(up_window)), max(down_window))

    def _changed_within(self, t: float, period: int, sign: int) -> int:
        return sum(d for when, d in self.events if when > t - period and d * sign > 0)

    def _up_limit(self, t: float, current: int) -> int:
        if self.rule.up.select == "Disabled":
            return current
        limits = []
        for kind, value, period in self.rule.up.policies:
            start = current - self._changed_within(t, period, +1)
            limits.append(start + value if kind == "Pods" else math.ceil(start * (1 + value / 100)))
        return max(limits) if self.rule.up.select == "Max" else min(limits)

    def _down_limit(self, t: float, current: int) -> int:
        if self.rule.down.select == "Disabled":
            return current
        limits = []
        for kind, value, period in self.rule.down.policies:
            start = current - self._changed_within(t, period, -1)
            limits.append(start - value if kind == "Pods" else math.floor(start * (1 - value / 100)))
        # Max picks the policy allowing the largest change, i.e. the lowest count.
        return min(limits) if self.rule.down.select == "Max" else max(limits)

    def decide(self, t: float, current: int, waiting: float = 0.0, utilisation: float = 0.0) -> int:
        stabilized = self._stabilized(t, self.proposal(waiting, utilisation, current), current)
        if stabilized > current:
            desired = min(stabilized, self._up_limit(t, current))
        elif stabilized < current:
            desired = max(stabilized, self._down_limit(t, current))
        else:
            desired = current
        desired = max(self.rule.min_replicas, min(self.rule.max_replicas, desired))
        if desired != current:
            self.events.append((t, desired - current))
            while self.events and self.events[0][0] < t - 3600:
                self.events.popleft()
        return desired


# --------------------------------------------------------------------------- the workers


@dataclass(frozen=True)
class WorkerModel:
    concurrency: int = 2  # --concurrency of k8s/base/mining-worker.yaml
    startup_s: int = 90  # schedule, pull a cached image, load the models
    median_s: float = REALDEV_MEDIAN_S
    p90_s: float = REALDEV_P90_S
    cap_s: float = 1.5 * REALDEV_MAX_S
    overhead_s: float = 0.2  # fetch the figure, write panels and regions
    cpu_request: float = 1.0  # cores, the CPU rule's utilisation is measured against it

    def service_times(self, rng: np.random.Generator, n: int) -> np.ndarray:
        sigma = math.log(self.p90_s / self.median_s) / Z90
        draws = rng.lognormal(math.log(self.median_s), sigma, n)
        return np.minimum(draws, self.cap_s) + self.overhead_s


@dataclass
class Pod:
    ready_at: float
    busy: list[float]  # remaining seconds of each slot's figure (0: idle)
    stopping: bool = False


@dataclass
class Cluster:
    model: WorkerModel
    pods: list[Pod] = field(default_factory=list)

    @property
    def replicas(self) -> int:
        return sum(1 for p in self.pods if not p.stopping)

    def scale_to(self, n: int, t: float) -> None:
        while self.replicas < n:
            self.pods.append(Pod(ready_at=t + self.model.startup_s, busy=[0.0] * self.model.concurrency))
        live = [p for p in self.pods if not p.stopping]
        # The ReplicaSet stops pods that are not ready first, then the newest.
        for pod in sorted(live, key=lambda p: (p.ready_at <= t, -p.ready_at))[: max(0, len(live) - n)]:
            pod.stopping = True

    def step(self, t: float, dt: float, queue: deque[float], service: Any, lags: list[float]) -> float:
        """Advance dt seconds; returns the CPU cores busy in that time."""
        busy_seconds = 0.0
        for pod in self.pods:
            if pod.ready_at <= t:
                busy_seconds += sum(
                    self._run_slot(pod, i, t, dt, queue, service, lags) for i in range(len(pod.busy))
                )
        self.pods = [p for p in self.pods if not (p.stopping and all(r <= 0 for r in p.busy))]
        return busy_seconds / dt

    @staticmethod
    def _run_slot(
        pod: Pod, slot: int, t: float, dt: float, queue: deque[float], service: Any, lags: list[float]
    ) -> float:
        """One slot through dt seconds, taking figures back to back; returns its busy seconds."""
        budget, remaining = dt, pod.busy[slot]
        while budget > 1e-9:
            if remaining <= 0:
                if pod.stopping or not queue:
                    break
                lags.append(t + dt - budget - queue.popleft())
                remaining = next(service)
            used = min(remaining, budget)
            remaining -= used
            budget -= used
        pod.busy[slot] = max(0.0, remaining)
        return dt - budget

    def cpu_utilisation(self, t: float, busy_cores: float) -> float:
        ready = [p for p in self.pods if p.ready_at <= t and not p.stopping]
        return busy_cores / (len(ready) * self.model.cpu_request) if ready else 0.0


# --------------------------------------------------------------------------- load and runs

# (minutes, figures/s at the start, figures/s at the end): linear within a phase.
DAY: tuple[tuple[float, float, float], ...] = (
    (30, 1, 1),
    (3, 40, 40),  # a bulk ingest: about 7,000 figures in three minutes
    (57, 1, 1),
    (60, 1, 18),  # the working day ramps up
    (60, 18, 18),
    (30, 18, 4),
    (60, 4, 4),
    (60, 0, 0),  # night
)


def rate_at(load: tuple[tuple[float, float, float], ...], t: float) -> float:
    start = 0.0
    for minutes, begin, end in load:
        length = minutes * 60
        if t < start + length:
            return begin + (end - begin) * (t - start) / length
        start += length
    return 0.0


def duration_s(load: tuple[tuple[float, float, float], ...]) -> int:
    return int(sum(minutes for minutes, _, _ in load) * 60)


@dataclass
class Trace:
    rule: str
    times: list[float] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)
    replicas: list[int] = field(default_factory=list)
    lags: list[float] = field(default_factory=list)
    changes: list[tuple[float, int]] = field(default_factory=list)  # (t, new count)
    pod_seconds: float = 0.0


def simulate(
    rule: Rule, load: tuple[tuple[float, float, float], ...], model: WorkerModel, seed: int
) -> Trace:
    rng = np.random.default_rng(seed)
    arrivals = rng.poisson([rate_at(load, s) for s in range(duration_s(load))])
    service = iter(model.service_times(rng, int(arrivals.sum()) + 1))
    cluster, scaler, queue, trace = Cluster(model), Autoscaler(rule), deque[float](), Trace(rule.name)
    cluster.scale_to(rule.min_replicas, -float(model.startup_s))  # warm at the start
    window_cores = 0.0
    for t, count in enumerate(arrivals):
        queue.extend(t + i / max(count, 1) for i in range(count))
        window_cores += cluster.step(float(t), 1.0, queue, service, trace.lags)
        trace.pod_seconds += len(cluster.pods)
        if t % rule.sync_s == 0:
            utilisation = cluster.cpu_utilisation(t, window_cores / rule.sync_s)
            window_cores = 0.0
            desired = scaler.decide(float(t), cluster.replicas, len(queue), utilisation)
            if desired != cluster.replicas:
                trace.changes.append((float(t), desired))
                cluster.scale_to(desired, float(t))
        trace.times.append(t)
        trace.waiting.append(len(queue))
        trace.replicas.append(cluster.replicas)
    return trace


def reversals(changes: list[tuple[float, int]], within_s: float, start: int) -> int:
    """Changes of direction less than `within_s` after the previous change: flapping."""
    count, previous, last = 0, None, start
    last_t = -math.inf
    for t, n in changes:
        direction = 1 if n > last else -1
        if previous is not None and direction != previous and t - last_t < within_s:
            count += 1
        previous, last, last_t = direction, n, t
    return count


def summary(trace: Trace, rule: Rule) -> dict[str, Any]:
    hours = len(trace.times) / 3600
    lags = np.array(trace.lags) if trace.lags else np.zeros(1)
    return {
        "rule": trace.rule,
        "figures": len(trace.lags),
        "max_lag_s": round(float(lags.max()), 1),
        "p95_lag_s": round(float(np.percentile(lags, 95)), 1),
        "max_waiting": max(trace.waiting),
        "max_replicas": max(trace.replicas),
        "replica_changes_per_hour": round(len(trace.changes) / hours, 2),
        "reversals_within_10min": reversals(trace.changes, 600, rule.min_replicas),
        "pod_hours": round(trace.pod_seconds / 3600, 1),
    }


def plot(traces: list[Trace], load: tuple[tuple[float, float, float], ...], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1, figsize=(11, 9), sharex=True)
    minutes = [t / 60 for t in traces[0].times]
    axes[0].plot(minutes, [rate_at(load, t) for t in traces[0].times], color="black")
    axes[0].set_ylabel("figures/s offered")
    # The first rule is the overlay's: drawn thicker and on top.
    for n, trace in enumerate(reversed(traces)):
        width = 2.0 if n == len(traces) - 1 else 1.0
        axes[1].plot(minutes, trace.waiting, label=trace.rule, linewidth=width)
        axes[2].step(minutes, trace.replicas, where="post", label=trace.rule, linewidth=width)
    axes[1].set_ylabel("waiting on `mining`")
    axes[1].set_yscale("symlog", linthresh=10)
    axes[2].set_ylabel("replicas")
    axes[2].set_xlabel("minutes")
    axes[2].legend(loc="upper right", fontsize=8)
    axes[0].set_title("mining-worker autoscaling, simulated (bench/autoscale_sim.py)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(seeds: list[int], model: WorkerModel, out: Path) -> list[dict[str, Any]]:
    rules = manifest_rules()
    rows = []
    for n, seed in enumerate(seeds):
        traces = [simulate(rule, DAY, model, seed) for rule in rules]
        if n == 0:
            out.parent.mkdir(parents=True, exist_ok=True)
            plot(traces, DAY, out.with_suffix(".png"))
        rows += [{"seed": seed, **summary(trace, rule)} for trace, rule in zip(traces, rules, strict=True)]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "autoscale-sim")
    parser.add_argument("--seeds", type=int, nargs="+", default=[20261127, 1, 2])
    parser.add_argument("--startup-s", type=int, default=WorkerModel.startup_s)
    args = parser.parse_args()
    model = WorkerModel(startup_s=args.startup_s)
    rows = run(args.seeds, model, args.out)
    record = {"worker_model": model.__dict__, "load": DAY, "results": rows}
    args.out.with_suffix(".json").write_text(json.dumps(record, indent=1) + "\n")
    for row in rows:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
