"""Checks of the deployment files: Dockerfiles, docker-compose.yml and the k8s/ manifests.

Nothing here builds or runs an image; the compose file is validated with the compose CLI
(`docker compose` or the standalone `docker-compose`), everything else is read as YAML.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tomllib
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
COMPOSE_FILE = ROOT / "docker-compose.yml"
K8S = ROOT / "k8s" / "base"
K8S_GPU = ROOT / "k8s" / "gpu"
NAMESPACE = "panel2patch"

CELERY_APP = "p2p.apps.worker:celery_app"
# Queues the Celery workers consume.
CELERY_QUEUES = {"ingest", "mining", "mining-lvlm", "embedding", "training"}
# `p2p` sub-commands that deployment files may run; all of them exist in the CLI.
P2P_COMMANDS = {("serve", "ingest"), ("serve", "embedding-api"), ("db", "upgrade")}
P2P_COMMANDS_NOT_YET_BUILT: set[tuple[str, ...]] = set()
# The app services of the stack (compose and k8s), besides the datastores and migrate.
APP_SERVICES = (
    "ingest",
    "ingest-worker",
    "mining-worker",
    "embedding-api",
    "embedding-worker",
    "training-worker",
)
WORKER_SERVICES = ("ingest-worker", "mining-worker", "embedding-worker", "training-worker")
EMBEDDING_IMAGE = "panel2patch/embedding-api:latest"
TRAINING_IMAGE = "panel2patch/training:latest"

# Variables docker-compose.yml requires (`${VAR:?...}`), with throwaway values.
COMPOSE_REQUIRED_ENV = {
    "POSTGRES_PASSWORD": "dummy-postgres-password",
    "MINIO_ROOT_USER": "dummy-user",
    "MINIO_ROOT_PASSWORD": "dummy-minio-password",
}
DEFAULT_SECRETS = {"minioadmin", "postgres", "password", "changeme", "secret"}

# Kinds that are not namespaced.
CLUSTER_SCOPED_KINDS = {"Namespace", "ClusterRole", "ClusterRoleBinding", "PersistentVolume", "StorageClass"}

DOCKERFILES = {
    "ingest": ROOT / "services" / "ingest" / "Dockerfile",
    "mining": ROOT / "services" / "mining" / "Dockerfile",
    "training": ROOT / "services" / "training" / "Dockerfile",
    "embedding-api": ROOT / "services" / "embedding-api" / "Dockerfile",
}
# What each image runs by default: a p2p sub-command or a Celery queue.
DOCKERFILE_EXPECTED_CMD = {
    "ingest": ("p2p", ("serve", "ingest")),
    "mining": ("celery", "mining"),
    "training": ("celery", "training"),
    "embedding-api": ("p2p", ("serve", "embedding-api")),
}


# --------------------------------------------------------------------------- helpers


def _as_argv(command: Any) -> list[str]:
    """A compose/k8s/Dockerfile command (list or string) as an argument list."""
    if command is None:
        return []
    if isinstance(command, str):
        return shlex.split(command)
    return [str(part) for part in command]


def _celery_queue(argv: list[str]) -> str | None:
    """The queue of a `celery -A <app> worker -Q <queue>` command line, else None."""
    if not argv or Path(argv[0]).name != "celery" or "worker" not in argv:
        return None
    assert "-A" in argv, f"celery command without -A: {argv}"
    assert argv[argv.index("-A") + 1] == CELERY_APP, f"celery app must be {CELERY_APP}: {argv}"
    for flag in ("-Q", "--queues"):
        if flag in argv:
            return argv[argv.index(flag) + 1]
    for arg in argv:
        if arg.startswith("--queues="):
            return arg.split("=", 1)[1]
    raise AssertionError(f"celery worker without an explicit queue: {argv}")


def _p2p_subcommand(argv: list[str]) -> tuple[str, ...] | None:
    if not argv or Path(argv[0]).name != "p2p":
        return None
    return tuple(argv[1:3])


def _check_command(argv: list[str], where: str) -> None:
    """A command must be a known p2p sub-command or a Celery command on a known queue."""
    sub = _p2p_subcommand(argv)
    if sub is not None:
        assert sub in P2P_COMMANDS, f"{where}: unknown p2p command {' '.join(argv)}"
        return
    if argv and Path(argv[0]).name == "celery":
        if "worker" in argv:
            queue = _celery_queue(argv)
            assert queue in CELERY_QUEUES, f"{where}: unknown celery queue {queue!r}"
        return
    raise AssertionError(f"{where}: command is neither p2p nor celery: {argv}")


def _compose_cli() -> list[str] | None:
    """`docker compose` when the plugin works, else `docker-compose`, else None."""
    if shutil.which("docker"):
        probe = subprocess.run(
            ["docker", "compose", "version"], capture_output=True, text=True, timeout=60, check=False
        )
        if probe.returncode == 0:
            return ["docker", "compose"]
    if shutil.which("docker-compose"):
        probe = subprocess.run(
            ["docker-compose", "version"], capture_output=True, text=True, timeout=60, check=False
        )
        if probe.returncode == 0:
            return ["docker-compose"]
    return None


def _run_compose_config(
    tmp_path: Path,
    extra_env: dict[str, str],
    *,
    profiles: tuple[str, ...] = (),
    config_args: tuple[str, ...] = ("-q",),
) -> subprocess.CompletedProcess[str]:
    cli = _compose_cli()
    if cli is None:
        pytest.fail(
            "Neither `docker compose` nor `docker-compose` works on this machine; the compose "
            "file cannot be validated. Install one (Debian: apt-get install -y docker-compose)."
        )
    # An empty env file, so a developer's .env cannot supply (or hide) required variables.
    env_file = tmp_path / "empty.env"
    env_file.write_text("")
    env = {k: v for k, v in os.environ.items() if k not in COMPOSE_REQUIRED_ENV and k != "POSTGRES_USER"}
    env.pop("COMPOSE_FILE", None)
    env.pop("COMPOSE_PROJECT_NAME", None)
    env.update(extra_env)
    return subprocess.run(
        [
            *cli,
            *(arg for profile in profiles for arg in ("--profile", profile)),
            "--env-file",
            str(env_file),
            "-f",
            str(COMPOSE_FILE),
            "config",
            *config_args,
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _load_compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE_FILE.read_text())
    assert isinstance(data, dict) and isinstance(data.get("services"), dict)
    return data


def _k8s_files() -> list[Path]:
    return sorted(K8S.glob("*.yaml"))


def _k8s_docs(path: Path) -> list[dict[str, Any]]:
    docs = [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]
    assert docs, f"{path} holds no YAML document"
    for doc in docs:
        assert isinstance(doc, dict), f"{path}: a document is not a mapping"
    return docs


def _all_k8s_resources() -> list[tuple[Path, dict[str, Any]]]:
    """Every document in k8s/base/*.yaml and k8s/gpu/*.yaml except kustomizations (the overlays:
    tests/test_k8s_autoscaling.py)."""
    files = [*_k8s_files(), *sorted(K8S_GPU.glob("*.yaml"))]
    return [(path, doc) for path in files if path.name != "kustomization.yaml" for doc in _k8s_docs(path)]


def _kustomized_resources() -> list[dict[str, Any]]:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    return [doc for name in kustomization["resources"] for doc in _k8s_docs(K8S / name)]


def _find(kind: str, name: str) -> dict[str, Any]:
    matches = [
        doc for doc in _kustomized_resources() if doc["kind"] == kind and doc["metadata"]["name"] == name
    ]
    assert len(matches) == 1, f"expected one {kind} {name} in the kustomization, found {len(matches)}"
    return matches[0]


def _pod_spec(doc: dict[str, Any]) -> dict[str, Any]:
    return doc["spec"]["template"]["spec"]


def _container_argv(container: dict[str, Any]) -> list[str]:
    return [*_as_argv(container.get("command")), *_as_argv(container.get("args"))]


def _dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with line continuations joined and comments dropped."""
    logical: list[str] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    if pending.strip():
        logical.append(pending)
    result = []
    for line in logical:
        instruction, _, rest = line.partition(" ")
        result.append((instruction.upper(), rest.strip()))
    return result


# --------------------------------------------------------------------------- (a) compose CLI


def test_compose_config_is_valid(tmp_path: Path) -> None:
    result = _run_compose_config(tmp_path, COMPOSE_REQUIRED_ENV)
    assert result.returncode == 0, f"compose config failed:\n{result.stdout}\n{result.stderr}"


@pytest.mark.parametrize("missing", sorted(COMPOSE_REQUIRED_ENV))
def test_compose_refuses_to_start_without_secrets(tmp_path: Path, missing: str) -> None:
    env = {k: v for k, v in COMPOSE_REQUIRED_ENV.items() if k != missing}
    result = _run_compose_config(tmp_path, env)
    assert result.returncode != 0, f"compose config accepted a missing {missing}"
    assert missing in result.stdout + result.stderr


# --------------------------------------------------------------------------- (b) compose content


def test_compose_services_present() -> None:
    services = _load_compose()["services"]
    expected = {"postgres", "redis", "minio", "migrate", *APP_SERVICES}
    assert expected <= set(services), f"missing services: {expected - set(services)}"


def test_compose_every_long_running_service_has_a_healthcheck() -> None:
    for name, service in _load_compose()["services"].items():
        if name == "migrate":
            continue
        check = service.get("healthcheck")
        assert isinstance(check, dict), f"{name} has no healthcheck"
        assert not check.get("disable"), f"{name} disables its healthcheck"
        test = check.get("test")
        assert test and test != ["NONE"], f"{name} has an empty healthcheck"


def test_compose_depends_on_uses_conditions() -> None:
    services = _load_compose()["services"]
    allowed = {"service_healthy", "service_completed_successfully"}
    for name, service in services.items():
        depends = service.get("depends_on")
        if depends is None:
            continue
        assert isinstance(depends, dict), f"{name}: depends_on must be a mapping with conditions"
        for dep, spec in depends.items():
            assert dep in services, f"{name} depends on unknown service {dep}"
            assert isinstance(spec, dict) and spec.get("condition") in allowed, (
                f"{name} -> {dep} has no healthy/completed condition"
            )
            if dep == "migrate":
                assert spec["condition"] == "service_completed_successfully"
            else:
                assert spec["condition"] == "service_healthy", f"{name} -> {dep} must wait until healthy"
                assert "healthcheck" in services[dep], f"{name} waits on {dep}, which has no healthcheck"


def test_compose_startup_order() -> None:
    services = _load_compose()["services"]
    assert set(services["migrate"]["depends_on"]) == {"postgres"}
    for name in APP_SERVICES:
        assert {"postgres", "redis", "minio", "migrate"} <= set(services[name]["depends_on"]), name


def test_compose_redis_is_persistent() -> None:
    redis = _load_compose()["services"]["redis"]
    argv = _as_argv(redis.get("command"))
    assert "--appendonly" in argv and argv[argv.index("--appendonly") + 1] == "yes"
    assert any(str(v).endswith(":/data") for v in redis.get("volumes", [])), "redis /data has no volume"


def test_compose_datastores() -> None:
    services = _load_compose()["services"]
    assert services["postgres"]["image"] == "pgvector/pgvector:pg16"
    assert "pg_isready" in json.dumps(services["postgres"]["healthcheck"]["test"])
    assert "redis-cli" in json.dumps(services["redis"]["healthcheck"]["test"])
    assert "/minio/health/live" in json.dumps(services["minio"]["healthcheck"]["test"])
    minio_argv = _as_argv(services["minio"]["command"])
    assert minio_argv[:2] == ["server", "/data"] and "--console-address" in minio_argv
    for name in ("postgres", "redis", "minio"):
        assert services[name].get("volumes"), f"{name} keeps no data volume"


def _literal_values(node: Any) -> list[str]:
    if isinstance(node, dict):
        return [v for value in node.values() for v in _literal_values(value)]
    if isinstance(node, list):
        return [v for value in node for v in _literal_values(value)]
    return [] if node is None else [str(node)]


def test_compose_sets_no_default_secret() -> None:
    data = _load_compose()
    for name, service in data["services"].items():
        env = service.get("environment") or {}
        assert isinstance(env, dict), f"{name}: use a mapping for environment"
        for key, value in env.items():
            text = str(value)
            assert "minioadmin" not in text.lower(), f"{name}.{key} sets the default MinIO secret"
            if any(word in key for word in ("PASSWORD", "SECRET")):
                assert re.fullmatch(r"\$\{[A-Z0-9_]+:\?[^}]*\}", text), (
                    f"{name}.{key} must come from a required variable (${{VAR:?message}}), not {text!r}"
                )
                assert text.lower() not in DEFAULT_SECRETS
    # Nowhere in the file, not even in an anchor or a default (${VAR:-minioadmin}).
    assert not any("minioadmin" in value.lower() for value in _literal_values(data))
    assert ":-minioadmin" not in COMPOSE_FILE.read_text()


def test_compose_shared_env_anchor() -> None:
    data = _load_compose()
    shared = data.get("x-p2p-env")
    assert isinstance(shared, dict), "x-p2p-env anchor missing"
    assert shared["P2P_PROFILE"] == "production"
    assert shared["P2P_REDIS__URL"] == "redis://redis:6379/0"
    assert shared["P2P_S3__ENDPOINT"] == "minio:9000"
    assert shared["P2P_DB__URL"].startswith("postgresql+psycopg://")
    assert shared["P2P_DB__URL"].endswith("@postgres:5432/panel2patch")
    assert "P2P_S3__ACCESS_KEY" in shared and "P2P_S3__SECRET_KEY" in shared
    for name in ("migrate", *APP_SERVICES):
        env = data["services"][name]["environment"]
        for key, value in shared.items():
            assert env.get(key) == value, f"{name} does not use x-p2p-env ({key})"


def test_compose_ingest_api() -> None:
    ingest = _load_compose()["services"]["ingest"]
    assert _as_argv(ingest["command"]) == ["p2p", "serve", "ingest"]
    published = [str(p) for p in ingest.get("ports", [])]
    assert any(re.fullmatch(r"(?:[\d.]+:)?8000:8000(?:/tcp)?", p) for p in published), published
    check = json.dumps(ingest["healthcheck"]["test"])
    assert "/readyz" in check and "urllib" in check, "ingest healthcheck must probe /readyz with python"
    assert ingest["build"]["dockerfile"] == "services/ingest/Dockerfile"
    assert ingest["build"]["context"] == "."


def test_compose_commands_are_known() -> None:
    services = _load_compose()["services"]
    assert _as_argv(services["migrate"]["command"]) == ["p2p", "db", "upgrade"]
    assert _celery_queue(_as_argv(services["ingest-worker"]["command"])) == "ingest"
    assert _celery_queue(_as_argv(services["mining-worker"]["command"])) == "mining"
    assert _as_argv(services["embedding-api"]["command"]) == ["p2p", "serve", "embedding-api"]
    assert _celery_queue(_as_argv(services["embedding-worker"]["command"])) == "embedding"
    assert _celery_queue(_as_argv(services["training-worker"]["command"])) == "training"
    for name, service in services.items():
        if "build" in service:
            _check_command(_as_argv(service.get("command")), f"compose {name}")
            dockerfile = ROOT / service["build"]["dockerfile"]
            assert dockerfile.is_file(), f"{name} builds from missing {dockerfile}"
    for name in WORKER_SERVICES:
        check = " ".join(_as_argv(services[name]["healthcheck"]["test"]))
        assert f"-A {CELERY_APP} inspect ping" in check and "celery@$$HOSTNAME" in check, name


def _dockerfile_tag(dockerfile: Path) -> str:
    """The image tag of the `docker build ... -t TAG .` line in a Dockerfile's header comment."""
    match = re.search(r"docker build .*-t (\S+)", dockerfile.read_text())
    assert match, f"{dockerfile} documents no `docker build -t` tag"
    return match.group(1)


def test_compose_images_match_their_dockerfiles() -> None:
    """Every built service is tagged as its Dockerfile documents, so compose never pulls it."""
    for name, service in _load_compose()["services"].items():
        if "build" not in service:
            continue
        dockerfile = ROOT / service["build"]["dockerfile"]
        assert service["image"] == _dockerfile_tag(dockerfile), name


def _seconds(duration: str) -> float:
    """A compose duration such as 90s, 3m or 1m30s in seconds."""
    parts = re.findall(r"(\d+(?:\.\d+)?)(h|ms|m|s)", str(duration))
    assert parts and "".join(n + u for n, u in parts) == str(duration), f"bad duration {duration!r}"
    return sum(float(n) * {"h": 3600, "m": 60, "s": 1, "ms": 0.001}[u] for n, u in parts)


def test_compose_embedding_services() -> None:
    services = _load_compose()["services"]
    api = services["embedding-api"]
    worker = services["embedding-worker"]
    for name, service in (("embedding-api", api), ("embedding-worker", worker)):
        assert service["build"] == {"context": ".", "dockerfile": "services/embedding-api/Dockerfile"}, name
        assert service["image"] == EMBEDDING_IMAGE, name
        assert "volumes" not in service, f"{name}: models come from the object store or the image"
    published = [str(p) for p in api.get("ports", [])]
    assert any(re.fullmatch(r"(?:[\d.]+:)?8001:8000(?:/tcp)?", p) for p in published), published
    check = api["healthcheck"]
    test = json.dumps(check["test"])
    assert "/healthz" in test and "urllib" in test and ":8000/" in test, test
    assert _seconds(check["start_period"]) >= 60, "start_period too short to load the model"

    argv = _as_argv(worker["command"])
    assert _celery_queue(argv) == "embedding"
    assert "--concurrency=1" in argv, "one process: the model is loaded once per worker"
    assert worker["healthcheck"] == services["ingest-worker"]["healthcheck"]
    # The ports of the two APIs do not collide on the host.
    assert "8000:8000" not in " ".join(published)


@pytest.mark.parametrize("service", ["embedding-api", "embedding-worker"])
def test_compose_embedding_env_is_valid_settings(monkeypatch: pytest.MonkeyPatch, service: str) -> None:
    """The embedding services' P2P_ variables (compose defaults substituted) load into Settings."""
    from p2p.shared.settings import Settings

    env = _load_compose()["services"][service]["environment"]
    for key in list(os.environ):
        if key.startswith("P2P_"):
            monkeypatch.delenv(key)
    for key, value in env.items():
        text = re.sub(r"\$\{[A-Z0-9_]+:[-?]([^}]*)\}", r"\1", str(value))
        monkeypatch.setenv(key, text.replace("set ", "dummy-"))
    settings = Settings()
    assert settings.profile == "production"
    assert settings.embedding.torch_threads >= 1


# --------------------------------------------------------------------------- (b2) compose gpu profile

VLLM_MODEL = "Qwen/Qwen2.5-VL-72B-Instruct"
VLLM_URL = "http://vllm:8000"
GPU_SERVICES = {"vllm", "lvlm-mining-worker"}
OPS_SERVICES = {"prometheus", "grafana"}
# Server arguments the LVLM backend relies on, as (flag, value).
VLLM_REQUIRED_ARGS = {
    "--tensor-parallel-size": "4",
    "--gpu-memory-utilization": "0.8",
    "--max-model-len": "8192",
    "--max-num-seqs": "512",
    "--served-model-name": VLLM_MODEL,
}
VLLM_MAX_PIXELS = 28 * 28 * 1280


def _flag_value(argv: list[str], flag: str) -> str:
    """The value of `--flag value` or `--flag=value`; fails when the flag is absent."""
    for index, arg in enumerate(argv):
        if arg == flag:
            assert index + 1 < len(argv), f"{flag} without a value"
            return argv[index + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    raise AssertionError(f"{flag} missing from {argv}")


def _check_vllm_argv(argv: list[str], where: str) -> None:
    """`vllm serve MODEL` with the arguments the LVLM backend was sized for."""
    assert argv[:3] == ["vllm", "serve", VLLM_MODEL], f"{where}: {argv[:3]}"
    for flag, value in VLLM_REQUIRED_ARGS.items():
        assert _flag_value(argv, flag) == value, f"{where}: {flag}"
    assert "--enable-prefix-caching" in argv, where
    limits = json.loads(_flag_value(argv, "--limit-mm-per-prompt"))
    assert 1 <= limits["image"] <= 4, f"{where}: image limit {limits}"
    kwargs = json.loads(_flag_value(argv, "--mm-processor-kwargs"))
    assert kwargs["max_pixels"] == VLLM_MAX_PIXELS, f"{where}: {kwargs}"


def _compose_vllm_argv(service: dict[str, Any]) -> list[str]:
    return [*_as_argv(service.get("entrypoint")), *_as_argv(service.get("command"))]


def test_compose_config_is_valid_with_gpu_profile(tmp_path: Path) -> None:
    result = _run_compose_config(tmp_path, COMPOSE_REQUIRED_ENV, profiles=("gpu",))
    assert result.returncode == 0, f"compose --profile gpu config failed:\n{result.stdout}\n{result.stderr}"


def test_compose_gpu_services_only_with_their_profile() -> None:
    """Without `--profile gpu` the CPU stack starts alone, so machines without GPUs still work.

    (Read from the file: `config --services` of docker-compose 1.x lists every profile.)
    """
    services = _load_compose()["services"]
    for name in GPU_SERVICES:
        assert services[name].get("profiles") == ["gpu"], name
    for name in OPS_SERVICES:
        assert services[name].get("profiles") == ["ops"], name
    for name in set(services) - GPU_SERVICES - OPS_SERVICES:
        assert "profiles" not in services[name], f"{name} must start without a profile"


def test_compose_config_is_valid_with_ops_profile(tmp_path: Path) -> None:
    result = _run_compose_config(tmp_path, COMPOSE_REQUIRED_ENV, profiles=("ops",))
    assert result.returncode == 0, f"compose --profile ops config failed:\n{result.stdout}\n{result.stderr}"


def test_compose_ops_profile_reads_the_repository_config() -> None:
    """Prometheus and Grafana mount the files of ops/ that exist, and Prometheus scrapes the ports
    the services serve metrics on."""
    services = _load_compose()["services"]
    for name in OPS_SERVICES:
        for volume in services[name]["volumes"]:
            source = str(volume).split(":", 1)[0]
            if source.startswith("./"):
                assert (ROOT / source).exists(), f"{name} mounts missing {source}"
    config = yaml.safe_load((ROOT / "ops" / "prometheus" / "prometheus.yml").read_text())
    ports = {c["job_name"]: c["dns_sd_configs"][0]["port"] for c in config["scrape_configs"]}
    assert ports == {"p2p-api": 8000, "p2p-worker": 9464}
    assert services["ingest-worker"]["environment"]["P2P_METRICS__WORKER_PORT"] == "9464"


def test_compose_vllm_service() -> None:
    data = _load_compose()
    vllm = data["services"]["vllm"]
    image, _, tag = vllm["image"].partition(":")
    assert image == "vllm/vllm-openai"
    assert re.fullmatch(r"v\d+\.\d+\.\d+(\.post\d+)?", tag), f"pin a release tag, not {tag!r}"
    argv = _compose_vllm_argv(vllm)
    _check_vllm_argv(argv, "compose vllm")
    assert _flag_value(argv, "--dtype") == "${VLLM_DTYPE:-bfloat16}", "dtype must be configurable"

    (device,) = vllm["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and int(device["count"]) == 4
    assert "gpu" in device["capabilities"]
    assert vllm.get("ipc") == "host" or vllm.get("shm_size"), "tensor parallelism needs shared memory"

    mounts = {str(v).split(":")[1]: str(v).split(":")[0] for v in vllm["volumes"]}
    cache = mounts.get("/root/.cache/huggingface")
    assert cache in data["volumes"], "the model cache must be a named volume"
    assert "HF_TOKEN" in vllm["environment"]

    check = vllm["healthcheck"]
    assert "http://localhost:8000/health" in json.dumps(check["test"])
    start = str(check["start_period"])
    minutes = int(start[:-1]) * {"s": 1 / 60, "m": 1, "h": 60}[start[-1]]
    assert minutes >= 20, f"start_period {start} is too short to load a 72B model"


def test_compose_lvlm_mining_worker() -> None:
    data = _load_compose()
    services = data["services"]
    worker = services["lvlm-mining-worker"]
    argv = _as_argv(worker["command"])
    assert _celery_queue(argv) == "mining-lvlm"
    assert "--pool=threads" in argv  # one process: one HTTP pool and one in-flight bound
    assert worker["image"] == services["mining-worker"]["image"]
    assert worker["build"] == services["mining-worker"]["build"]
    env = worker["environment"]
    for key, value in data["x-p2p-env"].items():
        if key != "P2P_MINING__BACKEND":
            assert env.get(key) == value, f"lvlm-mining-worker does not use x-p2p-env ({key})"
    assert env["P2P_MINING__BACKEND"] == "lvlm"
    assert env["P2P_MINING__LVLM__BASE_URL"] == VLLM_URL
    assert env["P2P_MINING__LVLM__MODEL"] == _flag_value(
        _compose_vllm_argv(services["vllm"]), "--served-model-name"
    )
    assert int(env["P2P_MINING__LVLM__MAX_PIXELS"]) == VLLM_MAX_PIXELS
    # The key the worker sends is the one the server requires.
    assert env["P2P_MINING__LVLM__API_KEY"] == services["vllm"]["environment"]["VLLM_API_KEY"]
    assert worker["depends_on"]["vllm"]["condition"] == "service_healthy"
    assert {"postgres", "redis", "minio", "migrate"} <= set(worker["depends_on"])
    # The CPU backend stays the default everywhere else.
    for name, service in services.items():
        if name != "lvlm-mining-worker":
            backend = (service.get("environment") or {}).get("P2P_MINING__BACKEND", "cpu")
            assert backend in ("cpu", "${P2P_MINING_BACKEND:-cpu}"), name


def test_compose_lvlm_worker_env_is_valid_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker's P2P_ variables (compose defaults substituted) load into Settings."""
    from p2p.shared.settings import Settings

    env = _load_compose()["services"]["lvlm-mining-worker"]["environment"]
    for key in list(os.environ):
        if key.startswith("P2P_"):
            monkeypatch.delenv(key)
    for key, value in env.items():
        text = re.sub(r"\$\{[A-Z0-9_]+:[-?]([^}]*)\}", r"\1", str(value))
        monkeypatch.setenv(key, text.replace("set ", "dummy-"))
    lvlm = Settings().mining.lvlm
    assert lvlm.base_url == VLLM_URL
    assert lvlm.mode in {"paper", "hybrid"}
    assert lvlm.api_key is not None and lvlm.api_key.get_secret_value(), "an empty key breaks the header"


# --------------------------------------------------------------------------- (c) kubernetes


def test_k8s_documents_are_well_formed() -> None:
    resources = _all_k8s_resources()
    assert len(resources) >= 10
    for path, doc in resources:
        where = f"{path.relative_to(ROOT)} {doc.get('kind')}"
        assert doc.get("apiVersion"), f"{where}: no apiVersion"
        assert doc.get("kind"), f"{where}: no kind"
        metadata = doc.get("metadata") or {}
        assert metadata.get("name"), f"{where}: no metadata.name"
        if doc["kind"] in CLUSTER_SCOPED_KINDS:
            assert "namespace" not in metadata, f"{where} is cluster-scoped"
        else:
            assert metadata.get("namespace") == NAMESPACE, f"{where}: namespace must be {NAMESPACE}"


def test_k8s_kustomization_lists_exactly_the_manifests() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert kustomization["kind"] == "Kustomization"
    assert kustomization["apiVersion"].startswith("kustomize.config.k8s.io/")
    listed = kustomization["resources"]
    assert len(listed) == len(set(listed)), "kustomization lists a file twice"
    expected = {p.name for p in _k8s_files()} - {"kustomization.yaml", "secret.example.yaml"}
    assert set(listed) == expected
    assert not any("optional" in entry or "secret" in entry for entry in listed)


def test_k8s_expected_objects() -> None:
    kinds = {(doc["kind"], doc["metadata"]["name"]) for doc in _kustomized_resources()}
    for kind, name in [
        ("Namespace", NAMESPACE),
        ("ConfigMap", "p2p-config"),
        ("Job", "p2p-migrate"),
        ("Deployment", "ingest"),
        ("Service", "ingest"),
        ("Deployment", "ingest-worker"),
        ("Deployment", "mining-worker"),
        ("Deployment", "embedding-api"),
        ("Service", "embedding-api"),
        ("Deployment", "embedding-worker"),
        ("Deployment", "training-worker"),
        ("StatefulSet", "postgres"),
        ("Service", "postgres"),
        ("StatefulSet", "redis"),
        ("Service", "redis"),
        ("StatefulSet", "minio"),
        ("Service", "minio"),
    ]:
        assert (kind, name) in kinds, f"missing {kind} {name}"
    # Secrets are created by the operator, never shipped with real values.
    assert not any(kind == "Secret" for kind, _ in kinds)


def test_k8s_configmap_holds_only_non_secret_p2p_settings() -> None:
    data = _find("ConfigMap", "p2p-config")["data"]
    assert data["P2P_PROFILE"] == "production"
    assert data["P2P_REDIS__URL"] == "redis://redis:6379/0"
    assert data["P2P_S3__ENDPOINT"] == "minio:9000"
    assert data["P2P_SERVER__HOST"] == "0.0.0.0"
    assert str(data["P2P_SERVER__PORT"]) == "8000"
    assert all(key.startswith("P2P_") for key in data)
    for forbidden in ("P2P_DB__URL", "P2P_S3__ACCESS_KEY", "P2P_S3__SECRET_KEY"):
        assert forbidden not in data


def test_k8s_secret_template() -> None:
    path = K8S / "secret.example.yaml"
    docs = _k8s_docs(path)
    assert all(doc["kind"] == "Secret" for doc in docs)
    keys = {key for doc in docs for key in doc.get("stringData", {})}
    assert {"P2P_DB__URL", "P2P_S3__ACCESS_KEY", "P2P_S3__SECRET_KEY"} <= keys
    values = [str(v) for doc in docs for v in doc.get("stringData", {}).values()]
    assert not any("minioadmin" in v for v in values)
    assert any("CHANGE-ME" in v for v in values), "template values must be obvious placeholders"
    assert "kubectl" in path.read_text() and "create secret" in path.read_text()


def test_k8s_every_workload_container_has_resources() -> None:
    for doc in _kustomized_resources():
        if doc["kind"] not in {"Deployment", "StatefulSet", "Job"}:
            continue
        for container in _pod_spec(doc)["containers"]:
            resources = container.get("resources") or {}
            where = f"{doc['kind']} {doc['metadata']['name']}/{container['name']}"
            assert resources.get("requests", {}).get("cpu"), f"{where}: no cpu request"
            assert resources.get("requests", {}).get("memory"), f"{where}: no memory request"
            assert resources.get("limits", {}).get("memory"), f"{where}: no memory limit"


def test_k8s_app_images_and_commands() -> None:
    expected = {
        ("Deployment", "ingest"): ("panel2patch/ingest:latest", ("p2p", ("serve", "ingest"))),
        ("Deployment", "ingest-worker"): ("panel2patch/ingest:latest", ("celery", "ingest")),
        ("Deployment", "mining-worker"): ("panel2patch/mining:latest", ("celery", "mining")),
        ("Deployment", "embedding-api"): (EMBEDDING_IMAGE, ("p2p", ("serve", "embedding-api"))),
        ("Deployment", "embedding-worker"): (EMBEDDING_IMAGE, ("celery", "embedding")),
        ("Deployment", "training-worker"): (TRAINING_IMAGE, ("celery", "training")),
        ("Job", "p2p-migrate"): ("panel2patch/ingest:latest", ("p2p", ("db", "upgrade"))),
    }
    for (kind, name), (image, (tool, target)) in expected.items():
        doc = _find(kind, name)
        spec = _pod_spec(doc)
        (container,) = spec["containers"]
        assert container["image"] == image, f"{name}: image {container['image']}"
        argv = _container_argv(container)
        _check_command(argv, f"k8s {name}")
        if tool == "p2p":
            assert _p2p_subcommand(argv) == target
        else:
            assert _celery_queue(argv) == target
        sources = {next(iter(ref)): next(iter(ref.values()))["name"] for ref in container["envFrom"]}
        assert sources == {"configMapRef": "p2p-config", "secretRef": "p2p-app"}, name
        assert spec["securityContext"]["runAsNonRoot"] is True, name
        assert spec["securityContext"]["runAsUser"] != 0, name


@pytest.mark.parametrize("name", ["ingest", "embedding-api"])
def test_k8s_api_probes_and_service(name: str) -> None:
    (container,) = _pod_spec(_find("Deployment", name))["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    ports = {p.get("name"): p["containerPort"] for p in container["ports"]}
    assert 8000 in ports.values()
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["port"] in {8000, *ports}
    service = _find("Service", name)
    assert any(p["port"] == 8000 for p in service["spec"]["ports"])
    labels = _find("Deployment", name)["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()


def test_k8s_worker_liveness_pings_own_node() -> None:
    for name in WORKER_SERVICES:
        (container,) = _pod_spec(_find("Deployment", name))["containers"]
        argv = container["livenessProbe"]["exec"]["command"]
        assert argv[:2] == ["sh", "-c"], f"{name}: the probe needs a shell to expand $HOSTNAME"
        script = argv[2]
        assert f"-A {CELERY_APP} inspect ping" in script, name
        # The probe must name this pod's worker; the shell, not Kubernetes, expands it.
        assert re.search(r"celery@(\$HOSTNAME|\$\{HOSTNAME\})", script), script


def test_k8s_images_match_compose_and_dockerfiles() -> None:
    """An app Deployment runs the image compose builds for the same service."""
    compose = _load_compose()["services"]
    for name in APP_SERVICES:
        (container,) = _pod_spec(_find("Deployment", name))["containers"]
        assert container["image"] == compose[name]["image"], name
        assert container["image"] == _dockerfile_tag(ROOT / compose[name]["build"]["dockerfile"]), name


def test_k8s_embedding_services() -> None:
    api = _find("Deployment", "embedding-api")
    (container,) = _pod_spec(api)["containers"]
    startup = container["startupProbe"]
    assert startup["httpGet"]["path"] == "/healthz"
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 120, "allow time to load the model"
    for doc in (api, _find("Deployment", "embedding-worker")):
        name = doc["metadata"]["name"]
        assert doc["metadata"]["labels"]["app.kubernetes.io/part-of"] == NAMESPACE, name
        spec = _pod_spec(doc)
        (container,) = spec["containers"]
        assert spec["securityContext"]["runAsNonRoot"] is True, name
        assert container["securityContext"]["allowPrivilegeEscalation"] is False, name
        assert "volumeMounts" not in container, f"{name}: models come from the object store or the image"
        requests = container["resources"]["requests"]
        # torch on CPU: at least one core and 1 GiB for the model and a batch.
        cpu = str(requests["cpu"])
        assert (float(cpu[:-1]) / 1000 if cpu.endswith("m") else float(cpu)) >= 1, name
        memory = str(requests["memory"])
        assert memory.endswith("Gi") and float(memory[:-2]) >= 1, name
        env = {item["name"]: item.get("value") for item in container.get("env", [])}
        assert all(key.startswith("P2P_EMBEDDING__") for key in env), name
    worker_argv = _container_argv(_pod_spec(_find("Deployment", "embedding-worker"))["containers"][0])
    assert "--concurrency=1" in worker_argv


def test_k8s_base_leaves_scaling_to_the_overlays() -> None:
    # Autoscalers live in k8s/overlays (tests/test_k8s_autoscaling.py); a replica count in the
    # base would reset theirs on every apply.
    assert not any(
        doc["kind"] in {"HorizontalPodAutoscaler", "ScaledObject"} for doc in _kustomized_resources()
    )
    for name in ("mining-worker", "embedding-worker"):
        assert "replicas" not in _find("Deployment", name)["spec"], name


def test_k8s_datastores() -> None:
    expected = {
        "postgres": "pgvector/pgvector:pg16",
        "redis": "redis:7",
        "minio": "minio/minio",
    }
    for name, image in expected.items():
        statefulset = _find("StatefulSet", name)
        assert statefulset["spec"]["serviceName"] == name
        assert statefulset["spec"]["volumeClaimTemplates"], f"{name} has no PVC template"
        (container,) = _pod_spec(statefulset)["containers"]
        assert container["image"].startswith(image)
        mounted = {m["name"] for m in container["volumeMounts"]}
        claims = {t["metadata"]["name"] for t in statefulset["spec"]["volumeClaimTemplates"]}
        assert claims <= mounted, f"{name} does not mount its PVC"
        _find("Service", name)
        text = (K8S / f"{name}.yaml").read_text()
        assert "managed" in text.lower(), f"{name}.yaml should mention managed services"
    (redis,) = _pod_spec(_find("StatefulSet", "redis"))["containers"]
    argv = _container_argv(redis)
    assert argv[argv.index("--appendonly") + 1] == "yes"


def _gpu_kustomization() -> dict[str, Any]:
    return yaml.safe_load((K8S_GPU / "kustomization.yaml").read_text())


def _gpu_resources() -> list[dict[str, Any]]:
    return [doc for name in _gpu_kustomization()["resources"] for doc in _k8s_docs(K8S_GPU / name)]


def _find_gpu(kind: str, name: str) -> dict[str, Any]:
    matches = [doc for doc in _gpu_resources() if doc["kind"] == kind and doc["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind} {name} in k8s/gpu, found {len(matches)}"
    return matches[0]


def test_k8s_gpu_addon_is_separate_from_the_cpu_base() -> None:
    kustomization = _gpu_kustomization()
    assert kustomization["kind"] == "Kustomization"
    assert kustomization.get("namespace") == NAMESPACE
    listed = kustomization["resources"]
    # kustomize refuses an overlay nested in its base (a cycle), so the add-on is applied
    # after the base instead of including it.
    assert not any(entry.startswith("..") for entry in listed)
    files = {p.name for p in K8S_GPU.glob("*.yaml")} - {"kustomization.yaml"}
    assert len(listed) == len(set(listed)), "the GPU kustomization lists a file twice"
    assert (
        set(listed)
        == files
        == {
            "vllm.yaml",
            "mining-worker-lvlm.yaml",
            "training-config.yaml",
            "training-job.yaml",
        }
    )
    # The base stays CPU-only: no GPU object in `kubectl apply -k k8s/`.
    base = _kustomized_resources()
    gpu_names = {doc["metadata"]["name"] for doc in _gpu_resources()}
    assert {"vllm", "mining-worker-lvlm", GPU_TRAIN_JOB, GPU_TRAIN_CONFIG} <= gpu_names
    assert not any(doc["metadata"]["name"] in gpu_names for doc in base)
    assert "nvidia.com/gpu" not in json.dumps(base)
    assert not any(doc["kind"] == "Secret" for doc in _gpu_resources())
    assert "kubectl apply -k k8s/gpu" in (K8S_GPU / "kustomization.yaml").read_text()


@pytest.mark.parametrize("directory", [K8S, K8S_GPU], ids=["base", "gpu"])
def test_k8s_kustomize_builds(directory: Path) -> None:
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed")
    result = subprocess.run(
        ["kubectl", "kustomize", str(directory)], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    assert all(
        doc["metadata"]["namespace"] == NAMESPACE
        for doc in yaml.safe_load_all(result.stdout)
        if doc and doc["kind"] != "Namespace"
    )


def test_k8s_gpu_workloads_have_resources() -> None:
    for doc in _gpu_resources():
        if doc["kind"] not in {"Deployment", "Job"}:
            continue
        spec = _pod_spec(doc)
        for container in [*spec.get("initContainers", []), *spec["containers"]]:
            resources = container.get("resources") or {}
            where = f"{doc['metadata']['name']}/{container['name']}"
            assert resources.get("requests", {}).get("cpu"), f"{where}: no cpu request"
            assert resources.get("requests", {}).get("memory"), f"{where}: no memory request"
            assert resources.get("limits", {}).get("memory"), f"{where}: no memory limit"


def test_k8s_vllm_deployment() -> None:
    deployment = _find_gpu("Deployment", "vllm")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"]["type"] == "Recreate"
    spec = _pod_spec(deployment)
    (container,) = spec["containers"]
    assert container["image"] == _load_compose()["services"]["vllm"]["image"], "compose and k8s pin one image"
    argv = _container_argv(container)
    _check_vllm_argv(argv, "k8s vllm")
    assert _flag_value(argv, "--dtype") == "$(VLLM_DTYPE)"
    env = {item["name"]: item for item in container["env"]}
    ref = env["VLLM_DTYPE"]["valueFrom"]["configMapKeyRef"]
    assert _find_gpu("ConfigMap", ref["name"])["data"][ref["key"]] in {"bfloat16", "float16", "float32"}
    assert env["VLLM_API_KEY"]["valueFrom"]["secretKeyRef"]["optional"] is True

    resources = container["resources"]
    assert int(resources["requests"]["nvidia.com/gpu"]) == 4
    assert int(resources["limits"]["nvidia.com/gpu"]) == 4

    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": 8000}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["path"] == "/health", probe
        assert container[probe]["httpGet"]["port"] in {8000, "http"}, probe
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 20 * 60, "allow at least 20 min to load"

    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"
    claim = volumes[mounts["/root/.cache/huggingface"]]["persistentVolumeClaim"]["claimName"]
    _find_gpu("PersistentVolumeClaim", claim)

    service = _find_gpu("Service", "vllm")
    assert service["spec"].get("type", "ClusterIP") == "ClusterIP"
    assert any(p["port"] == 8000 for p in service["spec"]["ports"])
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()


def test_k8s_lvlm_mining_worker() -> None:
    deployment = _find_gpu("Deployment", "mining-worker-lvlm")
    spec = _pod_spec(deployment)
    (container,) = spec["containers"]
    assert container["image"] == "panel2patch/mining:latest"
    argv = _container_argv(container)
    _check_command(argv, "k8s mining-worker-lvlm")
    assert _celery_queue(argv) == "mining-lvlm"
    assert "--pool=threads" in argv
    assert spec["securityContext"]["runAsNonRoot"] is True
    script = container["livenessProbe"]["exec"]["command"][2]
    assert re.search(r"celery@(\$HOSTNAME|\$\{HOSTNAME\})", script), script

    sources = [(next(iter(ref)), next(iter(ref.values()))["name"]) for ref in container["envFrom"]]
    assert ("configMapRef", "p2p-config") in sources and ("secretRef", "p2p-app") in sources
    (lvlm_config,) = [name for kind, name in sources if kind == "configMapRef" and name != "p2p-config"]
    data = _find_gpu("ConfigMap", lvlm_config)["data"]
    assert all(key.startswith("P2P_MINING__") for key in data)
    assert data["P2P_MINING__BACKEND"] == "lvlm"
    service = _find_gpu("Service", "vllm")
    assert data["P2P_MINING__LVLM__BASE_URL"] == f"http://{service['metadata']['name']}:8000" == VLLM_URL
    vllm_argv = _container_argv(_pod_spec(_find_gpu("Deployment", "vllm"))["containers"][0])
    assert data["P2P_MINING__LVLM__MODEL"] == _flag_value(vllm_argv, "--served-model-name")
    assert int(data["P2P_MINING__LVLM__MAX_PIXELS"]) == VLLM_MAX_PIXELS
    key_ref = {item["name"]: item for item in container["env"]}["P2P_MINING__LVLM__API_KEY"]
    assert key_ref["valueFrom"]["secretKeyRef"]["optional"] is True
    # The CPU backend stays the default for new jobs; the GPU add-on does not change it.
    assert _find("ConfigMap", "p2p-config")["data"]["P2P_MINING__BACKEND"] == "cpu"


# --------------------------------------------------------------------------- (c2) training

GPU_TRAIN_JOB = "p2p-train-gpu"
GPU_TRAIN_CONFIG = "p2p-training-gpu"
# A gigabyte-sized checkpoint upload after the current step: the worker pods get at least this.
MIN_TRAINING_GRACE_S = 300
# The trainer's command line as TrainerProcess builds it (`python -m p2p.training ...`); the
# stop scripts find it by "-m p2p[.]training " in /proc/*/cmdline.
STOP_PATTERN = "-m p2p[.]training "
FAKE_TRAINER = """
import signal, sys, time
def stop(*_):
    print("trainer-stopped", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
print("trainer-ready", flush=True)
time.sleep(120)
sys.exit(9)
"""
# Stands in for Celery: starts a trainer, and on SIGTERM (warm shutdown) waits for it.
FAKE_WORKER = """
import signal, subprocess, sys, time
token = sys.argv[1]
trainer = subprocess.Popen(
    [sys.executable, "-c", sys.argv[2], "-m", "p2p." + token, "--config", "x"],
    stdout=subprocess.PIPE, text=True,
)
assert trainer.stdout.readline().strip() == "trainer-ready"
stopping = []
signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
print("worker-ready", flush=True)
deadline = time.monotonic() + 60
while not stopping and time.monotonic() < deadline:
    time.sleep(0.05)
out, _ = trainer.communicate(timeout=30)
# 3: the trainer checkpointed (stopped on SIGTERM) before the worker went away.
sys.exit(3 if stopping and "trainer-stopped" in out else 4)
"""


