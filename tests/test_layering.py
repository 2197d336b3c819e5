"""The package layering of ARCHITECTURE.md, checked on the source: a new import across the line fails.

    p2p.cli -> p2p.apps -> services (ingest, mining, training, embedding_api) -> p2p.models -> p2p.shared

A package may import its own modules and any package of a lower layer; services never import each
other. Every import counts, at module level or inside a function, and so does a module named in a
string to ``importlib.import_module``.
"""

from __future__ import annotations

import ast
import logging
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

LAYERS: dict[str, int] = {
    "shared": 0,
    "models": 1,
    "ingest": 2,
    "mining": 2,
    "training": 2,
    "embedding_api": 2,
    "apps": 3,
    "cli": 4,
}


@dataclass(frozen=True)
class Violation:
    path: str
    line: int
    importer: str
    imported: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: p2p.{self.importer} imports p2p.{self.imported}"


def package_dirs(pyproject: Path = ROOT / "pyproject.toml") -> dict[str, Path]:
    """Top-level p2p packages and their folders, from pyproject's package-dir table."""
    table = tomllib.loads(pyproject.read_text())["tool"]["setuptools"]["package-dir"]
    return {name.split(".", 1)[1]: ROOT / folder for name, folder in table.items() if name.count(".") == 1}


def _imported_modules(tree: ast.AST) -> Iterator[tuple[int, str]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute | ast.Name)
            and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield node.lineno, node.args[0].value


def allowed(importer: str, imported: str) -> bool:
    if importer == imported:
        return True
    return LAYERS[imported] < LAYERS[importer]


def violations(packages: dict[str, Path], root: Path = ROOT) -> list[Violation]:
    found = []
    for package, folder in sorted(packages.items()):
        for path in sorted(folder.rglob("*.py")):
            if "migrations/versions" in path.as_posix():
                continue
            tree = ast.parse(path.read_text(), filename=str(path))
            for line, module in _imported_modules(tree):
                parts = module.split(".")
                if parts[0] != "p2p" or len(parts) < 2 or parts[1] not in LAYERS:
                    continue
                if not allowed(package, parts[1]):
                    found.append(Violation(str(path.relative_to(root)), line, package, parts[1]))
    return found


def test_every_package_has_a_layer() -> None:
    assert set(package_dirs()) == set(LAYERS), "give a new top-level p2p package its layer in LAYERS"


def test_no_import_crosses_the_layering() -> None:
    found = violations(package_dirs())
    assert not found, "imports against the layering (see ARCHITECTURE.md):\n" + "\n".join(map(str, found))


@pytest.mark.parametrize(
    ("package", "source", "bad"),
    [
        ("shared", "def f():\n    from p2p.mining.tasks import get_miner\n", "mining"),
        ("training", "from p2p.embedding_api import indexing\n", "embedding_api"),
        ("embedding_api", "import p2p.training.routes\n", "training"),
        ("models", "import importlib\nimportlib.import_module('p2p.ingest.images')\n", "ingest"),
        ("mining", "from p2p.apps import api\n", "apps"),
        ("apps", "from p2p.cli.common import open_runtime\n", "cli"),
    ],
)
def test_the_check_catches_a_new_violation(tmp_path: Path, package: str, source: str, bad: str) -> None:
    folder = tmp_path / package
    folder.mkdir()
    (folder / "fine.py").write_text("from p2p.shared.settings import Settings\n")
    (folder / "new.py").write_text(source)
    found = violations({package: folder}, root=tmp_path)
    assert [(v.path, v.imported) for v in found] == [(f"{package}/new.py", bad)]


def test_services_may_use_the_model_library_and_shared(tmp_path: Path) -> None:
    folder = tmp_path / "training"
    folder.mkdir()
    (folder / "ok.py").write_text(
        "from p2p.models.modeling import ModelSpec\n"
        "from p2p.shared.db import models\n"
        "import p2p.training.config\n"
    )
    assert violations({"training": folder}, root=tmp_path) == []


def test_the_composition_registers_every_services_tasks() -> None:
    """shared names the tasks, p2p.apps the modules that hold them: together a worker finds them all."""
    from p2p.apps.tasks import TASK_MODULES, register_tasks
    from p2p.shared import queue

    register_tasks()
    queue.import_task_modules()
    names = {
        value for name, value in vars(queue).items() if name.endswith("_TASK") and isinstance(value, str)
    }
    assert names and names <= set(queue.celery_app.tasks)
    assert set(TASK_MODULES) <= set(queue.celery_app.conf.include)


def test_the_ingest_process_and_the_task_modules_load_no_ml_library() -> None:
    """The ingest image installs no ML extra, and every worker imports every task module."""
    probe = (
        "import sys\n"
        "import p2p.apps.ingest\n"
        "from p2p.apps.tasks import register_tasks\n"
        "from p2p.shared import queue\n"
        "register_tasks()\n"
        "queue.import_task_modules()\n"
        "print(sorted(m for m in ('torch', 'torchvision', 'open_clip', 'cv2', 'onnxruntime', 'numpy')"
        " if m in sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True, timeout=120
    )
    assert result.stdout.strip() == "[]"


def test_an_in_process_dispatcher_without_task_modules_says_so(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from celery import Celery

    from p2p.shared import queue

    # A Celery worker started earlier in the session may have disabled existing loggers.
    monkeypatch.setattr(queue.log, "disabled", False)
    caplog.set_level(logging.WARNING, logger=queue.log.name)
    queue.InProcessDispatcher(Celery("bare"), workers=1).close()
    assert "no task modules registered" in caplog.text
