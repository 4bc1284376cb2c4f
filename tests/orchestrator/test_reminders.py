"""Reminders: stored rows, claimed atomically, turned into exactly one turn each, deleted
by name in one step."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from orchestrator.archiving import archive
from orchestrator.census.activity import census
from orchestrator.errors import SessionArchived
from orchestrator.reminder import poller, reminders
from orchestrator.session import sessions
from orchestrator.storage.store import Store
from orchestrator.turn import turns
from tests.helpers import RecordingDispatcher, wait_for

ISOLATED = "no-poller:"


@pytest.fixture
def store(redis_url: str, key_prefix: str) -> Iterator[Store]:
    """A store under a prefix no worker polls: the run's reminder worker (started by other
    tests) would otherwise claim these due reminders first."""
    isolated = Store(redis_url, key_prefix + ISOLATED)
    yield isolated
    isolated.close()


def claim_all(store: Store, limit: int = 100, refire: float = 30.0) -> list[reminders.DueReminder]:
    """Claim until nothing is due (each claimed one is re-claimable ``refire`` s later)."""
    out: list[reminders.DueReminder] = []
    seen: set[str] = set()
    while batch := [
        r for r in reminders.claim_due(store, limit, refire) if r.reminder_id not in seen
    ]:
        out.extend(batch)
        seen.update(r.reminder_id for r in batch)
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


def test_a_claimed_reminder_is_firing_and_still_live_until_its_turn_exists(
    store: Store, cwd: str
) -> None:
    # Given a due reminder
    sid = sessions.create_session(store, cwd).session_id
    rid = reminders.create_reminder(store, sid, 0, "say hi")
    # When it is claimed
    mine = [r for r in claim_all(store) if r.session_id == sid]
    # Then it comes with its session and prompt, is firing with a re-claim deadline, and still
    # counts as live work (a stop must still see it); it is not claimed again before then
    assert mine == [reminders.DueReminder(rid, sid, "say hi")]
    assert store.redis.hget(store.keys.reminder(rid), "state") == "firing"
    assert store.redis.zscore(store.keys.reminders_firing, rid) is not None
    assert [(i.family.value, i.id) for i in census(store, sid)] == [("reminder", rid)]
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


def test_stop_reminders_deletes_exactly_the_named_ones_in_one_step_and_they_never_fire(
    store: Store, cwd: str
) -> None:
    # Given three reminders of a session, already due (one of them claimed: firing), a fourth
    # the stop does not name (made after its census), and one of another session
    sid = sessions.create_session(store, cwd).session_id
    other = sessions.create_session(store, cwd).session_id
    rids = {reminders.create_reminder(store, sid, 0, f"say {i}") for i in range(3)}
    claim_all(store)
    newer = reminders.create_reminder(store, sid, 60, "say newer")
    kept = reminders.create_reminder(store, other, 60, "say other")
    # When the three are stopped (with the other session's one named under this session)
    assert reminders.stop_reminders(store, sid, [*rids, kept]) == 3
    # Then they are deleted and unscheduled, and no claim ever returns them
    assert store.redis.smembers(store.keys.live_reminders(sid)) == {newer}
    for rid in rids:
        assert store.redis.hget(store.keys.reminder(rid), "state") == "deleted"
        assert store.redis.zscore(store.keys.reminders_due, rid) is None
        assert store.redis.zscore(store.keys.reminders_firing, rid) is None
    assert rids.isdisjoint(r.reminder_id for r in claim_all(store, refire=0))
    # And the unnamed ones are untouched; a second stop deletes nothing
    assert store.redis.hget(store.keys.reminder(newer), "state") == "armed"
    assert store.redis.hget(store.keys.reminder(kept), "state") == "armed"
    assert reminders.stop_reminders(store, sid, list(rids)) == 0


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


# ------------------------------------------------------------- exactly one turn per reminder


def fire(store: Store, recorder: RecordingDispatcher, rem: reminders.DueReminder) -> str:
    """What ``reminder.fire`` does with a claimed reminder."""
    return turns.start_turn(
        store, recorder, rem.session_id, rem.prompt, source="reminder", reminder_id=rem.reminder_id
    )


def claimed(store: Store, rid: str, refire: float = 30.0) -> reminders.DueReminder:
    [rem] = [r for r in claim_all(store, refire=refire) if r.reminder_id == rid]
    return rem


def test_a_fired_reminder_becomes_one_turn_and_a_repeat_fire_creates_nothing(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    # Given a claimed reminder
    sid = sessions.create_session(store, cwd).session_id
    rid = reminders.create_reminder(store, sid, 0, "say hi")
    rem = claimed(store, rid)
    # When it is fired twice (a redelivered message, or a re-claim after its deadline)
    first = fire(store, recorder, rem)
    again = fire(store, recorder, rem)
    # Then both name the one turn, which is the reminder's and the session's only one
    assert first and again == first
    h = store.redis.hgetall(store.keys.reminder(rid))
    assert (h["state"], h["turnId"]) == ("fired", first)
    turn = turns.get_turn(store, first)
    assert turn is not None and turn.source == "reminder"
    assert store.redis.zrange(store.keys.live_turns(sid), 0, -1) == [first]
    # And it is spent: no longer live, scheduled or firing
    assert [(i.family.value, i.id) for i in census(store, sid)] == [("turn", first)]
    assert store.redis.zscore(store.keys.reminders_firing, rid) is None
    # And the repeat re-sent the first step (the step drops the copy it does not need)
    steps = [m for m in recorder.sent if m[0] == "turn.step" and m[1][1] == first]
    assert steps == [("turn.step", [sid, first, 0], "turn")] * 2


def test_a_fire_after_a_stop_deleted_the_reminder_creates_nothing(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    # Given a claimed (firing) reminder that a stop then deletes
    sid = sessions.create_session(store, cwd).session_id
    rid = reminders.create_reminder(store, sid, 0, "say hi")
    rem = claimed(store, rid)
    assert reminders.stop_reminders(store, sid, [rid]) == 1
    # When its fire arrives
    assert fire(store, recorder, rem) == ""
    # Then no turn exists and nothing was sent; the reminder stays deleted
    assert store.redis.zcard(store.keys.live_turns(sid)) == 0
    assert store.redis.llen(store.keys.history(sid)) == 0
    assert recorder.sent == []
    assert store.redis.hget(store.keys.reminder(rid), "state") == "deleted"


def test_a_fire_under_an_archived_lineage_is_refused_and_stores_nothing(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    # Given a child session whose reminder was claimed, and whose parent is then archived
    # (its stop never arrived)
    parent = sessions.create_session(store, cwd).session_id
    child = sessions.create_session(store, cwd, parent_id=parent).session_id
    rid = reminders.create_reminder(store, child, 0, "say hi")
    rem = claimed(store, rid)
    archive.archive(store, recorder, parent, stop_activity=True)
    recorder.sent.clear()
    before = store.redis.hget(store.keys.session(child), "updatedAt")
    # When its fire arrives
    with pytest.raises(SessionArchived):
        fire(store, recorder, rem)
    # Then nothing is stored or sent: the reminder is refused and no longer live
    assert store.redis.zcard(store.keys.live_turns(child)) == 0
    assert store.redis.llen(store.keys.history(child)) == 0
    assert store.redis.hget(store.keys.session(child), "updatedAt") == before
    assert recorder.sent == []
    assert store.redis.hget(store.keys.reminder(rid), "state") == "refused"
    assert census(store, parent) == []
    # And a repeat of it creates nothing either
    assert fire(store, recorder, rem) == ""


def test_a_claimed_reminder_whose_turn_never_came_is_claimed_again_after_its_deadline(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    # Given a reminder claimed with a short deadline, whose fire was lost
    sid = sessions.create_session(store, cwd).session_id
    rid = reminders.create_reminder(store, sid, 0, "say hi")
    claimed(store, rid, refire=0.2)
    # When the poller claims again once the deadline has passed
    again = wait_for(
        lambda: [r for r in reminders.claim_due(store, 100, 0.2) if r.reminder_id == rid],
        10,
        message="the re-claim",
    )
    # Then it is the same reminder, claimed a second time and still live
    assert again == [reminders.DueReminder(rid, sid, "say hi")]
    assert store.redis.hget(store.keys.reminder(rid), "claims") == "2"
    assert [i.id for i in census(store, sid)] == [rid]
    # And once a fire makes its turn, it is never claimed again
    tid = fire(store, recorder, again[0])
    assert store.redis.hget(store.keys.reminder(rid), "turnId") == tid
    assert store.redis.zscore(store.keys.reminders_firing, rid) is None
    assert store.redis.zscore(store.keys.reminders_due, rid) is None


def test_a_fired_reminder_is_not_claimed_again_even_past_its_deadline(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    # Given a reminder fired into its turn, claimed with a deadline already past
    sid = sessions.create_session(store, cwd).session_id
    rid = reminders.create_reminder(store, sid, 0, "say hi")
    fire(store, recorder, claimed(store, rid, refire=0))
    # When the poller claims, then its claim still lists nothing of it
    assert rid not in {r.reminder_id for r in claim_all(store, refire=0)}


# ------------------------------------------------------------------------------ the poller


def test_the_poller_asleep_for_a_later_reminder_wakes_for_one_armed_for_sooner(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    sid = sessions.create_session(store, cwd).session_id
    # Given a poller asleep until a reminder due in a minute (at most its 30 s wait)
    later = reminders.create_reminder(store, sid, 60, "say later")
    stopping = threading.Event()
    thread = threading.Thread(target=poller.run, args=(store, recorder, stopping), daemon=True)
    thread.start()
    try:
        wake = store.keys.reminders_wake
        wait_for(lambda: store.redis.pubsub_numsub(wake)[0][1] >= 1, 10, message="subscribed")
        # When a reminder is armed for 0.3 s from now
        soon = reminders.create_reminder(store, sid, 0.3, "say soon")

        # Then its fire is sent within a second or so of its due time, the later one's not
        def sent() -> set[str]:
            return {m[1][1] for m in recorder.sent if m[0] == "reminder.fire"}

        wait_for(lambda: soon in sent(), 3, message="the sooner reminder's fire")
        assert later not in sent()
    finally:
        stopping.set()
        thread.join(5)
        reminders.stop_reminders(store, sid, [later])
    assert not thread.is_alive()


class _Refusing:
    """A dispatcher whose every publish fails (the broker is away)."""

    def send(self, task: str, args: list[object], queue: str) -> None:
        raise ConnectionError("the broker is away")


def test_a_pass_whose_fire_was_not_sent_wakes_again_by_its_deadline(
    redis_url: str, key_prefix: str, cwd: str
) -> None:
    from orchestrator.settings import FleetSettings

    settings = FleetSettings(reminder_refire_seconds=5)
    isolated = Store(redis_url, key_prefix + ISOLATED, settings=settings)
    try:
        # Given one reminder falling due, and no later one
        sid = sessions.create_session(isolated, cwd).session_id
        rid = reminders.create_reminder(isolated, sid, 0, "say hi")

        # When a pass claims it and its fire cannot be sent
        claimed_now, wait = reminders.poll(isolated, _Refusing())

        # Then the pass asks to be woken by the claim's deadline, to send it again
        assert claimed_now == 1
        assert wait is not None and 4.0 <= wait <= 5.0, wait
        assert isolated.redis.zscore(isolated.keys.reminders_firing, rid) is not None
    finally:
        reminders.stop_reminders(isolated, sid, [rid])
        isolated.close()
