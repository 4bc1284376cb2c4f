"""An archive with ``stopActivity`` that finds its session already archived (a second archive,
or a delete's, racing the first) asks again to stop what lived under the archive in place,
never work created after an unarchive that comes between its check and its stops: the census
its stops name is read by its script, with the archive it found (a late stop touches nothing
created since)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from orchestrator.archiving import archive, bulk, deletion, reconcile
from orchestrator.errors import SessionUnarchived
from orchestrator.reminder import reminders
from orchestrator.session import sessions
from orchestrator.storage.store import Store
from orchestrator.turn import turns
from orchestrator.turn.turns import TurnState
from tests.helpers import RecordingDispatcher
from tests.orchestrator.support import deliver, stops

pytestmark = pytest.mark.redis


def _unarchived_after_already(
    store: Store, recorder: RecordingDispatcher, sid: str, made: list[str]
) -> Callable[..., Any]:
    """``store.run``, except that right after the first archive script answering ``already``
    the session is unarchived by someone else, who starts a turn of their own."""
    real = store.run

    def run(name: str, args: list[Any], **kwargs: Any) -> Any:
        result = real(name, args, **kwargs)
        if name == "archive" and result[0] in ("l", "L") and not made:
            assert archive.unarchive(store, sid) == 1
            made.append(turns.start_turn(store, recorder, sid, "say late\nthink 10"))
        return result

    return run


def _untouched(store: Store, tid: str) -> None:
    state, cancelled_by = store.redis.hmget(store.keys.turn(tid), "state", "cancelledBy")
    assert (state, cancelled_by) == (TurnState.RUNNING.value, None)


@pytest.mark.parametrize("cause", [turns.CANCELLED_BY_DELETE, turns.CANCELLED_BY_ARCHIVE])
def test_an_archive_finding_the_session_archived_never_stops_work_made_after_an_unarchive(
    store: Store,
    recorder: RecordingDispatcher,
    cwd: str,
    monkeypatch: pytest.MonkeyPatch,
    cause: str,
) -> None:
    # Given a busy session archived with stop (by a delete's archive, or a plain one)
    sid = sessions.create_session(store, cwd).session_id
    old = turns.start_turn(store, recorder, sid, "think 30")
    archive.archive(store, recorder, sid, stop_activity=True, cause=cause)
    # ... and archived again with stop, unarchived (a new turn started) right after that
    # archive's script found it archived
    made: list[str] = []
    since = len(recorder.sent)
    with monkeypatch.context() as patched:
        patched.setattr(store, "run", _unarchived_after_already(store, recorder, sid, made))
        again = archive.archive(store, recorder, sid, stop_activity=True)
    assert again.outcome == "already_archived"

    # When its stops arrive
    deliver(store, recorder, stops(recorder, since))

    # Then the turn made after the unarchive was neither named nor touched
    [new] = made
    assert new not in [item.id for item in again.stopped]
    _untouched(store, new)
    # ... while the turn the first archive stopped says which one did
    stopped = turns.get_turn(store, old)
    assert stopped is not None and stopped.cancelled_by == cause
    assert not sessions.get_session(store, sid).archived


def test_a_delete_finding_the_session_archived_never_stops_work_made_after_an_unarchive(
    store: Store, recorder: RecordingDispatcher, cwd: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a busy session archived with stop, then deleted with stop (its archive finds the
    # one in place), unarchived with a new turn right after the delete's archive script
    sid = sessions.create_session(store, cwd).session_id
    turns.start_turn(store, recorder, sid, "think 30")
    archive.archive(store, recorder, sid, stop_activity=True)
    made: list[str] = []
    since = len(recorder.sent)
    with monkeypatch.context() as patched, pytest.raises(SessionUnarchived):
        patched.setattr(store, "run", _unarchived_after_already(store, recorder, sid, made))
        deletion.delete(store, recorder, sid, stop_activity=True, wait_seconds=1.0)

    # When its stops arrive, Then the turn made after the unarchive is untouched
    deliver(store, recorder, stops(recorder, since))
    [new] = made
    _untouched(store, new)


def _unarchive_with_new_turn(
    store: Store, recorder: RecordingDispatcher, sid: str, made: list[str]
) -> None:
    assert archive.unarchive(store, sid) == 1
    made.append(turns.start_turn(store, recorder, sid, "say late\nthink 10"))


def test_a_bulk_archive_never_stops_work_made_after_an_unarchive_of_its_batch(
    store: Store, recorder: RecordingDispatcher, cwd: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a busy session, bulk archived with stop, unarchived with a new turn right after
    # its batch's script (before the batch's stops are built and sent)
    sid = sessions.create_session(store, cwd).session_id
    turns.start_turn(store, recorder, sid, "think 30")
    rid = reminders.create_reminder(store, sid, 600, "later")
    made: list[str] = []
    real = store.run

    def run(name: str, args: list[Any], **kwargs: Any) -> Any:
        result = real(name, args, **kwargs)
        if name == "archive" and not made:
            _unarchive_with_new_turn(store, recorder, sid, made)
        return result

    since = len(recorder.sent)
    with monkeypatch.context() as patched:
        patched.setattr(store, "run", run)
        result = bulk.bulk_archive(store, recorder, session_ids=[sid], stop_activity=True)
    assert result.totals["archived"] == 1

    # When its stops arrive, Then they name what lived under the archive (the reminder, read
    # in the batch's own script, as a single archive's census is) and the new turn was neither
    # named nor touched
    sent = stops(recorder, since, bulk=True)
    [new] = made
    assert rid in repr(sent), sent
    assert new not in repr(sent), sent
    deliver(store, recorder, sent)
    _untouched(store, new)


def test_the_reconciler_never_stops_work_made_after_an_unarchive(
    store: Store, recorder: RecordingDispatcher, cwd: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given an archived session whose reminder outlived its stop (never delivered here),
    # unarchived with a new turn right after the reconciler chose it
    sid = sessions.create_session(store, cwd).session_id
    reminders.create_reminder(store, sid, 600, "later")
    archive.archive(store, recorder, sid, stop_activity=True)
    made: list[str] = []
    real = reconcile._candidates

    def candidates(store: Store, sids: list[str], **kwargs: Any) -> Any:
        picked = real(store, sids, **kwargs)
        if sid in picked and not made:
            _unarchive_with_new_turn(store, recorder, sid, made)
        return picked

    monkeypatch.setattr(reconcile, "_candidates", candidates)
    since = len(recorder.sent)

    # When the reconciler runs and its stops arrive
    reconcile.reconcile(store, recorder, grace_seconds=0)
    sent = stops(recorder, since, bulk=True)
    deliver(store, recorder, sent)

    # Then nothing was sent for the session, unarchived since it was chosen
    [new] = made
    assert sid not in repr(sent), sent
    _untouched(store, new)