def _training_queue() -> str:
    from p2p.shared.queue import TRAINING_QUEUE

    return TRAINING_QUEUE


def _concurrency(argv: list[str]) -> int:
    """The pool size of a celery worker command line (Celery's default is the CPU count)."""
    assert "--autoscale" not in " ".join(argv), f"autoscaling changes the pool size: {argv}"
    for index, arg in enumerate(argv):
        if arg in ("-c", "--concurrency"):
            return int(argv[index + 1])
        if arg.startswith("--concurrency="):
            return int(arg.split("=", 1)[1])
    raise AssertionError(f"no explicit concurrency (the default is one process per CPU): {argv}")


def _check_training_worker_argv(argv: list[str], where: str) -> None:
    _check_command(argv, where)
    assert _celery_queue(argv) == _training_queue(), f"{where}: not the training queue"
    assert _concurrency(argv) == 1, f"{where}: one run at a time per worker"
    # The trainer is a child of the pool process; a thread pool would share one process.
    assert not any(arg.startswith("--pool") or arg == "-P" for arg in argv), f"{where}: keep prefork"


def _k8s_seconds(seconds: Any) -> int:
    assert isinstance(seconds, int), f"not a number of seconds: {seconds!r}"
    return seconds


def test_training_worker_consumes_the_training_queue_with_one_process() -> None:
    compose = _load_compose()["services"]["training-worker"]
    _check_training_worker_argv(_as_argv(compose["command"]), "compose training-worker")
    (container,) = _pod_spec(_find("Deployment", "training-worker"))["containers"]
    _check_training_worker_argv(_container_argv(container), "k8s training-worker")
    cmds = [args for name, args in _dockerfile_instructions(DOCKERFILES["training"]) if name == "CMD"]
    _check_training_worker_argv(json.loads(cmds[-1]), "services/training/Dockerfile")


