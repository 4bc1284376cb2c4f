"""The turn sweeper with real worker processes and a busy fleet: a step waiting in the broker
for a free turn thread is not lost, however long it waits; one whose message is gone is.

The module runs one turn worker of its own (run prefix + ``sweepq:``) with one thread, so a
``think`` step keeps every later step in the queue; its sweeper passes every 1/6 s and looks
at a turn after 1 s without progress (``FLEET_TURN_STUCK_SECONDS``), so a queued step is
examined several times while it waits. The visibility timeout is 10 minutes, so kombu never
hands a message back within a test."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator

import pytest

from orchestrator.families import Family
from orchestrator.session.sessions import create_session
from orchestrator.storage.store import Store
from orchestrator.turn import sweeper
from orchestrator.turn.turns import start_turn
from tests.faults.fleets import PrivateFleet, private_fleet, sweeping
from tests.helpers import STARTUP_TIMEOUT, wait_for
from tests.workers.support import requests_of, turn_state, wait_request, wait_turn_state

pytestmark = pytest.mark.timeout(STARTUP_TIMEOUT + 60)

STUCK = 1.0


@pytest.fixture(scope="module")
def private(
    redis_url: str, key_prefix: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[PrivateFleet]:
    env = sweeping(STUCK)
    with private_fleet(
        redis_url, key_prefix, tmp_path_factory, "sweepq", [Family.TURN], env, concurrency=1
    ) as fleet:
        yield fleet


def turn_queue(private: PrivateFleet) -> str:
    """The Redis list of the turn queue, as the transport's options name it."""
    options = private.dispatcher.app.conf.broker_transport_options
    return f"{options['global_keyprefix']}{Family.TURN.value}"


def queued_steps(private: PrivateFleet, tid: str) -> list[str]:
    """The raw messages in the turn queue of a step of ``tid`` (read from their bodies)."""
    found = []
    for raw in private.store.redis.lrange(turn_queue(private), 0, -1):
        message = json.loads(raw)
        if message["headers"].get("task") != "turn.step":
            continue
        args = json.loads(base64.b64decode(message["body"]))[0]
        if args[1] == tid:
            found.append(raw)
    return found


def age_ms(store: Store, tid: str) -> float:
    """Milliseconds since the turn's last progress, on Redis's clock."""
    sec, usec = store.redis.time()
    score = store.redis.zscore(store.keys.turns_inflight, tid)
    return int(sec) * 1000 + int(usec) // 1000 - (score or 0)


def resumes(store: Store, tid: str) -> str | None:
    found: str | None = store.redis.hget(store.keys.turn(tid), "resumes")
    return found


def a_busy_thread(private: PrivateFleet, seconds: int) -> str:
    """Start a turn whose step holds the worker's only thread for ``seconds``."""
    store = private.store
    sid = create_session(store, "/tmp/faults-sweepq").session_id
    tid = start_turn(store, private.dispatcher, sid, f"think {seconds}")
    wait_request(store, sid, tid, 0, timeout=30)
    return tid


def a_queued_turn(private: PrivateFleet) -> tuple[str, str]:
    """``(sid, tid)`` of a new turn ``say hi`` once its step message waits in the queue."""
    store = private.store
    sid = create_session(store, "/tmp/faults-sweepq").session_id
    tid = start_turn(store, private.dispatcher, sid, "say hi")
    wait_for(lambda: len(queued_steps(private, tid)) == 1, 10, message="the step queued")
    return sid, tid


def test_a_step_queued_behind_a_busy_worker_is_never_resumed_or_failed_and_runs_once(
    private: PrivateFleet,
) -> None:
    store, dispatcher = private.store, private.dispatcher
    # Given the worker's only thread busy for 6 s and a turn whose step waits behind it
    busy = a_busy_thread(private, 6)
    sid, tid = a_queued_turn(private)

    # When it has waited past FLEET_TURN_STUCK_SECONDS, the worker's sweeper passing every
    # 1/6 s, and a sweep runs here as well
    wait_for(
        lambda: age_ms(store, tid) >= 2000 * STUCK or resumes(store, tid),
        15,
        message="the queued turn stale",
    )
    report = sweeper.sweep(store, dispatcher, stuck_seconds=STUCK)

    # Then no sweep resumed or failed it: it is reported waiting, its one message queued
    assert resumes(store, tid) is None
    assert turn_state(store, tid) == "running"
    assert tid in report.waiting and report.totals["resumed"] == 0
    assert len(queued_steps(private, tid)) == 1
    assert turn_state(store, busy) == "running"
    # And once the thread is free it runs, once
    wait_turn_state(store, tid, "completed", timeout=30)
    assert requests_of(store, sid, tid) == [0]
    assert resumes(store, tid) is None
    assert queued_steps(private, tid) == []


def test_a_step_whose_queued_message_is_lost_is_resumed(private: PrivateFleet) -> None:
    store = private.store
    # Given a turn whose step waits behind a busy thread
    a_busy_thread(private, 4)
    sid, tid = a_queued_turn(private)

    # When its message is lost from the queue
    [raw] = queued_steps(private, tid)
    assert store.redis.lrem(turn_queue(private), 1, raw) == 1

    # Then a sweeper finds the step lost and dispatches it again, and it runs once
    wait_for(lambda: resumes(store, tid) == "1", 15, message="the step resumed")
    wait_turn_state(store, tid, "completed", timeout=30)
    assert requests_of(store, sid, tid) == [0]
    assert resumes(store, tid) == "1"


def test_a_step_taken_by_a_worker_that_never_begins_it_is_resumed_after_a_grace(
    private: PrivateFleet,
) -> None:
    store = private.store
    # Given a turn whose step waits behind a busy thread
    a_busy_thread(private, 5)
    sid, tid = a_queued_turn(private)

    # When a worker takes its message and dies before beginning it: the message is moved to
    # the unacked hash, as kombu records it (it would come back after 10 minutes)
    [raw] = queued_steps(private, tid)
    tag = json.loads(raw)["properties"]["delivery_tag"]
    sec, _ = store.redis.time()
    pipe = store.redis.pipeline()
    pipe.lrem(turn_queue(private), 1, raw)
    pipe.hset(store.keys.broker_unacked, tag, json.dumps([json.loads(raw), "", "turn"]))
    pipe.zadd(f"{store.keys.broker_unacked}_index", {tag: int(sec)})
    pipe.execute()

    # Then a sweeper first notes the delivery and waits, and resumes the step once it was held
    # FLEET_TURN_STUCK_SECONDS without beginning
    wait_for(lambda: resumes(store, tid) == "1", 15, message="the step resumed")
    wait_turn_state(store, tid, "completed", timeout=30)
    assert requests_of(store, sid, tid) == [0]
    assert resumes(store, tid) == "1"
    assert store.redis.hget(store.keys.turn(tid), "heldTag") is None
