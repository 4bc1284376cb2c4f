"""Imports run one way: the import graph of ``orchestrator``, ``workers``, ``api``,
``localfleet`` and ``bench`` has no cycle, and the interface layer reaches the workers only where
the diagram of ``docs/architecture.md`` says (``api -> orchestrator <- workers``; the entry
points wire a dispatcher in). The local runners (``localfleet``) sit beside the entry points:
they may import ``orchestrator`` and ``workers`` (as ``api.cli.processes`` does), never ``api``,
and only ``api``, ``bench`` and the tests import them.

The graph is read from the source with ``ast``, so it holds every import: at module level,
inside functions and under ``if TYPE_CHECKING:`` alike.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("orchestrator", "workers", "api", "localfleet", "bench")

#: The only ``api`` modules that may import ``workers``: the entry points that start workers,
#: beat or Flower, and the one factory that builds the Celery dispatcher for the interfaces.
API_MAY_IMPORT_WORKERS = {
    "api.cli.processes",
    "api.wiring",
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            found[_module_name(path)] = path
    return found


def _imports(name: str, path: Path, known: set[str]) -> Iterator[str]:
    """Project modules ``name`` imports (``from a import b`` counts ``a.b`` when it is a
    module, ``a`` otherwise); a package's parents run first but are not counted."""
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in known:
                    yield alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")
                anchor = anchor if is_package else anchor[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                target = f"{base}.{alias.name}"
                if target in known:
                    yield target
                elif base in known:
                    yield base


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: set(_imports(name, path, known)) - {name} for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_graph_sees_the_packages() -> None:
    graph = _graph()
    assert {
        "orchestrator.errors",
        "workers.app",
        "api.cli",
        "localfleet.fleet",
        "bench.run",
    } <= set(graph)
    assert "orchestrator.errors" in graph["orchestrator.storage.store"]


def test_the_import_graph_has_no_cycle() -> None:
    assert _cycles(_graph()) == []


def _edges(
    sources: tuple[str, ...], targets: tuple[str, ...], exempt: set[str] | None = None
) -> set[tuple[str, str]]:
    """``(module, imported)`` for every import from a module of the packages ``sources``
    (modules in ``exempt`` left out) of a module of the packages ``targets``."""
    return {
        (module, target)
        for module, imported in _graph().items()
        if module.split(".")[0] in sources and module not in (exempt or set())
        for target in imported
        if target.split(".")[0] in targets
    }


def test_the_domain_imports_no_interface_or_worker_module() -> None:
    others = tuple(p for p in PACKAGES if p != "orchestrator")
    assert _edges(("orchestrator",), others) == set()


def test_the_api_reaches_workers_only_through_its_entry_points_and_the_dispatcher() -> None:
    assert _edges(("api",), ("workers",), API_MAY_IMPORT_WORKERS) == set()


def test_the_local_runners_import_no_interface_module() -> None:
    assert _edges(("localfleet",), ("api",)) == set()


def test_only_the_interfaces_and_the_benchmarks_import_the_local_runners() -> None:
    assert _edges(("orchestrator", "workers"), ("localfleet",)) == set()


def test_a_worker_on_the_scripted_model_starts_without_importing_the_openai_package() -> None:
    # The openai package is most of a worker's start-up imports; only the openai model needs it.
    import subprocess
    import sys

    from workers.app import TASK_MODULES

    modules = ["workers.app", "workers.runtime", "api.cli.processes", *TASK_MODULES]
    probe = (
        f"import importlib, sys\nfor m in {modules!r}: importlib.import_module(m)\n"
        "from orchestrator.settings import FleetSettings\n"
        "from workers.runtime import build_model\n"
        "build_model(FleetSettings(model='scripted'))\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'openai'))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout
