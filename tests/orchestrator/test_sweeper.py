"""The turn sweeper (``orchestrator/turn/sweeper.py``, ``turn/turn_sweep.lua``) against real
Redis, no worker: each stuck state is built directly in Redis (a turn started with a
recording dispatcher has no step message anywhere and no lease; the running-turn index entry
is written by hand with an old score), so these tests do not depend on who maintains it.

Each test has a key prefix of its own: a sweep acts on every member of the index, and the
run's shared prefix holds other tests' turns."""

from __future__ import annotations

import json
import re
from datetime import datetime

import pytest

from orchestrator.archiving import archive
from orchestrator.models.model import ScriptedModel
from orchestrator.session import sessions
from orchestrator.storage.store import Store
from orchestrator.turn import scripts, steps, sweeper, tools, turns
from orchestrator.turn.turns import TurnState
from tests.helpers import RecordingDispatcher

STUCK = 2.0


def redis_ms(store: Store) -> int:
    sec, usec = store.redis.time()
    return int(sec) * 1000 + int(usec) // 1000


def mark(store: Store, tid: str, age_seconds: float = 10.0) -> None:
    """Index ``tid`` as last progressing ``age_seconds`` ago (Redis's clock)."""
    score = redis_ms(store) - int(age_seconds * 1000)
    store.redis.zadd(store.keys.turns_inflight, {tid: score})


def state(store: Store, tid: str) -> turns.Turn:
    t = turns.get_turn(store, tid)
    assert t is not None
    return t


def steps_sent(recorder: RecordingDispatcher, since: int = 0) -> list[list[object]]:
    return [args for task, args, _ in recorder.sent[since:] if task == "turn.step"]


def turn_events(store: Store, tid: str) -> list[dict[str, object]]:
    rows = store.redis.xrange(store.keys.event_stream, "-", "+")
    out = [json.loads(fields["event"]) for _, fields in rows]
    return [e for e in out if e.get("type") == "turn" and e.get("turnId") == tid]


def run(store: Store, recorder: RecordingDispatcher, **kw: object) -> sweeper.SweepReport:
    return sweeper.sweep(store, recorder, stuck_seconds=STUCK, max_resumes=2, **kw)  # type: ignore[arg-type]


@pytest.fixture
def store(own_store: Store) -> Store:
    """A store on a prefix of this test alone: a sweep acts on every member of the index."""
    return own_store


@pytest.fixture
def sid(store: Store, cwd: str) -> str:
    return sessions.create_session(store, cwd).session_id


@pytest.fixture
def lost(store: Store, recorder: RecordingDispatcher, sid: str) -> str:
    """A running turn whose first step message is lost: recorded, never delivered."""
    tid = turns.start_turn(store, recorder, sid, "say hello")
    recorder.sent.clear()
    mark(store, tid)
    return tid


def test_a_running_turn_whose_step_is_lost_is_dispatched_again_and_the_resume_counted(
    store: Store, recorder: RecordingDispatcher, sid: str, lost: str
) -> None:
    report = run(store, recorder)

    assert report.turns["resumed"] == [lost]
    assert steps_sent(recorder) == [[sid, lost, 0]]
    t = store.redis.hmget(store.keys.turn(lost), "state", "resumes", "resumeStep")
    assert t == ["running", "1", "0"]


def test_a_second_sweep_right_after_a_resume_does_nothing_so_overlapping_sweepers_are_harmless(
    store: Store, recorder: RecordingDispatcher, lost: str
) -> None:
    # Given one sweeper resumed the turn (the script re-scored it on Redis's clock)
    run(store, recorder)
    # When another sweeper runs a moment later
    again = run(store, recorder)
    # Then it leaves the turn alone: one dispatch in all
    assert again.totals == {"resumed": 0, "failed": 0, "settled": 0, "removed": 0}
    assert len(steps_sent(recorder)) == 1


def test_a_resumed_step_runs_once_and_its_late_duplicate_is_dropped(
    store: Store, recorder: RecordingDispatcher, sid: str, lost: str
) -> None:
    run(store, recorder)
    model = ScriptedModel()
    first = steps.run_step(store, recorder, model, tools.run_tool, sid, lost, 0)
    # The original message, redelivered late, is a duplicate of a step already run
    late = steps.run_step(store, recorder, model, tools.run_tool, sid, lost, 0)
    assert (first, late) == ("completed", "completed")
    assert state(store, lost).state == TurnState.COMPLETED
    assert len(store.redis.lrange(store.keys.model_requests(sid), 0, -1)) == 1


