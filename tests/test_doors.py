"""Each package's Lua scripts are called through its door (``orchestrator/<package>/scripts.py``):
one typed function per script, the only code that builds a script's ARGV or reads its reply.

A call names its script by a string (``store.run("job_claim", [...])``, ``store.script(...)``,
``store.run_many("...", ...)``); the test reads every such call in the project's Python with
``ast`` and fails on one outside a door.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from orchestrator.storage.store import _script_paths

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
CALLS = {"run", "script", "run_many", "queue_script"}

#: Code that calls scripts by name on purpose, by path from the repository's root: the store's
#: own tests (script loading, the durable write, what a refused connection sends) and the
#: benchmarks' seeding, which queues thousands of creations on one pipeline.
STORE_MACHINERY = {
    "tests/orchestrator/test_store_durable.py",
    "tests/orchestrator/test_lualink.py",
    "tests/orchestrator/test_idempotency.py",
    "bench/bulk.py",
    "bench/million.py",
}


def _direct_calls(path: Path, scripts: set[str]) -> list[int]:
    """Lines of ``path`` that call a script by name."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in CALLS
        and _named(node) in scripts
    ]


def _named(call: ast.Call) -> object:
    """The script a call names: its first argument (``queue_script``: its second)."""
    at = 1 if isinstance(call.func, ast.Attribute) and call.func.attr == "queue_script" else 0
    if len(call.args) > at and isinstance(call.args[at], ast.Constant):
        return call.args[at].value
    return None


def _offenders() -> dict[str, list[int]]:
    scripts = set(_script_paths())
    found: dict[str, list[int]] = {}
    for top in ("orchestrator", "workers", "api", "bench", "tests"):
        for path in sorted((ROOT / top).rglob("*.py")):
            if path.name == "scripts.py" and path.parent.parent.name == "orchestrator":
                continue
            if str(path.relative_to(ROOT)) in STORE_MACHINERY:
                continue
            lines = _direct_calls(path, scripts)
            if lines:
                found[str(path.relative_to(ROOT))] = lines
    return found


def test_scripts_are_called_through_their_package_door() -> None:
    assert _offenders() == {}, "call these scripts through the door of the package that owns them"