def test_training_grace_periods_leave_time_for_a_checkpoint() -> None:
    from p2p.training.jobs import STOP_GRACE_S

    # The worker itself gives a stopping trainer STOP_GRACE_S; the platform must not kill sooner.
    minimum = max(MIN_TRAINING_GRACE_S, STOP_GRACE_S)
    compose = _load_compose()["services"]["training-worker"]
    assert _seconds(compose["stop_grace_period"]) >= minimum
    worker = _pod_spec(_find("Deployment", "training-worker"))
    assert _k8s_seconds(worker["terminationGracePeriodSeconds"]) >= minimum
    job_spec = _pod_spec(_find_gpu("Job", GPU_TRAIN_JOB))
    grace = _k8s_seconds(job_spec["terminationGracePeriodSeconds"])
    # torchrun SIGKILLs the ranks after --shutdown-timeout (30 s by default), whatever the pod allows.
    timeout = int(_flag_value(_container_argv(job_spec["containers"][0]), "--shutdown-timeout"))
    assert minimum <= timeout < grace, (timeout, grace)


def test_k8s_training_worker() -> None:
    deployment = _find("Deployment", "training-worker")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["metadata"]["labels"]["app.kubernetes.io/part-of"] == NAMESPACE
    spec = _pod_spec(deployment)
    (container,) = spec["containers"]
    assert container["image"] == TRAINING_IMAGE
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    memory = str(container["resources"]["limits"]["memory"])
    assert memory.endswith("Gi") and float(memory[:-2]) >= 8, "a training run needs generous memory"
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert "emptyDir" in volumes[mounts["/tmp"]], "temp files go to an emptyDir"
    assert "nvidia.com/gpu" not in json.dumps(deployment), "the base stays CPU-only"


def _stop_scripts() -> dict[str, str]:
    """The shell scripts that SIGTERM the trainer before the worker stops (compose: `$$` unescaped)."""
    (container,) = _pod_spec(_find("Deployment", "training-worker"))["containers"]
    prestop = container["lifecycle"]["preStop"]["exec"]["command"]
    entrypoint = _as_argv(_load_compose()["services"]["training-worker"]["entrypoint"])
    assert prestop[:2] == ["sh", "-c"] and entrypoint[:2] == ["sh", "-c"]
    return {"k8s preStop": prestop[2], "compose entrypoint": entrypoint[2].replace("$$", "$")}


def test_training_stop_scripts_match_the_trainer_command(tmp_path: Path) -> None:
    from p2p.shared.settings import Settings
    from p2p.shared.storage import LocalObjectStore
    from p2p.training.trainer_process import TrainerProcess

    # The command line the worker really starts (not started here), as /proc/PID/cmdline shows it.
    trainer = TrainerProcess(
        store=LocalObjectStore(tmp_path),
        settings=Settings(),
        config_path=tmp_path / "config.json",
        data_prefix="snap",
        out_prefix="run",
        checkpoint_every=1,
        keep_checkpoints=1,
        progress_every=1,
        shuffle_buffer=0,
    )
    cmdline = " ".join(trainer.command) + " "
    assert re.search(STOP_PATTERN, cmdline), cmdline
    for where, script in _stop_scripts().items():
        assert script.count(STOP_PATTERN) == 1, f"{where} does not look for the trainer"
        # The pattern must not match the script's own command line (or grep's).
        assert not re.search(STOP_PATTERN, script), f"{where} would signal itself"


