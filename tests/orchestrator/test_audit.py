"""The audit trail (``orchestrator/storage/audit.py``): every lifecycle change is recorded with
when,
who and the outcome, refusals included; it is bounded by configuration and never fails the
change it records."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from orchestrator.archiving import archive, archive_run
from orchestrator.errors import AncestorArchived, InvalidParams, SessionActive
from orchestrator.session import sessions, titles
from orchestrator.storage import audit, bookkeeping, metrics
from orchestrator.storage.store import Store
from orchestrator.turn import turns
from tests.helpers import RecordingDispatcher


def trail(store: Store, sid: str | None, count: int = 50) -> list[dict[str, Any]]:
    return audit.read(store, sid, count)


def summary(entries: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """(action, outcome, actor) of each entry, newest first."""
    return [(e["action"], e["outcome"], e["actor"]) for e in entries]


def test_archive_and_unarchive_are_recorded_newest_first_with_actor_and_outcome(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    # Given a session archived and unarchived by "tester"
    sid = sessions.create_session(store, cwd).session_id
    with audit.acting_as("tester"):
        archive.archive(store, recorder, sid)
        archive.unarchive(store, sid)
    # Then its trail holds both, newest first, with what happened
    entries = trail(store, sid)
    assert summary(entries) == [
        ("unarchive", "unarchived", "tester"),
        ("archive", "archived", "tester"),
    ]
    assert entries[1]["detail"] == {"stopActivity": False, "archivedCount": 1, "stoppedTurns": 0}
    assert entries[0]["detail"] == {"restoredCount": 1}
    assert all(e["sessionId"] == sid and e["at"].endswith("Z") for e in entries)
    # And the fleet-wide trail has them too, newest first (workers of other tests may append
    # their own entries meanwhile)
    fleet_wide = [e["id"] for e in trail(store, None, 200) if e["sessionId"] == sid]
    assert fleet_wide == [e["id"] for e in entries]


def test_a_refused_archive_is_recorded_with_the_families_of_the_live_work(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    # Given a session with a queued turn
    sid = sessions.create_session(store, cwd).session_id
    turns.start_turn(store, recorder, sid, "think 5")
    # When a plain archive is refused
    with audit.acting_as("tester"), pytest.raises(SessionActive):
        archive.archive(store, recorder, sid)
    # Then the refusal is recorded
    [entry] = trail(store, sid)
    assert summary([entry]) == [("archive", "refused", "tester")]
    assert entry["detail"] == {"stopActivity": False, "families": ["turn"], "items": 1}


def test_archiving_twice_records_already_archived(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    sid = sessions.create_session(store, cwd).session_id
    archive.archive(store, recorder, sid)
    archive.archive(store, recorder, sid)
    assert [e["outcome"] for e in trail(store, sid)] == ["already_archived", "archived"]


class _Killed(BaseException):
    """Stands for the process dying: nothing after the raise runs."""


def test_an_archive_is_audited_and_counted_even_when_its_process_dies_right_after_the_write(
    store: Store, cwd: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a session with a queued turn, and a process that dies as soon as the archive's
    # script has committed (before the census and the stop fan-out)
    sid = sessions.create_session(store, cwd).session_id
    turns.start_turn(store, RecordingDispatcher(), sid, "think 5")
    counted = metrics.snapshot(store).counters.get(metrics.ARCHIVES.name, {})
    before = counted.get(("archived",), 0)

    def die(*_: object, **__: object) -> None:
        raise _Killed

    monkeypatch.setattr(archive_run, "census_of_rows", die)
    # When it is archived with stopActivity
    with audit.acting_as("tester"), pytest.raises(_Killed):
        archive.archive(store, RecordingDispatcher(), sid, stop_activity=True)
    # Then the archive is recorded and counted all the same: they committed with it
    [entry] = trail(store, sid)
    assert summary([entry]) == [("archive", "archived", "tester")]
    assert entry["detail"] == {"stopActivity": True, "archivedCount": 1, "stoppedTurns": 1}
    counted = metrics.snapshot(store).counters[metrics.ARCHIVES.name]
    assert counted[("archived",)] == before + 1


def test_an_archive_with_stop_records_what_its_fan_out_sent(store: Store, cwd: str) -> None:
    sid = sessions.create_session(store, cwd).session_id
    turns.start_turn(store, RecordingDispatcher(), sid, "think 5")
    archive.archive(store, RecordingDispatcher(), sid, stop_activity=True)
    stop, archived = trail(store, sid)
    assert (stop["action"], stop["outcome"], archived["outcome"]) == ("stop", "sent", "archived")
    assert stop["detail"] == {"stopped": 1, "families": ["turn"], "stopFailures": []}


def test_unarchive_refusals_and_no_ops_are_recorded(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    # Given a parent archived with its child
    parent = sessions.create_session(store, cwd).session_id
    child = sessions.create_session(store, cwd, parent_id=parent).session_id
    archive.archive(store, recorder, parent)
    # When the child is unarchived on its own, and a plain session is unarchived
    with pytest.raises(AncestorArchived):
        archive.unarchive(store, child)
    plain = sessions.create_session(store, cwd).session_id
    archive.unarchive(store, plain)
    # Then both are in the trail (the child's refusal after its parent's archive entry)
    refused, archived = trail(store, child)
    assert (archived["action"], archived["detail"]) == ("archive", {"ancestorId": parent})
    assert (refused["action"], refused["outcome"]) == ("unarchive", "refused")
    assert refused["detail"] == {"archivedAncestor": parent}
    assert [e["outcome"] for e in trail(store, plain)] == ["not_archived"]


def test_client_titles_are_recorded_and_generated_titles_are_not(store: Store, cwd: str) -> None:
    sid = sessions.create_session(store, cwd).session_id
    titles.set_title(store, sid, "from the fleet", source="generated")
    with audit.acting_as("tester"):
        titles.set_title(store, sid, "  Renamed\n by hand ")
    [entry] = trail(store, sid)
    assert summary([entry]) == [("set_title", "set", "tester")]
    assert entry["detail"] == {"title": "Renamed by hand"}


def test_a_delete_is_recorded_once_and_the_trail_outlives_the_session(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    sid = sessions.create_session(store, cwd).session_id
    archive.archive(store, recorder, sid)
    assert sessions.delete_session(store, sid)
    assert not sessions.delete_session(store, sid)  # nothing left to delete: not recorded
    assert [(e["action"], e["outcome"]) for e in trail(store, sid)] == [
        ("delete", "deleted"),
        ("archive", "archived"),
    ]


def test_the_actor_is_the_requests_then_the_processes_then_unknown() -> None:
    saved = audit.current_actor()
    try:
        audit.set_default_actor("unknown")
        assert audit.current_actor() == "unknown"
        audit.set_default_actor("cli")
        assert audit.current_actor() == "cli"
        with audit.acting_as("rest:10.0.0.7"):
            assert audit.current_actor() == "rest:10.0.0.7"
        assert audit.current_actor() == "cli"
    finally:
        audit.set_default_actor(saved)


def test_reading_pages_on_with_before(store: Store, cwd: str) -> None:
    # Given five titles set on one session
    sid = sessions.create_session(store, cwd).session_id
    for n in range(5):
        titles.set_title(store, sid, f"title {n}")
    # When the trail is read two at a time
    first = audit.read(store, sid, 2)
    second = audit.read(store, sid, 2, before=first[-1]["id"])
    third = audit.read(store, sid, 2, before=second[-1]["id"])
    # Then the pages follow each other, newest first, with nothing repeated
    seen = [e["detail"]["title"] for e in first + second + third]
    assert seen == ["title 4", "title 3", "title 2", "title 1", "title 0"]


@pytest.mark.parametrize(("count", "before"), [(0, None), (1001, None), (5, "not-an-id")])
def test_a_bad_page_request_raises_invalid_params(
    store: Store, count: int, before: str | None
) -> None:
    with pytest.raises(InvalidParams):
        audit.read(store, None, count, before)


def test_the_trails_are_capped_by_configuration(store_with: Any, cwd: str) -> None:
    # Given caps of 3 entries per session and 7 fleet-wide
    store = store_with(audit_max_per_session=3, audit_max_global=7)
    # When a session gets ten entries
    sid = sessions.create_session(store, cwd).session_id
    for n in range(10):
        titles.set_title(store, sid, f"title {n}")
    # Then only the newest are kept, in the session's trail and fleet-wide
    assert store.redis.llen(store.keys.audit_log(sid)) == 3
    assert store.redis.xlen(store.keys.audit_all) == 7
    assert [e["detail"]["title"] for e in trail(store, sid)] == ["title 9", "title 8", "title 7"]


def test_recording_never_fails_the_change_when_redis_is_away(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    dead = Store("redis://127.0.0.1:1/0", store.keys.prefix, connect_timeout=0.2)
    with caplog.at_level(logging.WARNING, logger="orchestrator.storage.audit"):
        assert audit.record(dead, "sess_x", "archive", "archived") is None
    [warning] = [r for r in caplog.records if r.name == "orchestrator.storage.audit"]
    assert "ConnectionError" in warning.getMessage()
    assert warning.exc_info is None  # one line, no traceback


def test_a_deferred_stop_record_is_written_when_its_runner_runs_it(store: Store, cwd: str) -> None:
    # Given an archive with stopActivity whose bookkeeping is deferred (as the HTTP API does)
    sid = sessions.create_session(store, cwd).session_id
    turns.start_turn(store, RecordingDispatcher(), sid, "think 5")
    later: list[bookkeeping.Fill] = []
    with audit.acting_as("tester"):
        archive.archive(store, RecordingDispatcher(), sid, stop_activity=True, defer=later.append)
    # Then the archive is recorded at once, the stop entry only when the runner runs it,
    # with the actor of the request
    assert summary(trail(store, sid)) == [("archive", "archived", "tester")]
    [fill] = later
    bookkeeping.write(store, [fill])
    stop, _ = trail(store, sid)
    assert (stop["action"], stop["outcome"], stop["actor"]) == ("stop", "sent", "tester")
