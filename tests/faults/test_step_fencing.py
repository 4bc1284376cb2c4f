"""A turn worker frozen past its step's lease while the sweeper runs the same step on another
worker: once it resumes, its copy of the step lands nothing (fencing tokens,
``orchestrator/session/fencing.py``).

Each test runs turn workers of its own (run prefix + ``fencing:``) with a visibility timeout of
10 minutes, so the frozen worker's unacknowledged step never comes back: the second copy is the
sweeper's resume (``FLEET_TURN_STUCK_SECONDS=2``, a pass every 2/6 s). Two turn workers are up
before the turn starts (starting one inside the step's window would race it on a loaded
machine); the one running the step is frozen with SIGSTOP by PID until the sweeper's copy began
on the other (its lease of 5 s lapsed), then continued with SIGCONT. The next step outlasts
the second copy, so a copy that still wrote would be seen twice."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from localfleet.fleet import LocalFleet
from orchestrator.families import Family
from orchestrator.session.sessions import create_session
from orchestrator.settings import FleetSettings
from orchestrator.storage.store import Store
from orchestrator.turn.turns import start_turn
from tests.helpers import STARTUP_TIMEOUT, wait_for
from tests.workers.support import (
    history,
    requests_of,
    wait_log,
    wait_turn_state,
    worker_running,
)
from workers.app import configure
from workers.dispatch import CeleryDispatcher

# Two workers start (STARTUP_TIMEOUT) before what each test checks.
pytestmark = pytest.mark.timeout(STARTUP_TIMEOUT + 150)


@pytest.fixture(scope="module")
def rig(redis_url: str, key_prefix: str) -> Iterator[tuple[Store, CeleryDispatcher, str]]:
    prefix = f"{key_prefix}fencing:"
    store = Store(redis_url, prefix)
    app = Celery("agent_fleet_fencing")
    configure(app, FleetSettings(redis_url=redis_url, key_prefix=prefix))
    try:
        yield store, CeleryDispatcher(app), prefix
    finally:
        for key in store.redis.scan_iter(match=f"{prefix}*", count=1000):
            store.redis.delete(key)
        store.close()
        app.close()


@pytest.fixture
def fleet(
    rig: tuple[Store, CeleryDispatcher, str], redis_url: str, tmp_path: Path
) -> Iterator[LocalFleet]:
    fleet = LocalFleet(
        redis_url,
        rig[2],
        tmp_path / "fleet",
        hostname="fence-0",
        concurrency=4,
        extra_env={
            "FLEET_VISIBILITY_TIMEOUT_SECONDS": "600",
            "FLEET_TURN_STUCK_SECONDS": "2",
        },
    )
    fleet.start([Family.TURN])
    fleet.start_worker(Family.TURN, "fence-1")
    try:
        fleet.wait_ready(STARTUP_TIMEOUT)
        yield fleet
    finally:
        # A stopped worker would ignore SIGTERM: let it run before the fleet stops it.
        for w in fleet.workers:
            if w.process.poll() is None:
                w.process.send_signal(signal.SIGCONT)
        fleet.stop()


def turn_events(store: Store, tid: str) -> list[dict[str, Any]]:
    rows = store.redis.xrange(store.keys.event_stream, "-", "+")
    events = [json.loads(fields["event"]) for _, fields in rows]
    return [e for e in events if e.get("type") == "turn" and e.get("turnId") == tid]


def updates(store: Store, sid: str, tid: str, kind: str) -> list[dict[str, Any]]:
    return [u for u in history(store, sid) if u["turnId"] == tid and u["sessionUpdate"] == kind]


def freeze_past_the_lease_while_the_sweeper_resumes(
    store: Store, dispatcher: CeleryDispatcher, fleet: LocalFleet, prompt: str, opens_call: bool
) -> tuple[str, str, Any]:
    """Run ``prompt`` until its step 0 began on one of the two workers (and, with
    ``opens_call``, recorded its tool call), SIGSTOP that one until the sweeper's copy of step
    0 began on the other, then SIGCONT it. Returns (session id, turn id, the frozen worker)."""
    sid = create_session(store, "/tmp/faults-fencing").session_id
    tid = start_turn(store, dispatcher, sid, prompt)
    wait_for(lambda: requests_of(store, sid, tid) == [0], 30, message="step 0 began")
    if opens_call:
        # Frozen between its step's start and its tool call, the first copy would open none.
        wait_for(
            lambda: len(updates(store, sid, tid, "tool_call")) == 1,
            30,
            message="step 0's tool call was recorded",
        )
    first = worker_running(dispatcher.app, fleet, tid)
    first.process.send_signal(signal.SIGSTOP)
    try:
        wait_for(
            lambda: requests_of(store, sid, tid) == [0, 0],
            40,
            message="the sweeper's copy of step 0 began on the second worker",
        )
    finally:
        first.process.send_signal(signal.SIGCONT)
    return sid, tid, first


def test_a_model_step_frozen_past_its_lease_lands_nothing_once_its_worker_resumes(
    rig: tuple[Store, CeleryDispatcher, str], fleet: LocalFleet
) -> None:
    store, dispatcher, _ = rig
    # Given step 0 of a turn (a model request of 8 s) frozen on its worker past its lease
    # while the sweeper runs it again on a second worker, and the first worker then resumed
    sid, tid, first = freeze_past_the_lease_while_the_sweeper_resumes(
        store, dispatcher, fleet, "think 8\nthink 1", opens_call=False
    )
    # When the turn runs to its end
    wait_turn_state(store, tid, "completed", timeout=90)
    # Then each step answered once
    texts = [u["content"]["text"] for u in updates(store, sid, tid, "agent_message_chunk")]
    assert texts == ["(thought for 8s)", "(thought for 1s)"]
    assert requests_of(store, sid, tid) == [0, 0, 1]
    # And the frozen copy was dropped as superseded, and the turn ended once (its end event
    # is published after its state is written: waited for, then counted)
    wait_for(
        lambda: any(e["state"] == "completed" for e in turn_events(store, tid)),
        30,
        message="the turn's end event",
    )
    wait_log(first, "superseded", timeout=30)
    assert [e["state"] for e in turn_events(store, tid)] == ["completed"]


def test_a_tool_call_frozen_past_its_lease_lands_nothing_once_its_worker_resumes(
    rig: tuple[Store, CeleryDispatcher, str], fleet: LocalFleet
) -> None:
    store, dispatcher, _ = rig
    # Given step 0 of a turn (an exec child of 8 s) frozen on its worker past its lease while
    # the sweeper runs it again on a second worker, and the first worker then resumed
    sid, tid, first = freeze_past_the_lease_while_the_sweeper_resumes(
        store, dispatcher, fleet, "exec 8\nthink 1", opens_call=True
    )
    # When the turn runs to its end
    wait_turn_state(store, tid, "completed", timeout=90)
    # Then each tool call has one result: the frozen copy's was settled failed when the second
    # copy began (its own result was dropped), the second copy's completed; the next step ran
    # once
    calls = [c["toolCallId"] for c in updates(store, sid, tid, "tool_call")]
    results = updates(store, sid, tid, "tool_call_update")
    assert [(r["toolCallId"], r["status"]) for r in results] == [
        (calls[0], "failed"),
        (calls[-1], "completed"),
    ]
    texts = [u["content"]["text"] for u in updates(store, sid, tid, "agent_message_chunk")]
    assert texts == ["(thought for 1s)"]
    assert requests_of(store, sid, tid) == [0, 0, 1]
    # And the frozen copy was dropped as superseded, and the turn ended once (its end event
    # is published after its state is written: waited for, then counted)
    wait_for(
        lambda: any(e["state"] == "completed" for e in turn_events(store, tid)),
        30,
        message="the turn's end event",
    )
    wait_log(first, "superseded", timeout=30)
    assert [e["state"] for e in turn_events(store, tid)] == ["completed"]
