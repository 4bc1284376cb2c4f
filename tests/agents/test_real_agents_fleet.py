"""The three real agents (Codex, Claude Code, Gemini CLI) as sessions' runtimes in a fleet of
real turn workers, offline against tests/agents/modelservers.py: a plain answer, a shell
command, an archive during a long command (the command and every process of the agent gone
within 2 s), unarchive and go on, and a permission request answered through REST.

Binaries come from tests/agents/install.py (``.ci/run`` installs them); where one is not
installed, or ``bwrap`` is missing for Codex, its tests skip with the reason. The agents' homes
live outside the temporary directory (Codex's sandbox refuses one under it)."""

from __future__ import annotations

import contextlib
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.agents import permissions
from orchestrator.archiving.archive import archive, unarchive
from orchestrator.errors import SessionActive
from orchestrator.families import Family
from orchestrator.session.sessions import create_session
from orchestrator.turn.turns import start_turn
from tests.agents import modelservers
from tests.agents.fleet_support import (
    Person,
    agent_fleet,
    ended,
    processes_with,
    prompt_over_acp,
    said,
)
from tests.agents.install import agent_binary, require_agent
from tests.helpers import rest_client, wait_for
from tests.workers.support import history

pytestmark = [pytest.mark.redis, pytest.mark.integration, pytest.mark.slow]

#: The fleet's preset and the binary of each real agent.
AGENTS = {"codex": "codex-acp", "claude": "claude-code-acp", "gemini": "gemini"}
#: Seconds a real agent's turn may take (Gemini starts in about 2 s, Claude Code in 2).
TURN = 90.0
MARK = uuid.uuid4().hex


def _definitions(base_url: str) -> str:
    blocks = []
    for preset, binary in AGENTS.items():
        found = agent_binary(binary)
        if found is None:
            continue
        argv = [str(found), "--acp"] if preset == "gemini" else [str(found)]
        upstream = f"{base_url}/v1" if preset == "codex" else base_url
        for name, policy in ((preset, "allow"), (f"{preset}-ask", "ask")):
            blocks.append(
                f'[agents.{name}]\npreset = "{preset}"\ncommand = {argv!r}\n'.replace("'", '"')
                + f'upstream = "{upstream}"\npermissions = "{policy}"\n'
                + f'start_timeout_seconds = 60\nenv = {{ FLEET_TEST_MARK = "{MARK}" }}\n'
            )
    return "\n".join(blocks)


@pytest.fixture(scope="module")
def fleet_and_store(
    redis_url: str, key_prefix: str, tmp_path_factory: Any
) -> Iterator[tuple[Any, Any]]:
    state = Path.home() / ".cache" / "agent-fleet" / "test-state" / uuid.uuid4().hex
    state.mkdir(parents=True)
    with (
        modelservers.serve() as server,
        agent_fleet(
            redis_url,
            key_prefix,
            tmp_path_factory,
            "realagents",
            _definitions(server.base_url),
            FLEET_STATE_DIR=str(state),
        ) as pair,
    ):
        yield pair
    shutil.rmtree(state, ignore_errors=True)


def _marked(cwd: Path) -> list[int]:
    """Live processes of the agents started by this module whose working directory is
    ``cwd`` (one session's agent and what it started)."""
    needle = f"FLEET_TEST_MARK={MARK}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                raw = (entry / "environ").read_bytes()
                stat = (entry / "stat").read_text()
                here = Path((entry / "cwd").readlink())
                inside = here == cwd or cwd in here.parents
                if needle in raw.split(b"\0") and ") Z " not in stat and inside:
                    found.append(int(entry.name))
    return found


def _ended(store: Any, tid: str) -> Any:
    return ended(store, tid, TURN)


@pytest.fixture(params=list(AGENTS))
def agent(request: pytest.FixtureRequest) -> str:
    require_agent(AGENTS[request.param])
    return str(request.param)


