"""The turn runtime behind the model seam, with models of the tests' own: the model says when
the turn ends, the step limit, streamed text, and what a step sees."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

import pytest

from orchestrator.models.model import (
    Emit,
    Role,
    StepAnswer,
    StepRequest,
    StopReason,
    ToolCall,
    Usage,
)
from orchestrator.session import sessions
from orchestrator.storage.store import Store
from orchestrator.turn import tools, turns
from tests.helpers import RecordingDispatcher, wait_for
from tests.orchestrator.support import run_turn

Answer = Callable[[StepRequest, threading.Event, Emit], StepAnswer]


class FakeModel:
    """Answers each step with ``answer`` and keeps every request it saw."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.requests: list[StepRequest] = []

    def step(self, request: StepRequest, cancel: threading.Event, emit: Emit) -> StepAnswer:
        self.requests.append(request)
        return self.answer(request, cancel, emit)


def chunks(store: Store, sid: str) -> list[str]:
    found = [json.loads(h) for h in store.redis.lrange(store.keys.history(sid), 0, -1)]
    return [u["content"]["text"] for u in found if u["sessionUpdate"] == "agent_message_chunk"]


@pytest.fixture
def sid(store: Store, cwd: str) -> str:
    return sessions.create_session(store, cwd).session_id


@pytest.mark.parametrize("stop", [StopReason.END_TURN, StopReason.MAX_TOKENS, StopReason.REFUSAL])
def test_the_model_ends_the_turn_with_its_stop_reason(
    store: Store, recorder: RecordingDispatcher, sid: str, stop: StopReason
) -> None:
    model = FakeModel(lambda r, c, emit: StepAnswer(stop=stop, usage=Usage(3, 4)))

    tid = run_turn(store, recorder, sid, model)

    turn = turns.get_turn(store, tid)
    assert turn is not None
    assert (turn.state.value, turn.stop_reason, len(model.requests)) == ("completed", stop, 1)
    assert sessions.get_session(store, sid).usage == {"inputTokens": 3, "outputTokens": 4}


def test_a_turn_that_never_ends_stops_at_the_step_limit(
    store: Store, recorder: RecordingDispatcher, sid: str, store_with: Any
) -> None:
    bounded = store_with(max_turn_requests=4)
    model = FakeModel(lambda r, c, emit: StepAnswer(stop=None))
    tid = run_turn(bounded, recorder, sid, model)

    turn = turns.get_turn(store, tid)
    assert turn is not None
    assert (turn.state.value, turn.stop_reason) == ("completed", "max_turn_requests")
    assert [r.index for r in model.requests] == [0, 1, 2, 3]


def test_a_step_sees_the_prompt_the_tools_and_the_last_steps_tool_result(
    store: Store, recorder: RecordingDispatcher, sid: str
) -> None:
    def answer(request: StepRequest, cancel: threading.Event, emit: Emit) -> StepAnswer:
        if request.index == 0:
            return StepAnswer((ToolCall("shell", '{"command": "echo seen-$((1+1))"}'),))
        return StepAnswer(stop=StopReason.END_TURN)

    model = FakeModel(answer)
    run_turn(store, recorder, sid, model)

    first, second = model.requests
    assert [(m.role, m.text) for m in first.conversation] == [(Role.USER, "do the thing")]
    assert {t.name for t in first.tools} == {"shell", "start_job", "spawn_subagent", "set_reminder"}
    call, result = second.conversation[-2:]
    assert (call.role, call.tool_calls[0].name) == (Role.ASSISTANT, "shell")
    assert result.role is Role.TOOL and result.call_id == call.tool_calls[0].call_id
    assert "seen-2" in result.text


def test_streamed_pieces_are_joined_and_text_held_back_lands_while_the_model_still_works(
    store: Store, recorder: RecordingDispatcher, sid: str
) -> None:
    # Given a model that streams three pieces at once and then keeps working
    landed = threading.Event()

    def answer(request: StepRequest, cancel: threading.Event, emit: Emit) -> StepAnswer:
        for piece in ("one ", "two ", "three"):
            emit(piece)
        landed.wait(10)
        return StepAnswer(stop=StopReason.END_TURN)

    runner = threading.Thread(target=run_turn, args=(store, recorder, sid, FakeModel(answer)))
    runner.start()
    try:
        # Then the first piece lands at once and the rest lands while the model still works
        wait_for(lambda: chunks(store, sid) == ["one ", "two three"], 10, message="the text")
    finally:
        landed.set()
        runner.join(10)
    assert chunks(store, sid) == ["one ", "two three"]


