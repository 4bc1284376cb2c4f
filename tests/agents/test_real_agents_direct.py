"""The three real agents (Codex, Claude Code, Gemini CLI) driven directly by the Python ACP SDK
as their client, offline against tests/agents/modelservers.py: the ground the fleet's agent
host stands on.

The client offers no ``fs`` and no ``terminal`` capability, so every agent runs its shell
commands itself, inside its own process tree: that is the tree the containment test must see
die. (Claude Code would run them through ``terminal/*`` if offered; Codex and Gemini never
ask.) A permission request is answered with the first ``allow`` option.

Each agent runs under ``unshare --pid --fork --kill-child --mount-proc`` (root only; the tests
skip otherwise, saying so) with ``FLEET_TEST_MARK=<uuid>`` in its environment, so every
process of its tree can be found by walking ``/proc``; SIGKILL of the ``unshare`` process is
the kill. Every wait is a deadline on an event or a polled condition, never a fixed sleep.

Binaries come from tests/agents/install.py; where they are not installed, or ``bwrap`` is
missing for Codex, the tests skip with the reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import shutil
import signal
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.agents import modelservers
from tests.agents.install import require_agent
from tests.agents.presets_probe import AGENTS, agent_env, codex_config_toml, prepare_home

acp = pytest.importorskip("acp", reason="pip install agent-client-protocol (the test extra)")

from acp import spawn_agent_process, text_block  # noqa: E402
from acp.schema import (  # noqa: E402
    AgentMessageChunk,
    AllowedOutcome,
    ClientCapabilities,
    DeniedOutcome,
    RequestPermissionResponse,
    ToolCallStart,
)

pytestmark = [pytest.mark.slow, pytest.mark.integration]

#: Seconds an agent has to answer initialize and session/new (Gemini takes about 2).
STARTUP = 60.0
#: Seconds a prompt has to finish.
TURN = 60.0
#: Seconds the tree has to be gone after the kill.
GONE = 5.0
#: Homes live outside TMPDIR: Codex's sandbox refuses a CODEX_HOME under it.
#: A prompt whose command outlives an uncontained agent's SIGKILL: Codex and Gemini CLI run
#: commands on a pty (its hangup kills what is not ``nohup``), Codex's sandbox dies with it
#: (hence ``ask``, outside the sandbox) and Codex sets a parent-death signal on the shell
#: (hence the grandchild).
UNCONTAINED_SURVIVOR = "ask: nohup sleep 300 & wait"
#: The stopReason of a turn whose command the client rejected: Codex's reject option is
#: "abort" (the turn), Claude Code ends the turn without asking the model again, Gemini CLI
#: tells the model the tool was cancelled and goes on.
REJECTED = {"codex-acp": "cancelled", "claude-code-acp": "end_turn", "gemini": "end_turn"}
HOMES = Path.home() / ".cache" / "agent-fleet" / "test-homes"


class Client:
    """The client side: records updates and permission requests, and answers each with its
    first option whose kind starts with ``answer`` (``allow`` or ``reject``)."""

    def __init__(self, answer: str = "allow") -> None:
        self.updates: list[Any] = []
        self.permissions: list[Any] = []
        self.answer = answer

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        self.updates.append(update)

    async def request_permission(
        self, session_id: str, tool_call: Any, options: list[Any], **kwargs: Any
    ) -> RequestPermissionResponse:
        self.permissions.append((tool_call, options))
        chosen = next((o for o in options if str(o.kind).startswith(self.answer)), None)
        if chosen is None:
            return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))
        return RequestPermissionResponse(
            outcome=AllowedOutcome(outcome="selected", option_id=chosen.option_id)
        )

    def on_connect(self, conn: Any) -> None:
        pass

    def text(self) -> str:
        """The agent's message text so far, chunks joined."""
        return "".join(
            u.content.text for u in self.updates if isinstance(u, AgentMessageChunk)
        ).strip()


