"""Where a local fleet runs: ``fleet up`` publishes it, every other command finds it.

``fleet up`` writes ``<state_dir>/fleet.json`` once its workers are ready and removes it when
it exits::

    {"redisUrl": "redis://127.0.0.1:40123/0", "keyPrefix": "fleet:",
     "apiUrl": "http://127.0.0.1:8765" | null, "pid": 4242, "startedAt": "...Z",
     "agentsFile": "/abs/agents.toml" | null, "agent": ""}

A command run with ``FLEET_REDIS_URL`` unset reads it from its own state directory
(``FLEET_STATE_DIR``, ``./.fleet`` by default), so ``fleet sessions ls`` in the directory
where ``fleet up`` runs talks to that fleet, and knows its agents (``FLEET_AGENTS_FILE`` and
``FLEET_AGENT`` of the fleet, when the command's own environment sets neither). A file whose
``pid`` is no longer a running ``fleet up`` (one killed with SIGKILL, its pid since reused) is
ignored.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import psutil

from orchestrator.errors import FleetError

FILE_NAME = "fleet.json"


class FleetNotFound(FleetError):
    """No Redis URL is configured and no ``fleet up`` publishes one in the state directory."""

    code = "fleet_not_found"

    def __init__(self, state_dir: Path) -> None:
        path = state_dir / FILE_NAME
        super().__init__(
            "No fleet to talk to: FLEET_REDIS_URL is not set and no `fleet up` runs with the "
            f"state directory {state_dir} (no live {path}). Either run `fleet up` in this "
            "directory and run this command again (from the same directory, or with "
            "FLEET_STATE_DIR set to that fleet's state directory), or point "
            "FLEET_REDIS_URL at your Redis (redis://HOST:6379/0) and FLEET_KEY_PREFIX at "
            "your fleet's prefix if it is not 'fleet:'.",
            {"stateDir": str(state_dir), "looked": str(path)},
        )


@dataclass(frozen=True)
class Published:
    """What a running ``fleet up`` published."""

    redis_url: str
    key_prefix: str
    api_url: str | None
    pid: int
    path: Path
    agents_file: str | None = None
    agent: str = ""


def publish(
    state_dir: Path,
    redis_url: str,
    key_prefix: str,
    api_url: str | None,
    agents_file: Path | None = None,
    agent: str = "",
) -> Path:
    """Write ``<state_dir>/fleet.json`` for this process (atomically, readable by its owner
    only); returns its path. Raises ``OSError``."""
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / FILE_NAME
    body = {
        "redisUrl": redis_url,
        "keyPrefix": key_prefix,
        "apiUrl": api_url,
        "pid": os.getpid(),
        "startedAt": datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
        "agentsFile": str(agents_file.resolve()) if agents_file else None,
        "agent": agent,
    }
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(body, fh, indent=2)
    os.replace(tmp, path)
    return path


def unpublish(path: Path) -> None:
    """Remove ``path`` if this process published it (a later ``fleet up`` may own it now)."""
    try:
        ours = json.loads(path.read_text(encoding="utf-8")).get("pid") == os.getpid()
    except (OSError, ValueError, AttributeError):
        return
    if ours:
        path.unlink(missing_ok=True)


def read(path: Path) -> Published | None:
    """The fleet published at ``path`` if its process still runs; ``None`` otherwise (no
    file, unreadable or malformed, or left by a process that is gone)."""
    try:
        body = json.loads(path.read_text(encoding="utf-8"))
        found = Published(
            str(body["redisUrl"]),
            str(body["keyPrefix"]),
            body.get("apiUrl") or None,
            int(body["pid"]),
            path,
            body.get("agentsFile") or None,
            str(body.get("agent") or ""),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return found if _runs_fleet_up(found.pid) else None


def _runs_fleet_up(pid: int) -> bool:
    """Whether ``pid`` is a running ``fleet up`` (not a process that got its pid since)."""
    try:
        args = psutil.Process(pid).cmdline()
    except psutil.Error:
        return False
    return "up" in args and any("fleet" in a or "api.cli" in a for a in args)


def find(state_dir: Path) -> Published | None:
    """The fleet a ``fleet up`` with this state directory publishes, if one runs."""
    return read(state_dir / FILE_NAME)
