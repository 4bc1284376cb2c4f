"""Fleet metrics counted in Redis (``orchestrator/storage/metrics.py``) and the archive-to-quiet
record (``activity.mark_quiet``/``note_quiet``). Counters are shared by the whole test run, so
every test compares a snapshot taken before with one taken after."""

from __future__ import annotations

import logging

import pytest

from orchestrator.archiving import archive
from orchestrator.census import activity
from orchestrator.errors import SessionActive
from orchestrator.job import jobs
from orchestrator.models.model import ScriptedModel
from orchestrator.reminder import reminders
from orchestrator.session import sessions
from orchestrator.storage import metrics
from orchestrator.storage.metrics import Snapshot
from orchestrator.storage.store import Store
from orchestrator.turn import steps, tools, turns
from tests.helpers import RecordingDispatcher, count_round_trips
from tests.orchestrator.support import FailingDispatcher, begin_step, claim_job, deliver, stops


def counted(before: Snapshot, after: Snapshot, counter: metrics.Counter) -> dict[str, int]:
    """What ``counter`` gained between two snapshots, by its (single) label value."""
    old, new = before.counters[counter.name], after.counters[counter.name]
    gained = {labels[0]: n - old.get(labels, 0) for labels, n in new.items()}
    return {label: n for label, n in gained.items() if n}


def quiet_count(snap: Snapshot) -> int:
    return snap.histograms[metrics.ARCHIVE_QUIET.name].count


