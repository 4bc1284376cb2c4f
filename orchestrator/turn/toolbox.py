"""The tool registry: every tool a model may call, its arguments' JSON Schema and the
activity family its work belongs to. Both models call tools from here (``orchestrator/
model.py``); the turn runtime runs them (``orchestrator/turn/tools.py``).

==================  ===========  =================================================================
``shell``           turn         a command run by ``/bin/sh`` inside the turn, in the session's
                                 cwd, as the worker's user; killed at its timeout or a stop; its
                                 output (stdout and stderr) cut to ``tools.OUTPUT_MAX_BYTES``
``start_job``       job          a background command (a job) on a job worker, stopped at its
                                 timeout
``spawn_subagent``  subagent     a child session whose first turn is the prompt
``set_reminder``    reminder     after ``seconds``, a turn with the prompt starts in this session
==================  ===========  =================================================================

Which tools are offered is ``FLEET_TOOLS`` (comma list; all four by default; another name is
refused when the settings are read, against ``settings.TOOL_NAMES``). A call of a tool not
offered, with arguments that are not JSON or do not match the schema, is a tool error the
model sees (``ToolArgumentsError``), never a crash. A model's arguments are untrusted input:
parsed by ``orchestrator.untrusted.loads`` (nested at most ``model.TOOL_JSON_MAX_DEPTH``
levels), and a call whose name and arguments pass ``model.TOOL_CALL_MAX_BYTES`` is a tool
error too; ``stored_arguments`` is what the conversation keeps of them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchestrator import untrusted
from orchestrator.errors import InvalidParams
from orchestrator.families import Family
from orchestrator.models.model import (
    MAX_SECONDS,
    TOOL_CALL_MAX_BYTES,
    TOOL_JSON_MAX_DEPTH,
    ToolCall,
    ToolSpec,
)
from orchestrator.settings import TOOL_NAMES

#: Every tool of the registry, as a ``FLEET_TOOLS`` comma list (its default).
ALL_TOOLS = ",".join(TOOL_NAMES)


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ShellArgs(_Args):
    """Arguments of ``shell``."""

    command: str = Field(min_length=1, max_length=10_000, description="Shell command to run.")
    timeout_seconds: float = Field(
        default=60.0, gt=0, le=MAX_SECONDS, description="Seconds before the command is killed."
    )


class StartJobArgs(_Args):
    """Arguments of ``start_job``."""

    command: str = Field(
        min_length=1, max_length=10_000, description="Shell command to run in the background."
    )
    timeout_seconds: float = Field(
        default=3600.0, gt=0, le=MAX_SECONDS, description="Seconds before the job is stopped."
    )


class SpawnSubagentArgs(_Args):
    """Arguments of ``spawn_subagent``."""

    prompt: str = Field(min_length=1, max_length=100_000, description="The subagent's task.")


class SetReminderArgs(_Args):
    """Arguments of ``set_reminder``."""

    seconds: float = Field(ge=0, le=MAX_SECONDS, description="Seconds from now.")
    prompt: str = Field(
        min_length=1, max_length=100_000, description="The prompt of the turn that starts then."
    )


@dataclass(frozen=True)
class Tool:
    """A registered tool: its name, description, argument model and family."""

    name: str
    description: str
    arguments: type[_Args]
    family: Family

    def spec(self) -> ToolSpec:
        """The tool as a model sees it (JSON Schema of its arguments; built once)."""
        return _spec(self)


TOOLS: dict[str, Tool] = {
    t.name: t
    for t in (
        Tool(
            "shell",
            "Run a shell command in the session's working directory and wait for it; returns "
            "its exit status and output.",
            ShellArgs,
            Family.TURN,
        ),
        Tool(
            "start_job",
            "Start a shell command in the background (a job) and return at once with its id.",
            StartJobArgs,
            Family.JOB,
        ),
        Tool(
            "spawn_subagent",
            "Start a subagent: a child session working on the prompt on its own.",
            SpawnSubagentArgs,
            Family.SUBAGENT,
        ),
        Tool(
            "set_reminder",
            "After the given seconds, start a new turn in this session with the prompt.",
            SetReminderArgs,
            Family.REMINDER,
        ),
    )
}


@functools.cache
def _spec(tool: Tool) -> ToolSpec:
    return ToolSpec(tool.name, tool.description, tool.arguments.model_json_schema())


class ToolArgumentsError(Exception):
    """A tool call that cannot run as asked: unknown or not offered tool, arguments not JSON
    or not matching the schema. Its message is the tool error the model sees."""


def offered(tools: str = ALL_TOOLS) -> list[Tool]:
    """The tools a comma list names (``FLEET_TOOLS``, as ``settings.tools`` holds it; empty:
    none), in registry order."""
    names = {n.strip() for n in tools.split(",") if n.strip()}
    return [t for name, t in TOOLS.items() if name in names]


def offered_specs(tools: str = ALL_TOOLS) -> list[ToolSpec]:
    """``offered(tools)`` as the model sees them."""
    return [t.spec() for t in offered(tools)]


#: Most characters of a tool's name a message or a stored update repeats.
NAME_SHOWN = 100
#: Most characters kept of arguments stored as text (not JSON, or over a limit).
STORED_TEXT_CHARS = 2000


def shown_name(call: ToolCall) -> str:
    """The call's tool name as messages and stored updates show it (cut to ``NAME_SHOWN``
    characters)."""
    name = call.name
    return name if len(name) <= NAME_SHOWN else f"{name[:NAME_SHOWN]}..."


def _size(call: ToolCall) -> int:
    """UTF-8 bytes of the call's name and arguments."""
    return len(call.name.encode("utf-8", "surrogatepass")) + len(
        call.arguments.encode("utf-8", "surrogatepass")
    )


