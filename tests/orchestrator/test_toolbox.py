"""The tool registry and the conversation a model step sees."""

from __future__ import annotations

import json

import pytest

from orchestrator.families import Family
from orchestrator.models import chat
from orchestrator.models.model import Message, Role, ToolCall
from orchestrator.turn import toolbox

pytestmark = pytest.mark.unit


def test_every_tool_names_its_family_and_an_object_schema() -> None:
    families = {t.name: t.family for t in toolbox.TOOLS.values()}
    assert families == {
        "shell": Family.TURN,
        "start_job": Family.JOB,
        "spawn_subagent": Family.SUBAGENT,
        "set_reminder": Family.REMINDER,
    }
    for spec in toolbox.offered_specs():
        assert spec.parameters["type"] == "object"
        assert spec.parameters["required"], spec.name


def test_the_settings_know_the_registry_s_tools() -> None:
    # FLEET_TOOLS is checked against settings.TOOL_NAMES, which the registry cannot drift from.
    from orchestrator.settings import TOOL_NAMES

    assert tuple(toolbox.TOOLS) == TOOL_NAMES


def test_a_valid_call_parses_to_its_arguments() -> None:
    tool, args = toolbox.parse_call(ToolCall("set_reminder", '{"seconds": 2, "prompt": "hi"}'))
    assert (tool.name, args.seconds, args.prompt) == ("set_reminder", 2.0, "hi")


@pytest.mark.parametrize(
    ("call", "fragment"),
    [
        (ToolCall("shell", '{"command": "ls"'), "not valid JSON"),
        (ToolCall("shell", "[1]"), "must be a JSON object"),
        (ToolCall("shell", '{"cmd": "ls"}'), "command: Field required"),
        (ToolCall("shell", '{"command": "ls", "timeout_seconds": -1}'), "timeout_seconds"),
        (ToolCall("set_reminder", '{"seconds": 1e12, "prompt": "x"}'), "seconds"),
        (ToolCall("rm_rf", "{}"), "unknown tool 'rm_rf'"),
    ],
)
def test_a_bad_call_is_a_tool_error_naming_what_is_wrong(call: ToolCall, fragment: str) -> None:
    with pytest.raises(toolbox.ToolArgumentsError, match=fragment):
        toolbox.parse_call(call)


def test_a_tool_not_offered_is_refused() -> None:
    assert [s.name for s in toolbox.offered_specs("shell")] == ["shell"]
    with pytest.raises(toolbox.ToolArgumentsError, match="the tools on offer: shell"):
        toolbox.parse_call(ToolCall("start_job", '{"command": "x"}'), "shell")


def _chunk(kind: str, text: str) -> dict[str, object]:
    return {"sessionUpdate": kind, "turnId": "t", "content": {"type": "text", "text": text}}


def _call(call_id: str, name: str, raw: object) -> dict[str, object]:
    return {
        "sessionUpdate": "tool_call",
        "toolCallId": call_id,
        "rawInput": raw,
        "_meta": {"agentFleet": {"tool": name}},
    }


def _result(call_id: str, text: str) -> dict[str, object]:
    content = [{"type": "content", "content": {"type": "text", "text": text}}]
    return {"sessionUpdate": "tool_call_update", "toolCallId": call_id, "content": content}


def test_stored_updates_fold_into_chat_messages() -> None:
    updates = [
        _chunk("user_message_chunk", "list files"),
        _chunk("agent_message_chunk", "Let me "),
        _chunk("agent_message_chunk", "look."),
        _call("c1", "shell", {"command": "ls"}),
        _result("c1", "a.py"),
        _call("c2", "shell", '{"command": "ls'),  # malformed, kept as written
        _result("c2", "shell: arguments are not valid JSON"),
        _call("c3", "shell", {"command": "sleep 9"}),  # stopped: no result
        _chunk("user_message_chunk", "again"),
        {"sessionUpdate": "available_commands_update"},
    ]

    assert chat.messages(updates) == [
        Message(Role.USER, "list files"),
        Message(
            Role.ASSISTANT,
            "Let me look.",
            (ToolCall("shell", json.dumps({"command": "ls"}), "c1"),),
        ),
        Message(Role.TOOL, "a.py", call_id="c1"),
        Message(Role.ASSISTANT, "", (ToolCall("shell", '{"command": "ls', "c2"),)),
        Message(Role.TOOL, "shell: arguments are not valid JSON", call_id="c2"),
        Message(Role.ASSISTANT, "", (ToolCall("shell", json.dumps({"command": "sleep 9"}), "c3"),)),
        Message(Role.TOOL, "(no result: the turn was stopped)", call_id="c3"),
        Message(Role.USER, "again"),
    ]
