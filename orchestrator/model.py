"""The model seam and the built-in deterministic model, ``scripted``.

A ``Model`` is asked for one step at a time and answers with a ``ModelAction``: a message, or
a tool call for the turn runtime to execute. ``ScriptedModel`` reads the turn's prompt one
instruction per line, so the demo and the tests need no network:

=========================  ====================================================================
``say TEXT``               answers TEXT
``think SECONDS``          a model request that takes SECONDS
``exec SECONDS``           a tool call running a real child process for SECONDS inside the turn
``run SECONDS``            a tool call starting a background job living SECONDS
``spawn TEXT``             a tool call starting a subagent whose prompt is TEXT (``|`` = newline)
``remind SECONDS TEXT``    a tool call storing a reminder: after SECONDS a turn with TEXT starts
=========================  ====================================================================
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from typing import Protocol

#: Longest duration an instruction may ask for, in seconds.
MAX_SECONDS = 24 * 3600.0
INSTRUCTIONS = ("say", "think", "exec", "run", "spawn", "remind")


class ModelError(Exception):
    """Raised when the model cannot answer; the turn ends ``failed`` with the message."""


@dataclass(frozen=True)
class StepRequest:
    """What a model step sees: the session, the turn, the step index (0-based) and the
    prompt's lines."""

    session_id: str
    turn_id: str
    index: int
    lines: list[str]


@dataclass(frozen=True)
class ModelAction:
    """A model's answer. ``kind`` is ``message`` (``text`` to show) or ``tool`` (``tool`` is
    ``exec``/``run``/``spawn``/``remind``, with ``seconds`` and/or ``text``)."""

    kind: str
    text: str = ""
    tool: str | None = None
    seconds: float = 0.0
    extra: dict[str, str] = field(default_factory=dict)


class Model(Protocol):
    """A model backend. ``step`` may block (a model request takes time) and must return early
    with any answer once ``cancel`` is set."""

    def steps_in(self, prompt: str) -> int:
        """How many steps the turn for ``prompt`` takes (at least 1)."""
        ...

    def step(self, request: StepRequest, cancel: threading.Event) -> ModelAction: ...


def prompt_lines(prompt: str) -> list[str]:
    """The non-blank lines of a prompt, stripped."""
    return [line.strip() for line in prompt.splitlines() if line.strip()]


def _seconds(word: str, line_no: int, line: str) -> float:
    try:
        value = float(word)
    except ValueError:
        raise ModelError(
            f"line {line_no} ({line!r}): {word!r} is not a number of seconds"
        ) from None
    if not math.isfinite(value) or value < 0 or value > MAX_SECONDS:
        raise ModelError(
            f"line {line_no} ({line!r}): seconds must be between 0 and {MAX_SECONDS:g}"
        )
    return value


def parse_instruction(line: str, line_no: int) -> ModelAction:
    """Parse one scripted instruction (see the module docstring). Raises ``ModelError`` with
    the line number and what was expected."""
    verb, _, rest = line.partition(" ")
    rest = rest.strip()
    if verb == "say":
        return ModelAction("message", text=rest)
    if verb == "think":
        return ModelAction("think", seconds=_seconds(rest, line_no, line))
    if verb in ("exec", "run"):
        return ModelAction("tool", tool=verb, seconds=_seconds(rest, line_no, line))
    if verb == "spawn":
        if not rest:
            raise ModelError(f"line {line_no}: spawn needs the subagent's prompt")
        return ModelAction("tool", tool="spawn", text=rest.replace("|", "\n"))
    if verb == "remind":
        when, _, text = rest.partition(" ")
        if not text.strip():
            raise ModelError(f"line {line_no}: remind needs SECONDS and the reminder's prompt")
        return ModelAction(
            "tool", tool="remind", seconds=_seconds(when, line_no, line), text=text.strip()
        )
    raise ModelError(
        f"line {line_no}: unknown instruction {verb!r}; expected one of {', '.join(INSTRUCTIONS)}"
    )


class ScriptedModel:
    """The deterministic built-in model: step *i* answers line *i* of the prompt."""

    def steps_in(self, prompt: str) -> int:
        """Number of instruction lines (an empty prompt is one ``say`` step)."""
        return max(1, len(prompt_lines(prompt)))

    def step(self, request: StepRequest, cancel: threading.Event) -> ModelAction:
        """Answer step ``request.index``; ``think`` waits its seconds unless cancelled."""
        if not request.lines:
            return ModelAction("message", text="")
        action = parse_instruction(request.lines[request.index], request.index + 1)
        if action.kind == "think":
            cancel.wait(action.seconds)
            return ModelAction("message", text=f"(thought for {action.seconds:g}s)")
        return action