def _spawn_fake_trainer(token: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", FAKE_TRAINER, "-m", f"p2p.{token}", "--config", "x"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "trainer-ready"
    return proc


def test_k8s_training_prestop_signals_only_the_trainer() -> None:
    # A unique token instead of "training", so no real trainer on this machine is touched.
    token = f"t{uuid.uuid4().hex}"
    script = _stop_scripts()["k8s preStop"].replace("p2p[.]training", f"p2p[.]{token}")
    trainer = _spawn_fake_trainer(token)
    bystander = _spawn_fake_trainer(f"{token}x"[::-1])
    try:
        result = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        out, _ = trainer.communicate(timeout=30)
        assert "trainer-stopped" in out and trainer.returncode == 0
        assert bystander.poll() is None, "the hook signalled a process that is not the trainer"
    finally:
        for proc in (trainer, bystander):
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_compose_training_entrypoint_stops_the_trainer_before_the_worker() -> None:
    token = f"t{uuid.uuid4().hex}"
    script = _stop_scripts()["compose entrypoint"].replace("p2p[.]training", f"p2p[.]{token}")
    wrapper = subprocess.Popen(
        ["sh", "-c", script, "training-worker", sys.executable, "-c", FAKE_WORKER, token, FAKE_TRAINER],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert wrapper.stdout is not None and wrapper.stdout.readline().strip() == "worker-ready"
        wrapper.send_signal(signal.SIGTERM)
        # The worker's exit status passes through: 3 means the trainer stopped cleanly first.
        assert wrapper.wait(timeout=60) == 3
    finally:
        if wrapper.poll() is None:
            wrapper.kill()
            wrapper.wait()


def test_compose_training_worker() -> None:
    services = _load_compose()["services"]
    worker = services["training-worker"]
    assert worker["build"] == {"context": ".", "dockerfile": "services/training/Dockerfile"}
    assert worker["image"] == TRAINING_IMAGE
    assert worker["healthcheck"] == services["ingest-worker"]["healthcheck"]
    # The entrypoint runs the command it is given, so `command` stays the worker's.
    entrypoint = _as_argv(worker["entrypoint"])
    assert '"$$@" &' in entrypoint[2] and len(entrypoint) == 4


def test_k8s_gpu_training_job() -> None:
    job = _find_gpu("Job", GPU_TRAIN_JOB)
    # Applying the add-on (for vLLM) must not start a 4-GPU run with placeholder inputs.
    assert job["spec"]["suspend"] is True
    # A retry resumes from {out}/latest.json, so retries are worth having.
    assert job["spec"]["backoffLimit"] >= 1
    spec = _pod_spec(job)
    assert spec["restartPolicy"] in {"OnFailure", "Never"}
    if "podFailurePolicy" in job["spec"]:
        assert spec["restartPolicy"] == "Never", "podFailurePolicy needs restartPolicy Never"
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert any(t["key"] == "nvidia.com/gpu" for t in spec["tolerations"])
    (container,) = spec["containers"]
    assert container["image"] == _load_compose()["services"]["training-worker"]["image"] == TRAINING_IMAGE
    sources = {next(iter(ref)): next(iter(ref.values()))["name"] for ref in container["envFrom"]}
    assert sources == {"configMapRef": "p2p-config", "secretRef": "p2p-app"}
    gpus = container["resources"]["limits"]["nvidia.com/gpu"]
    assert int(container["resources"]["requests"]["nvidia.com/gpu"]) == int(gpus) >= 1

    argv = _container_argv(container)
    assert argv[0] == "torchrun" and "--standalone" in argv
    assert int(_flag_value(argv, "--nproc_per_node")) == int(gpus), "one rank per GPU"
    module = argv.index("-m")
    assert argv[module + 1] == "p2p.training"
    assert all(arg.startswith("--") for arg in argv[1:module]), "torchrun options come before -m"
    trainer_argv = argv[module + 2 :]
    assert _flag_value(trainer_argv, "--device") == "cuda"

    # The trainer's own parser accepts the arguments (env references substituted).
    env = {item["name"]: item["valueFrom"]["configMapKeyRef"] for item in container["env"]}
    config_map = _find_gpu("ConfigMap", GPU_TRAIN_CONFIG)
    values = {}
    for name, ref in env.items():
        assert ref["name"] == GPU_TRAIN_CONFIG
        values[name] = config_map["data"][ref["key"]]
        assert not name.startswith("P2P_"), "the app rejects unknown P2P_ variables"
    resolved = [re.sub(r"\$\((\w+)\)", lambda m: values[m.group(1)], arg) for arg in trainer_argv]
    assert not any("$(" in arg for arg in resolved), resolved
    from p2p.training.__main__ import _parser

    parsed = _parser().parse_args(resolved)
    assert parsed.data and parsed.out and parsed.data != parsed.out

    # --config names train.json of the ConfigMap, mounted from a configMap volume.
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    config_dir, _, filename = str(parsed.config).rpartition("/")
    volume = volumes[mounts[config_dir]]["configMap"]
    assert volume["name"] == GPU_TRAIN_CONFIG
    # Only train.json is mounted (the prefixes in the same ConfigMap are not files).
    assert {item["path"]: item["key"] for item in volume["items"]} == {filename: "train.json"}
    assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory", "DDP needs shared memory"


def test_k8s_gpu_training_job_torchrun_arguments_parse() -> None:
    """torchrun itself accepts the options and hands the module its arguments."""
    run = pytest.importorskip("torch.distributed.run")
    (container,) = _pod_spec(_find_gpu("Job", GPU_TRAIN_JOB))["containers"]
    argv = _container_argv(container)
    args = run.get_args_parser().parse_args(argv[1:])
    assert args.standalone and args.module and args.training_script == "p2p.training"
    assert str(args.nproc_per_node) == str(container["resources"]["limits"]["nvidia.com/gpu"])
    assert args.training_script_args == argv[argv.index("p2p.training") + 1 :]


def test_k8s_gpu_training_config_is_a_valid_train_config() -> None:
    from p2p.training.config import TrainConfigError, load_config

    data = _find_gpu("ConfigMap", GPU_TRAIN_CONFIG)["data"]
    raw = json.loads(data["train.json"])
    config = load_config(raw)
    assert config.device == "cuda" and config.precision == "bf16"
    assert config.model.architecture == "ViT-B-32"
    # load_config is strict, so the check above would catch a misspelt key.
    with pytest.raises(TrainConfigError, match="unknown"):
        load_config({**raw, "batch_size": 1})


# --------------------------------------------------------------------------- (d) Dockerfiles


@pytest.mark.parametrize("service", sorted(DOCKERFILES))
def test_dockerfile(service: str) -> None:
    path = DOCKERFILES[service]
    assert path.is_file(), f"{path} missing"
    instructions = _dockerfile_instructions(path)
    names = [name for name, _ in instructions]

    (base,) = [args for name, args in instructions if name == "FROM"]
    assert base == "python:3.11-slim"

    users = [args for name, args in instructions if name == "USER"]
    assert users, "no USER instruction"
    final_user = users[-1].split(":")[0]
    assert final_user not in {"root", "0"}, f"runs as {users[-1]}"
    # USER must come after the install steps, so the process itself is unprivileged.
    assert names.index("USER") > max(i for i, n in enumerate(names) if n == "RUN")

    copies = " ".join(args for name, args in instructions if name == "COPY")
    # Every folder that pyproject maps a p2p package from (services/ holds several).
    package_dirs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    folders = {f"{Path(d).parts[0]}/" for d in package_dirs.values()}
    for needed in ("pyproject.toml", "README.md", *sorted(folders)):
        assert needed in copies, f"{needed} is not copied"
    installs = [args for name, args in instructions if name == "RUN" and "pip install" in args]
    assert installs and all("--no-cache-dir" in args for args in installs)
    wants_ml = service != "ingest"
    assert any(('".[ml]"' in a or "'.[ml]'" in a or " .[ml]" in a) for a in installs) == wants_ml

    cmds = [args for name, args in instructions if name == "CMD"]
    assert cmds, "no CMD"
    argv = json.loads(cmds[-1])
    _check_command(argv, str(path.relative_to(ROOT)))
    tool, target = DOCKERFILE_EXPECTED_CMD[service]
    if tool == "p2p":
        assert _p2p_subcommand(argv) == target
    else:
        assert _celery_queue(argv) == target

    if service != "training":
        health = [args for name, args in instructions if name == "HEALTHCHECK"]
        assert health and "CMD" in health[-1], f"{service} image has no HEALTHCHECK"


def test_dockerignore_keeps_context_clean() -> None:
    entries = {
        line.strip().rstrip("/")
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    for needed in (".venv", ".p2p-data", ".git", "**/__pycache__", ".env"):
        assert needed in entries, f".dockerignore misses {needed}"
    for kept in ("shared", "models", "apps", "services", "pyproject.toml", "README.md"):
        assert kept not in entries and f"/{kept}" not in entries


def test_p2p_console_script_is_declared() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'^p2p\s*=\s*"p2p\.cli:app"', text, re.MULTILINE)


def test_cli_provides_the_deployed_commands() -> None:
    """Once the CLI exists, the sub-commands the images run must resolve in it."""
    import importlib

    cli = importlib.import_module("p2p.cli")
    app = getattr(cli, "app", None)
    if app is None:
        pytest.skip("p2p.cli.app is not built yet")
    import typer.main

    root = typer.main.get_command(app)
    for path in sorted(P2P_COMMANDS - P2P_COMMANDS_NOT_YET_BUILT):
        command = root
        for part in path:
            sub = getattr(command, "commands", {}).get(part)
            assert sub is not None, f"`p2p {' '.join(path)}` does not exist in the CLI"
            command = sub


def test_celery_app_and_queues_exist() -> None:
    """The worker commands name the Celery app that exists and queues that p2p.shared.queue defines."""
    import importlib

    module_name, _, attribute = CELERY_APP.partition(":")
    worker_module = importlib.import_module(module_name)
    assert hasattr(worker_module, attribute), f"{CELERY_APP} does not exist"
    queue_module = importlib.import_module("p2p.shared.queue")
    defined = {
        value
        for name, value in vars(queue_module).items()
        if name.endswith("_QUEUE") and isinstance(value, str)
    }
    assert not CELERY_QUEUES - defined, (
        f"queues used by deployment files but not defined: {CELERY_QUEUES - defined}"
    )
