"""Reminders: stored rows, claimed exactly once, deleted in one step."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from orchestrator import reminders, sessions
from orchestrator.activity import census
from orchestrator.store import Store
from tests.helpers import RecordingDispatcher

ISOLATED = "no-poller:"


@pytest.fixture
def store(redis_url: str, key_prefix: str) -> Iterator[Store]:
    """A store under a prefix no worker polls: the run's reminder worker (started by other
    tests) would otherwise claim these due reminders first."""
    isolated = Store(redis_url, key_prefix + ISOLATED)
    yield isolated
    isolated.close()


def claim_all(store: Store, limit: int = 100) -> list[reminders.DueReminder]:
    out: list[reminders.DueReminder] = []
    while batch := reminders.claim_due(store, limit):
        out.extend(batch)
    return out


def test_a_reminder_is_stored_armed_and_scheduled(store: Store, cwd: str) -> None:
    sid = sessions.create_session(store, cwd).session_id

    rid = reminders.create_reminder(store, sid, 60, "say hi")

    h = store.redis.hgetall(store.keys.reminder(rid))
    assert (h["sessionId"], h["prompt"], h["state"]) == (sid, "say hi", "armed")
    assert store.redis.zscore(store.keys.reminders_due, rid) is not None
    assert store.redis.smembers(store.keys.live_reminders(sid)) == {rid}


def test_a_reminder_is_not_claimed_before_it_is_due(store: Store, cwd: str) -> None:
    sid = sessions.create_session(store, cwd).session_id
    rid = reminders.create_reminder(store, sid, 60, "say hi")

    claimed = {r.reminder_id for r in claim_all(store)}

    assert rid not in claimed
    assert store.redis.hget(store.keys.reminder(rid), "state") == "armed"


def test_a_claimed_reminder_is_fired_and_no_longer_live(store: Store, cwd: str) -> None:
    # Given a due reminder
    sid = sessions.create_session(store, cwd).session_id
    rid = reminders.create_reminder(store, sid, 0, "say hi")
    # When it is claimed
    mine = [r for r in claim_all(store) if r.session_id == sid]
    # Then it comes with its session and prompt, is marked fired and stops counting as live
    assert mine == [reminders.DueReminder(rid, sid, "say hi")]
    assert store.redis.hget(store.keys.reminder(rid), "state") == "fired"
    assert census(store, sid) == []
    assert rid not in {r.reminder_id for r in claim_all(store)}


def test_two_concurrent_claimers_claim_each_due_reminder_exactly_once(
    store: Store, redis_url: str, key_prefix: str, cwd: str
) -> None:
    # Given forty due reminders
    sid = sessions.create_session(store, cwd).session_id
    made = {reminders.create_reminder(store, sid, 0, f"say {i}") for i in range(40)}
    # When two pollers (each with its own connection) claim in small batches at the same time
    pollers = [Store(redis_url, key_prefix + ISOLATED) for _ in range(2)]
    claimed: list[list[str]] = [[], []]
    start = threading.Barrier(2)

    def poll(n: int) -> None:
        start.wait()
        while batch := reminders.claim_due(pollers[n], limit=3):
            claimed[n].extend(r.reminder_id for r in batch)

    threads = [threading.Thread(target=poll, args=(n,)) for n in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    for p in pollers:
        p.close()
    # Then every reminder was claimed once, by one poller only
    ours = [rid for rids in claimed for rid in rids if rid in made]
    assert sorted(ours) == sorted(made)
    assert len(ours) == len(set(ours))


def test_stop_reminders_deletes_all_of_a_session_in_one_step_and_they_never_fire(
    store: Store, cwd: str
) -> None:
    # Given three reminders of a session, already due, and one of another session
    sid = sessions.create_session(store, cwd).session_id
    other = sessions.create_session(store, cwd).session_id
    rids = {reminders.create_reminder(store, sid, 0, f"say {i}") for i in range(3)}
    kept = reminders.create_reminder(store, other, 60, "say other")
    # When the session's reminders are stopped
    assert reminders.stop_reminders(store, sid) == 3
    # Then they are deleted and unscheduled, and no claim ever returns them
    assert store.redis.scard(store.keys.live_reminders(sid)) == 0
    for rid in rids:
        assert store.redis.hget(store.keys.reminder(rid), "state") == "deleted"
        assert store.redis.zscore(store.keys.reminders_due, rid) is None
    assert rids.isdisjoint(r.reminder_id for r in claim_all(store))
    assert census(store, sid) == []
    # And the other session's reminder is untouched; a second stop deletes nothing
    assert store.redis.hget(store.keys.reminder(kept), "state") == "armed"
    assert reminders.stop_reminders(store, sid) == 0


def test_poll_once_sends_one_fire_task_per_due_reminder(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    sid = sessions.create_session(store, cwd).session_id
    rids = {reminders.create_reminder(store, sid, 0, f"say {i}") for i in range(3)}

    fired = reminders.poll_once(store, recorder)

    assert fired == len(recorder.sent) >= 3
    mine = [m for m in recorder.sent if m[1][0] == sid]
    assert sorted(mine) == sorted(
        (
            "reminder.fire",
            [sid, rid, store.redis.hget(store.keys.reminder(rid), "prompt")],
            "reminder",
        )
        for rid in rids
    )
    # and, claimed once, they are never fired again
    assert rids.isdisjoint(r.reminder_id for r in claim_all(store))
