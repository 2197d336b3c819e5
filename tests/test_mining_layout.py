"""The mining package's layout: no import cycles in the runtime, imports at module level in the
CPU miner, and the research tooling (``p2p.mining.lab``) never loaded by a worker."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

MINING = Path(__file__).resolve().parents[1] / "services" / "mining"
LAB = MINING / "lab"


def _module(path: Path) -> str:
    parts = list(path.relative_to(MINING).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(["p2p", "mining", *parts])


def _runtime_files() -> list[Path]:
    return [p for p in MINING.rglob("*.py") if LAB not in p.parents]


def _imports(tree: ast.Module, module: str, *, top_level_only: bool) -> set[str]:
    """The p2p.mining modules ``module`` imports (a name imported from a package counts as its
    submodule when there is one)."""
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.If) and top_level_only:
            continue  # ``if TYPE_CHECKING:`` imports are for the type checker only
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("p2p.mining")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("p2p.mining"):
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return found


def test_the_mining_runtime_has_no_import_cycle() -> None:
    modules = {_module(p): p for p in _runtime_files()}
    graph = {
        name: {m for m in _imports(ast.parse(path.read_text()), name, top_level_only=True) if m in modules}
        - {name}
        for name, path in modules.items()
    }
    # a package's __init__ is run before its submodules: an edge to a package is an edge to its __init__
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(name: str) -> None:
        state[name] = 1
        stack.append(name)
        for other in sorted(graph[name]):
            if state.get(other) == 1:
                cycle = [*stack[stack.index(other) :], other]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if other not in state:
                visit(other)
        stack.pop()
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name)


def test_the_cpu_miner_imports_at_module_level() -> None:
    for path in (MINING / "cpu").rglob("*.py"):
        tree = ast.parse(path.read_text())
        everywhere = _imports(tree, _module(path), top_level_only=False)
        top = _imports(tree, _module(path), top_level_only=True)
        type_only = {
            m
            for node in tree.body
            if isinstance(node, ast.If)
            for m in _imports(ast.Module(body=node.body, type_ignores=[]), "", top_level_only=True)
        }
        assert everywhere <= top | type_only, (
            f"{path.name} imports inside a function: {everywhere - top - type_only}"
        )


def test_the_runtime_never_imports_the_lab() -> None:
    for path in _runtime_files():
        imported = _imports(ast.parse(path.read_text()), _module(path), top_level_only=False)
        assert not any(m == "p2p.mining.lab" or m.startswith("p2p.mining.lab.") for m in imported), path
    code = (
        "import sys, p2p.mining.tasks, p2p.mining.pipeline, p2p.mining.lvlm.miner; "
        "print(sorted(m for m in sys.modules if m == 'p2p.mining.lab' or m.startswith('p2p.mining.lab.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
