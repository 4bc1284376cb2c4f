"""The scripted model: instructions, their parsing errors, and its steps."""

from __future__ import annotations

import threading

import pytest

from orchestrator.models.model import (
    MAX_SECONDS,
    Instruction,
    Message,
    ModelError,
    Role,
    ScriptedModel,
    StepAnswer,
    StepRequest,
    StopReason,
    ToolCall,
    Verb,
    parse_instruction,
    prompt_lines,
)

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("say hello there", Instruction(Verb.SAY, text="hello there")),
        ("say", Instruction(Verb.SAY, text="")),
        ("think 2.5", Instruction(Verb.THINK, seconds=2.5)),
        ("think 0", Instruction(Verb.THINK, seconds=0.0)),
        ("exec 3", Instruction(Verb.EXEC, seconds=3.0)),
        ("run 30", Instruction(Verb.RUN, seconds=30.0)),
        ("spawn say hi", Instruction(Verb.SPAWN, text="say hi")),
        ("spawn think 1|say done", Instruction(Verb.SPAWN, text="think 1\nsay done")),
        ("remind 60 say hi", Instruction(Verb.REMIND, seconds=60.0, text="say hi")),
        (
            "remind 1.5 say  two words ",
            Instruction(Verb.REMIND, seconds=1.5, text="say  two words"),
        ),
        (f"think {MAX_SECONDS:g}", Instruction(Verb.THINK, seconds=MAX_SECONDS)),
    ],
)
def test_each_instruction_parses_to_its_action(line: str, expected: Instruction) -> None:
    assert parse_instruction(line, 1) == expected


@pytest.mark.parametrize("verb", ["think", "exec", "run"])
@pytest.mark.parametrize("seconds", ["-1", "nan", "inf", "-inf", "abc", "1e9", "86401", ""])
def test_bad_seconds_raise_model_error_naming_the_line(verb: str, seconds: str) -> None:
    with pytest.raises(ModelError, match=r"^line 7\b"):
        parse_instruction(f"{verb} {seconds}".strip(), 7)


@pytest.mark.parametrize("seconds", ["-1", "nan", "abc", "1e9"])
def test_bad_remind_seconds_raise_model_error_naming_the_line(seconds: str) -> None:
    with pytest.raises(ModelError, match=r"^line 3\b"):
        parse_instruction(f"remind {seconds} say hi", 3)


@pytest.mark.parametrize(
    ("line", "fragment"),
    [
        ("spawn", "spawn needs"),
        ("spawn   ", "spawn needs"),
        ("remind 60", "remind needs"),
        ("remind", "remind needs"),
        ("fly away", "unknown instruction 'fly'"),
        ("SAY hi", "unknown instruction 'SAY'"),
        ("", "unknown instruction ''"),
    ],
)
def test_incomplete_or_unknown_instructions_raise_model_error_naming_the_line(
    line: str, fragment: str
) -> None:
    with pytest.raises(ModelError) as raised:
        parse_instruction(line, 4)
    assert str(raised.value).startswith("line 4")
    assert fragment in str(raised.value)


def test_prompt_lines_are_the_non_blank_lines_stripped() -> None:
    assert prompt_lines("  say a \n\n   \nthink 1\n") == ["say a", "think 1"]
    assert prompt_lines("") == []


def _request(index: int, prompt: str) -> StepRequest:
    conversation = [Message(Role.USER, "an earlier prompt"), Message(Role.ASSISTANT, "ok")]
    return StepRequest("sess_x", "turn_x", index, [*conversation, Message(Role.USER, prompt)], [])


def _step(
    index: int, prompt: str, cancel: threading.Event | None = None
) -> tuple[StepAnswer, list[str]]:
    said: list[str] = []
    answer = ScriptedModel().step(_request(index, prompt), cancel or threading.Event(), said.append)
    return answer, said


def test_a_scripted_step_answers_its_own_line_of_the_last_prompt() -> None:
    answer, said = _step(1, "say first\n\nsay second\nsay third")
    assert said == ["second"]
    assert answer == StepAnswer(stop=None)


def test_the_scripted_turn_ends_with_its_last_line() -> None:
    answer, said = _step(2, "say a\n\nthink 0\nsay b")
    assert (said, answer.stop) == (["b"], StopReason.END_TURN)


def test_an_empty_prompt_is_one_empty_message_ending_the_turn() -> None:
    answer, said = _step(0, "")
    assert (said, answer) == ([""], StepAnswer(stop=StopReason.END_TURN))


@pytest.mark.parametrize(
    ("line", "call"),
    [
        (
            "exec 3",
            ToolCall("shell", f'{{"command": "sleep 3", "timeout_seconds": {MAX_SECONDS}}}'),
        ),
        (
            "run 30",
            ToolCall("start_job", f'{{"command": "sleep 30", "timeout_seconds": {MAX_SECONDS}}}'),
        ),
        ("spawn say hi|say bye", ToolCall("spawn_subagent", '{"prompt": "say hi\\nsay bye"}')),
        ("remind 1.5 say x", ToolCall("set_reminder", '{"seconds": 1.5, "prompt": "say x"}')),
    ],
)
def test_tool_instructions_are_calls_of_the_fleet_tools(line: str, call: ToolCall) -> None:
    answer, said = _step(0, f"{line}\nsay after")
    assert (said, answer.tool_calls, answer.stop) == ([], (call,), None)


def test_a_think_step_returns_early_once_cancelled() -> None:
    cancel = threading.Event()
    cancel.set()
    done: list[tuple[StepAnswer, list[str]]] = []
    step = threading.Thread(target=lambda: done.append(_step(0, "think 60", cancel)), daemon=True)

    step.start()
    step.join(30)  # far less than the 60 s it would think if the cancel went unheard

    assert done and done[0][1] == ["(thought for 60s)"]


def test_a_scripted_step_error_names_the_one_based_line() -> None:
    with pytest.raises(ModelError, match=r"^line 2\b"):
        _step(1, "say ok\nthink soon")
