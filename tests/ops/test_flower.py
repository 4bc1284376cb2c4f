"""Operators see the whole fleet in Flower.

A real Flower (``fleet flower``, basic auth on) watches the real workers through the run's
broker prefix. After a busy session is archived with ``stopActivity``, Flower's HTTP API lists
the four stop tasks by their dotted names, each with the session id as its first argument and
run by the worker of its family (the job stop by the host that owns the job); a late step the
gate refuses shows as ``REFUSED``, neither an eternal ``STARTED`` nor a ``FAILURE``.
"""

from __future__ import annotations

import ast
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchestrator.archiving.archive import archive
from orchestrator.turn.turns import start_turn
from tests.helpers import RecordingDispatcher, wait_for
from tests.orchestrator.support import begin_step
from tests.workers.support import (
    ALL_FAMILIES,
    item_of,
    job_record,
    requests_of,
    turns_of,
    wait_drained,
    wait_families,
    wait_job_pid,
    wait_request,
    wait_turn_state,
)

pytestmark = pytest.mark.timeout(90)

USER, PASSWORD = "ops", "flower-test-secret"
STOP_TASKS = {"turn.stop", "job.stop", "subagent.stop", "reminder.stop"}
#: Step 0 spawns a subagent that thinks, step 1 starts a job, step 2 stores a reminder due
#: long after the test, step 3 thinks: live work in all four families.
BUSY = "spawn think 30|say done\nrun 63.7\nremind 120 say wake\nthink 60"


@dataclass
class Flower:
    """A running ``fleet flower``: its base URL, process and log."""

    url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def get(self, path: str, auth: tuple[str, str] | None = (USER, PASSWORD)) -> httpx.Response:
        return httpx.get(f"{self.url}{path}", auth=auth, timeout=10)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def flower(fleet: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Flower]:
    """``fleet flower`` on a free loopback port with basic auth, started with the run's
    environment (broker URL and key prefix) and ready once its event receiver has seen a
    heartbeat of every worker of the fleet."""
    port = _free_port()
    log_path = tmp_path_factory.mktemp("flower") / "flower.log"
    env = dict(os.environ, FLEET_FLOWER_BASIC_AUTH=f"{USER}:{PASSWORD}", PYTHONUNBUFFERED="1")
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "api.cli", "flower", "--port", str(port)],
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    running = Flower(f"http://127.0.0.1:{port}", proc, log_path)
    nodes = {w.node for w in fleet.workers}

    def every_worker_seen() -> bool:
        if proc.poll() is not None:
            pytest.fail(f"flower exited with {proc.returncode}:\n{running.log()}")
        try:
            # ?status=true answers from Flower's event state: a worker is listed only once
            # its heartbeat event crossed the broker under the run's prefix.
            alive = running.get("/api/workers?status=true").json()
        except (httpx.HTTPError, ValueError):
            return False
        return all(alive.get(node) for node in nodes)

    try:
        wait_for(every_worker_seen, 30, 0.2, message="Flower to see every worker's events")
        yield running
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def flower_tasks(flower: Flower, sid: str, **query: str) -> dict[str, dict[str, Any]]:
    """Flower's tasks (``/api/tasks``) whose first positional argument is ``sid``."""
    response = httpx.get(f"{flower.url}/api/tasks", params=query, auth=(USER, PASSWORD), timeout=10)
    assert response.status_code == 200, (response.status_code, response.text[:500])
    found = {}
    for uuid, task in response.json().items():
        args = task_args(task)
        if args and args[0] == sid:
            found[uuid] = task
    return found


def task_args(task: dict[str, Any]) -> list[Any]:
    """A task's positional arguments (Flower shows Celery's ``argsrepr``, a Python repr)."""
    try:
        args = ast.literal_eval(task.get("args") or "[]")
    except (ValueError, SyntaxError):
        return []
    return list(args) if isinstance(args, list | tuple) else []


