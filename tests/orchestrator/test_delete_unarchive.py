"""A delete with ``stopActivity`` is bound to the archive it made: a session unarchived while
the delete waited for its stopped work to end is not deleted, whatever was created after the
unarchive survives, and the delete answers ``SessionUnarchived``."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from orchestrator.archiving import archive, deletion
from orchestrator.census.activity import ActivityItem
from orchestrator.errors import SessionUnarchived
from orchestrator.session import sessions
from orchestrator.storage.store import Store
from orchestrator.turn import turns
from orchestrator.turn.turns import TurnState
from tests.helpers import RecordingDispatcher

pytestmark = pytest.mark.redis


def _unarchived_during(
    real: Callable[..., Any], at_call: int, then: Callable[[Store, str], None]
) -> Callable[..., Any]:
    """``real``, except that just before its ``at_call``-th call the session it is asked
    about is unarchived by someone else and ``then`` runs."""
    calls: list[str] = []

    def wrapped(store: Store, sid: str, *args: Any, **kwargs: Any) -> Any:
        calls.append(sid)
        if len(calls) == at_call:
            assert archive.unarchive(store, sid) >= 1
            then(store, sid)
        return real(store, sid, *args, **kwargs)

    return wrapped


def _new_turn(recorder: RecordingDispatcher, made: list[str]) -> Callable[[Store, str], None]:
    def start(store: Store, sid: str) -> None:
        made.append(turns.start_turn(store, recorder, sid, "say mine\nthink 30"))

    return start


def _end_turns(store: Store, sid: str) -> None:
    """The session's live turns end by themselves (for the new work: before the delete's
    script runs, the worst case, where its live-work check alone would not stop the
    delete)."""
    for tid in store.redis.zrange(store.keys.live_turns(sid), 0, -1):
        turns.finish(store, RecordingDispatcher(), tid, TurnState.COMPLETED)


@pytest.mark.parametrize("where", ["wait", "script"])
def test_a_session_unarchived_while_its_delete_waited_is_not_deleted(
    store: Store,
    recorder: RecordingDispatcher,
    cwd: str,
    monkeypatch: pytest.MonkeyPatch,
    where: str,
) -> None:
    # Given a busy session
    sid = sessions.create_session(store, cwd).session_id
    turns.start_turn(store, recorder, sid, "think 30")
    made: list[str] = []
    if where == "wait":
        # ... unarchived at the delete's first poll, a turn of the user's started after it
        monkeypatch.setattr(
            deletion, "census", _unarchived_during(deletion.census, 1, _new_turn(recorder, made))
        )
    else:
        # ... unarchived right before the delete's script, after its wait saw quiet: a new
        # turn started and ended in between (nothing live for the script's check to see)
        def both(store: Store, sid: str) -> None:
            _new_turn(recorder, made)(store, sid)
            _end_turns(store, sid)

        real_census = deletion.census

        def quiet(store: Store, sid: str, dispatcher: Any = None) -> list[ActivityItem]:
            _end_turns(store, sid)  # the stopped work ended: the wait sees quiet
            return real_census(store, sid, dispatcher)

        monkeypatch.setattr(deletion, "census", quiet)
        monkeypatch.setattr(
            deletion, "write_delete", _unarchived_during(deletion.write_delete, 1, both)
        )

    # When it is deleted with stopActivity
    with pytest.raises(SessionUnarchived) as refused:
        deletion.delete(store, recorder, sid, stop_activity=True, wait_seconds=5.0)

    # Then nothing was deleted: the session, unarchived, and the turn made after the
    # unarchive are still there, and the turn was not cancelled by the delete
    assert refused.value.code == "session_unarchived"
    assert "unarchived while the delete waited" in refused.value.message
    session = sessions.get_session(store, sid)
    assert not session.archived
    [tid] = made
    state, cancelled_by = store.redis.hmget(store.keys.turn(tid), "state", "cancelledBy")
    assert state in ("running", "completed") and not cancelled_by
    # And the refusal is in the session's audit trail
    entries = [json.loads(e) for e in store.redis.lrange(store.keys.audit_log(sid), 0, -1)]
    [last] = [e for e in entries if e["action"] == "delete"]
    assert (last["outcome"], json.loads(last["detail"])) == ("refused", {"reason": "unarchived"})


def test_a_delete_whose_session_was_unarchived_and_archived_again_deletes_nothing(
    store: Store, recorder: RecordingDispatcher, cwd: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a busy session unarchived during the delete's wait and archived again by someone
    # else (another transition), a turn of the user's run in between
    sid = sessions.create_session(store, cwd).session_id
    turns.start_turn(store, recorder, sid, "think 30")

    def rearchive(store: Store, sid: str) -> None:
        turns.start_turn(store, recorder, sid, "say mine")
        _end_turns(store, sid)
        archive.archive(store, recorder, sid)

    monkeypatch.setattr(deletion, "census", _unarchived_during(deletion.census, 1, rearchive))

    # When the delete goes on, then it deletes nothing: the archive in place is not its own
    with pytest.raises(SessionUnarchived):
        deletion.delete(store, recorder, sid, stop_activity=True, wait_seconds=5.0)
    assert sessions.get_session(store, sid).archived


def test_a_delete_of_a_session_already_archived_binds_to_that_archive(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    # Given an idle session archived earlier
    sid = sessions.create_session(store, cwd).session_id
    archive.archive(store, recorder, sid)
    # When it is deleted with stopActivity, then the archive in place is the delete's own
    result = deletion.delete(store, recorder, sid, stop_activity=True, wait_seconds=1.0)
    assert result.deleted


def test_over_http_the_refusal_is_409_session_unarchived_and_the_session_stays(
    store: Store, recorder: RecordingDispatcher, cwd: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.helpers import error_shape, rest_client

    monkeypatch.setattr(deletion, "census", _unarchived_during(deletion.census, 1, lambda *_: None))
    with rest_client(store=store, dispatcher=recorder) as client:
        sid = client.post("/sessions", json={"cwd": cwd}).json()["sessionId"]
        client.post(f"/sessions/{sid}/prompt", json={"prompt": "think 30"})
        resp = client.request("DELETE", f"/sessions/{sid}", json={"stopActivity": True})
        error = error_shape(resp, 409, "session_unarchived")
        assert error["data"] == {"sessionId": sid}
        assert "Delete it again" in error["message"]
        assert client.get(f"/sessions/{sid}").json()["archived"] is False
