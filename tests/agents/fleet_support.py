"""What the agent tests share: an agents file naming the project's tiny ACP agent
(``tests/agents/tiny_agent.py``) under each permission policy, a private fleet of turn
workers that reads it, and helpers to start a prompt and look for an agent's processes."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil

from orchestrator.families import Family
from orchestrator.settings import FleetSettings
from orchestrator.storage.store import Store
from tests.faults.fleets import PrivateFleet, private_fleet

TINY = Path(__file__).resolve().parent / "tiny_agent.py"


def agents_toml(extra: str = "") -> str:
    """Definitions of the tiny agent: ``tiny`` (allow), ``tiny-ask`` (ask, 30 s),
    ``tiny-deny`` (deny), ``tiny-brief`` (allow, kept 0.5 s between prompts), ``junk`` (writes what
    is not JSON-RPC), ``ghost`` (a binary that does not exist); ``extra`` appended."""
    command = f'command = ["{sys.executable}", "{TINY}"]'
    return f"""
[agents.tiny]
preset = "acp"
{command}
permissions = "allow"

[agents.tiny-ask]
preset = "acp"
{command}
permissions = "ask"
permission_timeout_seconds = 30

[agents.tiny-deny]
preset = "acp"
{command}
permissions = "deny"

[agents.tiny-brief]
preset = "acp"
{command}
permissions = "allow"
idle_seconds = 0.5

[agents.junk]
preset = "acp"
command = ["sh", "-c", "echo this is not json-rpc; exec sleep 60"]

[agents.ghost]
preset = "acp"
command = ["/nonexistent/agent-binary"]
{extra}
"""


@contextlib.contextmanager
def agent_fleet(
    redis_url: str, key_prefix: str, tmp_path_factory: Any, name: str, toml: str, **env: str
) -> Iterator[tuple[PrivateFleet, Store]]:
    """A private fleet of turn workers reading the agents file ``toml``, and a store on its
    prefix whose settings read the same file (for the interfaces' checks)."""
    folder = tmp_path_factory.mktemp(f"{name}-agents")
    path = folder / "agents.toml"
    path.write_text(toml)
    state = folder / "state"
    env = {"FLEET_AGENTS_FILE": str(path), "FLEET_STATE_DIR": str(state), **env}
    with private_fleet(redis_url, key_prefix, tmp_path_factory, name, [Family.TURN], env) as f:
        settings = FleetSettings(
            redis_url=redis_url,
            key_prefix=f.store.keys.prefix,
            agents_file=path,
            state_dir=state,
        )
        store = Store(redis_url, f.store.keys.prefix, settings=settings)
        try:
            yield f, store
        finally:
            store.close()


def processes_with(text: str) -> list[int]:
    """Pids of live processes whose command line contains ``text``."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        with contextlib.suppress(psutil.Error):
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if text in " ".join(proc.info["cmdline"] or []):
                found.append(proc.pid)
    return found


class Person:
    """An ACP client that answers every permission request with ``choice`` and records
    the requests and updates it is sent."""

    def __init__(self, choice: str) -> None:
        self.choice = choice
        self.asked: list[Any] = []
        self.updates: list[Any] = []

    async def session_update(self, session_id: str, update: Any, **_: Any) -> None:
        self.updates.append(update)

    async def request_permission(self, session_id: str, tool_call: Any, options: Any, **_: Any):
        from acp.schema import AllowedOutcome, RequestPermissionResponse

        self.asked.append((tool_call, options))
        chosen = next(o.option_id for o in options if o.kind == self.choice)
        picked = AllowedOutcome.model_validate({"outcome": "selected", "optionId": chosen})
        return RequestPermissionResponse(outcome=picked)

    def on_connect(self, conn: Any) -> None:
        pass


def prompt_over_acp(
    store: Store, cwd: Path, agent: str, text: str, person: Person, timeout: float = 90.0
) -> tuple[str, str]:
    """Run ``fleet acp`` on ``store``'s prefix and agents file as a client would: a new
    session run by ``agent`` in ``cwd``, one prompt ``text``, every permission request
    answered by ``person``. Returns (session id, stopReason)."""
    import asyncio
    import os

    from acp import spawn_agent_process, text_block

    env = {
        **os.environ,
        "FLEET_KEY_PREFIX": store.keys.prefix,
        "FLEET_AGENTS_FILE": str(store.settings.agents_file),
    }

    async def body() -> tuple[str, str]:
        argv = ["-m", "api.cli", "acp"]
        async with spawn_agent_process(person, sys.executable, *argv, env=env) as (conn, _):
            await conn.initialize(protocol_version=1)
            made = await conn.new_session(cwd=str(cwd), mcp_servers=[], agentFleet={"agent": agent})
            reply = await conn.prompt(session_id=made.session_id, prompt=[text_block(text)])
            return made.session_id, str(reply.stop_reason)

    return asyncio.run(asyncio.wait_for(body(), timeout))


class RawAcp:
    """``fleet acp`` on a store's prefix and agents file, driven line by line with raw
    JSON-RPC (to see what the Python SDK hides: requests it is sent and withdrawn)."""

    def __init__(self, store: Store) -> None:
        import os
        import subprocess

        env = {
            **os.environ,
            "FLEET_KEY_PREFIX": store.keys.prefix,
            "FLEET_AGENTS_FILE": str(store.settings.agents_file),
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "api.cli", "acp"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )
        self._next = 0
        self.seen: list[dict[str, Any]] = []

    def send(self, message: dict[str, Any]) -> None:
        """Write one message."""
        import json

        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(message) + "\n").encode())
        self.proc.stdin.flush()

    def request(self, method: str, params: dict[str, Any]) -> int:
        """Send a request; its id."""
        self._next += 1
        self.send({"jsonrpc": "2.0", "id": self._next, "method": method, "params": params})
        return self._next

    def until(self, match: Any, timeout: float = 60.0) -> dict[str, Any]:
        """Read messages until one for which ``match(message)`` is true; that message.
        Raises ``TimeoutError``."""
        import json
        import select
        import time

        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.2)
            if not ready:
                continue
            line = self.proc.stdout.readline()
            if not line:
                raise EOFError("fleet acp closed its output")
            message = json.loads(line)
            self.seen.append(message)
            if match(message):
                return message
        raise TimeoutError(f"no matching message in {timeout} s; seen {self.seen[-5:]}")

    def close(self) -> None:
        """End the process."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except Exception:
            self.proc.kill()
            self.proc.wait(10)


#: The states a turn ends in.
FINAL = ("completed", "failed", "cancelled", "blocked")


def ended(store: Store, tid: str, timeout: float = 30.0) -> Any:
    """The turn once it has ended (fails the test after ``timeout`` s)."""
    from orchestrator.turn.turns import get_turn
    from tests.helpers import wait_for

    return wait_for(
        lambda: (t := get_turn(store, tid)) is not None and t.state in FINAL and t,
        timeout,
        message=f"turn {tid} to end",
    )


def said(store: Store, sid: str, tid: str) -> str:
    """The agent's message in turn ``tid``, its chunks joined."""
    from tests.workers.support import history

    return "".join(
        u["content"]["text"]
        for u in history(store, sid)
        if u.get("turnId") == tid and u["sessionUpdate"] == "agent_message_chunk"
    )