def _arguments(call: ToolCall) -> Any:
    """The call's arguments parsed within the model limits. Raises ``ToolArgumentsError``."""
    if _size(call) > TOOL_CALL_MAX_BYTES:
        raise ToolArgumentsError(
            f"{shown_name(call)}: the call's name and arguments are more than "
            f"{TOOL_CALL_MAX_BYTES} bytes; send shorter arguments"
        )
    try:
        return untrusted.loads(
            call.arguments or "{}", param="arguments", max_depth=TOOL_JSON_MAX_DEPTH
        )
    except InvalidParams as exc:  # a limit of untrusted.loads, or a key given twice
        raise ToolArgumentsError(f"{shown_name(call)}: {exc.message}") from None
    except ValueError as exc:
        raise ToolArgumentsError(
            f"{shown_name(call)}: arguments are not valid JSON ({exc})"
        ) from None


def stored_arguments(call: ToolCall) -> Any:
    """What a ``tool_call`` update keeps of the call's arguments (its ``rawInput``): the
    parsed JSON when it is within the limits, else the text (its first
    ``STORED_TEXT_CHARS`` characters when the call is over the size limit)."""
    try:
        return _arguments(call)
    except ToolArgumentsError:
        text = call.arguments
        if _size(call) <= TOOL_CALL_MAX_BYTES:
            return text
        return f"{text[:STORED_TEXT_CHARS]}... (cut: {len(text)} characters and more)"


def parse_call(call: ToolCall, tools: str = ALL_TOOLS) -> tuple[Tool, Any]:
    """The tool a call names among those ``tools`` offers (``offered``) and its validated
    arguments (an instance of the tool's argument model). Raises ``ToolArgumentsError`` with a
    message the model can act on."""
    on_offer = offered(tools)
    tool = next((t for t in on_offer if t.name == call.name), None)
    if tool is None:
        names = ", ".join(t.name for t in on_offer) or "none"
        raise ToolArgumentsError(f"unknown tool {shown_name(call)!r}; the tools on offer: {names}")
    raw = _arguments(call)
    if not isinstance(raw, dict):
        raise ToolArgumentsError(f"{call.name}: arguments must be a JSON object")
    try:
        return tool, tool.arguments.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'arguments'}: {e['msg']}" for e in exc.errors()
        )
        raise ToolArgumentsError(f"{call.name}: {problems}") from None