@dataclass
class Running:
    """One agent under test: its connection, session, client, process and figures (seconds)."""

    name: str
    conn: Any
    process: Any
    client: Client
    session_id: str
    mark: str
    server: modelservers.ModelServer
    timings: dict[str, float] = field(default_factory=dict)

    async def prompt(self, text: str) -> Any:
        """Send one prompt; its ``PromptResponse``."""
        call = self.conn.prompt(session_id=self.session_id, prompt=[text_block(text)])
        return await asyncio.wait_for(call, TURN)


def marked_pids(mark: str) -> list[int]:
    """Pids of every process whose environment carries ``FLEET_TEST_MARK=<mark>``."""
    needle = f"FLEET_TEST_MARK={mark}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
    return found


def kill_marked(mark: str) -> list[int]:
    """SIGKILL every marked process, by pid: the ones it found."""
    found = marked_pids(mark)
    for pid in found:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return found


def cmdline(pid: int) -> str:
    with contextlib.suppress(OSError):
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    return ""


def commands(mark: str, text: str) -> list[int]:
    """Pids of the marked processes whose command line contains ``text``."""
    return [p for p in marked_pids(mark) if text in cmdline(p)]


def sleeps(mark: str) -> list[int]:
    """Pids of the marked ``sleep 300`` processes themselves (not the shells around them)."""
    return [p for p in marked_pids(mark) if cmdline(p).startswith("sleep 300")]


async def poll(condition: Callable[[], object], timeout: float, every: float = 0.02) -> float:
    """Poll ``condition()`` until it holds: the seconds it took; ``TimeoutError`` after
    ``timeout``."""
    start = time.monotonic()
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(every)
    return time.monotonic() - start


@pytest.fixture(scope="module")
def model_server() -> Iterator[modelservers.ModelServer]:
    with modelservers.serve() as server:
        yield server


@pytest.fixture
def home() -> Iterator[Path]:
    path = HOMES / uuid.uuid4().hex[:12]
    yield path
    shutil.rmtree(path, ignore_errors=True)