def test_archive_outcomes_are_counted(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    # Given a quiet session and one with a queued turn
    quiet = sessions.create_session(store, cwd).session_id
    busy = sessions.create_session(store, cwd).session_id
    turns.start_turn(store, recorder, busy, "think 5")
    before = metrics.snapshot(store)
    # When the first is archived twice and the second is refused
    archive.archive(store, recorder, quiet)
    archive.archive(store, recorder, quiet)
    with pytest.raises(SessionActive):
        archive.archive(store, recorder, busy)
    after = metrics.snapshot(store)
    # Then each outcome is counted once, and the refusal by the family of its live work
    assert counted(before, after, metrics.ARCHIVES) == {
        "archived": 1,
        "already_archived": 1,
        "refused": 1,
    }
    assert counted(before, after, metrics.ARCHIVE_REFUSALS) == {"turn": 1}


def test_stop_dispatches_and_failures_are_counted_by_family(store: Store, cwd: str) -> None:
    # Given a session with a queued turn and an armed reminder, and a broker that refuses
    # reminder stops
    failing = FailingDispatcher({"reminder.stop"})
    sid = sessions.create_session(store, cwd).session_id
    turns.start_turn(store, failing, sid, "think 5")
    reminders.create_reminder(store, sid, 60, "say hi")
    before = metrics.snapshot(store)
    # When it is archived with stopActivity
    archive.archive(store, failing, sid, stop_activity=True)
    after = metrics.snapshot(store)
    # Then the sent stop and the failed one are counted under their families
    assert counted(before, after, metrics.STOP_DISPATCHES) == {"turn": 1}
    assert counted(before, after, metrics.STOP_FAILURES) == {"reminder": 1}


def test_a_stop_failure_is_one_warning_line_with_the_traceback_only_at_debug(
    store: Store, cwd: str, caplog: pytest.LogCaptureFixture
) -> None:
    failing = FailingDispatcher({"turn.stop"})
    sid = sessions.create_session(store, cwd).session_id
    turns.start_turn(store, failing, sid, "think 5")
    with caplog.at_level(logging.DEBUG, logger="orchestrator.archiving.stops"):
        archive.archive(store, failing, sid, stop_activity=True)
    records = [r for r in caplog.records if r.name == "orchestrator.archiving.stops"]
    [warning] = [r for r in records if r.levelno == logging.WARNING]
    assert warning.getMessage() == "stop dispatch for turn failed: RuntimeError: broker down"
    assert warning.exc_info is None
    assert (warning.session_id, warning.family) == (sid, "turn")  # type: ignore[attr-defined]
    # (the traceback is on the debug record: as exc_info, or as the redacted exc_text once the
    # log redaction filter of an API created earlier in the run has seen it)
    assert any(r.levelno == logging.DEBUG and (r.exc_info or r.exc_text) for r in records)


def test_gate_refusals_are_counted_by_reason(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    # Given a turn whose step was in flight when its session was archived with stopActivity,
    # and whose worker died (the lease lapsed)
    sid = sessions.create_session(store, cwd).session_id
    tid = turns.start_turn(store, recorder, sid, "say hi")
    assert begin_step(store, tid)
    archive.archive(store, recorder, sid, stop_activity=True)
    store.redis.delete(store.keys.step_lease(tid))
    before = metrics.snapshot(store)
    # When the step is delivered again
    outcome = steps.run_step(store, recorder, ScriptedModel(), tools.run_tool, sid, tid, 0)
    # Then the gate refused it and the refusal is counted
    assert outcome == "refused"
    assert counted(before, metrics.snapshot(store), metrics.GATE_REFUSALS) == {"archived": 1}


def test_the_session_gauges_follow_the_listing_indexes(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    before = metrics.snapshot(store).sessions
    sid = sessions.create_session(store, cwd).session_id
    sessions.create_session(store, cwd)
    archive.archive(store, recorder, sid)
    after = metrics.snapshot(store).sessions
    assert after["active"] - before["active"] == 1
    assert after["archived"] - before["archived"] == 1


def test_observations_fall_into_the_smallest_bucket_that_holds_them(store: Store) -> None:
    before = metrics.snapshot(store).histograms[metrics.ARCHIVE_QUIET.name]
    metrics.observe(store, metrics.ARCHIVE_QUIET, 0.3)
    metrics.observe(store, metrics.ARCHIVE_QUIET, 1e6)
    after = metrics.snapshot(store).histograms[metrics.ARCHIVE_QUIET.name]
    gained = {
        bound: new - old
        for (bound, new), (_, old) in zip(after.buckets, before.buckets, strict=True)
    }
    assert gained[0.25] == 0
    assert gained[0.5] == 1  # cumulative: every bound from 0.5 up counts the 0.3
    assert gained[300.0] == 1
    assert gained[float("inf")] == 2
    assert after.count - before.count == 2
    assert after.sum - before.sum == pytest.approx(1e6 + 0.3)


def test_counting_never_raises_when_redis_is_away(store: Store) -> None:
    dead = Store("redis://127.0.0.1:1/0", store.keys.prefix, connect_timeout=0.2)
    metrics.incr(dead, metrics.ARCHIVES, "archived")
    metrics.observe(dead, metrics.ARCHIVE_QUIET, 1.0)


# --------------------------------------------------------------------------- archive to quiet


def test_an_archive_with_stop_is_recorded_quiet_once_its_work_has_stopped(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    # Given a session with a job no worker has taken yet, archived with stopActivity
    sid = sessions.create_session(store, cwd).session_id
    jobs.create_job(store, recorder, sid, 5, "sleep 5s")
    before = quiet_count(metrics.snapshot(store))
    mark = len(recorder.sent)
    archive.archive(store, recorder, sid, stop_activity=True)
    assert sessions.get_session(store, sid).quiet_at is None
    # When the job stop is delivered and the stop handler checks for quiet
    deliver(store, recorder, stops(recorder, mark))
    activity.note_quiet(store, sid)
    # Then the session is recorded quiet, in its SessionInfo and in the histogram
    session = sessions.get_session(store, sid)
    assert session.quiet_at is not None and session.archived_at is not None
    assert session.quiet_at >= session.archived_at
    assert session.to_info()["_meta"]["agentFleet"]["quietAt"] == session.quiet_at
    assert quiet_count(metrics.snapshot(store)) == before + 1
    # And later censuses observe nothing more
    assert activity.census(store, sid) == []
    activity.note_quiet(store, sid)
    assert quiet_count(metrics.snapshot(store)) == before + 1


def test_an_archive_with_nothing_to_stop_is_quiet_at_once(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    sid = sessions.create_session(store, cwd).session_id
    before = quiet_count(metrics.snapshot(store))
    archive.archive(store, recorder, sid, stop_activity=True)
    assert sessions.get_session(store, sid).quiet_at is not None
    assert quiet_count(metrics.snapshot(store)) == before + 1


def test_a_plain_archive_is_marked_quiet_but_not_observed(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    # Given a session with a child
    sid = sessions.create_session(store, cwd).session_id
    child = sessions.create_session(store, cwd, parent_id=sid).session_id
    before = quiet_count(metrics.snapshot(store))
    # When it is archived without stopActivity (possible only when nothing is live)
    archive.archive(store, recorder, sid)
    # Then both are quiet from the start, and there is no time to measure
    assert sessions.get_session(store, sid).quiet_at is not None
    assert sessions.get_session(store, child).quiet_at is not None
    assert quiet_count(metrics.snapshot(store)) == before


def test_quiet_is_recorded_anew_for_each_archive_and_hidden_while_unarchived(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    sid = sessions.create_session(store, cwd).session_id
    archive.archive(store, recorder, sid, stop_activity=True)
    first = sessions.get_session(store, sid).quiet_at
    archive.unarchive(store, sid)
    unarchived = sessions.get_session(store, sid)
    assert unarchived.quiet_at is None
    assert "quietAt" not in unarchived.to_info()["_meta"]["agentFleet"]
    before = quiet_count(metrics.snapshot(store))
    archive.archive(store, recorder, sid, stop_activity=True)
    second = sessions.get_session(store, sid).quiet_at
    assert first is not None and second is not None and second >= first
    assert quiet_count(metrics.snapshot(store)) == before + 1


def test_a_stop_in_a_subagent_records_the_archived_ancestors_quiet_once(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    # Given a root whose grandchild has a queued turn, archived with stopActivity
    root = sessions.create_session(store, cwd).session_id
    child = sessions.create_session(store, cwd, parent_id=root).session_id
    grandchild = sessions.create_session(store, cwd, parent_id=child).session_id
    turns.start_turn(store, recorder, grandchild, "think 5", source="subagent")
    before = quiet_count(metrics.snapshot(store))
    archive.archive(store, recorder, root, stop_activity=True)
    # When the grandchild's turn is cancelled and its stop handler checks for quiet
    turns.cancel_session_turns(store, recorder, grandchild)
    activity.note_quiet(store, grandchild)
    # Then every session of the archive is quiet, and the archive is observed once
    for sid in (root, child, grandchild):
        assert sessions.get_session(store, sid).quiet_at is not None, sid
    assert quiet_count(metrics.snapshot(store)) == before + 1


def test_a_quiet_check_of_a_session_that_is_not_archived_does_nothing(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    sid = sessions.create_session(store, cwd).session_id
    activity.note_quiet(store, sid)
    activity.note_quiet(store, "sess_" + "0" * 24)  # unknown: skipped, never raises
    assert sessions.get_session(store, sid).quiet_at is None
    assert not store.redis.hexists(store.keys.session(sid), "quietAt")


def test_the_end_of_a_subagents_last_work_records_its_whole_archive_quiet_in_one_round_trip(
    store: Store, recorder: RecordingDispatcher, cwd: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a session whose subagent runs a job, archived with stopActivity
    sid = sessions.create_session(store, cwd).session_id
    child = sessions.create_session(store, cwd, parent_id=sid).session_id
    jid = jobs.create_job(store, recorder, child, 5, "sleep 5s")
    claim_job(store, jid)
    archive.archive(store, recorder, sid, stop_activity=True)
    assert sessions.get_session(store, sid).quiet_at is None
    before = quiet_count(metrics.snapshot(store))
    # When the job's worker has ended it and checks for quiet, as a stop handler does
    assert jobs.end_job(store, jid, jobs.JobState.STOPPED) == "ok"
    writes = count_round_trips(monkeypatch)
    activity.note_quiet(store, child)
    monkeypatch.undo()
    # Then the subagent and the session it reports to are recorded quiet, the archive timed
    # once, in one round trip for the check and the marks (and one for the histogram): this
    # is on the way from the last item's end to quietAt, on a worker that may be busy
    assert sessions.get_session(store, child).quiet_at is not None
    assert sessions.get_session(store, sid).quiet_at is not None
    assert quiet_count(metrics.snapshot(store)) == before + 1
    assert len(writes) == 2, [w[:80] for w in writes]
