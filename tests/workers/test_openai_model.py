"""The ``openai`` model on real turn, job and reminder workers, driving a real
OpenAI-compatible server of the tests' own (``tests/openai_server.py``, replaying
``tests/fixtures/openai``) through the official SDK. Each session names its fixture as its
model; the server's request log, not the fleet's, is what proves what was asked and when.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator import metrics
from orchestrator.archive import archive
from orchestrator.families import Family
from orchestrator.sessions import create_session, get_session
from orchestrator.turns import get_turn, start_turn
from tests.faults.fleets import PrivateFleet, private_fleet
from tests.helpers import wait_for
from tests.openai_server import Served, serve
from tests.workers.support import history, job_record, process_alive, wait_gone, wait_job_pid

pytestmark = [pytest.mark.redis, pytest.mark.integration, pytest.mark.timeout(120)]

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "openai"
MAX_STEPS = 3
RETRIES = 2


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with serve(FIXTURES, tmp_path_factory.mktemp("openai") / "requests.jsonl") as served:
        yield served


@pytest.fixture(scope="module")
def private(
    redis_url: str, key_prefix: str, tmp_path_factory: Any, server: Served
) -> Iterator[PrivateFleet]:
    env = {
        "FLEET_MODEL": "openai",
        "FLEET_OPENAI_BASE_URL": server.base_url,
        "FLEET_OPENAI_API_KEY": "test-key",
        "FLEET_OPENAI_MODEL": "plain",
        "FLEET_OPENAI_MAX_RETRIES": str(RETRIES),
        "FLEET_MAX_TURN_REQUESTS": str(MAX_STEPS),
    }
    families = [Family.TURN, Family.JOB, Family.REMINDER]
    with private_fleet(redis_url, key_prefix, tmp_path_factory, "oai", families, env) as fleet:
        yield fleet


def _turn(private: PrivateFleet, tmp_path: Path, model: str) -> tuple[str, str, str]:
    """A new session on ``model`` and a turn with a prompt of its own: (sid, tid, prompt)."""
    sid = create_session(private.store, str(tmp_path), model=model).session_id
    prompt = f"{model} task {uuid.uuid4().hex[:8]}"
    return sid, start_turn(private.store, private.dispatcher, sid, prompt), prompt


def _ended(private: PrivateFleet, tid: str, timeout: float = 30.0) -> Any:
    final = ("completed", "failed", "cancelled", "blocked")
    return wait_for(
        lambda: (t := get_turn(private.store, tid)) is not None and t.state in final and t,
        timeout,
        message=f"turn {tid} to end",
    )


def _of(private: PrivateFleet, sid: str, tid: str, kind: str) -> list[dict[str, Any]]:
    return [
        u for u in history(private.store, sid) if u["turnId"] == tid and u["sessionUpdate"] == kind
    ]


def _said(private: PrivateFleet, sid: str, tid: str) -> str:
    return "".join(u["content"]["text"] for u in _of(private, sid, tid, "agent_message_chunk"))


def _result(update: dict[str, Any]) -> str:
    return str(update["content"][0]["content"]["text"])


def test_a_plain_answer_streams_as_chunks_and_its_usage_is_stored_and_counted(
    private: PrivateFleet, server: Served, tmp_path: Path
) -> None:
    sid, tid, prompt = _turn(private, tmp_path, "plain")

    turn = _ended(private, tid)

    assert (turn.state.value, turn.stop_reason) == ("completed", "end_turn")
    assert turn.usage == {"inputTokens": 12, "outputTokens": 9}
    chunks = _of(private, sid, tid, "agent_message_chunk")
    assert len(chunks) > 1  # streamed in pieces, each its own update
    assert _said(private, sid, tid) == "Hello from the fixture server, in several pieces."
    [request] = server.records(prompt=prompt)
    assert request["messages"] == [{"role": "user", "content": prompt}]
    assert request["tools"] == ["shell", "start_job", "spawn_subagent", "set_reminder"]
    info = get_session(private.store, sid).to_info()["_meta"]["agentFleet"]
    assert (info["model"], info["usage"]) == ("plain", {"inputTokens": 12, "outputTokens": 9})
    counters = metrics.snapshot(private.store).counters
    assert counters["fleet_model_tokens"][("input",)] >= 12
    assert counters["fleet_model_requests"][("ok",)] >= 1


def test_shell_runs_a_real_command_in_the_session_cwd_and_its_output_goes_back(
    private: PrivateFleet, server: Served, tmp_path: Path
) -> None:
    sid, tid, prompt = _turn(private, tmp_path, "shell")

    turn = _ended(private, tid)

    assert (turn.state.value, turn.stop_reason) == ("completed", "end_turn")
    [call] = _of(private, sid, tid, "tool_call")
    assert call["_meta"]["agentFleet"]["tool"] == "shell"
    [update] = _of(private, sid, tid, "tool_call_update")
    assert update["status"] == "completed"
    assert _result(update).splitlines()[1:] == ["fleet-42", str(tmp_path)]
    first, second = server.records(prompt=prompt)
    assert second["messages"][-1]["role"] == "tool"
    assert "fleet-42" in second["messages"][-1]["content"]
    assert second["messages"][1]["tool_calls"][0]["function"]["name"] == "shell"
    assert _said(private, sid, tid) == "The command printed fleet-42."


def test_start_job_runs_a_real_background_process_on_a_job_worker(
    private: PrivateFleet, tmp_path: Path
) -> None:
    sid, tid, _ = _turn(private, tmp_path, "job")

    assert _ended(private, tid).state.value == "completed"
    [update] = _of(private, sid, tid, "tool_call_update")
    jid = re.fullmatch(r"started job (\S+)", _result(update))
    assert jid is not None
    pid = wait_job_pid(private.store, jid[1])
    assert process_alive(pid)
    assert job_record(private.store, jid[1])["command"] == "sleep 41.3"

    archive(private.store, private.dispatcher, sid, stop_activity=True)
    wait_gone(pid)


def test_spawn_subagent_starts_a_real_child_session_on_the_same_model(
    private: PrivateFleet, server: Served, tmp_path: Path
) -> None:
    sid, tid, _ = _turn(private, tmp_path, "spawn")

    assert _ended(private, tid).state.value == "completed"
    [update] = _of(private, sid, tid, "tool_call_update")
    child = re.fullmatch(r"started subagent (\S+)", _result(update))
    assert child is not None
    assert get_session(private.store, child[1]).model == "spawn"
    child_prompt = "child task: count to three"
    wait_for(lambda: server.records(prompt=child_prompt), 30, message="the child's request")
    child_turns = [u["turnId"] for u in history(private.store, child[1])]
    assert _ended(private, child_turns[0]).state.value == "completed"
    assert _said(private, child[1], child_turns[0]) == "one, two, three"


def test_set_reminder_stores_a_reminder_that_fires_a_turn_on_the_model(
    private: PrivateFleet, server: Served, tmp_path: Path
) -> None:
    sid, tid, prompt = _turn(private, tmp_path, "reminder")

    assert _ended(private, tid).state.value == "completed"

    def fired() -> list[dict[str, Any]]:
        return [
            r
            for r in server.records(prompt=prompt)
            if r["messages"][-1] == {"role": "user", "content": "the reminder fired"}
        ]

    wait_for(fired, 30, message="a request for the reminder's turn")
    users = [u for u in history(private.store, sid) if u["sessionUpdate"] == "user_message_chunk"]
    assert [u["content"]["text"] for u in users] == [prompt, "the reminder fired"]
    assert _ended(private, users[1]["turnId"]).state.value == "completed"


def test_an_archive_closes_a_held_stream_and_no_request_follows_it(
    private: PrivateFleet, server: Served, tmp_path: Path
) -> None:
    # Given a turn whose answer streams its first words, then holds the stream open
    sid, tid, prompt = _turn(private, tmp_path, "hold")
    wait_for(lambda: _said(private, sid, tid), 30, message="the streamed first words")
    assert _said(private, sid, tid) == "thinking about it..."

    # When the session is archived (stopping its work)
    archive(private.store, private.dispatcher, sid, stop_activity=True)
    mark = f"archived-{sid}"
    server.mark(mark)

    # Then the turn ends cancelled, the server saw the connection close, and no request came
    # after the archive (the server's own log)
    assert _ended(private, tid).state.value == "cancelled"
    wait_for(lambda: server.records("closed", prompt), 10, message="the server to see the close")
    assert len(server.records(prompt=prompt)) == 1
    assert [
        r for r in server.since_mark(mark) if r.get("prompt") == prompt and r["event"] == "request"
    ] == []


def test_a_429_is_retried_and_the_turn_answers(
    private: PrivateFleet, server: Served, tmp_path: Path
) -> None:
    sid, tid, prompt = _turn(private, tmp_path, "ratelimit")

    assert _ended(private, tid).state.value == "completed"
    assert len(server.records(prompt=prompt)) == 2
    assert _said(private, sid, tid) == "Answered after the rate limit."


def test_a_500_forever_fails_the_turn_after_bounded_retries(
    private: PrivateFleet, server: Served, tmp_path: Path
) -> None:
    sid, tid, prompt = _turn(private, tmp_path, "down")

    turn = _ended(private, tid)

    assert turn.state.value == "failed"
    assert "500" in turn.error and "The server had an error." in turn.error
    assert len(server.records(prompt=prompt)) == RETRIES + 1


def test_another_4xx_fails_the_turn_with_the_providers_message_at_once(
    private: PrivateFleet, server: Served, tmp_path: Path
) -> None:
    sid, tid, prompt = _turn(private, tmp_path, "badrequest")

    turn = _ended(private, tid)

    assert turn.state.value == "failed"
    assert "This model does not support tools." in turn.error
    assert len(server.records(prompt=prompt)) == 1
    assert "This model does not support tools." in _said(private, sid, tid)


def test_malformed_tool_arguments_are_tool_errors_the_model_sees(
    private: PrivateFleet, server: Served, tmp_path: Path
) -> None:
    sid, tid, prompt = _turn(private, tmp_path, "malformed")

    assert _ended(private, tid).state.value == "completed"
    updates = _of(private, sid, tid, "tool_call_update")
    assert [u["status"] for u in updates] == ["failed", "failed"]
    requests = server.records(prompt=prompt)
    assert len(requests) == 3
    not_json, wrong_field = (r["messages"][-1] for r in requests[1:])
    assert not_json["role"] == wrong_field["role"] == "tool"
    assert "not valid JSON" in not_json["content"]
    assert "command" in wrong_field["content"] and "cmd" in wrong_field["content"]


def test_the_step_limit_ends_a_turn_with_max_turn_requests(
    private: PrivateFleet, server: Served, tmp_path: Path
) -> None:
    sid, tid, prompt = _turn(private, tmp_path, "loop")

    turn = _ended(private, tid)

    assert (turn.state.value, turn.stop_reason) == ("completed", "max_turn_requests")
    assert len(server.records(prompt=prompt)) == MAX_STEPS
    assert len(_of(private, sid, tid, "tool_call_update")) == MAX_STEPS


def test_an_archive_during_a_retry_back_off_sends_no_further_request(
    private: PrivateFleet, server: Served, tmp_path: Path
) -> None:
    # Given a turn whose first request met a 429 (its retry waits its back-off)
    sid, tid, prompt = _turn(private, tmp_path, "ratelimit")
    wait_for(lambda: server.records(prompt=prompt), 30, message="the first request")

    # When the session is archived (stopping its work)
    archive(private.store, private.dispatcher, sid, stop_activity=True)
    mark = f"archived-{sid}"
    server.mark(mark)

    # Then the turn ends and no request of it reached the server after the archive
    _ended(private, tid)
    after = [r for r in server.since_mark(mark) if r.get("prompt") == prompt]
    assert [r for r in after if r["event"] == "request"] == []
