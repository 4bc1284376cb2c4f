"""What the turn sweeper reads of the broker (``turn/turn_broker_scan.lua``) against real
Redis, no worker: step messages are written by hand where kombu's Redis transport keeps them
(``Keys.broker_queue``, ``Keys.broker_unacked``), in its shape, with the task id the
dispatcher gives a step (``families.step_message_id``). The real transport is exercised by
``tests/faults/test_turn_sweeper_queue.py``."""

from __future__ import annotations

import json
import uuid

import pytest

from orchestrator.families import Family, step_message_id
from orchestrator.session import sessions
from orchestrator.storage.store import Store
from orchestrator.turn import sweeper, turns
from tests.helpers import RecordingDispatcher

STUCK = 2.0


def redis_ms(store: Store) -> int:
    sec, usec = store.redis.time()
    return int(sec) * 1000 + int(usec) // 1000


@pytest.fixture
def store(own_store: Store) -> Store:
    """A store on a prefix of this test alone: a sweep acts on every member of the index."""
    return own_store


@pytest.fixture
def stale(store: Store, recorder: RecordingDispatcher, cwd: str) -> str:
    """A running turn at step 0, no lease, last progress 10 s ago; its message nowhere yet."""
    sid = sessions.create_session(store, cwd).session_id
    tid = turns.start_turn(store, recorder, sid, "say hello")
    recorder.sent.clear()
    store.redis.zadd(store.keys.turns_inflight, {tid: redis_ms(store) - 10_000})
    return tid


def message(task_id: str, parent_id: str | None = None) -> dict[str, object]:
    """A step message as kombu keeps it (the body, base64 JSON, is not read)."""
    headers = {"lang": "py", "task": "turn.step", "id": task_id, "parent_id": parent_id}
    properties = {"correlation_id": task_id, "delivery_tag": str(uuid.uuid4())}
    return {"body": "W10=", "headers": headers, "properties": properties}


def queue(store: Store, *messages: dict[str, object]) -> None:
    """Push messages on the turn queue as kombu publishes (on the left)."""
    for m in messages:
        store.redis.lpush(store.keys.broker_queue(Family.TURN.value), json.dumps(m))


def take(store: Store, m: dict[str, object]) -> str:
    """Record ``m`` as taken by a worker and not acknowledged; returns its delivery tag."""
    tag = str(m["properties"]["delivery_tag"])  # type: ignore[index]
    store.redis.hset(store.keys.broker_unacked, tag, json.dumps([m, "", "turn"]))
    return tag


def run(store: Store, recorder: RecordingDispatcher, **kw: int) -> sweeper.SweepReport:
    return sweeper.sweep(store, recorder, stuck_seconds=STUCK, max_resumes=2, **kw)


def test_a_step_whose_message_is_queued_waits_however_old(
    store: Store, recorder: RecordingDispatcher, stale: str
) -> None:
    queue(store, message(step_message_id(stale, 0)), message("other"))
    for _ in range(4):  # more passes than resumes allowed
        report = run(store, recorder)
        assert report.waiting == [stale] and not report.turns
    assert recorder.sent == []
    assert store.redis.hget(store.keys.turn(stale), "resumes") is None
    assert run(store, recorder).to_wire()["waiting"] == 1


def test_only_the_current_steps_own_id_counts_not_another_step_nor_a_child_naming_it(
    store: Store, recorder: RecordingDispatcher, stale: str
) -> None:
    # Given messages of another step, and one sent by the step (its parent) but not of it
    queue(
        store,
        message(step_message_id(stale, 1)),
        message("child", parent_id=step_message_id(stale, 0)),
    )
    # Then the step is lost
    assert run(store, recorder).turns["resumed"] == [stale]


def test_a_suspect_beyond_the_scans_bound_waits_for_a_later_pass(
    store: Store, recorder: RecordingDispatcher, stale: str
) -> None:
    # Given the step's message newest in a queue longer than the scan reads (oldest first)
    queue(store, *[message(f"m{i}") for i in range(5)], message(step_message_id(stale, 0)))
    # Then a pass cannot rule on it and leaves it, and one reading the whole queue finds it
    assert run(store, recorder, scan_limit=3).waiting == [stale]
    assert run(store, recorder, scan_limit=6).waiting == [stale]
    # And a step found nowhere in a queue read to its end is lost
    store.redis.delete(store.keys.broker_queue(Family.TURN.value))
    queue(store, *[message(f"m{i}") for i in range(5)])
    assert run(store, recorder, scan_limit=5).turns["resumed"] == [stale]


def test_a_step_taken_and_not_begun_waits_a_grace_then_is_lost(
    store: Store, recorder: RecordingDispatcher, stale: str
) -> None:
    # Given the step's message taken by a worker that has not begun it
    tag = take(store, message(step_message_id(stale, 0)))
    # Then passes note the delivery and wait
    assert run(store, recorder).waiting == [stale]
    held = store.redis.hmget(store.keys.turn(stale), "heldTag", "heldMs")
    assert held[0] == tag
    assert run(store, recorder).waiting == [stale]
    assert store.redis.hget(store.keys.turn(stale), "heldMs") == held[1]
    # And once the same delivery was held FLEET_TURN_STUCK_SECONDS (first seen that long ago)
    # its worker is taken for dead: the step is resumed and the note dropped
    store.redis.hset(store.keys.turn(stale), "heldMs", int(held[1]) - int(STUCK * 1000))
    assert run(store, recorder).turns["resumed"] == [stale]
    assert store.redis.hmget(store.keys.turn(stale), "heldTag", "heldMs") == [None, None]


def test_another_delivery_of_the_step_starts_the_grace_again(
    store: Store, recorder: RecordingDispatcher, stale: str
) -> None:
    first = take(store, message(step_message_id(stale, 0)))
    assert run(store, recorder).waiting == [stale]
    store.redis.hset(store.keys.turn(stale), "heldMs", redis_ms(store) - 10_000)
    # When that delivery is handed back and taken again under another tag
    store.redis.hdel(store.keys.broker_unacked, first)
    second = take(store, message(step_message_id(stale, 0)))
    # Then it waits again, its grace counted from now
    assert run(store, recorder).waiting == [stale]
    assert store.redis.hget(store.keys.turn(stale), "heldTag") == second
    # And a copy in the queue outweighs a held one
    store.redis.hset(store.keys.turn(stale), "heldMs", redis_ms(store) - 10_000)
    queue(store, message(step_message_id(stale, 0)))
    assert run(store, recorder).waiting == [stale]
    assert store.redis.hget(store.keys.turn(stale), "heldTag") is None


def test_a_held_step_that_began_and_lost_its_lease_is_lost_at_once(
    store: Store, recorder: RecordingDispatcher, stale: str
) -> None:
    # Given the step began (its copy's token on the turn, its lease lapsed since) and its
    # message is still held unacknowledged: its worker died mid-step
    store.redis.hset(store.keys.turn(stale), "stepToken", "t1")
    take(store, message(step_message_id(stale, 0)))
    # Then the first pass resumes it, without waiting out the grace
    assert run(store, recorder).turns["resumed"] == [stale]
