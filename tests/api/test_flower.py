"""``fleet flower`` (issue 13, item 18): on loopback its API answers without auth, a busy port
is a one-line error, and every task it lists has a name. A real Flower process on a free
loopback port, beside the shared real workers."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchestrator import sessions, turns
from orchestrator.store import Store
from tests.helpers import wait_for


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _flower(port: int, log: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k != "FLOWER_UNAUTHENTICATED_API"}
    env.pop("FLEET_FLOWER_BASIC_AUTH", None)
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "api.cli", "flower", "--port", str(port)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )


@contextmanager
def _running_flower(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    port = _free_port()
    tmp_path.mkdir(parents=True, exist_ok=True)
    log = tmp_path / "flower.log"
    proc = _flower(port, log)
    base = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        assert proc.poll() is None, log.read_text()
        try:
            return httpx.get(f"{base}/healthcheck", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(answers, 60, message="Flower to answer")
        yield base, log
    finally:
        proc.terminate()
        proc.wait(20)


@pytest.mark.integration
def test_flower_on_loopback_answers_its_api_without_auth_and_names_every_task(
    fleet: Any, store: Store, dispatcher: Any, tmp_path: Path
) -> None:
    # A turn whose step is already running when Flower starts: Flower sees its end, never
    # its start, and still shows it by name. Flower's event receiver must be connected while
    # the step still runs; on a machine so loaded that it is not, the round is run again.
    for attempt in range(3):
        sid = sessions.create_session(store, "/tmp/fleet-flower-test").session_id
        tid = turns.start_turn(store, dispatcher, sid, "think 8\nsay hello")
        wait_for(lambda tid=tid: _running(store, tid), 30, message="the turn's first step to run")
        with _running_flower(tmp_path / str(attempt)) as (base, log):
            wait_for(lambda base=base: _receives_events(base), 30, message="Flower's events")
            if not _running(store, tid):
                continue  # its step ended before Flower could hear it: another round
            wait_for(
                lambda tid=tid: (
                    (t := turns.get_turn(store, tid)) is not None and t.state.value == "completed"
                ),
                30,
                message="the turn to complete",
            )

            def listed(base: str = base, sid: str = sid) -> dict[str, Any]:
                response = httpx.get(f"{base}/api/tasks", timeout=5)
                assert response.status_code == 200, (response.status_code, response.text)
                tasks: dict[str, Any] = response.json()
                return tasks if any(sid in str(t.get("args")) for t in tasks.values()) else {}

            tasks = wait_for(listed, 30, message="Flower to list the turn's step")
            unnamed = [(u, t.get("state")) for u, t in tasks.items() if not t.get("name")]
            assert not unnamed, unnamed
            assert "Traceback" not in log.read_text()
            return
    pytest.fail("Flower never heard the workers while a step ran, in three rounds")


def _receives_events(base: str) -> bool:
    """Whether Flower's event receiver has heard a worker (its events-state worker list)."""
    response = httpx.get(f"{base}/api/workers", params={"status": "true"}, timeout=5)
    return response.status_code == 200 and bool(response.json())


def _running(store: Store, tid: str) -> bool:
    turn = turns.get_turn(store, tid)
    return turn is not None and turn.state.value == "running" and turn.step >= 0


def test_a_busy_port_is_a_one_line_error(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = _flower(port, tmp_path / "flower.log")
        code = proc.wait(60)
    out = (tmp_path / "flower.log").read_text()
    assert code == 2, out
    assert "Traceback" not in out, out
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) == 1 and f"port {port}" in lines[0], out
