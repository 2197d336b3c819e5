"""Autoscaling, disruption and scraping as the rendered k8s/ overlays define them.

- KEDA reads the Redis lists that Celery really writes: checked by publishing through the
  project's own Celery app and job routing to a real Redis, then reading the lists named by the
  rendered ScaledObjects (with priorities, kombu would spread a queue over several lists).
- No workload is scaled by two autoscalers, in one overlay or across the KEDA and CPU overlays.
- Scale-down and drains wait for the longest task; every app has a disruption budget.
- Prometheus finds every API and worker, by annotations and by the operator's monitors.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis as redis_lib

from p2p.shared import jobs
from p2p.shared.queue import (
    EMBED_FIGURES_TASK,
    MINE_FIGURE_TASK,
    CeleryDispatcher,
    configure_celery,
    time_limits,
)
from p2p.shared.settings import Settings
from tests.k8s_manifests import (
    AUTOSCALER_KINDS,
    STACK_OVERLAYS,
    autoscaler_target,
    celery_queues,
    keda_hpa_name,
    named,
    of_kind,
    render,
)
from tests.servers import start_redis

# The queues scaled on their depth (issue 22) and the model server scaled on waiting requests.
QUEUE_SCALED = {
    "mining-worker": "mining",
    "mining-worker-lvlm": "mining-lvlm",
    "embedding-worker": "embedding",
}
WORKER_METRICS_PORT = 9464
API_PORT = 8000
# A database of its own on the machine's Redis: the session fixture uses 11.
REDIS_DB = 14


def _deployments(name: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in of_kind(render(name), "Deployment")}


def _container(deployment: dict[str, Any]) -> dict[str, Any]:
    return deployment["spec"]["template"]["spec"]["containers"][0]


def _redis_triggers(overlay: str) -> dict[str, dict[str, str]]:
    """Target deployment -> metadata of its ScaledObject's redis trigger."""
    found = {}
    for scaled in of_kind(render(overlay), "ScaledObject"):
        for trigger in scaled["spec"]["triggers"]:
            if trigger["type"] == "redis":
                found[autoscaler_target(scaled)[1]] = trigger["metadata"]
    return found


# --------------------------------------------------------------------------- which lists


def test_keda_scales_each_queue_on_the_list_its_workers_consume() -> None:
    triggers = _redis_triggers("autoscale-keda-gpu")
    assert {name: meta["listName"] for name, meta in triggers.items()} == QUEUE_SCALED
    deployments = _deployments("autoscale-keda-gpu")
    config = named(render("base"), "ConfigMap", "p2p-config")["data"]
    broker = urlsplit(config["P2P_REDIS__URL"])
    for name, meta in triggers.items():
        assert celery_queues(_container(deployments[name])) == [meta["listName"]], name
        # The broker of the ConfigMap, reached through its in-cluster Service name.
        host, port = meta["address"].rsplit(":", 1)
        assert host.split(".")[0] == broker.hostname and int(port) == broker.port, name
        assert meta["databaseIndex"] == broker.path.lstrip("/"), name
        assert int(meta["listLength"]) >= 1


def test_cpu_triggers_have_requests_to_measure_against() -> None:
    # KEDA's cpu trigger (utilisation of the request) refuses a target whose containers request
    # no CPU; the mining worker's one keeps the busy pods that an empty queue would let go.
    deployments = _deployments("autoscale-keda-gpu")
    with_cpu = set()
    for scaled in of_kind(render("autoscale-keda-gpu"), "ScaledObject"):
        if any(t["type"] == "cpu" for t in scaled["spec"]["triggers"]):
            target = deployments[autoscaler_target(scaled)[1]]
            for container in target["spec"]["template"]["spec"]["containers"]:
                assert container["resources"]["requests"]["cpu"], target["metadata"]["name"]
            with_cpu.add(target["metadata"]["name"])
    assert "mining-worker" in with_cpu


