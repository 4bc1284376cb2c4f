"""The packages of ``orchestrator`` import one way: each may import only the packages below it
in ``LAYERS`` (and its own modules), so a reader finds a concept in one folder and its
dependencies underneath it. ``docs/architecture.md`` draws the same order.

Imports are read from the source with ``ast``: at module level, inside functions and under
``if TYPE_CHECKING:`` alike. One kind of upward import is allowed, and named: a family's
declaration (``orchestrator/families/<family>.py``) registers callbacks that call into the
package owning that family, imported inside the callback when it runs.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent / "orchestrator"

#: Lowest first. Top-level modules of ``orchestrator`` are units of their own.
LAYERS: list[set[str]] = [
    {"errors", "items", "settings", "untrusted", "states", "entries"},
    {"families"},
    {"storage"},
    {"logs"},
    {"models"},
    {"session"},
    {"census"},
    {"process"},
    {"job", "reminder", "agents"},
    {"turn"},
    {"archiving"},
]

#: The family declarations' callbacks: (declaring module, package it calls into).
FAMILY_CALLBACKS = {
    ("families.turn", "storage"),
    ("families.turn", "turn"),
    ("families.job", "storage"),
    ("families.job", "job"),
    ("families.reminder", "storage"),
    ("families.reminder", "reminder"),
}


def _unit(module: str) -> str:
    """The package (or top-level module) ``orchestrator.<module>`` belongs to."""
    return module.split(".")[0]


def _layer(unit: str) -> int:
    for i, layer in enumerate(LAYERS):
        if unit in layer:
            return i
    raise AssertionError(f"orchestrator.{unit} is in no layer of LAYERS: add it where it belongs")


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "orchestrator":
                found.update(alias.name for alias in node.names)
            elif node.module.startswith("orchestrator."):
                found.add(node.module.removeprefix("orchestrator."))
        elif isinstance(node, ast.Import):
            found.update(
                a.name.removeprefix("orchestrator.")
                for a in node.names
                if a.name.startswith("orchestrator.")
            )
    return found


def _modules() -> dict[str, Path]:
    return {
        ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p
        for p in sorted(ROOT.rglob("*.py"))
        if p != ROOT / "__init__.py"
    }


def test_every_package_imports_only_what_lies_below_it() -> None:
    upward = []
    for module, path in _modules().items():
        here = _unit(module)
        for target in _imports(path):
            there = _unit(target)
            if there == here or (module, there) in FAMILY_CALLBACKS:
                continue
            if _layer(there) > _layer(here):
                upward.append(f"orchestrator.{module} imports orchestrator.{target}")
    assert upward == []


def test_at_most_ten_modules_stay_at_the_top() -> None:
    top = sorted(p.name for p in ROOT.glob("*.py"))
    assert len(top) <= 10, top


def test_every_layer_names_a_package_or_module_that_exists() -> None:
    units = {_unit(m) for m in _modules()}
    named = set().union(*LAYERS)
    assert named == units, (sorted(named - units), sorted(units - named))


def test_every_named_family_callback_is_used() -> None:
    used = {
        (module, _unit(target)) for module, path in _modules().items() for target in _imports(path)
    }
    assert used >= FAMILY_CALLBACKS, sorted(FAMILY_CALLBACKS - used)