def test_a_step_in_flight_holding_its_lease_is_left_alone_however_old_its_progress(
    store: Store, recorder: RecordingDispatcher, lost: str
) -> None:
    store.redis.set(store.keys.step_lease(lost), 0, px=5000)
    assert run(store, recorder).totals["resumed"] == 0
    assert recorder.sent == []


def test_a_turn_with_recent_progress_is_left_alone(
    store: Store, recorder: RecordingDispatcher, lost: str
) -> None:
    mark(store, lost, age_seconds=0)
    assert run(store, recorder).examined == 0
    assert recorder.sent == []


def test_a_step_lost_again_and_again_ends_the_turn_failed_and_starts_the_next(
    store: Store, recorder: RecordingDispatcher, sid: str, lost: str
) -> None:
    # Given a prompt queued behind the lost turn
    queued = turns.start_turn(store, recorder, sid, "say next")
    # When the step is found lost three times (max_resumes=2) without progress
    for _ in range(2):
        assert run(store, recorder).turns["resumed"] == [lost]
        mark(store, lost)  # nothing ran the dispatched copy either
    report = run(store, recorder)

    # Then the turn ends failed with a reason, and the next turn runs
    assert report.turns["failed"] == [lost]
    t = state(store, lost)
    assert t.state == TurnState.FAILED and t.stop_reason == "end_turn"
    assert t.error.startswith("step 0 lost 3 times")
    assert state(store, queued).state == TurnState.RUNNING
    assert steps_sent(recorder)[-1] == [sid, queued, 0]
    assert store.redis.zscore(store.keys.turns_inflight, lost) is None
    # And the turn's event (which settles a pending ACP prompt) and its error message are out
    assert turn_events(store, lost)[-1]["state"] == "failed"
    assert turn_events(store, lost)[-1]["stopReason"] is None  # ACP has no reason for a failure
    last = json.loads(store.redis.lindex(store.keys.history(sid), -1))
    assert last["turnId"] == lost and last["content"]["text"].startswith("error: step 0 lost")


def test_progress_between_losses_starts_the_count_again(
    store: Store, recorder: RecordingDispatcher, lost: str
) -> None:
    run(store, recorder)
    mark(store, lost)
    run(store, recorder)
    # When the turn moves on to its next step, and that one is lost
    store.redis.hset(store.keys.turn(lost), "step", 1)
    mark(store, lost)
    report = run(store, recorder)
    # Then it is resumed, as a first loss of that step
    assert report.turns["resumed"] == [lost]
    assert store.redis.hmget(store.keys.turn(lost), "resumes", "resumeStep") == ["1", "1"]


def test_a_cancelling_turn_whose_step_is_gone_ends_cancelled(
    store: Store, recorder: RecordingDispatcher, sid: str, lost: str
) -> None:
    # Given a stop found the step in flight (cancelling), then the step's worker died
    store.redis.set(store.keys.step_lease(lost), 0, px=5000)
    assert turns.cancel_turns(store, recorder, sid, [lost]) == {lost: "cancelling"}
    assert run(store, recorder).totals["settled"] == 0  # the lease still holds
    store.redis.delete(store.keys.step_lease(lost))

    report = run(store, recorder)

    assert report.turns["settled"] == [lost]
    assert state(store, lost).state == TurnState.CANCELLED
    # endedAt is Redis's clock in the house format (ISO 8601 UTC, milliseconds, Z)
    ended = store.redis.hget(store.keys.turn(lost), "endedAt")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", ended), ended
    at = datetime.fromisoformat(ended).timestamp() * 1000
    assert abs(at - redis_ms(store)) < 60_000
    assert turn_events(store, lost)[-1]["stopReason"] == "cancelled"
    assert store.redis.get(store.keys.active_turn(sid)) is None