@contextlib.asynccontextmanager
async def running(
    name: str,
    server: modelservers.ModelServer,
    home: Path,
    cwd: Path,
    answer: str = "allow",
    contain: bool = True,
    config_file: bool = False,
) -> AsyncIterator[Running]:
    """Start agent ``name`` (under ``unshare`` unless ``contain`` is false), initialize it and
    open a session in ``cwd``; on leaving, SIGKILL it (and, uncontained, every marked process
    left, one by one) and wait until nothing of the tree is left. ``config_file``: Codex reads
    its settings from ``$CODEX_HOME/config.toml`` instead of its command line."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("REAL AGENTS NEED ROOT here: the tests contain them with unshare --pid")
    binary = require_agent(name)
    argv, env = agent_env(name, server.base_url, prepare_home(home, name), str(binary))
    if config_file:
        (Path(env["CODEX_HOME"]) / "config.toml").write_text(codex_config_toml(server.base_url))
        argv = argv[:1]
    mark = uuid.uuid4().hex
    env["FLEET_TEST_MARK"] = mark
    if contain:
        argv = ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", *argv]
    client: Any = Client(answer)  # the part of acp.Client these agents call
    started = time.monotonic()
    spawned: list[Any] = []
    try:
        async with spawn_agent_process(
            client, *argv, env=env, cwd=str(cwd), transport_kwargs={"stderr": None}
        ) as (conn, process):
            spawned.append(process)
            try:
                init = conn.initialize(protocol_version=1, client_capabilities=ClientCapabilities())
                await asyncio.wait_for(init, STARTUP)
                initialized = time.monotonic()
                session = await asyncio.wait_for(
                    conn.new_session(cwd=str(cwd), mcp_servers=[]), STARTUP
                )
                timings = {
                    "initialize": initialized - started,
                    "session/new": time.monotonic() - initialized,
                }
                yield Running(
                    name, conn, process, client, session.session_id, mark, server, timings
                )
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGKILL)
                left = marked_pids if contain else kill_marked
                await poll(lambda: not left(mark), GONE)
    finally:
        # The SDK stops reading stdout before its EOF, so asyncio would close the transport
        # only when it is collected, after the loop is gone ("Event loop is closed").
        for process in spawned:
            transport = getattr(process, "_transport", None)
            if transport is not None:
                transport.close()


@pytest.mark.parametrize("name", AGENTS)
def test_a_plain_prompt_is_answered_in_one_message_ending_the_turn(
    name: str, model_server: modelservers.ModelServer, home: Path, tmp_path: Path
) -> None:
    async def scenario() -> None:
        async with running(name, model_server, home, tmp_path) as agent:
            # When a plain prompt is sent
            started = time.monotonic()
            reply = await agent.prompt("hello from the lab")
            took = time.monotonic() - started
            # Then the agent streams the model's text and the turn ends normally
            assert reply.stop_reason == "end_turn"
            assert agent.client.text() == "echo: hello from the lab"
            print(f"\n{name}: {agent.timings} prompt {took:.3f}s")

    asyncio.run(scenario())


def test_codex_reads_the_same_settings_from_its_config_toml(
    model_server: modelservers.ModelServer, home: Path, tmp_path: Path
) -> None:
    async def scenario() -> None:
        async with running("codex-acp", model_server, home, tmp_path, config_file=True) as agent:
            reply = await agent.prompt("hello from a file")
            assert (reply.stop_reason, agent.client.text()) == (
                "end_turn",
                "echo: hello from a file",
            )

    asyncio.run(scenario())


@pytest.mark.parametrize("name", AGENTS)
def test_a_run_prompt_calls_the_shell_tool_and_answers_with_its_output(
    name: str, model_server: modelservers.ModelServer, home: Path, tmp_path: Path
) -> None:
    async def scenario() -> None:
        async with running(name, model_server, home, tmp_path) as agent:
            # When the model is made to call the agent's shell tool with `echo hi`
            reply = await agent.prompt("run: echo hi")
            # Then the agent reports a tool call, runs it, and the model's last word quotes it
            assert reply.stop_reason == "end_turn"
            assert any(isinstance(u, ToolCallStart) for u in agent.client.updates)
            assert agent.client.text().endswith("done: hi")
            asked = [r for r in model_server.requests if r.reply and r.reply.tool]
            assert asked and asked[-1].reply is not None
            assert asked[-1].reply.command == "echo hi"

    asyncio.run(scenario())


@pytest.mark.parametrize("name", AGENTS)
def test_cancel_then_kill_of_the_container_leaves_no_process_of_the_tree(
    name: str, model_server: modelservers.ModelServer, home: Path, tmp_path: Path
) -> None:
    async def scenario() -> None:
        async with running(name, model_server, home, tmp_path) as agent:
            # Given a turn running `sleep 300` through the agent's shell tool
            turn = asyncio.ensure_future(agent.prompt("run: sleep 300"))
            sleeping = functools.partial(commands, agent.mark, "sleep 300")
            await poll(lambda: bool(sleeping()) or turn.done(), TURN)
            assert sleeping(), f"no `sleep 300` started; the turn ended: {turn.done()}"
            # When the client cancels the turn
            cancelled_at = time.monotonic()
            await agent.conn.cancel(session_id=agent.session_id)
            reply = await asyncio.wait_for(turn, TURN)
            answered = time.monotonic() - cancelled_at
            try:
                stopped = f"stopped {await poll(lambda: not sleeping(), GONE):.3f}s after"
            except TimeoutError:
                stopped = f"still running {GONE:.0f}s after"

            # And kills the container
            tree = marked_pids(agent.mark)
            os.kill(agent.process.pid, signal.SIGKILL)
            gone = await poll(lambda: not marked_pids(agent.mark), GONE)
            # Then the prompt answered `cancelled` and not one process of the tree is left
            assert reply.stop_reason == "cancelled"
            assert marked_pids(agent.mark) == []
            print(
                f"\n{name}: cancel answered in {answered:.3f}s; `sleep 300` {stopped} the "
                f"answer; {len(tree)} processes gone {gone:.3f}s after SIGKILL; "
                f"{len(agent.client.permissions)} permission requests"
            )

    asyncio.run(scenario())


@pytest.mark.parametrize("name", AGENTS)
def test_kill_of_the_container_mid_command_leaves_no_process_of_the_tree(
    name: str, model_server: modelservers.ModelServer, home: Path, tmp_path: Path
) -> None:
    async def scenario() -> None:
        async with running(name, model_server, home, tmp_path) as agent:
            # Given a turn running a `sleep 300` that survives the agent when not contained
            # (test_without_the_container_...): deaf to SIGHUP, a grandchild of the agent
            turn = asyncio.ensure_future(agent.prompt(UNCONTAINED_SURVIVOR))
            sleeping = functools.partial(sleeps, agent.mark)
            await poll(lambda: bool(sleeping()) or turn.done(), TURN)
            assert sleeping(), f"no `sleep 300` started; the turn ended: {turn.done()}"
            sessions = {os.getsid(p) for p in marked_pids(agent.mark)}
            # When the container is killed with no cancel first
            tree = marked_pids(agent.mark)
            os.kill(agent.process.pid, signal.SIGKILL)
            gone = await poll(lambda: not marked_pids(agent.mark), GONE)
            # Then the whole tree is gone, the command too, and the prompt fails
            assert marked_pids(agent.mark) == []
            with pytest.raises(ConnectionError):  # the SDK's answer to a peer gone
                await asyncio.wait_for(turn, TURN)
            print(
                f"\n{name}: {len(tree)} processes in {len(sessions)} sessions gone "
                f"{gone:.3f}s after SIGKILL mid-command"
            )

    asyncio.run(scenario())


@pytest.mark.parametrize("answer", ["allow", "reject"])
@pytest.mark.parametrize("name", AGENTS)
def test_a_command_that_writes_asks_permission_and_runs_only_when_allowed(
    name: str, answer: str, model_server: modelservers.ModelServer, home: Path, tmp_path: Path
) -> None:
    async def scenario() -> None:
        async with running(name, model_server, home, tmp_path, answer) as agent:
            # When the model asks to run a command that writes into the session's cwd
            reply = await agent.prompt("ask: touch made.txt && echo ok")
            # Then the agent asked the client first, and ran it only if allowed
            assert reply.stop_reason == ("end_turn" if answer == "allow" else REJECTED[name])
            assert len(agent.client.permissions) == 1
            assert (tmp_path / "made.txt").exists() == (answer == "allow")
            if answer == "allow":
                assert agent.client.text().endswith("done: ok")
            options = [(o.kind, o.option_id) for o in agent.client.permissions[0][1]]
            print(f"\n{name} {answer}: options {options}; said {agent.client.text()!r}")

    asyncio.run(scenario())


@pytest.mark.parametrize("name", AGENTS)
def test_without_the_container_killing_the_agent_leaves_its_command_running(
    name: str, model_server: modelservers.ModelServer, home: Path, tmp_path: Path
) -> None:
    async def scenario() -> None:
        async with running(name, model_server, home, tmp_path, contain=False) as agent:
            # Given a turn running a `sleep 300` deaf to SIGHUP, a grandchild of the agent
            turn = asyncio.ensure_future(agent.prompt(UNCONTAINED_SURVIVOR))
            sleeping = functools.partial(sleeps, agent.mark)
            await poll(lambda: bool(sleeping()) or turn.done(), TURN)
            assert sleeping(), f"no `sleep 300` started; the turn ended: {turn.done()}"
            # When only the agent's own process is killed
            os.kill(agent.process.pid, signal.SIGKILL)
            await poll(lambda: agent.process.returncode is not None, GONE)
            with pytest.raises(ConnectionError):
                await asyncio.wait_for(turn, TURN)
            # Then the command it started goes on (`running` kills it by pid on leaving)
            left = [cmdline(p) for p in marked_pids(agent.mark)]
            assert sleeping(), left
            print(f"\n{name}: left running after SIGKILL of the agent alone: {left}")

    asyncio.run(scenario())
