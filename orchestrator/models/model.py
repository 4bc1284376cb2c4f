"""The model seam and the built-in deterministic model, ``scripted``.

A ``Model`` is asked for one step at a time. It sees the session's conversation (its stored
updates as chat ``Message`` s: user prompts, assistant text, tool calls and their results) and
the tools on offer (``ToolSpec``), streams the text it says through ``emit`` and answers a
``StepAnswer``: the tool calls it makes and, when the turn ends here, why (``StopReason``,
ACP's ``stopReason`` values). The turn runtime (``orchestrator/turn/steps.py``) runs the tool calls
and, unless the answer ends the turn, asks for another step; it knows nothing of how a model
decides. Backends: ``scripted`` (this module) and ``openai``
(``orchestrator/models/openai_model.py``),
picked by ``FLEET_MODEL`` (``workers/runtime.py``).

``ScriptedModel`` reads the turn's prompt (the conversation's last user message) one
instruction per line; step *i* of the turn answers line *i*, so the demo and the tests need no
network. Its tool calls are calls of the fleet's tools (``orchestrator/turn/toolbox.py``):

=========================  ====================================================================
``say TEXT``               answers TEXT
``think SECONDS``          a model request that takes SECONDS
``exec SECONDS``           ``shell``: a real child process (``sleep``) for SECONDS inside the turn
``run SECONDS``            ``start_job``: a background job (``sleep``) living SECONDS
``escape SECONDS``         ``start_job``: a job whose command also starts a ``sleep SECONDS`` in a
                           session of its own (``setsid``), beside its own ``sleep SECONDS``
``escape_exec SECONDS``    ``shell``: a command that starts ``sleep SECONDS`` in a session of its
                           own and another by a double fork, then sleeps SECONDS itself
``spawn TEXT``             ``spawn_subagent``: a subagent whose prompt is TEXT (``|`` = newline)
``remind SECONDS TEXT``    ``set_reminder``: after SECONDS a turn with TEXT starts
=========================  ====================================================================
"""

from __future__ import annotations

import contextlib
import json
import math
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from orchestrator.errors import InvalidParams

#: Longest duration an instruction may ask for, in seconds.
MAX_SECONDS = 24 * 3600.0
#: Longest model name a session may ask for, in characters.
MAX_MODEL_LENGTH = 200


class ModelError(Exception):
    """Raised when the model cannot answer; the turn ends ``failed`` with the message."""


class StopReason(StrEnum):
    """Why a turn ended (ACP ``stopReason``)."""

    END_TURN = "end_turn"  #: the model finished its answer
    MAX_TOKENS = "max_tokens"  #: the model ran out of tokens for its answer
    MAX_TURN_REQUESTS = "max_turn_requests"  #: the turn reached FLEET_MAX_TURN_REQUESTS steps
    REFUSAL = "refusal"  #: the model refused to go on
    CANCELLED = "cancelled"  #: the turn was stopped (a cancel, an archive)


class Role(StrEnum):
    """Who a conversation message is from."""

    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"  #: a tool call's result


@dataclass(frozen=True)
class ToolCall:
    """A call of a tool by ``name``; ``arguments`` is the JSON text the model wrote (it may be
    malformed: the runtime answers a tool error). ``call_id`` names the call in the
    conversation (``""`` in a model's answer: the runtime gives each call its id)."""

    name: str
    arguments: str
    call_id: str = ""


@dataclass(frozen=True)
class Message:
    """One chat message: ``text`` (a prompt, said text or a tool result), the ``tool_calls``
    an assistant message made, and for a ``tool`` message the ``call_id`` it answers."""

    role: Role
    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    call_id: str = ""


@dataclass(frozen=True)
class ToolSpec:
    """A tool as a model sees it: its name, what it does and the JSON Schema of its
    arguments (an object)."""

    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(frozen=True)
class Usage:
    """Tokens one model step read (``input_tokens``) and wrote (``output_tokens``)."""

    input_tokens: int = 0
    output_tokens: int = 0


def _always() -> bool:
    return True


