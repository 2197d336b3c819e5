"""Rendering and schema validation of the k8s/ kustomizations, shared by the manifest tests.

Built-in kinds are checked against the Kubernetes OpenAPI schemas that kubernetes-validate ships
(strict: unknown fields are errors). The custom resources (KEDA, Prometheus operator) are checked
against the JSON schemas in k8s/schemas/, written from those projects' CRDs.
"""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
K8S_ROOT = ROOT / "k8s"
SCHEMAS = K8S_ROOT / "schemas"
OVERLAYS = K8S_ROOT / "overlays"

# Every directory an operator applies with `kubectl apply -k`.
KUSTOMIZATIONS = {
    "base": K8S_ROOT / "base",
    "gpu": K8S_ROOT / "gpu",
    "autoscale-keda": OVERLAYS / "autoscale-keda",
    "autoscale-keda-gpu": OVERLAYS / "autoscale-keda-gpu",
    "autoscale-cpu": OVERLAYS / "autoscale-cpu",
    "monitoring": OVERLAYS / "monitoring",
}
# The stack overlays: each is a whole deployment, applied instead of the others.
STACK_OVERLAYS = ("autoscale-keda", "autoscale-keda-gpu", "autoscale-cpu")
# The oldest Kubernetes release supported and the newest one kubernetes-validate knows.
K8S_VERSIONS = ("1.30", "1.37")

AUTOSCALER_KINDS = {"HorizontalPodAutoscaler", "ScaledObject"}


@functools.cache
def render(name: str) -> tuple[dict[str, Any], ...]:
    """`kubectl kustomize` of one kustomization: the objects `kubectl apply -k` would send."""
    if shutil.which("kubectl") is None:
        pytest.fail("kubectl is not installed (make test-deps installs it)")
    result = subprocess.run(
        ["kubectl", "kustomize", str(KUSTOMIZATIONS[name])],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, f"kubectl kustomize {name}: {result.stderr}"
    docs = tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc is not None)
    assert docs, f"{name} renders nothing"
    return docs


def of_kind(docs: tuple[dict[str, Any], ...], kind: str) -> list[dict[str, Any]]:
    return [doc for doc in docs if doc["kind"] == kind]


def named(docs: tuple[dict[str, Any], ...], kind: str, name: str) -> dict[str, Any]:
    (doc,) = [d for d in of_kind(docs, kind) if d["metadata"]["name"] == name]
    return doc


@functools.cache
def crd_schema(api_version: str, kind: str) -> dict[str, Any] | None:
    path = SCHEMAS / f"{api_version.replace('/', '-')}-{kind}.json"
    if not path.exists():
        return None
    schema: dict[str, Any] = json.loads(path.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return schema


def schema_errors(doc: dict[str, Any], k8s_version: str) -> list[str]:
    """Why `doc` would be refused (or silently pruned) by a cluster; empty when it is valid."""
    where = f"{doc.get('kind')} {doc.get('metadata', {}).get('name')}"
    schema = crd_schema(str(doc.get("apiVersion")), str(doc.get("kind")))
    if schema is not None:
        validator = jsonschema.Draft202012Validator(schema)
        return [
            f"{where}: {'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)
        ]
    try:
        kubernetes_validate.validate(doc, k8s_version, strict=True)
    except kubernetes_validate.SchemaNotFoundError:
        return [f"{where}: no schema for {doc.get('apiVersion')} {doc.get('kind')}"]
    except kubernetes_validate.ValidationError as error:
        return [f"{where}: {'/'.join(map(str, error.path))}: {error.message}"]
    return []


def autoscaler_target(doc: dict[str, Any]) -> tuple[str, str]:
    ref = doc["spec"]["scaleTargetRef"]
    # A ScaledObject's kind defaults to Deployment.
    return ref.get("kind", "Deployment"), ref["name"]


def keda_hpa_name(scaled_object: dict[str, Any]) -> str:
    """The name of the HPA that KEDA creates for a ScaledObject (keda-hpa-<name> unless set)."""
    config = scaled_object["spec"].get("advanced", {}).get("horizontalPodAutoscalerConfig", {})
    return str(config.get("name") or f"keda-hpa-{scaled_object['metadata']['name']}")


def celery_queues(container: dict[str, Any]) -> list[str]:
    """The queues of a `celery ... worker -Q a,b` container; empty for anything else."""
    argv = [*container.get("command", []), *container.get("args", [])]
    if "celery" not in argv or "worker" not in argv or "-Q" not in argv:
        return []
    return str(argv[argv.index("-Q") + 1]).split(",")
