"""Where a local fleet runs (``localfleet/discovery.py``): a published ``fleet.json`` counts only
while its ``fleet up`` runs (``tests/api/test_up.py`` finds a real one)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from localfleet import discovery


def test_publish_writes_where_the_fleet_runs_readable_by_its_owner_only(tmp_path: Path) -> None:
    path = discovery.publish(tmp_path / "state", "redis://127.0.0.1:1/0", "p:", None)
    body = json.loads(path.read_text())
    assert body["redisUrl"] == "redis://127.0.0.1:1/0" and body["keyPrefix"] == "p:"
    assert body["pid"] == os.getpid() and body["apiUrl"] is None
    assert path.stat().st_mode & 0o077 == 0
    discovery.unpublish(path)
    assert not path.exists()


def test_a_file_left_by_a_process_that_is_not_fleet_up_is_ignored(tmp_path: Path) -> None:
    # This test process is no `fleet up`, and a process that exited is none either.
    discovery.publish(tmp_path, "redis://127.0.0.1:1/0", "p:", None)
    assert discovery.find(tmp_path) is None
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    body = json.loads((tmp_path / discovery.FILE_NAME).read_text())
    body["pid"] = int(gone.stdout)
    (tmp_path / discovery.FILE_NAME).write_text(json.dumps(body))
    assert discovery.find(tmp_path) is None


def test_a_missing_or_malformed_file_is_no_fleet(tmp_path: Path) -> None:
    assert discovery.find(tmp_path) is None
    (tmp_path / discovery.FILE_NAME).write_text("{not json")
    assert discovery.find(tmp_path) is None
    (tmp_path / discovery.FILE_NAME).write_text(json.dumps({"redisUrl": "x"}))
    assert discovery.find(tmp_path) is None


def test_a_command_knows_the_agents_of_the_fleet_up_it_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from api import context
    from orchestrator.settings import get_settings

    agents = tmp_path / "agents.toml"
    discovery.publish(tmp_path, "redis://127.0.0.1:1/0", "p:", None, agents, "tiny")
    # As if this process were the `fleet up` that published it
    monkeypatch.setattr(discovery, "_runs_fleet_up", lambda pid: pid == os.getpid())
    monkeypatch.setenv("FLEET_STATE_DIR", str(tmp_path))
    for name in ("FLEET_REDIS_URL", "FLEET_AGENTS_FILE", "FLEET_AGENT"):
        monkeypatch.delenv(name, raising=False)

    def fresh() -> Any:
        get_settings.cache_clear()
        context.settings.cache_clear()
        return context.settings()

    try:
        found = fresh()
        monkeypatch.setenv("FLEET_AGENT", "")
        own = fresh()
    finally:
        get_settings.cache_clear()
        context.settings.cache_clear()

    assert found.agents_file == agents.resolve() and found.agent == "tiny"
    assert own.agent == ""  # the command's own environment wins
