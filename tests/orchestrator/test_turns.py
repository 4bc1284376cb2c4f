"""Turns: queueing, named cancels, the archive refusal, and steps run without a worker."""

from __future__ import annotations

import json
import threading
import time

import pytest

from orchestrator.archiving import archive, deletion
from orchestrator.errors import InvalidParams, SessionArchived, SessionNotFound
from orchestrator.models.model import ScriptedModel
from orchestrator.session import sessions
from orchestrator.storage import audit, metrics
from orchestrator.storage.store import Store
from orchestrator.turn import steps, tools, turns
from orchestrator.turn.turns import TurnState
from tests.helpers import RecordingDispatcher, wait_for
from tests.orchestrator.support import begin_step, chain, model_requests


def state(store: Store, tid: str) -> TurnState:
    t = turns.get_turn(store, tid)
    assert t is not None, tid
    return t.state


def steps_sent(recorder: RecordingDispatcher, since: int = 0) -> list[list[object]]:
    return [args for task, args, queue in recorder.sent[since:] if task == "turn.step"]


def step(store: Store, recorder: RecordingDispatcher, sid: str, tid: str, index: int) -> str:
    return steps.run_step(store, recorder, ScriptedModel(), tools.run_tool, sid, tid, index)


def history(store: Store, sid: str) -> list[dict[str, object]]:
    return [json.loads(h) for h in store.redis.lrange(store.keys.history(sid), 0, -1)]


@pytest.fixture
def sid(store: Store, cwd: str) -> str:
    return sessions.create_session(store, cwd).session_id


# --------------------------------------------------------------------------- starting turns


def test_a_prompt_on_an_idle_session_runs_and_sends_its_first_step(
    store: Store, recorder: RecordingDispatcher, sid: str
) -> None:
    tid = turns.start_turn(store, recorder, sid, "think 5")

    assert state(store, tid) == TurnState.RUNNING
    assert recorder.sent == [("turn.step", [sid, tid, 0], "turn")]
    assert store.redis.get(store.keys.active_turn(sid)) == tid
    # The prompt enters the conversation when its first step is admitted, and only once
    assert history(store, sid) == []
    assert begin_step(store, tid)
    store.redis.delete(store.keys.step_lease(tid))
    assert begin_step(store, tid)
    assert history(store, sid) == [
        {
            "sessionUpdate": "user_message_chunk",
            "turnId": tid,
            "content": {"type": "text", "text": "think 5"},
        }
    ]


def test_a_second_prompt_queues_behind_the_first(
    store: Store, recorder: RecordingDispatcher, sid: str
) -> None:
    first = turns.start_turn(store, recorder, sid, "think 5")
    second = turns.start_turn(store, recorder, sid, "say hi")

    assert state(store, first) == TurnState.RUNNING
    assert state(store, second) == TurnState.QUEUED
    assert steps_sent(recorder) == [[sid, first, 0]]
    assert store.redis.get(store.keys.active_turn(sid)) == first


def test_when_the_running_turn_ends_the_oldest_queued_turn_starts(
    store: Store, recorder: RecordingDispatcher, sid: str
) -> None:
    # Given one running and two queued turns, prompted a few milliseconds apart
    first = turns.start_turn(store, recorder, sid, "think 5")
    time.sleep(0.003)
    second = turns.start_turn(store, recorder, sid, "say two")
    time.sleep(0.003)
    third = turns.start_turn(store, recorder, sid, "say three")
    mark = len(recorder.sent)
    # When the running one completes
    assert turns.finish(store, recorder, first, TurnState.COMPLETED) is True
    # Then only the oldest queued one starts, with its first step sent
    assert state(store, second) == TurnState.RUNNING
    assert state(store, third) == TurnState.QUEUED
    assert steps_sent(recorder, mark) == [[sid, second, 0]]