def test_the_model_server_scales_on_waiting_requests() -> None:
    scaled = named(render("autoscale-keda-gpu"), "ScaledObject", "vllm")
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "prometheus"
    assert "vllm:num_requests_waiting" in trigger["metadata"]["query"]
    assert scaled["spec"]["minReplicaCount"] >= 1, "a cold model server takes most of an hour"
    # Prometheus scrapes the server where the metric lives: its API port.
    vllm = _deployments("autoscale-keda-gpu")["vllm"]
    annotations = vllm["spec"]["template"]["metadata"]["annotations"]
    ports = {p["name"]: p["containerPort"] for p in _container(vllm)["ports"]}
    assert annotations["prometheus.io/port"] == str(ports["http"])


def _clear_queues(client: redis_lib.Redis) -> None:
    # Only the keys of the scaled queues and kombu's bindings, in a database of our own.
    keys = [k for pattern in ("mining*", "embedding*", "_kombu.*") for k in client.keys(pattern)]
    if keys:
        client.delete(*keys)


@pytest.fixture
def broker_url(tmp_path: Path) -> Iterator[str]:
    handle = start_redis(tmp_path / "redis", db=REDIS_DB)
    client = redis_lib.Redis.from_url(handle.url)
    _clear_queues(client)  # what an interrupted run may have left
    yield handle.url
    _clear_queues(client)
    client.close()
    handle.stop()


def _publish_through_the_project(url: str, tmp_path: Path) -> Counter[str]:
    """One message per way the services enqueue scaled work, routed by the project's own code."""
    settings = Settings(data_dir=tmp_path / "data", redis={"url": url})
    dispatcher = CeleryDispatcher(configure_celery(settings), url, settings=settings)
    sent: Counter[str] = Counter()
    try:
        for backend in ("cpu", "lvlm"):
            queue = jobs.MINING.queue(SimpleNamespace(backend=backend))
            dispatcher.send(MINE_FIGURE_TASK, args=[f"job-{backend}"], queue=queue)
            sent[queue] += 1
        reindex = jobs.REINDEX.queue(SimpleNamespace(progress={}))
        dispatcher.send(jobs.REINDEX.task_name, args=["version", "default"], queue=reindex)
        sent[reindex] += 1
        dispatcher.send(EMBED_FIGURES_TASK, args=[["figure"]], queue=reindex)
        sent[reindex] += 1
    finally:
        dispatcher.close()
    return sent


def test_keda_reads_the_lists_celery_writes(broker_url: str, tmp_path: Path) -> None:
    sent = _publish_through_the_project(broker_url, tmp_path)
    client = redis_lib.Redis.from_url(broker_url)
    lists = {key.decode(): client.llen(key) for key in client.keys("*") if client.type(key) == b"list"}
    read_by_keda = {meta["listName"] for meta in _redis_triggers("autoscale-keda-gpu").values()}
    # Every message sits in a list some ScaledObject reads, as many as were sent to its queue. With
    # task priorities kombu would also write "<queue>\x06\x16<n>" lists that KEDA does not see.
    assert lists == {queue: count for queue, count in sent.items()}, lists
    assert set(lists) == read_by_keda
    # And a Celery consumer of that queue takes the message from that same list.
    with configure_celery(Settings(redis={"url": broker_url})).connection_for_read(broker_url) as conn:
        message = conn.default_channel.basic_get("mining", no_ack=True)
    assert message is not None and message.headers["task"] == MINE_FIGURE_TASK
    assert client.llen("mining") == sent["mining"] - 1
    client.close()


def test_a_task_priority_would_move_messages_out_of_sight(broker_url: str) -> None:
    # Why the check above matters: kombu's Redis transport keeps a prioritised message in a list
    # "<queue>\x06\x16<step>", which a redis trigger on "<queue>" does not count.
    app = configure_celery(Settings(redis={"url": broker_url}))
    with app.connection_for_write(broker_url) as conn:
        app.send_task(MINE_FIGURE_TASK, args=["job"], queue="mining", priority=5, connection=conn)
    client = redis_lib.Redis.from_url(broker_url)
    assert client.llen("mining") == 0
    assert client.llen("mining\x06\x163") == 1
    client.close()


# --------------------------------------------------------------------------- one autoscaler each


