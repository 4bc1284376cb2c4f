"""Two deletes that race never answer ``SessionNotFound``: the one whose script runs first
deletes, and the other, finding the session gone at whatever step it has reached (its
archive, its wait for quiet, its refusal's census), answers ``deleted=False`` with what it
had itself stopped."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from orchestrator.archiving import archive, archive_run, deletion
from orchestrator.archiving.deletion import DeleteResult
from orchestrator.census.activity import ActivityItem
from orchestrator.errors import SessionNotFound
from orchestrator.reminder import reminders
from orchestrator.session import sessions
from orchestrator.storage.store import Store
from orchestrator.turn import turns
from tests.helpers import RecordingDispatcher
from tests.orchestrator.support import chain

pytestmark = pytest.mark.redis


def _deleting_first(
    real: Callable[..., list[ActivityItem]], at_call: int
) -> Callable[..., list[ActivityItem]]:
    """``real`` (a census), except that just before its ``at_call``-th call another delete
    of the session it is asked about completes."""
    calls: list[str] = []

    def census(store: Store, sid: str, dispatcher: Any = None) -> list[ActivityItem]:
        calls.append(sid)
        if len(calls) == at_call:
            assert sessions.write_delete(store, sid, check_live=False)[0] == "deleted"
        return real(store, sid, dispatcher)

    return census


@pytest.mark.parametrize(
    ("where", "wait_seconds"),
    [
        ("wait", 5.0),  # the other delete lands while this one waits for quiet
        ("refusal", 0.0),  # ... after this one's check found work live, before its census
    ],
)
def test_a_delete_whose_session_another_delete_took_answers_deleted_false_with_its_stops(
    store: Store,
    recorder: RecordingDispatcher,
    cwd: str,
    monkeypatch: pytest.MonkeyPatch,
    where: str,
    wait_seconds: float,
) -> None:
    # Given root -> child -> grandchild with a running turn and a reminder on the grandchild
    # (no worker here: the reminder stays live until its stop is delivered)
    _root, child, grand = chain(store, 2, cwd)
    turns.start_turn(store, recorder, grand.session_id, "think 30")
    reminders.create_reminder(store, grand.session_id, 600, "later")
    # and another delete of the child that completes at that exact moment
    at_call = 1 if where == "wait" else 2
    monkeypatch.setattr(deletion, "census", _deleting_first(deletion.census, at_call))

    # When the child is deleted with stopActivity
    result = deletion.delete(
        store, recorder, child.session_id, stop_activity=True, wait_seconds=wait_seconds
    )

    # Then it answers deleted: false (the other delete deleted it) ...
    assert not result.deleted and result.deleted_descendants == []
    # ... and still says what it stopped itself: the grandchild's turn, sent as a subagent stop
    assert [(i.family, i.id) for i in result.stopped] == [("subagent", grand.session_id)]
    wire = result.to_wire()
    assert wire["deleted"] is False
    assert [i["id"] for i in wire["stopped"]] == [grand.session_id]
    assert wire["stopDispatch"] == {"sent": {"subagent": 1}, "failed": []}
    with pytest.raises(SessionNotFound):
        sessions.get_session(store, child.session_id)


def test_a_delete_whose_archive_finds_the_session_gone_answers_deleted_false(
    store: Store, recorder: RecordingDispatcher, cwd: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a tree an ancestor's delete has archived with stop, the child's reminder not yet
    # stopped (so the child's own archive finds it already archived with live work, and
    # reads its census) ...
    root, child, _grand = chain(store, 2, cwd)
    reminders.create_reminder(store, child.session_id, 3600, "later")
    archive.archive(store, recorder, root.session_id, stop_activity=True)
    # ... and whose delete of the child completes right after that script, before the
    # archive reads the census the script returned
    real_rows = archive_run.census_of_rows

    def deleting_first(store: Store, sid: str, *args: Any) -> list[ActivityItem]:
        assert sessions.write_delete(store, sid, check_live=False)[0] == "deleted"
        return real_rows(store, sid, *args)

    monkeypatch.setattr(archive_run, "census_of_rows", deleting_first)

    # When the child is deleted with stopActivity, Then nothing is raised: deleted: false, and
    # what its archive's script found live (the reminder) was stopped
    result = deletion.delete(store, recorder, child.session_id, stop_activity=True)
    assert not result.deleted and [i.family for i in result.stopped] == ["reminder"]


def _race(
    store: Store, recorder: RecordingDispatcher, ids: list[str]
) -> list[DeleteResult | BaseException]:
    """Delete ``ids`` with stopActivity from one thread each, started together."""
    barrier = threading.Barrier(len(ids))
    out: list[DeleteResult | BaseException] = [RuntimeError("not run")] * len(ids)

    def run(i: int) -> None:
        barrier.wait()
        try:
            out[i] = deletion.delete(store, recorder, ids[i], stop_activity=True, wait_seconds=5)
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            out[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(ids))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return out


def test_deletes_racing_on_a_parent_and_its_child_always_answer(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    for _ in range(20):
        # Given root -> child -> grandchild
        root, child, grand = (s.session_id for s in chain(store, 2, cwd))
        # When the child is deleted twice at once, Then exactly one of them deleted it
        twice = _race(store, recorder, [child, child])
        assert all(isinstance(r, DeleteResult) for r in twice), twice
        assert sorted(r.deleted for r in twice if isinstance(r, DeleteResult)) == [False, True]
        # Given another tree
        root, child, grand = (s.session_id for s in chain(store, 2, cwd))
        # When the root and the child are deleted at once
        pair = _race(store, recorder, [root, child])
        # Then both answer, the root's delete deleted the root
        assert all(isinstance(r, DeleteResult) for r in pair), pair
        by_root, by_child = (r for r in pair if isinstance(r, DeleteResult))
        assert by_root.deleted
        # and the grandchild was deleted by exactly one of them
        took_grand = [r for r in (by_root, by_child) if grand in r.deleted_descendants]
        assert len(took_grand) == 1
        assert by_child.deleted == (took_grand[0] is by_child)
        for sid in (root, child, grand):
            with pytest.raises(SessionNotFound):
                sessions.get_session(store, sid)
