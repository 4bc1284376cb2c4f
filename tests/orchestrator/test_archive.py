"""Archive and unarchive: refusal with live work, stop fan-out, subtrees, restoration."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from orchestrator.archiving import archive
from orchestrator.census.activity import census
from orchestrator.errors import (
    AncestorArchived,
    InvalidParams,
    SessionActive,
    SessionArchived,
    SessionNotFound,
)
from orchestrator.families import Family
from orchestrator.job import jobs
from orchestrator.reminder import reminders
from orchestrator.session import gate, sessions
from orchestrator.session.gate import StepRefused
from orchestrator.session.sessions import Session
from orchestrator.storage.store import Store
from orchestrator.turn import turns
from tests.helpers import RecordingDispatcher
from tests.orchestrator.support import (
    FailingDispatcher,
    begin_step,
    chain,
    claim_job,
    deliver,
    model_requests,
    stops,
)

UNKNOWN = "sess_" + "0" * 24


def read(store: Store, session: Session | str) -> Session:
    sid = session if isinstance(session, str) else session.session_id
    return sessions.get_session(store, sid)


def listed(store: Store, cwd: str, flt: str) -> set[str]:
    return {s.session_id for s in sessions.list_sessions(store, cwd=cwd, archived=flt).sessions}


class Busy:
    """A session with one live item of every family: a running turn, a starting job, an armed
    reminder and a subagent with a running turn of its own."""

    def __init__(self, store: Store, recorder: RecordingDispatcher, cwd: str) -> None:
        self.session = sessions.create_session(store, cwd)
        self.sid = self.session.session_id
        self.turn = turns.start_turn(store, recorder, self.sid, "think 5")
        self.job = jobs.create_job(store, recorder, self.sid, 30, "sleep 30s")
        self.reminder = reminders.create_reminder(store, self.sid, 60, "say hi")
        self.child = sessions.create_session(store, cwd, parent_id=self.sid).session_id
        self.child_turn = turns.start_turn(
            store, recorder, self.child, "think 5", source="subagent"
        )


# --------------------------------------------------------------------------- not found


@pytest.mark.parametrize("bad_id", [UNKNOWN, "../x", "a*b", "x" * 200])
def test_archiving_or_unarchiving_an_unknown_session_raises_session_not_found(
    store: Store, recorder: RecordingDispatcher, bad_id: str
) -> None:
    with pytest.raises(SessionNotFound):
        archive.archive(store, recorder, bad_id)
    with pytest.raises(SessionNotFound):
        archive.unarchive(store, bad_id)


def test_archiving_a_non_string_id_raises_invalid_params(
    store: Store, recorder: RecordingDispatcher
) -> None:
    with pytest.raises(InvalidParams):
        archive.archive(store, recorder, None)  # type: ignore[arg-type]


def test_a_deleted_session_can_be_neither_archived_nor_unarchived(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    # Given an archived session and a plain one, both deleted
    archived = sessions.create_session(store, cwd)
    plain = sessions.create_session(store, cwd)
    archive.archive(store, recorder, archived.session_id)
    sessions.delete_session(store, archived.session_id)
    sessions.delete_session(store, plain.session_id)
    # Then archive and unarchive both say it is not found, and nothing is restored
    for s in (archived, plain):
        with pytest.raises(SessionNotFound):
            archive.archive(store, recorder, s.session_id, stop_activity=True)
        with pytest.raises(SessionNotFound):
            archive.unarchive(store, s.session_id)
    assert listed(store, cwd, "include") == set()
    assert recorder.sent == []


# --------------------------------------------------------------------------- quiet sessions


def test_a_quiet_session_archives(store: Store, recorder: RecordingDispatcher, cwd: str) -> None:
    s = sessions.create_session(store, cwd)

    result = archive.archive(store, recorder, s.session_id)

    assert result.outcome == "archived"
    assert result.archived_count == 1
    assert result.stopped == []
    stored = read(store, s)
    assert stored.archived is True
    assert stored.archived_at is not None
    assert store.redis.sismember(store.keys.archived, s.session_id)
    assert recorder.sent == []


def test_archiving_an_archived_session_is_already_archived_and_changes_nothing(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    # Given an archived session
    s = sessions.create_session(store, cwd)
    archive.archive(store, recorder, s.session_id)
    before = store.redis.hgetall(store.keys.session(s.session_id))
    # When it is archived again, with and without stopActivity
    again = archive.archive(store, recorder, s.session_id)
    with_stop = archive.archive(store, recorder, s.session_id, stop_activity=True)
    # Then both succeed as already_archived and the stored session (archivedAt too) is unchanged
    assert again.outcome == with_stop.outcome == "already_archived"
    assert again.archived_count == 0
    assert store.redis.hgetall(store.keys.session(s.session_id)) == before
    assert recorder.sent == []


def test_archive_result_wire_shape(store: Store, recorder: RecordingDispatcher, cwd: str) -> None:
    s = sessions.create_session(store, cwd)
    wire = archive.archive(store, recorder, s.session_id).to_wire()
    assert wire == {
        "sessionId": s.session_id,
        "outcome": "archived",
        "archivedCount": 1,
        "stopped": [],
        "stopDispatch": {"sent": {}, "failed": []},
    }


# --------------------------------------------------------------------------- refusal


def refused(store: Store, recorder: RecordingDispatcher, sid: str) -> SessionActive:
    with pytest.raises(SessionActive) as raised:
        archive.archive(store, recorder, sid)
    assert read(store, sid).archived is False, "a refused archive must write nothing"
    return raised.value


def test_a_live_turn_refuses_archive_and_is_named(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    s = sessions.create_session(store, cwd)
    tid = turns.start_turn(store, recorder, s.session_id, "think 5")

    error = refused(store, recorder, s.session_id)

    [item] = error.items
    assert (item.family, item.id, item.session_id) == (Family.TURN, tid, s.session_id)
    assert "think 5" in item.label and "running" in item.label
    assert error.data["activity"] == [item.to_wire()]


def test_a_live_job_refuses_archive_and_is_named(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    s = sessions.create_session(store, cwd)
    jid = jobs.create_job(store, recorder, s.session_id, 30, "sleep 30s")

    [item] = refused(store, recorder, s.session_id).items

    assert (item.family, item.id) == (Family.JOB, jid)
    assert "sleep 30s" in item.label


def test_an_armed_reminder_refuses_archive_and_is_named(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    s = sessions.create_session(store, cwd)
    rid = reminders.create_reminder(store, s.session_id, 60, "say hi")

    [item] = refused(store, recorder, s.session_id).items

    assert (item.family, item.id) == (Family.REMINDER, rid)
    assert "say hi" in item.label


def test_a_subagent_with_live_work_refuses_archive_and_is_named(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    root, child = chain(store, 1, cwd)
    turns.start_turn(store, recorder, child.session_id, "think 5", source="subagent")

    [item] = refused(store, recorder, root.session_id).items

    assert (item.family, item.id) == (Family.SUBAGENT, child.session_id)
    assert child.session_id in item.label
    assert read(store, child).archived is False


def test_live_work_of_every_family_is_named_exactly(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    busy = Busy(store, recorder, cwd)

    error = refused(store, recorder, busy.sid)

    assert sorted((i.family.value, i.id) for i in error.items) == sorted(
        [
            ("turn", busy.turn),
            ("job", busy.job),
            ("reminder", busy.reminder),
            ("subagent", busy.child),
        ]
    )
    assert all(i.label for i in error.items)
    assert "job" in error.message and "turn" in error.message


# --------------------------------------------------------------------------- stopActivity


def test_stop_activity_archives_and_sends_one_stop_per_family(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    # Given a session with live work in every family (the job not taken by any worker yet)
    busy = Busy(store, recorder, cwd)
    mark = len(recorder.sent)
    # When it is archived with stopActivity
    result = archive.archive(store, recorder, busy.sid, stop_activity=True)
    # Then it is archived (its subagent too) and exactly one stop per family was sent
    assert result.outcome == "archived"
    assert result.archived_count == 2
    assert read(store, busy.sid).archived and read(store, busy.child).archived
    assert sorted(stops(recorder, mark)) == sorted(
        [
            ("turn.stop", [busy.sid, [busy.turn]], "turn.ctl"),
            ("job.stop", [busy.sid, [busy.job]], "job.ctl"),
            (
                "subagent.stop",
                [busy.sid, {busy.child: {"turns": [busy.child_turn], "jobs": [], "reminders": []}}],
                "subagent.ctl",
            ),
            ("reminder.stop", [busy.sid, [busy.reminder]], "reminder.ctl"),
        ]
    )
    assert len(recorder.sent) == mark + 4, "nothing but the stops is sent"
    assert result.stop_report.sent == {"turn": 1, "job": 1, "subagent": 1, "reminder": 1}
    assert result.stop_report.failed == []
    assert {i.id for i in result.stopped} == {busy.turn, busy.job, busy.reminder, busy.child}


def test_the_stop_of_a_claimed_job_goes_to_its_hosts_queue(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    # Given a job taken by the worker on hostA
    s = sessions.create_session(store, cwd)
    jid = jobs.create_job(store, recorder, s.session_id, 30, "sleep 30s")
    assert claim_job(store, jid, "hostA") == "ok"
    mark = len(recorder.sent)
    # When the session is archived with stopActivity
    result = archive.archive(store, recorder, s.session_id, stop_activity=True)
    # Then the job's stop goes to hostA's control queue only
    assert stops(recorder, mark) == [("job.stop", [s.session_id, [jid]], "job.ctl.hostA")]
    assert [i.host for i in result.stopped] == ["hostA"]


def test_a_subagent_stop_names_every_descendant_with_live_work(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    # Given root -> child -> grandchild -> great-grandchild, work in the child and the great one
    root, child, _grandchild, great = chain(store, 3, cwd)
    turns.start_turn(store, recorder, child.session_id, "think 5", source="subagent")
    reminders.create_reminder(store, great.session_id, 60, "say later")
    mark = len(recorder.sent)
    # When the root is archived with stopActivity
    archive.archive(store, recorder, root.session_id, stop_activity=True)
    # Then one subagent stop names exactly those two descendants
    [(task, args, queue)] = stops(recorder, mark)
    assert (task, queue, args[0]) == ("subagent.stop", "subagent.ctl", root.session_id)
    assert sorted(args[1]) == sorted([child.session_id, great.session_id])


def test_a_failed_stop_dispatch_keeps_the_archive_and_the_other_stops(
    store: Store, cwd: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a busy session and a broker that refuses job stops
    failing = FailingDispatcher({"job.stop"})
    busy = Busy(store, failing, cwd)
    mark = len(failing.sent)
    # When it is archived with stopActivity
    with caplog.at_level(logging.WARNING, logger="orchestrator"):
        result = archive.archive(store, failing, busy.sid, stop_activity=True)
    # Then the archive stands
    assert result.outcome == "archived"
    assert read(store, busy.sid).archived
    # And the other three families were still asked to stop
    assert sorted(task for task, _, _ in stops(failing, mark)) == [
        "reminder.stop",
        "subagent.stop",
        "turn.stop",
    ]
    assert result.stop_report.sent == {"turn": 1, "subagent": 1, "reminder": 1}
    # And the failure is reported and logged as a warning
    assert result.stop_report.failed == [("job", "RuntimeError: broker down")]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert any("job" in r.getMessage() and "broker down" in r.getMessage() for r in warnings)


def test_every_dispatch_failing_still_leaves_the_session_archived(
    store: Store, cwd: str, caplog: pytest.LogCaptureFixture
) -> None:
    failing = FailingDispatcher({"turn.stop", "job.stop", "subagent.stop", "reminder.stop"})
    busy = Busy(store, failing, cwd)

    with caplog.at_level(logging.WARNING, logger="orchestrator"):
        result = archive.archive(store, failing, busy.sid, stop_activity=True)

    assert result.outcome == "archived"
    assert sorted(f for f, _ in result.stop_report.failed) == [
        "job",
        "reminder",
        "subagent",
        "turn",
    ]
    assert result.stop_report.sent == {}
    assert read(store, busy.sid).archived


def test_stopped_work_ends_once_the_stops_are_delivered(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    # Given a busy session archived with stopActivity
    busy = Busy(store, recorder, cwd)
    mark = len(recorder.sent)
    archive.archive(store, recorder, busy.sid, stop_activity=True)
    # When the family workers handle the stops
    deliver(store, recorder, stops(recorder, mark))
    # Then nothing is live any more, in the session or its subagent
    assert census(store, busy.sid) == []
    assert census(store, busy.child) == []
    assert store.redis.hget(store.keys.job(busy.job), "state") == "stopped"
    assert store.redis.hget(store.keys.reminder(busy.reminder), "state") == "deleted"
    t = turns.get_turn(store, busy.turn)
    assert t is not None and t.state == turns.TurnState.CANCELLED


# --------------------------------------------------------------------------- updatedAt


def test_archive_and_unarchive_leave_updated_at_unchanged(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    s = sessions.create_session(store, cwd)
    score = store.redis.zscore(store.keys.index("all"), s.session_id)

    archive.archive(store, recorder, s.session_id)
    assert read(store, s).updated_at == s.updated_at
    archive.unarchive(store, s.session_id)

    assert read(store, s).updated_at == s.updated_at
    assert store.redis.zscore(store.keys.index("all"), s.session_id) == score


# --------------------------------------------------------------------------- subtrees


def test_archiving_a_parent_archives_its_subtree_and_unarchive_restores_it(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    # Given a lineage three deep
    nodes = chain(store, 3, cwd)
    everyone = {n.session_id for n in nodes}
    # When the root is archived
    result = archive.archive(store, recorder, nodes[0].session_id)
    # Then the whole subtree is archived and listed only as archived
    assert result.archived_count == 4
    assert all(read(store, n).archived for n in nodes)
    assert listed(store, cwd, "only") == everyone
    assert listed(store, cwd, "exclude") == set()
    # When the root is unarchived
    assert archive.unarchive(store, nodes[0].session_id) == 4
    # Then exactly those four come back
    assert not any(read(store, n).archived for n in nodes)
    assert listed(store, cwd, "exclude") == everyone
    assert listed(store, cwd, "only") == set()


def test_a_child_archived_on_its_own_stays_archived_after_its_parents_unarchive(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    # Given root -> child -> grandchild, and the child archived on its own first
    root, child, grandchild = chain(store, 2, cwd)
    assert archive.archive(store, recorder, child.session_id).archived_count == 2
    child_archived_at = read(store, child).archived_at
    # When the root is archived and then unarchived
    assert archive.archive(store, recorder, root.session_id).archived_count == 1
    assert archive.unarchive(store, root.session_id) == 1
    # Then only the root came back; the child (and its grandchild) stay as they were
    assert read(store, root).archived is False
    assert read(store, child).archived is True
    assert read(store, child).archived_at == child_archived_at
    assert read(store, grandchild).archived is True
    # And the child can now be unarchived with its grandchild
    assert archive.unarchive(store, child.session_id) == 2
    assert not read(store, grandchild).archived


def test_unarchiving_a_child_under_an_archived_parent_raises_ancestor_archived(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    root, child, grandchild = chain(store, 2, cwd)
    archive.archive(store, recorder, root.session_id)

    # Each names the root, the one session whose unarchive is not refused (the child between
    # it and the grandchild is archived too)
    for s in (child, grandchild):
        with pytest.raises(AncestorArchived) as raised:
            archive.unarchive(store, s.session_id)
        assert raised.value.data["archivedAncestor"] == root.session_id
        assert read(store, s).archived is True


def test_under_two_archives_the_refusal_names_the_one_to_unarchive_first(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    # Given root -> child -> grandchild, the child archived on its own, then the root
    root, child, grandchild = chain(store, 2, cwd)
    archive.archive(store, recorder, child.session_id)
    archive.archive(store, recorder, root.session_id)
    # Then the grandchild's unarchive and its prompt name the root
    with pytest.raises(AncestorArchived) as raised:
        archive.unarchive(store, grandchild.session_id)
    assert raised.value.data["archivedAncestor"] == root.session_id
    with pytest.raises(SessionArchived) as refused:
        turns.start_turn(store, recorder, grandchild.session_id, "hello")
    assert refused.value.data["archivedAncestor"] == root.session_id
    # When the root is unarchived (the child's own archive stands), they name the child
    archive.unarchive(store, root.session_id)
    with pytest.raises(AncestorArchived) as raised:
        archive.unarchive(store, grandchild.session_id)
    assert raised.value.data["archivedAncestor"] == child.session_id
    with pytest.raises(SessionArchived) as refused:
        turns.start_turn(store, recorder, grandchild.session_id, "hello")
    assert refused.value.data["archivedAncestor"] == child.session_id
    # And following the names unarchives the grandchild
    archive.unarchive(store, child.session_id)
    assert not read(store, grandchild).archived


def test_a_prompt_to_a_session_archived_with_its_parent_names_the_session_to_unarchive(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    # Given root -> child -> grandchild, archived together through the root
    root, child, grandchild = chain(store, 2, cwd)
    archive.archive(store, recorder, root.session_id)
    # When the child or the grandchild is prompted, then the refusal names the root (their
    # own unarchive, and the child's for the grandchild, would be refused), and a prompt to
    # the root names no ancestor
    for s in (child, grandchild):
        with pytest.raises(SessionArchived) as refused:
            turns.start_turn(store, recorder, s.session_id, "hello")
        assert refused.value.data == {
            "sessionId": s.session_id,
            "archivedAncestor": root.session_id,
        }
    assert "unarchive that session first" in refused.value.message
    assert root.session_id in refused.value.message
    with pytest.raises(SessionArchived) as own:
        turns.start_turn(store, recorder, root.session_id, "hello")
    assert own.value.data == {"sessionId": root.session_id}
    assert own.value.message.endswith("is archived; unarchive it first.")


def test_a_child_created_under_an_archived_parent_is_born_archived_and_restored_with_it(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    # Given an archived session
    root = sessions.create_session(store, cwd)
    archive.archive(store, recorder, root.session_id)
    # When a subagent (and its own subagent) is created under it
    child = sessions.create_session(store, cwd, parent_id=root.session_id)
    grandchild = sessions.create_session(store, cwd, parent_id=child.session_id)
    # Then both are born archived: hidden from the default list and gated
    assert child.archived and grandchild.archived
    assert child.session_id not in listed(store, cwd, "exclude")
    assert {child.session_id, grandchild.session_id} <= listed(store, cwd, "only")
    with pytest.raises(StepRefused):
        gate.admit(store, grandchild.session_id)
    # When the parent is unarchived
    assert archive.unarchive(store, root.session_id) == 3
    # Then they are restored with it
    assert not read(store, child).archived and not read(store, grandchild).archived
    gate.admit(store, grandchild.session_id)


def test_a_deleted_descendant_stays_deleted_with_its_subtree_after_its_parents_unarchive(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    # Given root -> child -> grandchild archived together, then the child deleted (its own
    # child with it)
    root, child, grandchild = chain(store, 2, cwd)
    archive.archive(store, recorder, root.session_id)
    sessions.delete_session(store, child.session_id)
    # When the root is unarchived
    assert archive.unarchive(store, root.session_id) == 1
    # Then the child and the grandchild stay deleted and unlisted, the root alone came back
    for gone in (child, grandchild):
        with pytest.raises(SessionNotFound):
            read(store, gone)
        for flt in ("exclude", "include", "only"):
            assert gone.session_id not in listed(store, cwd, flt)
    assert not read(store, root).archived


# --------------------------------------------------------------------------- unarchive


def test_unarchive_is_idempotent(store: Store, recorder: RecordingDispatcher, cwd: str) -> None:
    never = sessions.create_session(store, cwd)
    s = sessions.create_session(store, cwd)
    archive.archive(store, recorder, s.session_id)

    assert archive.unarchive(store, never.session_id) == 0
    assert archive.unarchive(store, s.session_id) == 1
    assert archive.unarchive(store, s.session_id) == 0
    assert not read(store, s).archived


def snapshot(store: Store, busy: Busy) -> dict[str, Any]:
    k = store.keys
    return {
        "turns": {t: store.redis.hgetall(k.turn(t)) for t in (busy.turn, busy.child_turn)},
        "job": store.redis.hgetall(k.job(busy.job)),
        "reminder": store.redis.hgetall(k.reminder(busy.reminder)),
        "due": store.redis.zscore(k.reminders_due, busy.reminder),
        "live": [
            store.redis.zrange(k.live_turns(busy.sid), 0, -1),
            store.redis.smembers(k.live_jobs(busy.sid)),
            store.redis.smembers(k.live_reminders(busy.sid)),
            store.redis.zrange(k.live_turns(busy.child), 0, -1),
        ],
        "active": [
            store.redis.get(k.active_turn(busy.sid)),
            store.redis.get(k.active_turn(busy.child)),
        ],
    }


def test_unarchive_never_restarts_anything(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    # Given a busy session (plus a queued prompt) archived with stopActivity, stops delivered
    busy = Busy(store, recorder, cwd)
    queued = turns.start_turn(store, recorder, busy.sid, "say later")
    mark = len(recorder.sent)
    archive.archive(store, recorder, busy.sid, stop_activity=True)
    deliver(store, recorder, stops(recorder, mark))
    before = snapshot(store, busy)
    sent_before = list(recorder.sent)
    # When it is unarchived (twice)
    assert archive.unarchive(store, busy.sid) == 2
    assert archive.unarchive(store, busy.sid) == 0
    # Then no turn, job or reminder changed state, nothing was dispatched, nothing is live
    assert snapshot(store, busy) == before
    assert recorder.sent == sent_before
    assert census(store, busy.sid) == []
    assert store.redis.hget(store.keys.reminder(busy.reminder), "state") == "deleted"
    assert before["due"] is None
    queued_turn = turns.get_turn(store, queued)
    assert queued_turn is not None and queued_turn.state == turns.TurnState.CANCELLED
    assert model_requests(store, busy.sid) == []


def test_unarchive_leaves_undelivered_stops_and_turn_states_alone(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    # Given a busy session archived with stopActivity whose stops have not arrived yet
    busy = Busy(store, recorder, cwd)
    archive.archive(store, recorder, busy.sid, stop_activity=True)
    before = snapshot(store, busy)
    sent_before = list(recorder.sent)
    # When it is unarchived
    archive.unarchive(store, busy.sid)
    # Then unarchive itself neither restarts, re-arms nor dispatches anything
    assert snapshot(store, busy) == before
    assert recorder.sent == sent_before


def test_an_unarchived_session_keeps_its_id_cwd_and_conversation(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    # Given a session with a conversation (a turn whose first step began)
    s = sessions.create_session(store, cwd)
    tid = turns.start_turn(store, recorder, s.session_id, "say hi")
    assert begin_step(store, tid)
    turns.finish(store, recorder, tid, turns.TurnState.COMPLETED)
    history = store.redis.lrange(store.keys.history(s.session_id), 0, -1)
    assert [json.loads(h)["sessionUpdate"] for h in history] == ["user_message_chunk"]
    stored = read(store, s)
    # When it is archived and unarchived
    archive.archive(store, recorder, s.session_id)
    archived = read(store, s)
    archive.unarchive(store, s.session_id)
    # Then the conversation, cwd, times and the turn record are all still there
    assert archived.archived and archived.cwd == cwd
    assert store.redis.lrange(store.keys.history(s.session_id), 0, -1) == history
    after = read(store, s)
    assert (after.cwd, after.created_at, after.updated_at) == (
        stored.cwd,
        stored.created_at,
        stored.updated_at,
    )
    assert after.archived is False and after.archived_at is None
    t = turns.get_turn(store, tid)
    assert t is not None and t.state == turns.TurnState.COMPLETED


def test_archive_state_is_what_the_listing_shows(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    s = sessions.create_session(store, cwd)
    assert listed(store, cwd, "exclude") == {s.session_id}

    archive.archive(store, recorder, s.session_id)
    assert listed(store, cwd, "only") == {s.session_id}
    assert listed(store, cwd, "exclude") == set()
    [info] = [x.to_info() for x in sessions.list_sessions(store, cwd=cwd, archived="only").sessions]
    assert info["archived"] is True

    archive.unarchive(store, s.session_id)
    assert listed(store, cwd, "exclude") == {s.session_id}
    assert listed(store, cwd, "only") == set()


def test_archive_and_unarchive_publish_events(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    # Given a subscriber on the events channel
    s = sessions.create_session(store, cwd)
    pubsub = store.redis.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(store.keys.events)
    try:
        pubsub.get_message(timeout=1)
        # When the session is archived and unarchived
        archive.archive(store, recorder, s.session_id)
        archive.unarchive(store, s.session_id)
        # Then one event each is seen, carrying the new state
        seen = []
        for _ in range(20):
            message = pubsub.get_message(timeout=0.5)
            if message:
                event = json.loads(message["data"])
                if event["sessionId"] == s.session_id:
                    seen.append((event["type"], event["archived"]))
            if len(seen) == 2:
                break
    finally:
        pubsub.close()
    assert seen == [("archived", True), ("unarchived", False)]


def test_archiving_again_with_stop_activity_resends_stops_for_work_that_outlived_the_first(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    # Given an archived session whose first stop dispatch was lost (a job still live)
    s = sessions.create_session(store, cwd)
    jid = jobs.create_job(store, recorder, s.session_id, 30, "sleep 30s")
    archive.archive(store, FailingDispatcher({"job.stop"}), s.session_id, stop_activity=True)
    assert [i.id for i in census(store, s.session_id)] == [jid]
    before = read(store, s).archived_at
    # When it is archived again with stopActivity
    result = archive.archive(store, recorder, s.session_id, stop_activity=True)
    # Then the archive state is unchanged but the job is asked to stop again
    assert result.outcome == "already_archived"
    assert read(store, s).archived_at == before
    assert ("job.stop", [s.session_id, [jid]], "job.ctl") in recorder.sent


def test_a_wake_up_of_an_archived_session_does_not_count_as_activity(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    # Given an archived session
    s = sessions.create_session(store, cwd)
    archive.archive(store, recorder, s.session_id)
    before = read(store, s).updated_at
    # When a late reminder tries to store a turn for it
    with pytest.raises(SessionArchived):
        turns.start_turn(store, recorder, s.session_id, "say late", source="reminder")
    # Then nothing is stored and updatedAt does not move
    assert read(store, s).updated_at == before
    assert store.redis.zcard(store.keys.live_turns(s.session_id)) == 0
    assert store.redis.llen(store.keys.history(s.session_id)) == 0