@dataclass(frozen=True)
class StepRequest:
    """What a model step sees: the session, the turn, the step index (0-based), the
    conversation (oldest first, ending with what the turn said so far), the tools on offer and
    the model the session named (``""``: the backend's default). ``may_send`` reads the store
    afresh: whether this step may still send a request to a model server (its turn runs and
    this copy owns it); a backend calls it right before each request it sends, so none
    starts once a stop (an archive) has committed, without waiting for the step's next poll."""

    session_id: str
    turn_id: str
    index: int
    conversation: Sequence[Message]
    tools: Sequence[ToolSpec]
    model: str = ""
    may_send: Callable[[], bool] = _always


@dataclass(frozen=True)
class StepAnswer:
    """A step's answer: tool calls to run (in order) and ``stop``, the reason the turn ends
    after them, or ``None`` for another step (which sees the tool results)."""

    tool_calls: tuple[ToolCall, ...] = ()
    stop: StopReason | None = None
    usage: Usage = field(default_factory=Usage)


#: Model output is untrusted input (``orchestrator/untrusted.py``). Most UTF-8 bytes of one
#: tool call's name and arguments: past them the request is stopped and the call answers a
#: tool error the model sees in its next step.
TOOL_CALL_MAX_BYTES = 262_144
#: Deepest nesting of a tool call's JSON arguments; deeper ones are a tool error.
TOOL_JSON_MAX_DEPTH = 64
#: Most tool calls one model step may make: past them the turn ends ``failed``.
MAX_TOOL_CALLS = 64


#: Receives the text a step says, as it arrives (each piece becomes an
#: ``agent_message_chunk``). It raises ``ModelError`` once the step's text passes
#: ``FLEET_MODEL_TEXT_MAX_BYTES`` (model output is untrusted: an endless answer ends its turn
#: ``failed``); a backend lets that error through and stops reading its answer.
Emit = Callable[[str], None]


class Cancel(threading.Event):
    """A step's stop: an ``Event`` that also runs the callbacks registered with ``on_set``
    when it is set, in the thread that sets it, so a backend blocked in I/O is woken at once
    (it shuts its socket down) rather than by a poll of its own."""

    def __init__(self) -> None:
        super().__init__()
        self._hooks: list[Callable[[], None]] = []
        self._hooks_lock = threading.Lock()

    def set(self) -> None:
        """Set the event, then run (once each) the callbacks registered so far."""
        with self._hooks_lock:
            super().set()
            hooks, self._hooks = self._hooks, []
        for hook in hooks:
            hook()

    @contextlib.contextmanager
    def on_set(self, hook: Callable[[], None]) -> Iterator[None]:
        """Run ``hook`` once when the event is set while the block runs (at once when it is
        set already); a hook must be quick and must not raise."""
        with self._hooks_lock:
            now = self.is_set()
            if not now:
                self._hooks.append(hook)
        if now:
            hook()
        try:
            yield
        finally:
            with self._hooks_lock, contextlib.suppress(ValueError):
                self._hooks.remove(hook)


class Model(Protocol):
    """A model backend. ``step`` may block (a model request takes time) and must return early
    with any answer once ``cancel`` is set. Raises ``ModelError`` when it cannot answer."""

    def step(self, request: StepRequest, cancel: threading.Event, emit: Emit) -> StepAnswer: ...


def check_model(model: object) -> str:
    """Return the model name a session asks for (``""`` for ``None``: the backend's default).
    Raises ``InvalidParams`` unless it is printable text of at most ``MAX_MODEL_LENGTH``
    characters."""
    if model is None:
        return ""
    if not isinstance(model, str) or len(model) > MAX_MODEL_LENGTH:
        raise InvalidParams(
            f"model must be a string of at most {MAX_MODEL_LENGTH} characters.",
            {"param": "model"},
        )
    if not model.isprintable() or any(0xD800 <= ord(ch) <= 0xDFFF for ch in model):
        raise InvalidParams("model must be printable Unicode text.", {"param": "model"})
    return model


# -- scripted -------------------------------------------------------------------------------