def test_prompts_queued_within_one_millisecond_run_in_the_order_they_were_sent(
    store: Store, recorder: RecordingDispatcher, sid: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a running turn and ten prompts queued behind it, all in the same millisecond
    monkeypatch.setattr(store, "now_ms", lambda: 1_800_000_000_000)
    made = [turns.start_turn(store, recorder, sid, f"say {i}") for i in range(11)]
    # When each running turn completes in turn
    ran = [made[0]]
    for _ in range(10):
        turns.finish(store, recorder, ran[-1], TurnState.COMPLETED)
        ran.append(store.redis.get(store.keys.active_turn(sid)))
    # Then they ran in the order they were prompted
    assert ran == made


def test_a_prompt_on_an_unknown_or_deleted_session_raises_session_not_found(
    store: Store, recorder: RecordingDispatcher, sid: str
) -> None:
    sessions.delete_session(store, sid)
    for target in (sid, "sess_" + "0" * 24, "../x"):
        with pytest.raises(SessionNotFound):
            turns.start_turn(store, recorder, target, "say hi")
    assert recorder.sent == []


@pytest.mark.parametrize("prompt", [None, 5, "x" * (turns.MAX_PROMPT + 1)])
def test_a_prompt_that_is_not_a_string_or_too_long_is_invalid_params(
    store: Store, recorder: RecordingDispatcher, sid: str, prompt: object
) -> None:
    with pytest.raises(InvalidParams):
        turns.start_turn(store, recorder, sid, prompt)  # type: ignore[arg-type]
    assert recorder.sent == []


# --------------------------------------------------------------------------- cancelling


def test_a_late_stop_naming_an_old_finished_turn_leaves_the_newer_turn_running(
    store: Store, recorder: RecordingDispatcher, sid: str
) -> None:
    # Given a first turn that finished and a newer one now running
    old = turns.start_turn(store, recorder, sid, "say one")
    turns.finish(store, recorder, old, TurnState.COMPLETED)
    new = turns.start_turn(store, recorder, sid, "think 5")
    mark = len(recorder.sent)
    # When a stop naming only the old turn arrives late
    outcomes = turns.cancel_turns(store, recorder, sid, [old])
    # Then it reports the old turn as already completed and the new turn is untouched
    assert outcomes == {old: "completed"}
    assert state(store, old) == TurnState.COMPLETED
    assert state(store, new) == TurnState.RUNNING
    assert store.redis.get(store.keys.active_turn(sid)) == new
    assert recorder.sent[mark:] == []


def test_cancel_turns_cancels_only_the_named_turns(
    store: Store, recorder: RecordingDispatcher, sid: str
) -> None:
    first = turns.start_turn(store, recorder, sid, "think 5")
    second = turns.start_turn(store, recorder, sid, "say two")
    third = turns.start_turn(store, recorder, sid, "say three")

    assert turns.cancel_turns(store, recorder, sid, [third]) == {third: "cancelled"}

    assert [state(store, t) for t in (first, second, third)] == [
        TurnState.RUNNING,
        TurnState.QUEUED,
        TurnState.CANCELLED,
    ]


def test_a_cancelled_queued_turn_is_discarded(
    store: Store, recorder: RecordingDispatcher, sid: str
) -> None:
    # Given a running turn and one queued behind it
    running = turns.start_turn(store, recorder, sid, "think 5")
    queued = turns.start_turn(store, recorder, sid, "say later")
    # When the queued one is cancelled
    assert turns.cancel_turns(store, recorder, sid, [queued]) == {queued: "cancelled"}
    # Then it leaves the live set for good: it does not start when the running one ends
    assert state(store, queued) == TurnState.CANCELLED
    assert store.redis.zrange(store.keys.live_turns(sid), 0, -1) == [running]
    mark = len(recorder.sent)
    turns.finish(store, recorder, running, TurnState.COMPLETED)
    assert steps_sent(recorder, mark) == []
    assert state(store, queued) == TurnState.CANCELLED
    assert store.redis.get(store.keys.active_turn(sid)) is None


def test_cancelling_the_running_turn_between_steps_starts_the_next_one(
    store: Store, recorder: RecordingDispatcher, sid: str
) -> None:
    running = turns.start_turn(store, recorder, sid, "think 5")
    queued = turns.start_turn(store, recorder, sid, "say next")
    mark = len(recorder.sent)

    assert turns.cancel_turns(store, recorder, sid, [running]) == {running: "cancelled"}

    assert state(store, running) == TurnState.CANCELLED
    assert state(store, queued) == TurnState.RUNNING
    assert steps_sent(recorder, mark) == [[sid, queued, 0]]


def test_cancelling_a_turn_with_a_step_in_flight_leaves_it_to_the_step(
    store: Store, recorder: RecordingDispatcher, sid: str
) -> None:
    # Given a turn whose step is in flight (its lease is held)
    tid = turns.start_turn(store, recorder, sid, "think 5")
    assert begin_step(store, tid)
    # When it is cancelled
    assert turns.cancel_turns(store, recorder, sid, [tid]) == {tid: "cancelling"}
    # Then it is cancelling, and a redelivered copy of its step settles it as cancelled
    assert state(store, tid) == TurnState.CANCELLING
    store.redis.delete(store.keys.step_lease(tid))
    assert step(store, recorder, sid, tid, 0) == "cancelling"
    assert state(store, tid) == TurnState.CANCELLED
    assert len(model_requests(store, sid)) == 1  # the step that began; the copy made none


def busy_lineage(store: Store, recorder: RecordingDispatcher, cwd: str) -> tuple[str, ...]:
    """A parent with a turn between steps and its child with a turn mid-step (the step's copy
    ``a-copy`` holds it): ``(parent, child, turn between steps, turn in flight)``."""
    parent, child = (s.session_id for s in chain(store, 1, cwd))
    between = turns.start_turn(store, recorder, parent, "think 5")
    in_flight = turns.start_turn(store, recorder, child, "think 5")
    assert begin_step(store, in_flight)
    return parent, child, between, in_flight


def test_a_turn_an_archive_stops_says_so_whichever_path_ends_it(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    # Given a parent with a turn between steps, and its child with a turn mid-step and one
    # queued behind it
    parent, child, between, in_flight = busy_lineage(store, recorder, cwd)
    queued = turns.start_turn(store, recorder, child, "say later")

    # When the parent is archived with its work stopped
    archive.archive(store, recorder, parent, stop_activity=True)

    # Then the turns its script ended record the archive, and so does the one mid-step
    for tid in (between, queued):
        turn = turns.get_turn(store, tid)
        assert turn is not None and turn.state is TurnState.CANCELLED
        assert (turn.stop_reason, turn.cancelled_by) == ("cancelled", "archive")
    assert state(store, in_flight) == TurnState.CANCELLING
    # once the step in flight settles it (as it does on seeing it cancelling), it still does
    ended = turns.finish(store, recorder, in_flight, TurnState.CANCELLED, token="a-copy")
    assert ended
    settled = turns.get_turn(store, in_flight)
    assert settled is not None and settled.state is TurnState.CANCELLED
    assert (settled.stop_reason, settled.cancelled_by) == ("cancelled", "archive")
    assert settled.to_wire()["cancelledBy"] == "archive"


def test_the_turns_a_delete_stops_record_the_delete_whichever_path_ends_them(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    # Given a parent with a turn between steps, and its child with a turn mid-step
    parent, child, between, in_flight = busy_lineage(store, recorder, cwd)
    # When the parent is deleted with its work stopped (its archive first), the step in flight
    # settling its turn meanwhile as it does on seeing it cancelling
    settle = threading.Timer(
        0.2, lambda: turns.finish(store, recorder, in_flight, TurnState.CANCELLED, token="a-copy")
    )
    settle.start()
    result = deletion.delete(store, recorder, parent, stop_activity=True, wait_seconds=10)
    settle.join()
    # Then both turns say a delete stopped them, not an archive
    assert result.deleted
    for tid in (between, in_flight):
        turn = turns.get_turn(store, tid)
        assert turn is not None and turn.state is TurnState.CANCELLED
        assert (turn.stop_reason, turn.cancelled_by) == ("cancelled", "delete")


def test_a_turn_a_user_cancels_names_no_archive(
    store: Store, recorder: RecordingDispatcher, sid: str
) -> None:
    tid = turns.start_turn(store, recorder, sid, "think 5")
    assert turns.cancel_turns(store, recorder, sid, [tid]) == {tid: "cancelled"}
    turn = turns.get_turn(store, tid)
    assert turn is not None and turn.cancelled_by == ""
    assert "cancelledBy" not in turn.to_wire()


def test_cancel_session_turns_stops_running_and_queued_turns(
    store: Store, recorder: RecordingDispatcher, sid: str
) -> None:
    first = turns.start_turn(store, recorder, sid, "think 5")
    second = turns.start_turn(store, recorder, sid, "say two")
    mark = len(recorder.sent)

    outcomes = turns.cancel_session_turns(store, recorder, sid)

    assert outcomes == {first: "cancelled", second: "cancelled"}
    assert recorder.sent[mark:] == [], "a cancelled queued turn must not be promoted"
    assert store.redis.zcard(store.keys.live_turns(sid)) == 0


def test_cancelling_no_turns_or_unknown_turns_is_harmless(
    store: Store, recorder: RecordingDispatcher, sid: str
) -> None:
    tid = turns.start_turn(store, recorder, sid, "think 5")
    assert turns.cancel_turns(store, recorder, sid, []) == {}
    assert turns.cancel_turns(store, recorder, sid, ["turn_nope"]) == {"turn_nope": "missing"}
    assert state(store, tid) == TurnState.RUNNING


def test_a_terminal_turn_does_not_move_again(
    store: Store, recorder: RecordingDispatcher, sid: str
) -> None:
    tid = turns.start_turn(store, recorder, sid, "say hi")
    assert turns.finish(store, recorder, tid, TurnState.COMPLETED) is True
    for target in (TurnState.CANCELLED, TurnState.FAILED, TurnState.BLOCKED):
        assert turns.finish(store, recorder, tid, target) is False
    assert state(store, tid) == TurnState.COMPLETED


def test_the_transition_table_has_no_way_out_of_a_terminal_state() -> None:
    for terminal in (TurnState.COMPLETED, TurnState.CANCELLED, TurnState.BLOCKED, TurnState.FAILED):
        assert turns.TRANSITIONS[terminal] == frozenset()
        assert terminal not in turns.LIVE_STATES
    assert turns.sources_of(TurnState.CANCELLED).split(",") == ["queued", "running", "cancelling"]


# --------------------------------------------------------------------------- archived sessions


def test_a_user_prompt_on_an_archived_session_raises_session_archived(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    # Given an archived session with a subagent archived with it
    root, child = chain(store, 1, cwd)
    archive.archive(store, recorder, root.session_id)
    # When a user prompts either
    for s in (root, child):
        with pytest.raises(SessionArchived):
            turns.start_turn(store, recorder, s.session_id, "say hi")
        # Then nothing is stored or sent
        assert store.redis.zcard(store.keys.live_turns(s.session_id)) == 0
        assert store.redis.llen(store.keys.history(s.session_id)) == 0
    assert recorder.sent == []


def test_a_wake_up_of_an_archived_session_stores_nothing_and_is_audited_and_counted(
    store: Store, recorder: RecordingDispatcher, sid: str
) -> None:
    # Given an archived session
    archive.archive(store, recorder, sid)
    before = metrics.snapshot(store)
    updated = sessions.get_session(store, sid).updated_at
    for source in ("reminder", "subagent_result"):
        # When a wake-up tries to start a turn for it
        with pytest.raises(SessionArchived):
            turns.start_turn(store, recorder, sid, "say hi", source=source)
    # Then nothing is stored or sent, and the conversation and updatedAt are as archived
    assert store.redis.zcard(store.keys.live_turns(sid)) == 0
    assert history(store, sid) == [] and steps_sent(recorder) == []
    assert sessions.get_session(store, sid).updated_at == updated
    # And each refusal is counted and audited
    old = before.counters[metrics.WAKEUPS_REFUSED.name]
    new = metrics.snapshot(store).counters[metrics.WAKEUPS_REFUSED.name]
    gained = {k[0]: n - old.get(k, 0) for k, n in new.items() if n != old.get(k, 0)}
    assert gained == {"reminder": 1, "subagent_result": 1}
    entries = audit.read(store, sid)
    assert [(e["action"], e["outcome"]) for e in entries[:2]] == [("wakeup", "refused")] * 2


# --------------------------------------------------------------------------- steps


def test_a_say_step_completes_the_turn_with_one_model_request(
    store: Store, recorder: RecordingDispatcher, sid: str
) -> None:
    # Given a running turn "say hi"
    tid = turns.start_turn(store, recorder, sid, "say hi")
    # When its only step runs
    outcome = step(store, recorder, sid, tid, 0)
    # Then the turn is completed (end_turn) after exactly one model request
    assert outcome == "completed"
    t = turns.get_turn(store, tid)
    assert t is not None and (t.state, t.stop_reason) == (TurnState.COMPLETED, "end_turn")
    [request] = [json.loads(r) for r in model_requests(store, sid)]
    assert (request["turnId"], request["step"]) == (tid, 0)
    # And the answer is in the conversation
    assert history(store, sid)[-1] == {
        "sessionUpdate": "agent_message_chunk",
        "turnId": tid,
        "content": {"type": "text", "text": "hi"},
    }
    assert store.redis.get(store.keys.active_turn(sid)) is None
    assert not store.redis.exists(store.keys.step_lease(tid))


def test_an_archive_with_stop_ends_a_turn_between_steps_and_its_late_step_does_nothing(
    store: Store, recorder: RecordingDispatcher, sid: str
) -> None:
    # Given a running turn, and the session then archived with stopActivity
    tid = turns.start_turn(store, recorder, sid, "say hi")
    archive.archive(store, recorder, sid, stop_activity=True)
    # Then the archive itself ended the turn
    assert state(store, tid) == TurnState.CANCELLED
    # And its step, arriving late, is dropped: the model was never asked
    assert step(store, recorder, sid, tid, 0) == "cancelled"
    assert model_requests(store, sid) == [] and history(store, sid) == []


def test_a_step_of_a_deleted_session_is_refused_and_makes_no_model_request(
    store: Store, recorder: RecordingDispatcher, sid: str
) -> None:
    # Given a running turn, and the session then deleted
    tid = turns.start_turn(store, recorder, sid, "say hi")
    sessions.delete_session(store, sid)
    # When the turn's step runs
    outcome = step(store, recorder, sid, tid, 0)
    # Then it is refused, the turn ends blocked, and the model was never asked
    assert outcome == "refused"
    t = turns.get_turn(store, tid)
    assert t is not None
    assert (t.state, t.stop_reason, t.error) == (TurnState.BLOCKED, "cancelled", "gate: deleted")
    assert model_requests(store, sid) == []


def test_a_step_of_a_subagent_under_an_archived_parent_is_refused(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    root, child = chain(store, 1, cwd)
    tid = turns.start_turn(store, recorder, child.session_id, "say hi", source="subagent")
    assert begin_step(store, tid)
    archive.archive(store, recorder, root.session_id, stop_activity=True)
    assert state(store, tid) == TurnState.CANCELLING
    store.redis.delete(store.keys.step_lease(tid))  # its worker died mid-step

    assert step(store, recorder, child.session_id, tid, 0) == "refused"
    assert state(store, tid) == TurnState.CANCELLED
    assert len(model_requests(store, child.session_id)) == 1  # only the step that began


def test_a_duplicate_of_a_step_already_run_is_stale(
    store: Store, recorder: RecordingDispatcher, sid: str
) -> None:
    # Given a two-step turn whose first step ran
    tid = turns.start_turn(store, recorder, sid, "say one\nsay two")
    assert step(store, recorder, sid, tid, 0) == "ran"
    assert steps_sent(recorder)[-1] == [sid, tid, 1]
    # When the first step is delivered again
    outcome = step(store, recorder, sid, tid, 0)
    # Then it is dropped as stale: no second model request, the turn still on step 1
    assert outcome == "stale"
    assert len(model_requests(store, sid)) == 1
    t = turns.get_turn(store, tid)
    assert t is not None and (t.state, t.step) == (TurnState.RUNNING, 1)
    # And the second step completes the turn
    assert step(store, recorder, sid, tid, 1) == "completed"
    assert len(model_requests(store, sid)) == 2


def test_a_copy_of_a_step_that_is_in_flight_is_dropped(
    store: Store, recorder: RecordingDispatcher, sid: str
) -> None:
    tid = turns.start_turn(store, recorder, sid, "say hi")
    assert begin_step(store, tid)

    assert step(store, recorder, sid, tid, 0) == "inflight"
    assert len(model_requests(store, sid)) == 1  # only the step that began
    assert state(store, tid) == TurnState.RUNNING


def test_a_step_of_a_turn_that_is_no_longer_running_does_nothing(
    store: Store, recorder: RecordingDispatcher, sid: str
) -> None:
    tid = turns.start_turn(store, recorder, sid, "say hi")
    turns.cancel_turns(store, recorder, sid, [tid])

    assert step(store, recorder, sid, tid, 0) == "cancelled"
    assert model_requests(store, sid) == []


def test_an_unknown_instruction_fails_the_turn_naming_the_line(
    store: Store, recorder: RecordingDispatcher, sid: str
) -> None:
    # Given a turn whose second line is not an instruction
    tid = turns.start_turn(store, recorder, sid, "say hi\nfly away")
    assert step(store, recorder, sid, tid, 0) == "ran"
    # When that line's step runs
    assert step(store, recorder, sid, tid, 1) == "failed"
    # Then the turn failed with a message naming line 2 and the word it did not know
    t = turns.get_turn(store, tid)
    assert t is not None
    assert (t.state, t.stop_reason) == (TurnState.FAILED, "end_turn")
    assert "line 2" in t.error and "'fly'" in t.error
    assert "line 2" in str(history(store, sid)[-1]["content"])


def test_a_failed_turn_starts_the_next_queued_one(
    store: Store, recorder: RecordingDispatcher, sid: str
) -> None:
    bad = turns.start_turn(store, recorder, sid, "think abc")
    queued = turns.start_turn(store, recorder, sid, "say next")

    assert step(store, recorder, sid, bad, 0) == "failed"

    assert state(store, queued) == TurnState.RUNNING
    assert steps_sent(recorder)[-1] == [sid, queued, 0]


def test_a_remind_step_stores_a_reminder_for_the_session(
    store: Store, recorder: RecordingDispatcher, sid: str
) -> None:
    tid = turns.start_turn(store, recorder, sid, "remind 60 say later")

    assert step(store, recorder, sid, tid, 0) == "completed"

    [rid] = store.redis.smembers(store.keys.live_reminders(sid))
    assert store.redis.hget(store.keys.reminder(rid), "prompt") == "say later"
    updates = [h["sessionUpdate"] for h in history(store, sid)]
    assert updates[-2:] == ["tool_call", "tool_call_update"]


def test_a_finished_subagent_turn_wakes_its_parent(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    # Given a subagent's first turn
    root, child = chain(store, 1, cwd)
    c = child.session_id
    tid = turns.start_turn(store, recorder, c, "say done", source="subagent")
    # When it completes
    assert step(store, recorder, c, tid, 0) == "completed"
    # Then the parent gets a turn of its own reporting it, and its first step is sent
    [wake] = store.redis.zrange(store.keys.live_turns(root.session_id), 0, -1)
    t = turns.get_turn(store, wake)
    assert t is not None
    assert (t.source, t.prompt) == ("subagent_result", f"say subagent {c} finished")
    assert steps_sent(recorder)[-1] == [root.session_id, wake, 0]


# --------------------------------------------------------------------------- worker shutdown


def test_a_worker_shutting_down_hands_its_step_on_and_the_turn_stays_at_that_step(
    store: Store, recorder: RecordingDispatcher, sid: str
) -> None:
    # Given a turn in a 30 s model request on a worker
    stopping = threading.Event()
    tid = turns.start_turn(store, recorder, sid, "think 30\nsay after")
    mark = len(recorder.sent)
    outcome: list[str] = []

    def run() -> None:
        model = ScriptedModel()
        outcome.append(
            steps.run_step(store, recorder, model, tools.run_tool, sid, tid, 0, stopping=stopping)
        )

    runner = threading.Thread(target=run)
    runner.start()
    wait_for(lambda: model_requests(store, sid), 5, message="the model request")
    # When the worker starts shutting down
    stopping.set()
    runner.join(5)
    # Then the request is aborted, the lease dropped and the same step sent again
    assert outcome == ["handed_off"]
    assert steps_sent(recorder, mark) == [[sid, tid, 0]]
    assert not store.redis.exists(store.keys.step_lease(tid))
    t = turns.get_turn(store, tid)
    assert t is not None and (t.state, t.step) == (TurnState.RUNNING, 0)
    # And another worker can begin it there; the prompt was said once
    assert begin_step(store, tid)
    said = [u for u in history(store, sid) if u["sessionUpdate"] == "user_message_chunk"]
    assert len(said) == 1
