"""The lab's parts without any agent: the model server answers each API as the agents read it,
deterministically, with usage (checked over real HTTP); the installer says why an agent is
missing; the presets give each agent its own home."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.agents import modelservers, presets_probe
from tests.agents.install import UnknownAgent, agent_binary, skip_reason

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def server() -> Iterator[modelservers.ModelServer]:
    with modelservers.serve() as running:
        yield running


def post(server: modelservers.ModelServer, path: str, body: dict[str, Any]) -> tuple[str, int]:
    request = urllib.request.Request(
        server.base_url + path,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.read().decode(), answer.status
    except urllib.error.HTTPError as exc:
        return exc.read().decode(), exc.code


def events(stream: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in stream.splitlines() if line.startswith("data: ")]


def test_responses_echo_a_prompt_and_call_exec_command_for_a_run_prompt(server: Any) -> None:
    user = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": ""}]}
    tools = [{"type": "function", "name": "exec_command"}]
    context = {**user, "content": [{"type": "input_text", "text": "<environment_context/>"}]}
    plain = {**user, "content": [{"type": "input_text", "text": "hi there"}]}
    stream, _ = post(server, "/v1/responses", {"input": [context, plain], "tools": tools})
    done = events(stream)[-1]
    assert done["type"] == "response.completed"
    assert done["response"]["output"][0]["content"][0]["text"] == "echo: hi there"
    assert done["response"]["usage"]["input_tokens_details"]["cached_tokens"] > 0

    run = {**user, "content": [{"type": "input_text", "text": "run: echo hi"}]}
    stream, _ = post(server, "/v1/responses", {"input": [run], "tools": tools})
    call = events(stream)[-1]["response"]["output"][0]
    assert (call["name"], json.loads(call["arguments"])["cmd"]) == ("exec_command", "echo hi")

    result = {"type": "function_call_output", "call_id": "c", "output": "Output:\nhi\n"}
    stream, _ = post(server, "/v1/responses", {"input": [run, result], "tools": tools})
    assert events(stream)[-1]["response"]["output"][0]["content"][0]["text"] == "done: hi"


def test_messages_stream_a_bash_tool_use_then_done_and_count_tokens(server: Any) -> None:
    tools = [{"name": "Bash", "input_schema": {}}]
    run = {"role": "user", "content": [{"type": "text", "text": "run: ls -l"}]}
    stream, _ = post(server, "/v1/messages", {"messages": [run], "tools": tools, "stream": True})
    sent = events(stream)
    assert [e["type"] for e in sent][0] == "message_start"
    assert sent[1]["content_block"]["name"] == "Bash"
    assert json.loads(sent[2]["delta"]["partial_json"])["command"] == "ls -l"
    assert sent[-2]["delta"]["stop_reason"] == "tool_use"

    result = {"role": "user", "content": [{"type": "tool_result", "content": "total 0\nx"}]}
    body = {"messages": [run, {"role": "assistant", "content": []}, result], "tools": tools}
    answer, _ = post(server, "/v1/messages", body)
    assert json.loads(answer)["content"][0]["text"] == "done: total 0"
    counted, status = post(server, "/v1/messages/count_tokens", {"messages": [run]})
    assert status == 200 and json.loads(counted)["input_tokens"] > 0


def test_gemini_calls_run_shell_command_and_fills_a_json_schema(server: Any) -> None:
    tools = [{"functionDeclarations": [{"name": "run_shell_command"}]}]
    run = {"role": "user", "parts": [{"text": "run: echo hi"}]}
    path = "/v1beta/models/m:streamGenerateContent?alt=sse"
    stream, _ = post(server, path, {"contents": [run], "tools": tools})
    (chunk,) = events(stream)
    call = chunk["candidates"][0]["content"]["parts"][0]["functionCall"]
    assert call == {"name": "run_shell_command", "args": {"command": "echo hi"}}
    assert chunk["usageMetadata"]["cachedContentTokenCount"] > 0

    output = {"output": "<x>\nOutput: hi\nExit Code: 0"}
    response = {"functionResponse": {"name": "run_shell_command", "response": output}}
    body = {"contents": [run, {"role": "user", "parts": [response]}], "tools": tools}
    answer, _ = post(server, "/v1beta/models/m:generateContent", body)
    assert json.loads(answer)["candidates"][0]["content"]["parts"][0]["text"] == "done: hi"

    schema = {"type": "OBJECT", "properties": {"score": {"type": "INTEGER"}}}
    config = {"responseMimeType": "application/json", "responseJsonSchema": schema}
    answer, _ = post(
        server, "/v1beta/models/m:generateContent", {**body, "generationConfig": config}
    )
    assert json.loads(json.loads(answer)["candidates"][0]["content"]["parts"][0]["text"]) == {
        "score": 1
    }


def test_an_unknown_route_is_logged_and_refused(server: Any) -> None:
    answer, status = post(server, "/v2/whatever", {"x": 1})
    assert status == 404 and "no route" in answer
    assert server.of("other")[-1].path == "/v2/whatever"


def test_an_agent_not_installed_skips_with_how_to_install_it(tmp_path: Any) -> None:
    assert agent_binary("gemini", tmp_path) is None
    assert "python -m tests.agents.install" in str(skip_reason("gemini", tmp_path))
    with pytest.raises(UnknownAgent, match="known: codex-acp"):
        agent_binary("vim", tmp_path)


def test_agent_env_gives_each_agent_its_own_home_and_refuses_an_unknown_one() -> None:
    homes = {}
    for name in presets_probe.AGENTS:
        _, env = presets_probe.agent_env(name, "http://127.0.0.1:9", Path("/h") / name)
        homes[name] = {k: v for k, v in env.items() if v.startswith("/h/")}
    assert homes["codex-acp"]["CODEX_HOME"] == "/h/codex-acp"
    assert homes["claude-code-acp"]["CLAUDE_CONFIG_DIR"] == "/h/claude-code-acp"
    assert homes["gemini"]["HOME"] == "/h/gemini"
    with pytest.raises(presets_probe.UnknownAgent, match="no preset for agent 'vim'"):
        presets_probe.agent_env("vim", "http://127.0.0.1:9", Path("/h"))