@pytest.mark.parametrize("overlay", [*STACK_OVERLAYS, "base", "gpu", "monitoring"])
def test_no_workload_has_two_autoscalers(overlay: str) -> None:
    docs = render(overlay)
    targets = Counter(autoscaler_target(d) for d in docs if d["kind"] in AUTOSCALER_KINDS)
    assert all(count == 1 for count in targets.values()), targets
    deployments = _deployments(overlay)
    for kind, name in targets:
        assert kind == "Deployment" and name in deployments, f"{overlay}: {name} is not in the overlay"
        # A fixed count would reset the autoscaler's on every apply.
        assert "replicas" not in deployments[name]["spec"], f"{overlay}: {name} sets replicas"
    assert bool(targets) == (overlay in STACK_OVERLAYS)


def test_keda_and_cpu_overlays_exclude_each_other() -> None:
    keda = of_kind(render("autoscale-keda-gpu"), "ScaledObject")
    cpu = of_kind(render("autoscale-cpu"), "HorizontalPodAutoscaler")
    assert not of_kind(render("autoscale-keda-gpu"), "HorizontalPodAutoscaler")
    assert not of_kind(render("autoscale-keda"), "HorizontalPodAutoscaler")
    assert not of_kind(render("autoscale-cpu"), "ScaledObject")
    # KEDA's HPA for a workload has the name of the CPU overlay's HPA for it: applying one overlay
    # over the other rewrites that one HPA object instead of adding a second scaler.
    keda_hpas = {autoscaler_target(s): keda_hpa_name(s) for s in keda}
    cpu_hpas = {autoscaler_target(h): h["metadata"]["name"] for h in cpu}
    assert cpu_hpas and set(cpu_hpas) <= set(keda_hpas)
    for target, name in cpu_hpas.items():
        assert keda_hpas[target] == name, target
    assert len(set(keda_hpas.values())) == len(keda_hpas)


def test_the_gpu_overlay_is_the_keda_overlay_plus_the_gpu_addon() -> None:
    # The GPU overlay is the CPU-cluster KEDA overlay plus the GPU add-on, never a second copy.
    cpu_cluster = {(d["kind"], d["metadata"]["name"]) for d in render("autoscale-keda")}
    gpu_cluster = {(d["kind"], d["metadata"]["name"]) for d in render("autoscale-keda-gpu")}
    gpu_addon = {(d["kind"], d["metadata"]["name"]) for d in render("gpu")}
    assert (
        cpu_cluster | gpu_addon | {("ScaledObject", "mining-worker-lvlm"), ("ScaledObject", "vllm")}
        == gpu_cluster
    )


# --------------------------------------------------------------------------- safe scale-down


GRACE_MARGIN_S = 30


@pytest.mark.parametrize("overlay", ["autoscale-keda-gpu", "autoscale-cpu"])
def test_stopping_workers_outlast_their_longest_task(overlay: str) -> None:
    """A worker told to stop (scale-down, drain) finishes its running tasks first: Celery's warm
    shutdown waits for them, and each ends by its hard time limit at the latest."""
    settings = Settings()
    checked = set()
    for name, deployment in _deployments(overlay).items():
        for queue in celery_queues(_container(deployment)):
            limits = time_limits(settings, queue)
            if not limits:  # training runs checkpoint instead (test_deploy's grace test)
                continue
            grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
            assert grace >= limits["time_limit"] + GRACE_MARGIN_S, (name, queue, grace, limits)
            checked.add(queue)
    expected = {"ingest", "mining", "embedding"} | ({"mining-lvlm"} if "gpu" in overlay else set())
    assert checked == expected


def test_a_wedged_worker_is_not_given_the_long_grace_period() -> None:
    # The kubelet stops liveness probes once a pod terminates, so this only shortens the kill of a
    # worker whose liveness failed; a scale-down or drain still gets the full grace period.
    for name, deployment in _deployments("autoscale-keda-gpu").items():
        spec = deployment["spec"]["template"]["spec"]
        if celery_queues(spec["containers"][0]) and spec["terminationGracePeriodSeconds"] > 600:
            probe = spec["containers"][0]["livenessProbe"]
            assert probe["terminationGracePeriodSeconds"] <= 120, name


