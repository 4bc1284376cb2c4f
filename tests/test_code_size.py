"""Sizes stay readable: no function or method over 80 lines and no module over 450 lines in
the product packages (``api``, ``orchestrator``, ``workers``, and ``localfleet``, the local
runners). Read from the source with ``ast``; no Redis, nothing imported."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("api", "orchestrator", "workers", "localfleet")
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 450


def _modules() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))


def _oversized() -> list[str]:
    """``path: what`` for every module and function over its limit."""
    found = []
    for path in _modules():
        name = path.relative_to(ROOT).as_posix()
        source = path.read_text(encoding="utf-8")
        lines = source.count("\n")
        if lines > MAX_MODULE_LINES:
            found.append(f"{name}: {lines} lines (module limit {MAX_MODULE_LINES})")
        for node in ast.walk(ast.parse(source, filename=name)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                assert node.end_lineno is not None
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    found.append(
                        f"{name}: {node.name}() at line {node.lineno} is {length} lines "
                        f"(function limit {MAX_FUNCTION_LINES})"
                    )
    return found


def test_the_packages_are_read() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in _modules()}
    assert {"api/rest.py", "orchestrator/storage/store.py", "workers/app.py"} <= names


def test_no_function_or_module_is_over_its_limit() -> None:
    assert _oversized() == []
