"""The domain core stays framework-free and its Lua scripts are sound."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import orchestrator
from orchestrator.storage.store import Store, _script_paths

PACKAGE_DIR = Path(orchestrator.__file__).parent
ROOT = PACKAGE_DIR.parent
FORBIDDEN = ("fastapi", "starlette", "celery", "kombu", "prometheus_client")


def test_importing_every_orchestrator_module_loads_no_web_or_task_framework() -> None:
    # Given a fresh interpreter (nothing imported yet)
    code = textwrap.dedent(
        f"""
        import importlib, json, pkgutil, sys
        import orchestrator
        found = pkgutil.iter_modules(orchestrator.__path__)
        names = sorted("orchestrator." + m.name for m in found)
        for name in names:
            importlib.import_module(name)
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in {FORBIDDEN!r})
        print(json.dumps({{"modules": names, "forbidden": loaded}}))
        """
    )
    # When every orchestrator module is imported
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    # Then every module on disk was imported and none of the frameworks came with them
    on_disk = sorted(
        [f"orchestrator.{p.stem}" for p in PACKAGE_DIR.glob("*.py") if p.stem != "__init__"]
        + [f"orchestrator.{p.parent.name}" for p in PACKAGE_DIR.glob("*/__init__.py")]
    )
    assert report["modules"] == on_disk
    assert len(on_disk) >= 15
    assert report["forbidden"] == []


def test_every_lua_script_compiles_on_the_server(store: Store) -> None:
    scripts = sorted(name for name in _script_paths() if name != "_lib")
    assert scripts
    for name in scripts:
        # SCRIPT LOAD compiles the script (with the shared library prepended) without running it
        sha = store.redis.script_load(store.script(name).script)
        assert re.fullmatch(r"[0-9a-f]{40}", sha), name


def test_no_lua_script_spells_a_key_name() -> None:
    # Every key a script touches comes from orchestrator/storage/keys.py (the generated ``K``
    # prelude)
    spelled = re.compile(r"(P|ARGV\[1\])\s*\.\.\s*'")
    found = [
        f"{path.relative_to(PACKAGE_DIR)}:{n}"
        for path in sorted(PACKAGE_DIR.glob("**/*.lua"))
        for n, line in enumerate(path.read_text().splitlines(), start=1)
        if spelled.search(line.split("--")[0])
    ]
    assert found == []


def test_the_key_prelude_builds_the_keys_python_builds(store: Store) -> None:
    from orchestrator.storage.keys import lua_prelude

    lua = (
        lua_prelude() + "return {K.turn('t1'), K.archived, K.index('all'), K.index('active', 'c')}"
    )
    k = store.keys
    expected = [k.turn("t1"), k.archived, k.index("all"), k.index("active", "c")]
    assert store.redis.eval(lua, 0, k.prefix) == expected


def test_every_script_the_code_runs_exists_as_a_lua_file() -> None:
    pattern = re.compile(r"""\.run\(\s*["'](\w+)["']""")
    used: set[str] = set()
    for source in PACKAGE_DIR.glob("**/*.py"):
        used.update(pattern.findall(source.read_text(encoding="utf-8")))
    assert used, "no store.run calls found: the pattern is out of date"
    missing = sorted(used - set(_script_paths()))
    assert missing == []
