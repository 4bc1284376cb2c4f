"""The official TypeScript ACP SDK (npm ``@agentclientprotocol/sdk`` 2.x) as the client.

``tests/acp_driver/driver.mjs`` runs a scripted sequence (initialize, session/new,
session/set_title, session/list with archived filters, archive, unarchive, a prompt "say hi"
ending end_turn, the SDK's session helper, delete) and prints one JSON line per check; each test
here runs it over one transport and asserts every check passed: over stdio to a ``fleet acp``
process it spawns, and over the ``/acp`` WebSocket of a ``fleet api`` server started here.

The driver's packages are installed once with ``npm ci`` (from the committed package-lock.json)
into ``tests/acp_driver/node_modules``. Skipped only when ``node`` or ``npm`` is missing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.api_process import api_process
from tests.helpers import STARTUP_TIMEOUT

DRIVER_DIR = Path(__file__).resolve().parents[1] / "acp_driver"


def _installed_sdk_version() -> str | None:
    manifest = DRIVER_DIR / "node_modules" / "@agentclientprotocol" / "sdk" / "package.json"
    try:
        version: str = json.loads(manifest.read_text())["version"]
    except (OSError, ValueError, KeyError):
        return None
    return version


@pytest.fixture(scope="module")
def node() -> str:
    """The node executable, with the driver's packages installed."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("node and npm are needed to run the TypeScript SDK client (tests/acp_driver)")
    wanted = json.loads((DRIVER_DIR / "package.json").read_text())["dependencies"][
        "@agentclientprotocol/sdk"
    ]
    if _installed_sdk_version() != wanted:
        done = subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=DRIVER_DIR,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, f"npm ci failed:\n{done.stdout}\n{done.stderr}"
    assert _installed_sdk_version() == wanted
    return node


def _agent_env() -> dict[str, str]:
    env = dict(os.environ)  # FLEET_REDIS_URL / FLEET_KEY_PREFIX of this run (conftest)
    env.pop("FLEET_API_TOKEN", None)
    env["FLEET_TEST_STARTUP_TIMEOUT"] = str(STARTUP_TIMEOUT)  # the driver's initialize bound
    return env


@pytest.fixture(scope="module")
def api_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``fleet api`` on a free port (uvicorn, a real WebSocket server)."""
    with api_process(tmp_path_factory.mktemp("acp-api") / "api.log") as server:
        yield f"ws://127.0.0.1:{server.port}/acp"


def _run_driver(node: str, *args: str) -> list[dict[str, Any]]:
    done = subprocess.run(
        [node, str(DRIVER_DIR / "driver.mjs"), *args],
        cwd=DRIVER_DIR,
        env=_agent_env(),
        capture_output=True,
        text=True,
        timeout=STARTUP_TIMEOUT + 150,
    )
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    failed = [line for line in lines if line.get("ok") is False]
    report = (
        "\n".join(json.dumps(line) for line in failed) + f"\n--- stderr:\n{done.stderr[-4000:]}"
    )
    assert not failed, f"SDK driver checks failed:\n{report}"
    assert lines and lines[-1].get("done") is True, f"driver did not finish:\n{report}"
    assert lines[-1]["failed"] == 0 and lines[-1]["passed"] >= 40, lines[-1]
    assert done.returncode == 0, report
    return lines


def _cwd() -> str:
    return f"/tmp/fleet-acp-sdk-test/{uuid.uuid4().hex}"


def test_typescript_sdk_client_over_stdio(node: str, fleet: Any) -> None:
    lines = _run_driver(node, "stdio", _cwd(), sys.executable, "-m", "api.cli", "acp")
    checks = {line["check"] for line in lines if "check" in line}
    assert "agent exits cleanly when stdin closes" in checks
    assert "prompt: stopReason end_turn" in checks


def test_typescript_sdk_client_over_websocket(node: str, api_url: str, fleet: Any) -> None:
    lines = _run_driver(node, "ws", _cwd(), api_url)
    assert {line["transport"] for line in lines if "check" in line} == {"ws"}
