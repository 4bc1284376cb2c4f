"""``fleet flower``: on loopback its API answers without auth, a busy port
is a one-line error, and every task it lists has a name; without auth no page of another
origin may read it (no CORS header) and a rebound ``Host`` is refused. A real Flower process
on a free loopback port, beside the shared real workers."""

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

from orchestrator.session import sessions
from orchestrator.storage.store import Store
from orchestrator.turn import turns
from tests.helpers import STARTUP_TIMEOUT, http_ok, wait_for, wait_until_up
from tests.workers.support import active_step, wait_turn_state


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
    try:
        wait_until_up(lambda: http_ok(f"{base}/healthcheck"), proc, "fleet flower", log.read_text)
        yield base, log
    finally:
        proc.terminate()
        proc.wait(20)


@pytest.mark.integration
def test_flower_on_loopback_answers_its_api_without_auth_and_names_every_task(
    fleet: Any, store: Store, dispatcher: Any, tmp_path: Path
) -> None:
    # A turn whose step is already running when Flower starts: Flower sees its end, never
    # its start, and still shows it by name. The step runs until the turn is cancelled, once
    # Flower's event receiver hears the workers (however long Flower takes to start).
    sid = sessions.create_session(store, "/tmp/fleet-flower-test").session_id
    tid = turns.start_turn(store, dispatcher, sid, "think 600\nsay never")
    try:
        wait_for(lambda: _running(store, tid), 30, message="the turn's first step to run")
        _, step = wait_for(
            lambda: active_step(dispatcher.app, tid, len(fleet.workers)),
            30,
            message="the step's task among the workers' active ones",
        )
        with _running_flower(tmp_path) as (base, log):
            wait_for(lambda: _receives_events(base), STARTUP_TIMEOUT, message="Flower's events")
            assert _running(store, tid)
            turns.cancel_session_turns(store, dispatcher, sid, [tid])
            wait_turn_state(store, tid, "cancelled", timeout=30)

            def listed() -> dict[str, Any]:
                response = httpx.get(f"{base}/api/tasks", timeout=5)
                assert response.status_code == 200, (response.status_code, response.text)
                tasks: dict[str, Any] = response.json()
                return tasks if step in tasks else {}

            tasks = wait_for(listed, 30, message="Flower to list the step it saw end")
            assert tasks[step].get("name") == "turn.step", tasks[step]
            unnamed = [(u, t.get("state")) for u, t in tasks.items() if not t.get("name")]
            assert not unnamed, unnamed
            assert "Traceback" not in log.read_text()
    finally:  # a failed test must not leave its step thinking in the shared fleet
        turns.cancel_session_turns(store, dispatcher, sid, [tid])


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


#: Flower's answers a page of another origin could read through the browser with CORS.
READS = ["/api/tasks", "/api/workers", "/api/task/types", "/", "/tasks"]


def test_without_auth_no_page_of_another_origin_may_read_flower(tmp_path: Path) -> None:
    with _running_flower(tmp_path) as (base, _log):
        port = base.rsplit(":", 1)[1]
        for path in READS:
            # When a page of another origin reads Flower (a fetch, and its preflight)
            got = httpx.get(base + path, headers={"Origin": "http://evil.example"}, timeout=10)
            asked = httpx.options(
                base + path,
                headers={
                    "Origin": "http://evil.example",
                    "Access-Control-Request-Method": "GET",
                    "Access-Control-Request-Headers": "authorization",
                },
                timeout=10,
            )
            # Then Flower still answers (as it answers its own clients: curl, its UI), with no
            # header that lets the browser hand the answer to that page
            assert got.status_code == 200, (path, got.status_code, got.text[:200])
            for response in (got, asked):
                cors = [h for h in response.headers if h.lower().startswith("access-control-")]
                assert cors == [], (path, response.status_code, dict(response.headers))
            # And a page whose name was rebound to 127.0.0.1 is refused
            rebound = httpx.get(
                base + path,
                headers={
                    "Host": f"rebound.example:{port}",
                    "Origin": f"http://rebound.example:{port}",
                },
                timeout=10,
            )
            assert rebound.status_code == 403, (path, rebound.status_code, rebound.text[:200])
        for host in (f"localhost:{port}", f"127.0.0.1:{port}"):
            assert httpx.get(base + "/api/tasks", headers={"Host": host}).status_code == 200