class Verb(StrEnum):
    """A scripted instruction's verb."""

    SAY = "say"
    THINK = "think"
    EXEC = "exec"
    RUN = "run"
    ESCAPE = "escape"
    ESCAPE_EXEC = "escape_exec"
    SPAWN = "spawn"
    REMIND = "remind"


@dataclass(frozen=True)
class Instruction:
    """One parsed line of a scripted prompt."""

    verb: Verb
    seconds: float = 0.0
    text: str = ""


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


def parse_instruction(line: str, line_no: int) -> Instruction:
    """Parse one scripted instruction (see the module docstring). Raises ``ModelError`` with
    the line number and what was expected."""
    word, _, rest = line.partition(" ")
    rest = rest.strip()
    try:
        verb = Verb(word)
    except ValueError:
        expected = ", ".join(v.value for v in Verb)
        raise ModelError(
            f"line {line_no}: unknown instruction {word!r}; expected one of {expected}"
        ) from None
    if verb is Verb.SAY:
        return Instruction(verb, text=rest)
    if verb in (Verb.THINK, Verb.EXEC, Verb.RUN, Verb.ESCAPE, Verb.ESCAPE_EXEC):
        return Instruction(verb, seconds=_seconds(rest, line_no, line))
    if verb is Verb.SPAWN:
        if not rest:
            raise ModelError(f"line {line_no}: spawn needs the subagent's prompt")
        return Instruction(verb, text=rest.replace("|", "\n"))
    when, _, text = rest.partition(" ")
    if not text.strip():
        raise ModelError(f"line {line_no}: remind needs SECONDS and the reminder's prompt")
    return Instruction(verb, seconds=_seconds(when, line_no, line), text=text.strip())


def tool_call_of(instruction: Instruction) -> ToolCall:
    """The fleet tool call a tool instruction (``exec``, ``run``, ``escape``,
    ``escape_exec``, ``spawn``, ``remind``) stands for."""
    sleep = f"sleep {instruction.seconds:g}"
    escaping = f"setsid {sleep} & {sleep}"
    forking = f"setsid {sleep} & ( ({sleep} &) & ); {sleep}"
    name, args = {
        Verb.EXEC: ("shell", {"command": sleep, "timeout_seconds": MAX_SECONDS}),
        Verb.RUN: ("start_job", {"command": sleep, "timeout_seconds": MAX_SECONDS}),
        Verb.ESCAPE: ("start_job", {"command": escaping, "timeout_seconds": MAX_SECONDS}),
        Verb.ESCAPE_EXEC: ("shell", {"command": forking, "timeout_seconds": MAX_SECONDS}),
        Verb.SPAWN: ("spawn_subagent", {"prompt": instruction.text}),
        Verb.REMIND: ("set_reminder", {"seconds": instruction.seconds, "prompt": instruction.text}),
    }[instruction.verb]
    return ToolCall(name, json.dumps(args))


def last_prompt(conversation: Sequence[Message]) -> str:
    """The text of the conversation's last user message (``""`` when there is none)."""
    return next((m.text for m in reversed(conversation) if m.role is Role.USER), "")


class ScriptedModel:
    """The deterministic built-in model: step *i* of a turn answers line *i* of its prompt,
    and the turn ends with the last line (``end_turn``)."""

    def step(self, request: StepRequest, cancel: threading.Event, emit: Emit) -> StepAnswer:
        """Answer step ``request.index``; ``think`` waits its seconds unless cancelled.
        Raises ``ModelError`` for a malformed line."""
        lines = prompt_lines(last_prompt(request.conversation))
        last = request.index + 1 >= len(lines)
        stop = StopReason.END_TURN if last else None
        if request.index >= len(lines):  # an empty prompt is one empty message
            emit("")
            return StepAnswer(stop=stop)
        instruction = parse_instruction(lines[request.index], request.index + 1)
        if instruction.verb is Verb.SAY:
            emit(instruction.text)
            return StepAnswer(stop=stop)
        if instruction.verb is Verb.THINK:
            cancel.wait(instruction.seconds)
            emit(f"(thought for {instruction.seconds:g}s)")
            return StepAnswer(stop=stop)
        return StepAnswer(tool_calls=(tool_call_of(instruction),), stop=stop)
