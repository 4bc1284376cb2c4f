"""``fleet acp`` with stdin that the event loop cannot watch: ``/dev/null`` (a character device
epoll refuses) and a regular file are read by a thread, so their end ends the agent as the end
of a pipe does: exit 0, no traceback. Without a fleet the agent says only ``fleet_not_found``
(exit 2), whatever its stdin. A line that is not UTF-8 is answered -32700 and the next one
is served."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import IO, Any

import pytest

from tests.helpers import STARTUP_TIMEOUT

INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": 1, "clientCapabilities": {}},
}


def _acp(stdin: int | IO[Any], env: dict[str, str], cwd: Path | None = None) -> Any:
    return subprocess.run(
        [sys.executable, "-m", "api.cli", "acp"],
        stdin=stdin,
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=STARTUP_TIMEOUT,
    )


def _requests_file(tmp_path: Path) -> Path:
    path = tmp_path / "requests.jsonl"
    path.write_text(json.dumps(INITIALIZE) + "\n")
    return path


def test_stdin_from_dev_null_ends_the_agent_at_once() -> None:
    proc = _acp(subprocess.DEVNULL, dict(os.environ))
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "PermissionError" not in proc.stderr, proc.stderr
    assert proc.stdout == ""


def test_stdin_from_a_regular_file_is_answered_then_ends_the_agent(tmp_path: Path) -> None:
    with _requests_file(tmp_path).open("rb") as stdin:
        proc = _acp(stdin, dict(os.environ))
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    (answer,) = [json.loads(line) for line in proc.stdout.splitlines()]
    assert answer["id"] == 1 and answer["result"]["protocolVersion"] == 1, answer


@pytest.mark.parametrize("kind", ["dev-null", "file"])
def test_without_a_fleet_the_agent_says_fleet_not_found_only(tmp_path: Path, kind: str) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("FLEET_REDIS_URL", "FLEET_STATE_DIR")}
    empty = tmp_path / "empty"
    empty.mkdir()
    if kind == "dev-null":
        proc = _acp(subprocess.DEVNULL, env, cwd=empty)
    else:
        with _requests_file(tmp_path).open("rb") as stdin:
            proc = _acp(stdin, env, cwd=empty)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    assert proc.stderr.startswith("error (fleet_not_found): "), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_a_line_that_is_not_utf8_is_a_parse_error_and_the_next_is_served(tmp_path: Path) -> None:
    path = tmp_path / "requests.jsonl"
    cut = b'{"jsonrpc":"2.0","id":2,"method":"session/new","params":{"cwd":"/tmp/\xff"}}'
    path.write_bytes(cut + b"\n" + json.dumps(INITIALIZE).encode() + b"\n")
    with path.open("rb") as stdin:
        proc = _acp(stdin, dict(os.environ))
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    refused, answer = [json.loads(line) for line in proc.stdout.splitlines()]
    assert refused["id"] is None and refused["error"]["code"] == -32700, refused
    assert refused["error"]["message"] == (
        "Parse error: message is not valid UTF-8 JSON: "
        "byte 0xff at offset 69 is not UTF-8 (invalid start byte)."
    ), refused
    assert answer["id"] == 1 and answer["result"]["protocolVersion"] == 1, answer
