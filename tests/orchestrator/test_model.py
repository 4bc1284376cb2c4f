"""The scripted model: instructions, their parsing errors, and its steps."""

from __future__ import annotations

import threading

import pytest

from orchestrator.model import (
    MAX_SECONDS,
    ModelAction,
    ModelError,
    ScriptedModel,
    StepRequest,
    parse_instruction,
    prompt_lines,
)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("say hello there", ModelAction("message", text="hello there")),
        ("say", ModelAction("message", text="")),
        ("think 2.5", ModelAction("think", seconds=2.5)),
        ("think 0", ModelAction("think", seconds=0.0)),
        ("exec 3", ModelAction("tool", tool="exec", seconds=3.0)),
        ("run 30", ModelAction("tool", tool="run", seconds=30.0)),
        ("spawn say hi", ModelAction("tool", tool="spawn", text="say hi")),
        ("spawn think 1|say done", ModelAction("tool", tool="spawn", text="think 1\nsay done")),
        ("remind 60 say hi", ModelAction("tool", tool="remind", seconds=60.0, text="say hi")),
        (
            "remind 1.5 say  two words ",
            ModelAction("tool", tool="remind", seconds=1.5, text="say  two words"),
        ),
        (f"think {MAX_SECONDS:g}", ModelAction("think", seconds=MAX_SECONDS)),
    ],
)
def test_each_instruction_parses_to_its_action(line: str, expected: ModelAction) -> None:
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


def test_the_scripted_model_takes_one_step_per_line() -> None:
    model = ScriptedModel()
    assert model.steps_in("say a\n\nthink 1\nsay b") == 3
    assert model.steps_in("") == 1


def test_a_scripted_step_answers_its_own_line() -> None:
    model = ScriptedModel()
    lines = ["say first", "say second"]

    action = model.step(StepRequest("sess_x", "turn_x", 1, lines), threading.Event())

    assert action == ModelAction("message", text="second")


def test_an_empty_prompt_is_one_empty_message() -> None:
    action = ScriptedModel().step(StepRequest("sess_x", "turn_x", 0, []), threading.Event())
    assert action == ModelAction("message", text="")


def test_a_think_step_returns_early_once_cancelled() -> None:
    cancel = threading.Event()
    cancel.set()
    done: list[ModelAction] = []
    step = threading.Thread(
        target=lambda: done.append(
            ScriptedModel().step(StepRequest("s", "t", 0, ["think 60"]), cancel)
        ),
        daemon=True,
    )

    step.start()
    step.join(30)  # far less than the 60 s it would think if the cancel went unheard

    assert done and done[0].kind == "message"


def test_a_scripted_step_error_names_the_one_based_line() -> None:
    with pytest.raises(ModelError, match=r"^line 2\b"):
        ScriptedModel().step(StepRequest("s", "t", 1, ["say ok", "think soon"]), threading.Event())