def _pdb_for(docs: tuple[dict[str, Any], ...], labels: dict[str, str]) -> list[dict[str, Any]]:
    return [
        pdb
        for pdb in of_kind(docs, "PodDisruptionBudget")
        if pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    ]


@pytest.mark.parametrize("overlay", ["autoscale-keda-gpu", "autoscale-cpu"])
def test_every_app_has_one_disruption_budget_that_never_blocks_a_drain(overlay: str) -> None:
    docs = render(overlay)
    for name, deployment in _deployments(overlay).items():
        budgets = _pdb_for(docs, deployment["spec"]["template"]["metadata"]["labels"])
        assert len(budgets) == 1, f"{name}: {len(budgets)} disruption budgets"
        spec = budgets[0]["spec"]
        replicas = deployment["spec"].get("replicas", 1)
        # minAvailable below the replica count (or maxUnavailable >= 1) still lets a drain through.
        assert spec.get("maxUnavailable", 0) >= 1 or spec["minAvailable"] < replicas, name


# --------------------------------------------------------------------------- scraping


def _scrape(deployment: dict[str, Any]) -> tuple[int, str]:
    annotations = deployment["spec"]["template"]["metadata"].get("annotations", {})
    assert annotations.get("prometheus.io/scrape") == "true", deployment["metadata"]["name"]
    return int(annotations["prometheus.io/port"]), annotations["prometheus.io/path"]


def test_pod_annotations_point_prometheus_at_every_api_and_worker() -> None:
    for name, deployment in _deployments("autoscale-keda-gpu").items():
        port, path = _scrape(deployment)
        ports = {p["name"]: p["containerPort"] for p in _container(deployment).get("ports", [])}
        if celery_queues(_container(deployment)):
            assert (port, path) == (WORKER_METRICS_PORT, "/metrics"), name
            assert ports.get("metrics") == WORKER_METRICS_PORT, name
        else:
            assert port == ports["http"] and path == "/metrics", name
            assert name == "vllm" or port == API_PORT, name


def test_workers_serve_metrics_where_their_annotations_point() -> None:
    """The workers' metrics server binds 127.0.0.1 unless told otherwise: the ConfigMap must open it
    to the pod network on the annotated port, in settings the app accepts."""
    config = named(render("base"), "ConfigMap", "p2p-config")["data"]
    metrics = Settings(
        metrics={
            "worker_host": config["P2P_METRICS__WORKER_HOST"],
            "worker_port": config["P2P_METRICS__WORKER_PORT"],
        }
    ).metrics
    assert metrics.worker_host == "0.0.0.0"
    assert metrics.worker_port == WORKER_METRICS_PORT


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for expression in selector.get("matchExpressions", []):
        assert expression["operator"] == "In"
        if labels.get(expression["key"]) not in expression["values"]:
            return False
    return True


def test_operator_monitors_cover_every_api_and_worker() -> None:
    stack = render("autoscale-keda-gpu")
    monitors = render("monitoring")
    pod_monitors = of_kind(monitors, "PodMonitor")
    service_monitors = of_kind(monitors, "ServiceMonitor")
    for name, deployment in _deployments("autoscale-keda-gpu").items():
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        port_names = {p["name"] for p in _container(deployment).get("ports", [])}
        by_pod = [m for m in pod_monitors if _selects(m["spec"]["selector"], labels)]
        services = [s for s in of_kind(stack, "Service") if s["spec"]["selector"].items() <= labels.items()]
        by_service = [
            m
            for m in service_monitors
            for s in services
            if _selects(m["spec"]["selector"], s["metadata"]["labels"])
        ]
        assert len(by_pod) + len(by_service) == 1, f"{name}: scraped {len(by_pod) + len(by_service)} times"
        for monitor in by_pod:
            assert {e["port"] for e in monitor["spec"]["podMetricsEndpoints"]} <= port_names, name
        for service in services:
            service_ports = {p["name"] for p in service["spec"]["ports"]}
            assert all({e["port"] for e in m["spec"]["endpoints"]} <= service_ports for m in by_service), name