def _tool_results(store: Store, sid: str) -> list[dict[str, object]]:
    found = [json.loads(h) for h in store.redis.lrange(store.keys.history(sid), 0, -1)]
    return [u for u in found if u["sessionUpdate"] == "tool_call_update"]


def _one_call(arguments: str) -> FakeModel:
    def answer(request: StepRequest, cancel: threading.Event, emit: Emit) -> StepAnswer:
        if request.index == 0:
            return StepAnswer((ToolCall("shell", arguments),))
        return StepAnswer(stop=StopReason.END_TURN)

    return FakeModel(answer)


def test_a_shell_command_over_its_timeout_is_killed_and_a_tool_error(
    store: Store, recorder: RecordingDispatcher, tmp_path: object
) -> None:
    sid = sessions.create_session(store, str(tmp_path)).session_id
    model = _one_call('{"command": "echo started; sleep 30", "timeout_seconds": 0.3}')

    run_turn(store, recorder, sid, model)

    [result] = _tool_results(store, sid)
    text = result["content"][0]["content"]["text"]  # type: ignore[index]
    assert result["status"] == "failed"
    assert "timed out after 0.3s" in text and "started" in text
    assert "timed out after 0.3s" in model.requests[1].conversation[-1].text


def test_a_shell_commands_output_is_cut_to_its_bound(
    store: Store, recorder: RecordingDispatcher, tmp_path: object
) -> None:
    sid = sessions.create_session(store, str(tmp_path)).session_id
    model = _one_call('{"command": "head -c 100000 /dev/zero | tr \\"\\\\0\\" a"}')

    run_turn(store, recorder, sid, model)

    [result] = _tool_results(store, sid)
    text = str(result["content"][0]["content"]["text"])  # type: ignore[index]
    assert result["status"] == "completed"
    keep = tools.OUTPUT_MAX_BYTES
    assert text.splitlines()[1:] == [
        "a" * keep,
        f"(output cut to its first {keep} of 100000 bytes)",
    ]


def test_a_shell_command_in_a_cwd_missing_on_the_worker_runs_in_an_empty_scratch_directory(
    store: Store, recorder: RecordingDispatcher, sid: str
) -> None:
    run_turn(store, recorder, sid, _one_call('{"command": "ls -A | wc -l"}'))

    [result] = _tool_results(store, sid)
    text = str(result["content"][0]["content"]["text"])  # type: ignore[index]
    assert "is not a directory on this worker: ran in" in text
    assert text.splitlines()[-1].strip() == "0"


def test_a_model_that_breaks_fails_its_turn_once_with_what_broke(
    store: Store, recorder: RecordingDispatcher, sid: str
) -> None:
    # Given a backend that raises something other than ModelError (a fault of its own, or
    # what its server sent)
    def broken(r: StepRequest, c: threading.Event, emit: Emit) -> StepAnswer:
        raise KeyError("choices")

    model = FakeModel(broken)

    # When its turn runs
    tid = run_turn(store, recorder, sid, model)

    # Then the turn failed naming it, after one request (not resumed as a lost step)
    turn = turns.get_turn(store, tid)
    assert turn is not None and turn.state.value == "failed"
    assert turn.error == "the model backend broke (KeyError: 'choices')"
    assert len(model.requests) == 1


def test_the_text_of_a_step_is_cut_at_its_bound_and_fails_the_turn(
    store: Store, recorder: RecordingDispatcher, sid: str, store_with: Any
) -> None:
    # Given a bound of 10 bytes of text a step and a model saying 4 bytes at a time, forever
    bounded = store_with(model_text_max_bytes=10)
    said: list[str] = []

    def endless(r: StepRequest, c: threading.Event, emit: Emit) -> StepAnswer:
        while True:
            emit("\u00e9\u00e9")  # 4 bytes of UTF-8
            said.append("\u00e9\u00e9")

    tid = run_turn(bounded, recorder, sid, FakeModel(endless))

    # Then what landed is the first 10 bytes (whole characters) and the turn failed saying so
    assert len(said) == 2
    assert "".join(chunks(store, sid)[:-1]) == "\u00e9" * 5
    turn = turns.get_turn(store, tid)
    assert turn is not None and turn.state.value == "failed"
    assert "passed 10 bytes of text in one step (FLEET_MODEL_TEXT_MAX_BYTES)" in turn.error
