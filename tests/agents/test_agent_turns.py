"""Sessions run by an external ACP agent (the project's tiny agent), on real turn workers:
a turn is one ``session/prompt``, what the agent says lands in the conversation, the agent's
own session is loaded by the next prompt, its permission requests follow the definition's
policy or wait for a person, and an archive stops the agent's whole tree."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from orchestrator.agents import permissions
from orchestrator.archiving.archive import archive
from orchestrator.errors import SessionActive
from orchestrator.session.sessions import create_session, get_session
from orchestrator.turn.turns import start_turn
from tests.agents.fleet_support import (
    Person,
    RawAcp,
    agent_fleet,
    agents_toml,
    ended,
    processes_with,
    prompt_over_acp,
    said,
)
from tests.helpers import error_shape, rest_client, wait_for
from tests.workers.support import history

pytestmark = [pytest.mark.redis, pytest.mark.integration]


@pytest.fixture(scope="module")
def fleet_and_store(
    redis_url: str, key_prefix: str, tmp_path_factory: Any
) -> Iterator[tuple[Any, Any]]:
    with agent_fleet(redis_url, key_prefix, tmp_path_factory, "agents1", agents_toml()) as pair:
        yield pair


@pytest.fixture
def private(fleet_and_store: tuple[Any, Any]) -> Any:
    return fleet_and_store[0]


@pytest.fixture
def store(fleet_and_store: tuple[Any, Any]) -> Any:
    return fleet_and_store[1]


def prompt(private: Any, sid: str, text: str) -> str:
    return start_turn(private.store, private.dispatcher, sid, text)


def updates(store: Any, sid: str, tid: str, kind: str) -> list[dict[str, Any]]:
    return [u for u in history(store, sid) if u.get("turnId") == tid and u["sessionUpdate"] == kind]


def test_a_prompt_is_answered_by_the_agent_and_its_session_is_loaded_next_time(
    private: Any, store: Any, tmp_path: Path
) -> None:
    # Given a session run by the tiny agent
    sid = create_session(store, str(tmp_path), agent="tiny").session_id
    assert get_session(store, sid).to_info()["_meta"]["agentFleet"]["agent"] == "tiny"

    # When it is prompted twice
    first = ended(store, prompt(private, sid, "hello there"))
    second = ended(store, prompt(private, sid, "history"))

    # Then the agent answered each, and the second prompt ran in the agent's own session,
    # loaded by a new process (the first prompt is in its history)
    assert first.state == "completed", first
    assert said(store, sid, first.turn_id) == "echo: hello there"
    assert second.state == "completed", second
    assert said(store, sid, second.turn_id) == "history: 1"


def test_the_agent_process_is_kept_between_prompts_and_archived_means_offline(
    private: Any, store: Any, tmp_path: Path
) -> None:
    from orchestrator.archiving.archive import unarchive

    sid = create_session(store, str(tmp_path), agent="tiny").session_id
    first = ended(store, prompt(private, sid, "pid"))
    second = ended(store, prompt(private, sid, "pid"))
    pid = int(said(store, sid, first.turn_id).split()[-1])
    assert said(store, sid, second.turn_id) == f"pid: {pid}"  # the same process, idle between

    # When the idle session is archived (no live work: a plain archive is not refused)
    archive(store, private.dispatcher, sid)

    # Then its agent process goes (archived means offline)
    wait_for(lambda: not psutil.pid_exists(pid) or _zombie(pid), 5, message="the agent to stop")

    # And after unarchive the next prompt starts a new process that loads the session
    unarchive(store, sid)
    third = ended(store, prompt(private, sid, "history"))
    assert said(store, sid, third.turn_id) == "history: 2"


def test_an_idle_agent_is_stopped_after_its_idle_seconds(
    private: Any, store: Any, tmp_path: Path
) -> None:
    sid = create_session(store, str(tmp_path), agent="tiny-brief").session_id
    turn = ended(store, prompt(private, sid, "pid"))
    pid = int(said(store, sid, turn.turn_id).split()[-1])

    wait_for(lambda: not psutil.pid_exists(pid) or _zombie(pid), 10, message="the agent to stop")


def _zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def test_message_chunks_land_in_the_order_the_agent_sent_them(
    private: Any, store: Any, tmp_path: Path
) -> None:
    sid = create_session(store, str(tmp_path), agent="tiny").session_id

    turn = ended(store, prompt(private, sid, "count: 300"))

    assert said(store, sid, turn.turn_id) == "".join(f"{i} " for i in range(300))


def test_a_shell_command_becomes_a_tool_call_of_the_turn(
    private: Any, store: Any, tmp_path: Path
) -> None:
    sid = create_session(store, str(tmp_path), agent="tiny").session_id

    turn = ended(store, prompt(private, sid, "run: echo hi from the agent"))

    assert turn.state == "completed", turn
    assert said(store, sid, turn.turn_id) == "done: hi from the agent"
    calls = updates(store, sid, turn.turn_id, "tool_call")
    assert [c["title"] for c in calls] == ["echo hi from the agent"]
    settled = updates(store, sid, turn.turn_id, "tool_call_update")
    assert settled[-1]["status"] == "completed"


def test_a_deny_policy_rejects_the_command_and_the_turn_goes_on(
    private: Any, store: Any, tmp_path: Path
) -> None:
    sid = create_session(store, str(tmp_path), agent="tiny-deny").session_id
    marker = tmp_path / "ran"

    turn = ended(store, prompt(private, sid, f"run: touch {marker}"))

    assert turn.state == "completed", turn
    assert said(store, sid, turn.turn_id) == "denied"
    assert not marker.exists()


def test_files_are_written_inside_the_cwd_and_refused_outside_it(
    private: Any, store: Any, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "out").symlink_to(tmp_path)
    sid = create_session(store, str(work), agent="tiny").session_id

    inside = ended(store, prompt(private, sid, f"write: {work}/a.txt hello"))
    outside = ended(store, prompt(private, sid, f"write: {tmp_path}/b.txt nope"))
    through_link = ended(store, prompt(private, sid, f"write: {work}/out/c.txt nope"))

    assert said(store, sid, inside.turn_id) == "wrote"
    assert (work / "a.txt").read_text() == "hello"
    assert said(store, sid, outside.turn_id).startswith("refused")
    assert said(store, sid, through_link.turn_id).startswith("refused")
    assert not (tmp_path / "b.txt").exists() and not (tmp_path / "c.txt").exists()


def test_archive_refuses_a_running_prompt_then_stops_the_agents_whole_tree(
    private: Any, store: Any, tmp_path: Path
) -> None:
    # Given an agent running a long command (started in a session of its own, as real
    # agents start their shells)
    sid = create_session(store, str(tmp_path), agent="tiny").session_id
    seconds = f"300.{uuid.uuid4().int % 10**6}"
    tid = prompt(private, sid, f"run: sleep {seconds}")
    wait_for(lambda: processes_with(f"sleep {seconds}"), 30, message="the agent's command")

    # When it is archived without stopping: refused, naming the turn
    with pytest.raises(SessionActive) as refused:
        archive(store, private.dispatcher, sid)
    assert [(i.family, i.id) for i in refused.value.items] == [("turn", tid)]

    # And with stopActivity
    archive(store, private.dispatcher, sid, stop_activity=True)

    # Then the command and every process of the agent are gone within 2 s
    wait_for(lambda: not processes_with(f"sleep {seconds}"), 2, message="the command to die")
    wait_for(lambda: not processes_with(str(Path(tmp_path))), 2, message="the agent to die")
    assert ended(store, tid).state == "cancelled"


def test_a_permission_request_waits_for_a_person_and_is_answered_through_rest(
    private: Any, store: Any, tmp_path: Path
) -> None:
    sid = create_session(store, str(tmp_path), agent="tiny-ask").session_id
    marker = tmp_path / "allowed"
    tid = prompt(private, sid, f"run: touch {marker}")

    waiting = wait_for(lambda: permissions.pending(store, sid), 30, message="the request")
    with rest_client(store=store, dispatcher=private.dispatcher) as client:
        listed = client.get(f"/sessions/{sid}/permissions").json()["permissions"]
        assert [p["requestId"] for p in listed] == [waiting[0].request_id]
        assert listed[0]["turnId"] == tid
        bad = client.post(
            f"/sessions/{sid}/permissions/{waiting[0].request_id}", json={"outcome": "maybe"}
        )
        error_shape(bad, 422, "invalid_params")
        ok = client.post(
            f"/sessions/{sid}/permissions/{waiting[0].request_id}", json={"outcome": "allow"}
        )
        assert ok.status_code == 200, ok.text
        again = client.post(
            f"/sessions/{sid}/permissions/{waiting[0].request_id}", json={"outcome": "allow"}
        )

    assert ended(store, tid).state == "completed"
    assert marker.exists()
    assert again.status_code in (200, 404)  # a second answer races the first one's pop
    assert permissions.pending(store, sid) == []


def test_an_archive_answers_a_waiting_permission_request_cancelled(
    private: Any, store: Any, tmp_path: Path
) -> None:
    sid = create_session(store, str(tmp_path), agent="tiny-ask").session_id
    marker = tmp_path / "never"
    tid = prompt(private, sid, f"run: touch {marker}")
    wait_for(lambda: permissions.pending(store, sid), 30, message="the request")

    archive(store, private.dispatcher, sid, stop_activity=True)

    assert ended(store, tid).state == "cancelled"
    wait_for(lambda: not permissions.pending(store, sid), 5, message="the request to go")
    assert not marker.exists()


def test_an_agent_that_exits_mid_prompt_fails_its_turn_naming_why(
    private: Any, store: Any, tmp_path: Path
) -> None:
    sid = create_session(store, str(tmp_path), agent="tiny").session_id

    turn = ended(store, prompt(private, sid, "exit: 3"))

    assert turn.state == "failed", turn
    assert "its process ended" in turn.error


def test_a_missing_binary_fails_the_turn_naming_it(
    private: Any, store: Any, tmp_path: Path
) -> None:
    sid = create_session(store, str(tmp_path), agent="ghost").session_id

    turn = ended(store, prompt(private, sid, "hello"))

    assert turn.state == "failed", turn
    assert "/nonexistent/agent-binary" in turn.error and "not found" in turn.error


def test_an_unknown_agent_is_refused_by_rest_with_the_known_ones(
    private: Any, store: Any, tmp_path: Path
) -> None:
    with rest_client(store=store, dispatcher=private.dispatcher) as client:
        resp = client.post("/sessions", json={"cwd": str(tmp_path), "agent": "nobody"})
        listed = client.get("/agents").json()

    body = error_shape(resp, 422, "unknown_agent")
    names = ["ghost", "junk", "tiny", "tiny-ask", "tiny-brief", "tiny-deny"]
    assert body["data"]["allowed"] == names
    assert [a["name"] for a in listed["agents"]] == names


def test_an_acp_client_is_asked_the_agents_permission_request_and_its_answer_is_taken(
    private: Any, store: Any, tmp_path: Path
) -> None:
    marker = tmp_path / "allowed-over-acp"
    person = Person("allow_once")

    sid, stop = prompt_over_acp(store, tmp_path, "tiny-ask", f"run: touch {marker}", person)

    assert stop == "end_turn"
    assert len(person.asked) == 1
    assert marker.exists()
    assert get_session(store, sid).agent == "tiny-ask"


def test_the_cli_lists_a_waiting_request_and_rejects_it(
    private: Any, store: Any, tmp_path: Path
) -> None:
    import json
    import os
    import subprocess
    import sys

    sid = create_session(store, str(tmp_path), agent="tiny-ask").session_id
    marker = tmp_path / "rejected"
    tid = prompt(private, sid, f"run: touch {marker}")
    wait_for(lambda: permissions.pending(store, sid), 30, message="the request")
    env = {**os.environ, "FLEET_KEY_PREFIX": store.keys.prefix}

    def fleet(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "api.cli", *args]
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)

    listed = fleet("permissions", "ls", sid, "--json")
    rid = json.loads(listed.stdout)["permissions"][0]["requestId"]
    wrong = fleet("permissions", "answer", sid, rid, "perhaps")
    answered = fleet("permissions", "answer", sid, rid, "reject")

    assert wrong.returncode == 2 and "names none of this request's options" in wrong.stderr
    assert answered.returncode == 0, answered.stderr
    assert ended(store, tid).state == "completed"
    assert said(store, sid, tid) == "denied"
    assert not marker.exists()


def test_an_agent_that_says_too_much_fails_its_turn_at_the_bound(
    private: Any, store: Any, tmp_path: Path
) -> None:
    sid = create_session(store, str(tmp_path), agent="tiny").session_id

    turn = ended(store, prompt(private, sid, "big: 3000000"))

    assert turn.state == "failed", turn
    assert "FLEET_MODEL_TEXT_MAX_BYTES" in turn.error
    assert len(said(store, sid, turn.turn_id).encode()) <= 1_048_576 + 200


def test_delete_stops_the_agent_and_removes_its_home(
    private: Any, store: Any, tmp_path: Path
) -> None:
    from orchestrator.archiving.deletion import delete

    sid = create_session(store, str(tmp_path), agent="tiny").session_id
    turn = ended(store, prompt(private, sid, "pid"))
    pid = int(said(store, sid, turn.turn_id).split()[-1])
    home = store.settings.state_dir / "agents" / sid
    assert home.is_dir()

    assert delete(store, private.dispatcher, sid, stop_activity=True).deleted

    assert not home.exists()
    wait_for(lambda: not psutil.pid_exists(pid) or _zombie(pid), 5, message="the agent to stop")


def _asked_over_raw_acp(store: Any, tmp_path: Path, text: str) -> tuple[RawAcp, str, int, Any]:
    acp = RawAcp(store)
    hello = acp.request("initialize", {"protocolVersion": 1})
    acp.until(lambda m: m.get("id") == hello)
    made = acp.request(
        "session/new",
        {"cwd": str(tmp_path), "mcpServers": [], "_meta": {"agentFleet": {"agent": "tiny-ask"}}},
    )
    sid = acp.until(lambda m: m.get("id") == made)["result"]["sessionId"]
    asked = acp.request(
        "session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": text}]}
    )
    request = acp.until(lambda m: m.get("method") == "session/request_permission")
    return acp, sid, asked, request


def test_an_archive_withdraws_a_permission_request_from_the_acp_clients_it_was_sent_to(
    private: Any, store: Any, tmp_path: Path
) -> None:
    acp, sid, asked, request = _asked_over_raw_acp(store, tmp_path, "run: echo never")
    try:
        archive(store, private.dispatcher, sid, stop_activity=True)

        withdrawn = acp.until(lambda m: m.get("method") == "$/cancel_request", 10)
        answer = acp.until(lambda m: m.get("id") == asked, 10)
    finally:
        acp.close()
    assert withdrawn["params"]["id"] == request["id"]
    assert answer["result"]["stopReason"] == "cancelled"


def test_an_acp_clients_answer_naming_no_option_is_no_permission(
    private: Any, store: Any, tmp_path: Path
) -> None:
    acp, sid, asked, request = _asked_over_raw_acp(store, tmp_path, "run: echo never")
    try:
        picked = {"outcome": {"outcome": "selected", "optionId": "nope-not-an-option"}}
        acp.send({"jsonrpc": "2.0", "id": request["id"], "result": picked})
        answer = acp.until(lambda m: m.get("id") == asked, 10)
    finally:
        acp.close()
    assert answer["result"]["stopReason"] == "end_turn"
    assert permissions.pending(store, sid) == []
    turn_ids = [u["turnId"] for u in history(store, sid) if u.get("turnId")]
    assert said(store, sid, turn_ids[-1]) == "denied"


@pytest.mark.parametrize(("agent", "text"), [("tiny", "garbage"), ("junk", "hello")])
def test_an_agent_that_breaks_the_protocol_fails_its_turn_at_once_saying_so(
    private: Any, store: Any, tmp_path: Path, agent: str, text: str
) -> None:
    sid = create_session(store, str(tmp_path), agent=agent).session_id

    turn = ended(store, prompt(private, sid, text), timeout=20)

    assert turn.state == "failed", turn
    assert "not JSON-RPC" in turn.error


def test_the_cli_prints_a_streamed_message_as_one_text(
    private: Any, store: Any, tmp_path: Path
) -> None:
    import os
    import subprocess
    import sys

    sid = create_session(store, str(tmp_path), agent="tiny").session_id
    env = {**os.environ, "FLEET_KEY_PREFIX": store.keys.prefix}
    argv = [sys.executable, "-m", "api.cli", "prompt", sid, "count: 40"]

    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)

    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["".join(f"{i} " for i in range(40))]
