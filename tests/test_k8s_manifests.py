"""Every kustomization under k8s/ renders, and every object it renders validates: built-in kinds
against the Kubernetes schemas (kubernetes-validate), KEDA and Prometheus-operator resources
against k8s/schemas/. The second half breaks rendered objects on purpose: the validation must
catch each break, or the first half proves nothing."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from tests.k8s_manifests import (
    K8S_VERSIONS,
    KUSTOMIZATIONS,
    crd_schema,
    named,
    of_kind,
    render,
    schema_errors,
)


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("name", sorted(KUSTOMIZATIONS))
def test_rendered_objects_validate_against_their_schemas(name: str, version: str) -> None:
    docs = render(name)
    errors = [error for doc in docs for error in schema_errors(doc, version)]
    assert not errors, "\n".join(errors)
    others = [d for d in docs if d["kind"] != "Namespace"]
    assert all(d["metadata"]["namespace"] == "panel2patch" for d in others), name


def test_custom_resources_are_validated_by_the_repository_schemas() -> None:
    # Which rendered kinds go to k8s/schemas/ (an object of a kind with no schema at all fails above).
    custom = {
        (doc["apiVersion"], doc["kind"])
        for name in KUSTOMIZATIONS
        for doc in render(name)
        if crd_schema(doc["apiVersion"], doc["kind"]) is not None
    }
    assert custom == {
        ("keda.sh/v1alpha1", "ScaledObject"),
        ("monitoring.coreos.com/v1", "ServiceMonitor"),
        ("monitoring.coreos.com/v1", "PodMonitor"),
    }
    assert crd_schema("keda.sh/v1alpha1", "TriggerAuthentication") is not None


def _scaled_object() -> dict[str, Any]:
    return copy.deepcopy(named(render("autoscale-keda-gpu"), "ScaledObject", "mining-worker"))


def _vllm_scaled_object() -> dict[str, Any]:
    return copy.deepcopy(named(render("autoscale-keda-gpu"), "ScaledObject", "vllm"))


def _deployment() -> dict[str, Any]:
    return copy.deepcopy(named(render("base"), "Deployment", "mining-worker"))


def _pod_monitor() -> dict[str, Any]:
    return copy.deepcopy(of_kind(render("monitoring"), "PodMonitor")[0])


def _service_monitor() -> dict[str, Any]:
    return copy.deepcopy(of_kind(render("monitoring"), "ServiceMonitor")[0])


def _trigger_authentication() -> dict[str, Any]:
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "TriggerAuthentication",
        "metadata": {"name": "redis-auth", "namespace": "panel2patch"},
        "spec": {"secretTargetRef": [{"parameter": "password", "name": "p2p-redis", "key": "password"}]},
    }


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def apply(doc: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = doc
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        if value is _DELETE:
            del node[last]
        else:
            node[last] = value

    return apply


_DELETE = object()

BREAKS: dict[str, tuple[Callable[[], dict[str, Any]], Callable[[dict[str, Any]], None]]] = {
    # KEDA reads trigger metadata as strings only; a YAML number is refused by the CRD.
    "listLength as a number": (_scaled_object, _set("spec.triggers.0.metadata.listLength", 8)),
    "redis trigger without listName": (_scaled_object, _set("spec.triggers.0.metadata.listName", _DELETE)),
    "misspelt spec field": (_scaled_object, _set("spec.maxReplicas", 10)),
    "no scale target": (_scaled_object, _set("spec.scaleTargetRef", _DELETE)),
    "no triggers": (_scaled_object, _set("spec.triggers", [])),
    "cpu trigger without metricType": (_scaled_object, _set("spec.triggers.1.metricType", _DELETE)),
    "cpu trigger value with a percent sign": (_scaled_object, _set("spec.triggers.1.metadata.value", "150%")),
    "bad select policy": (
        _scaled_object,
        _set("spec.advanced.horizontalPodAutoscalerConfig.behavior.scaleDown.selectPolicy", "Least"),
    ),
    "stabilization over an hour": (
        _scaled_object,
        _set(
            "spec.advanced.horizontalPodAutoscalerConfig.behavior.scaleDown.stabilizationWindowSeconds", 7200
        ),
    ),
    "prometheus trigger without query": (
        _vllm_scaled_object,
        _set("spec.triggers.0.metadata.query", _DELETE),
    ),
    "threshold not a number": (_vllm_scaled_object, _set("spec.triggers.0.metadata.threshold", "many")),
    "deployment: unknown field": (_deployment, _set("spec.replica", 2)),
    "deployment: grace period as a string": (
        _deployment,
        _set("spec.template.spec.terminationGracePeriodSeconds", "660"),
    ),
    "deployment: no selector": (_deployment, _set("spec.selector", _DELETE)),
    "pod monitor: interval without unit": (_pod_monitor, _set("spec.podMetricsEndpoints.0.interval", "30")),
    "pod monitor: no selector": (_pod_monitor, _set("spec.selector", _DELETE)),
    "service monitor: bad scheme": (_service_monitor, _set("spec.endpoints.0.scheme", "tcp")),
    "service monitor: bad selector operator": (
        _service_monitor,
        _set("spec.selector.matchExpressions.0.operator", "Is"),
    ),
    "trigger authentication: secret ref without key": (
        _trigger_authentication,
        _set("spec.secretTargetRef.0.key", _DELETE),
    ),
}


@pytest.mark.parametrize("case", sorted(BREAKS))
def test_validation_catches_a_broken_manifest(case: str) -> None:
    make, breaks = BREAKS[case]
    doc = make()
    assert not schema_errors(doc, K8S_VERSIONS[0]), "the unbroken object must be valid"
    breaks(doc)
    assert schema_errors(doc, K8S_VERSIONS[0]), f"{case} passed validation"


def test_an_unknown_custom_kind_is_an_error() -> None:
    doc = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}, "spec": {}}
    assert schema_errors(doc, K8S_VERSIONS[0])