def test_a_real_agent_answers_and_runs_a_shell_command(
    agent: str, fleet_and_store: tuple[Any, Any], tmp_path: Path
) -> None:
    private, store = fleet_and_store
    sid = create_session(store, str(tmp_path), agent=agent).session_id

    plain = _ended(store, start_turn(private.store, private.dispatcher, sid, "hello fleet"))
    shell = _ended(store, start_turn(private.store, private.dispatcher, sid, "run: echo hi-fleet"))

    assert plain.state == "completed", plain
    assert "echo: hello fleet" in said(store, sid, plain.turn_id)
    assert shell.state == "completed", shell
    assert "done: hi-fleet" in said(store, sid, shell.turn_id)
    calls = [u for u in history(store, sid) if u.get("turnId") == shell.turn_id]
    assert any(u["sessionUpdate"] == "tool_call" for u in calls)


def test_archive_during_a_long_command_leaves_nothing_of_the_agent_running(
    agent: str, fleet_and_store: tuple[Any, Any], tmp_path: Path
) -> None:
    private, store = fleet_and_store
    sid = create_session(store, str(tmp_path), agent=agent).session_id
    seconds = f"300.{uuid.uuid4().int % 10**6}"
    tid = start_turn(private.store, private.dispatcher, sid, f"run: sleep {seconds}")
    wait_for(lambda: processes_with(f"sleep {seconds}"), TURN, message="the agent's command")
    assert _marked(tmp_path), "the agent's processes are found by their mark"

    with pytest.raises(SessionActive):
        archive(store, private.dispatcher, sid)
    archive(store, private.dispatcher, sid, stop_activity=True)

    wait_for(lambda: not processes_with(f"sleep {seconds}"), 2, message="the command to die")
    wait_for(lambda: not _marked(tmp_path), 2, message="every process of the agent to die")
    assert _ended(store, tid).state == "cancelled"

    # Unarchive restores nothing; the next prompt starts the agent again and runs
    unarchive(store, sid)
    again = _ended(store, start_turn(private.store, private.dispatcher, sid, "hello again"))
    assert again.state == "completed", again
    assert "echo: hello again" in said(store, sid, again.turn_id)


def test_a_permission_request_is_answered_through_rest(
    agent: str, fleet_and_store: tuple[Any, Any], tmp_path: Path
) -> None:
    private, store = fleet_and_store
    sid = create_session(store, str(tmp_path), agent=f"{agent}-ask").session_id
    tid = start_turn(private.store, private.dispatcher, sid, "ask: touch made.txt && echo ok")

    waiting = wait_for(lambda: permissions.pending(store, sid), TURN, message="the request")
    with rest_client(store=store, dispatcher=private.dispatcher) as client:
        rid = waiting[0].request_id
        answered = client.post(f"/sessions/{sid}/permissions/{rid}", json={"outcome": "allow"})
    assert answered.status_code == 200, answered.text

    turn = _ended(store, tid)
    assert turn.state == "completed", turn
    assert (tmp_path / "made.txt").exists()
    assert "done: ok" in said(store, sid, tid)


def test_a_permission_request_is_answered_by_an_acp_client(
    agent: str, fleet_and_store: tuple[Any, Any], tmp_path: Path
) -> None:
    _, store = fleet_and_store
    person = Person("allow_once")

    sid, stop = prompt_over_acp(
        store, tmp_path, f"{agent}-ask", "ask: touch made.txt && echo ok", person, TURN
    )

    assert stop == "end_turn"
    assert len(person.asked) == 1
    assert (tmp_path / "made.txt").exists()


def test_a_killed_turn_worker_takes_the_agent_and_its_command(
    agent: str, fleet_and_store: tuple[Any, Any], tmp_path: Path
) -> None:
    private, store = fleet_and_store
    sid = create_session(store, str(tmp_path), agent=agent).session_id
    seconds = f"300.{uuid.uuid4().int % 10**6}"
    start_turn(private.store, private.dispatcher, sid, f"run: sleep {seconds}")
    wait_for(lambda: processes_with(f"sleep {seconds}"), TURN, message="the agent's command")
    assert _marked(tmp_path)

    private.kill(Family.TURN)
    try:
        # Killed by the worker's watchdog, which may still be starting on a loaded machine (a
        # full suite on 2 cores once took 37 s here; alone it takes well under a second)
        wait_for(lambda: not processes_with(f"sleep {seconds}"), 60, message="the command to die")
        wait_for(lambda: not _marked(tmp_path), 10, message="every process of the agent to die")
    finally:
        private.restart(Family.TURN)