def test_index_entries_of_turns_not_running_are_removed(
    store: Store, recorder: RecordingDispatcher, sid: str, lost: str
) -> None:
    queued = turns.start_turn(store, recorder, sid, "say later")
    turns.finish(store, recorder, lost, TurnState.COMPLETED)  # promotes `queued`, then:
    turns.finish(store, recorder, queued, TurnState.COMPLETED)
    for tid in (lost, queued, "turn_doesnotexist000000000000"):
        mark(store, tid)
    store.redis.hset(store.keys.turn(queued), "state", "queued")
    recorder.sent.clear()

    report = run(store, recorder)

    gone = sorted([lost, queued, "turn_doesnotexist000000000000"])
    assert sorted(report.turns["removed"]) == gone
    assert store.redis.zcard(store.keys.turns_inflight) == 0
    assert recorder.sent == []


def test_a_lost_step_of_a_session_archived_with_stop_leaves_the_sweeper_nothing_to_resume(
    store: Store, recorder: RecordingDispatcher, sid: str, lost: str
) -> None:
    # Given a turn whose step was lost, archived with stopActivity and its stop message lost
    # too (a recording dispatcher): the archive's own script ended the turn
    archive.archive(store, RecordingDispatcher(), sid, stop_activity=True)
    before = store.redis.lrange(store.keys.history(sid), 0, -1)
    assert state(store, lost).state == TurnState.CANCELLED
    # When the sweeper passes over an entry left for it
    mark(store, lost)
    report = run(store, recorder)
    # Then it resumes nothing, drops the entry, and the conversation stays as archived
    assert report.turns.get("resumed") is None and steps_sent(recorder) == []
    assert store.redis.zscore(store.keys.turns_inflight, lost) is None
    assert store.redis.lrange(store.keys.history(sid), 0, -1) == before


def open_call(store: Store, tid: str) -> str:
    """Record an in-progress tool call of ``tid``'s step, as its lost copy did."""
    call = {"sessionUpdate": "tool_call", "turnId": tid, "toolCallId": "call_lost"}
    update = {**call, "title": "sleep 60", "kind": "execute", "status": "in_progress"}
    recorded = scripts.turn_record(
        store, turn_id=tid, update_json=json.dumps(update), settle=False, token=""
    )
    assert recorded is scripts.Recorded.APPENDED
    return "call_lost"


def call_results(store: Store, sid: str, call: str) -> list[dict[str, object]]:
    history = [json.loads(raw) for raw in store.redis.lrange(store.keys.history(sid), 0, -1)]
    return [u for u in history if u.get("toolCallId") == call and u["status"] != "in_progress"]


def test_a_turn_failed_by_its_lost_step_settles_the_steps_open_tool_call_failed(
    store: Store, recorder: RecordingDispatcher, sid: str, lost: str
) -> None:
    # Given the lost step had a tool call in progress
    call = open_call(store, lost)
    # When the step is found lost past max_resumes
    for _ in range(2):
        run(store, recorder)
        mark(store, lost)
    assert run(store, recorder).turns["failed"] == [lost]
    # Then its tool call ends failed in the conversation, saying why
    [result] = call_results(store, sid, call)
    assert result["status"] == "failed"
    assert "lost 3 times" in json.dumps(result["content"])


def test_a_cancelling_turn_whose_step_is_gone_settles_its_open_tool_call_cancelled(
    store: Store, recorder: RecordingDispatcher, sid: str, lost: str
) -> None:
    call = open_call(store, lost)
    store.redis.set(store.keys.step_lease(lost), 0, px=5000)
    assert turns.cancel_turns(store, recorder, sid, [lost]) == {lost: "cancelling"}
    store.redis.delete(store.keys.step_lease(lost))
    assert run(store, recorder).turns["settled"] == [lost]
    [result] = call_results(store, sid, call)
    assert result["status"] == "cancelled"


def test_a_turn_that_ends_keeps_no_note_of_a_held_delivery(
    store: Store, recorder: RecordingDispatcher, sid: str, lost: str
) -> None:
    # Given a running turn the sweeper noted as held by a worker that has not begun its step
    # (a resumed step's new delivery, noted after the resume cleared the first one)
    store.redis.hset(store.keys.turn(lost), mapping={"heldTag": "tag-1", "heldMs": "1"})
    # When the turn ends, then the note goes with it
    assert turns.finish(store, recorder, lost, TurnState.COMPLETED)
    assert store.redis.hmget(store.keys.turn(lost), "heldTag", "heldMs") == [None, None]
