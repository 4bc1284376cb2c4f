"""The activity census: what is live, read from stored state only."""

from __future__ import annotations

import logging

import pytest

from orchestrator.archiving import archive, deletion
from orchestrator.census import activity
from orchestrator.census.activity import ActivityItem, census, merge_items, shorten
from orchestrator.errors import SessionNotFound
from orchestrator.families import Family
from orchestrator.job import jobs
from orchestrator.reminder import reminders
from orchestrator.session import sessions
from orchestrator.storage.store import Store
from orchestrator.turn import turns
from tests.helpers import RecordingDispatcher
from tests.orchestrator.support import (
    Delivering,
    begin_step,
    chain,
    claim_job,
    stop_jobs_elsewhere,
)


def test_a_new_session_has_no_live_work(store: Store, cwd: str) -> None:
    s = sessions.create_session(store, cwd)
    assert census(store, s.session_id) == []


def test_the_census_of_an_unknown_or_deleted_session_raises_session_not_found(
    store: Store, cwd: str
) -> None:
    s = sessions.create_session(store, cwd)
    sessions.delete_session(store, s.session_id)
    for sid in (s.session_id, "sess_" + "0" * 24, "../x"):
        with pytest.raises(SessionNotFound):
            census(store, sid)


def test_a_starting_job_with_its_start_lease_is_live(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    s = sessions.create_session(store, cwd)
    jid = jobs.create_job(store, recorder, s.session_id, 30, "sleep 30s")

    [item] = census(store, s.session_id)

    assert item == ActivityItem(Family.JOB, jid, "job sleep 30s (starting)", s.session_id, None)


def test_a_claimed_job_is_live_and_names_its_host(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    s = sessions.create_session(store, cwd)
    jid = jobs.create_job(store, recorder, s.session_id, 30, "sleep 30s")
    claim_job(store, jid, "hostA")

    [item] = census(store, s.session_id)

    assert (item.family, item.id, item.host) == (Family.JOB, jid, "hostA")
    assert item.to_wire()["host"] == "hostA"


@pytest.mark.parametrize("claimed", [False, True], ids=["starting", "running"])
def test_a_job_whose_lease_expired_is_not_live_and_is_marked_lost(
    store: Store,
    recorder: RecordingDispatcher,
    cwd: str,
    caplog: pytest.LogCaptureFixture,
    claimed: bool,
) -> None:
    # Given a job (starting, or taken by a worker) whose lease ran out
    s = sessions.create_session(store, cwd)
    jid = jobs.create_job(store, recorder, s.session_id, 30, "sleep 30s")
    if claimed:
        claim_job(store, jid, "hostA")
    store.redis.delete(store.keys.job_lease(jid))
    # When the census is taken
    with caplog.at_level(logging.WARNING, logger="orchestrator"):
        items = census(store, s.session_id)
    # Then the job is not live; it is marked lost and leaves the live set
    assert items == []
    assert store.redis.hget(store.keys.job(jid), "state") == jobs.JobState.LOST.value
    assert not store.redis.sismember(store.keys.live_jobs(s.session_id), jid)
    [record] = [r for r in caplog.records if jid in r.getMessage() and "lost" in r.getMessage()]
    # And the log line names the job's session, so an operator can find whose job it was
    assert (record.session_id, record.family) == (s.session_id, "job")  # type: ignore[attr-defined]


def test_a_session_with_only_a_reminder_counts_as_active(store: Store, cwd: str) -> None:
    # Given a session with no turn at all, only an armed reminder
    s = sessions.create_session(store, cwd)
    rid = reminders.create_reminder(store, s.session_id, 60, "say hi")
    due = store.redis.hget(store.keys.reminder(rid), "dueAt")
    # Then the reminder is its live work
    [item] = census(store, s.session_id)
    assert (item.family, item.id, item.session_id) == (Family.REMINDER, rid, s.session_id)
    assert item.label == f'reminder "say hi" due {due}'


def test_a_grandchild_with_a_live_turn_appears_as_a_subagent_item(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    # Given root -> child -> grandchild, only the grandchild with a running turn
    root, child, grandchild = chain(store, 2, cwd)
    tid = turns.start_turn(store, recorder, grandchild.session_id, "think 5", source="subagent")
    g = grandchild.session_id
    # Then the root and the child each see one subagent item naming the grandchild
    for ancestor in (root, child):
        [item] = census(store, ancestor.session_id)
        assert (item.family, item.id, item.session_id) == (Family.SUBAGENT, g, g)
        assert item.label == f"subagent {g} (1 turn)"
    # And the grandchild sees its own turn
    [own] = census(store, g)
    assert (own.family, own.id) == (Family.TURN, tid)


def test_a_subagent_item_summarises_its_live_work(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    root, child = chain(store, 1, cwd)
    c = child.session_id
    turns.start_turn(store, recorder, c, "think 5")
    turns.start_turn(store, recorder, c, "say next")
    reminders.create_reminder(store, c, 60, "later")

    [item] = census(store, root.session_id)

    assert item.label == f"subagent {c} (2 turns, 1 reminder)"


def test_finished_turns_and_ended_jobs_are_not_live(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    s = sessions.create_session(store, cwd)
    tid = turns.start_turn(store, recorder, s.session_id, "say hi")
    turns.finish(store, recorder, tid, turns.TurnState.COMPLETED)
    jid = jobs.create_job(store, recorder, s.session_id, 1, "sleep 1s")
    stop_jobs_elsewhere(store, recorder, s.session_id, [jid])

    assert census(store, s.session_id) == []


def test_a_cancelling_turn_is_live_while_its_step_holds_the_lease(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    # Given a turn stopped while a step is in flight
    s = sessions.create_session(store, cwd)
    tid = turns.start_turn(store, recorder, s.session_id, "think 5")
    assert begin_step(store, tid)
    assert turns.cancel_turns(store, recorder, s.session_id, [tid]) == {tid: "cancelling"}
    # Then it stays live while the lease lasts
    [item] = census(store, s.session_id)
    assert (item.id, "cancelling" in item.label) == (tid, True)
    # When the step's worker vanishes (the lease lapses)
    store.redis.delete(store.keys.step_lease(tid))
    # Then a census that may act (it has a dispatcher) settles it as cancelled
    assert census(store, s.session_id, recorder) == []
    t = turns.get_turn(store, tid)
    assert t is not None and t.state == turns.TurnState.CANCELLED


def test_settling_a_stale_cancelling_turn_does_not_strand_the_turn_queued_behind_it(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    # Given a running turn with a step in flight and a second prompt queued behind it
    s = sessions.create_session(store, cwd)
    first = turns.start_turn(store, recorder, s.session_id, "think 5")
    second = turns.start_turn(store, recorder, s.session_id, "say hi")
    assert begin_step(store, first)
    # And the first turn cancelled while its step is in flight, then its worker vanished
    assert turns.cancel_turns(store, recorder, s.session_id, [first]) == {first: "cancelling"}
    store.redis.delete(store.keys.step_lease(first))
    # When a census with a dispatcher (the API's, the archive's) settles the first turn
    census(store, s.session_id, recorder)
    # Then the second turn, now the session's running turn, has had its first step sent
    t = turns.get_turn(store, second)
    assert t is not None and t.state == turns.TurnState.RUNNING
    assert ("turn.step", [s.session_id, second, 0], "turn") in recorder.sent


def test_a_census_without_a_dispatcher_leaves_a_stale_turn_for_one_that_can_act(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    # Given a cancelling turn whose worker vanished, with a prompt queued behind it
    s = sessions.create_session(store, cwd)
    first = turns.start_turn(store, recorder, s.session_id, "think 5")
    second = turns.start_turn(store, recorder, s.session_id, "say hi")
    assert begin_step(store, first)
    turns.cancel_turns(store, recorder, s.session_id, [first])
    store.redis.delete(store.keys.step_lease(first))
    # When a read-only census runs
    items = census(store, s.session_id)
    # Then the stale turn is not reported live and nothing was promoted without a dispatcher
    assert [i.id for i in items] == [second]
    t = turns.get_turn(store, second)
    assert t is not None and t.state == turns.TurnState.QUEUED


def test_own_items_leave_out_descendants(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    root, child = chain(store, 1, cwd)
    turns.start_turn(store, recorder, child.session_id, "think 5")
    assert activity.own_items(store, root.session_id) == []
    assert len(census(store, root.session_id)) == 1


def test_labels_show_the_first_line_of_a_prompt_cut_with_an_ellipsis() -> None:
    assert shorten("  say hi\nsecond line") == "say hi"
    assert shorten("") == ""
    assert shorten("\n\n") == ""
    long = "x" * 100
    assert shorten(long) == "x" * 59 + "…"
    assert len(shorten(long)) == 60
    assert shorten("y" * 60) == "y" * 60


@pytest.mark.parametrize("how", ["archive", "delete"])
def test_a_stopped_subagent_item_names_everything_stopped_in_it(
    store: Store, recorder: RecordingDispatcher, cwd: str, how: str
) -> None:
    # Given a parent whose subagent has a running turn (stopped by the archive's own script),
    # a job and a reminder (stopped by the messages sent after it)
    root, child = chain(store, 1, cwd)
    c = child.session_id
    turns.start_turn(store, recorder, c, "think 30")
    jobs.create_job(store, recorder, c, 30, "sleep 30s")
    reminders.create_reminder(store, c, 600, "later")

    # When the parent is archived (or deleted) with its work stopped
    if how == "archive":
        stopped = archive.archive(store, recorder, root.session_id, stop_activity=True).stopped
    else:
        result = deletion.delete(store, Delivering(store), root.session_id, stop_activity=True)
        assert result.deleted and result.deleted_descendants == [c]
        stopped = result.stopped

    # Then the subagent item's label counts all of it, not only the turn the script stopped
    [item] = stopped
    assert (item.family, item.id) == (Family.SUBAGENT, c)
    assert item.label == f"subagent {c} (1 turn, 1 job, 1 reminder)"
    assert sorted(p.family for p in item.parts) == ["job", "reminder", "turn"]
    assert item.to_wire() == {
        "family": "subagent",
        "id": c,
        "label": item.label,
        "sessionId": c,
    }


def test_merging_adds_the_later_parts_to_the_subagent_label() -> None:
    turn = ActivityItem(Family.TURN, "turn_1", "turn", "sess_c")
    job = ActivityItem(Family.JOB, "job_1", "job", "sess_c")
    first = [ActivityItem(Family.SUBAGENT, "sess_c", "x", "sess_c", parts=(turn,))]
    then = [ActivityItem(Family.SUBAGENT, "sess_c", "y", "sess_c", parts=(turn, job))]
    [merged] = merge_items(first, then)
    assert merged.label == "subagent sess_c (1 turn, 1 job)"
    assert merged.parts == (turn, job)
    # nothing added: the first label stays
    assert merge_items(first, first)[0].label == "x"