def test_flower_shows_the_stops_of_an_archive_and_the_refused_late_step(
    fleet: Any, store: Any, dispatcher: Any, sessions: Any, flower: Flower
) -> None:
    # Given a session busy in all four families, watched by Flower
    sid = sessions.new()
    tid = start_turn(store, dispatcher, sid, BUSY)
    wait_families(store, sid, set(ALL_FAMILIES))
    wait_request(store, sid, tid, 3)
    jid = item_of(store, sid, "job").id
    wait_job_pid(store, jid)
    job_host = job_record(store, jid)["host"]
    child = item_of(store, sid, "subagent").id
    wait_request(store, child, turns_of(store, child)[0], 0)
    rid = item_of(store, sid, "reminder").id

    # When it is archived with stopActivity; and another session is archived while a step of
    # its turn was in flight on a worker that vanished (the lease lapsed), and a copy of that
    # step arrives late, for the gate to refuse
    result = archive(store, dispatcher, sid, stop_activity=True)
    assert result.stop_report.sent == {"turn": 1, "job": 1, "subagent": 1, "reminder": 1}
    wait_drained(store, sid)
    other = sessions.new()
    late = start_turn(store, RecordingDispatcher(), other, "say late")  # its step never sent
    assert begin_step(store, late)
    archive(store, dispatcher, other, stop_activity=True)
    store.redis.delete(store.keys.step_lease(late))
    dispatcher.send("turn.step", [other, late, 0], "turn")
    wait_turn_state(store, late, "cancelled")

    # Then Flower lists one task per stop, by name, with the session id first, done by the
    # worker of its family (the job stop by the host owning the job, the others by their
    # family's control-only worker or its own worker); and the late step as REFUSED.
    # Every task of the session has settled: none STARTED, none FAILURE.
    expected_workers = {
        "turn.stop": {"turn.ctl@test", "turn@test"},
        "job.stop": {f"job@{job_host}"},
        "subagent.stop": {"subagent.ctl@test", "subagent@test"},
        "reminder.stop": {"reminder.ctl@test", "reminder@test"},
    }

    def settled() -> dict[str, dict[str, Any]] | None:
        tasks = flower_tasks(flower, sid)
        names = {t["name"] for t in tasks.values()}
        states = {t["state"] for t in tasks.values()}
        if not names >= STOP_TASKS or states - {"SUCCESS", "REFUSED"}:
            return None
        if not any(t["state"] == "REFUSED" for t in flower_tasks(flower, other).values()):
            return None
        return tasks

    tasks = wait_for(settled, 20, 0.2, message=f"Flower to show the settled tasks of {sid}")
    stops = {t["name"]: t for t in tasks.values() if t["name"] in STOP_TASKS}
    for name, task in stops.items():
        assert task["state"] == "SUCCESS", (name, task)
        assert task["worker"] in expected_workers[name], (name, task)
    assert task_args(stops["job.stop"]) == [sid, [jid]]
    # (Celery's argument repr cuts the plan's nested lists short: only its keys are shown.)
    sub_sid, plans = task_args(stops["subagent.stop"])
    assert sub_sid == sid and list(plans) == [child]
    assert task_args(stops["turn.stop"]) == [sid, [tid]]
    assert task_args(stops["reminder.stop"]) == [sid, [rid]]
    [refused] = [t for t in flower_tasks(flower, other).values() if t["state"] == "REFUSED"]
    assert refused["name"] == "turn.step"
    assert task_args(refused) == [other, late, 0]
    assert refused["worker"] == "turn@test"
    assert refused["failed"] is None and refused["succeeded"] is None
    assert requests_of(store, other, late) == [0]  # only the step that began before
    assert not [t for t in tasks.values() if t["state"] in {"STARTED", "FAILURE"}]
    # An operator can search for the session id, and filter on the state and the dotted name
    everything = flower.get("/api/tasks").json()
    found = flower.get(f"/api/tasks?search={sid}").json()
    assert set(found) == set(tasks) != set(everything)  # the subagent's steps are not found
    assert set(flower_tasks(flower, other, state="REFUSED")) == {refused["uuid"]}
    assert {t["name"] for t in flower_tasks(flower, sid, taskname="job.stop").values()} == {
        "job.stop"
    }


def test_flower_refuses_requests_without_valid_credentials(flower: Flower) -> None:
    for path in ("/api/tasks", "/api/workers", "/tasks", "/"):
        assert flower.get(path, auth=None).status_code == 401, path
        assert flower.get(path, auth=(USER, "wrong")).status_code == 401, path
    assert flower.get("/api/tasks").status_code == 200


def test_fleet_flower_will_not_serve_beyond_loopback_without_credentials() -> None:
    env = {k: v for k, v in os.environ.items() if k != "FLEET_FLOWER_BASIC_AUTH"}
    proc = subprocess.run(
        [sys.executable, "-m", "api.cli", "flower", "--address", "0.0.0.0", "--port", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2
    assert "FLEET_FLOWER_BASIC_AUTH" in proc.stdout + proc.stderr
