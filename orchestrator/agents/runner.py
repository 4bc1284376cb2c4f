"""One prompt of a session run by its agent: the agent process started contained, driven
over ACP (``initialize``, ``session/load`` or ``session/new``, ``session/prompt``) and
stopped when the prompt ends.

The process lives as long as the prompt: it is started in the step's thread as a contained
tree (``orchestrator/process/containment.py``: a cgroup or a PID namespace, so every process
it starts, shells in sessions of their own included, dies with it), and it is killed when the
prompt answers, when the turn is stopped (``session/cancel``, then the kill after the
definition's ``cancel_grace_seconds``) and with the worker that started it. The next prompt
starts a fresh process, which loads the agent's own session when the agent can
(``loadSession``), so nothing of an idle session runs: an archived session's agent is
offline. An agent that cannot load is given the fleet's record of the conversation with the
prompt instead.

Frames over ``MAX_FRAME_BYTES``, a process that exits or writes what is not JSON-RPC, an
agent that does not answer ``initialize`` in time: each fails the turn with ``AgentFailed``
naming what happened; the tree is killed in every case.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, cast

from acp import PROTOCOL_VERSION, Client, text_block
from acp.client.connection import ClientSideConnection
from acp.schema import ClientCapabilities, FileSystemCapabilities, Implementation

from orchestrator.agents.client import AgentFailed, FleetClient, Sink
from orchestrator.agents.definitions import AgentDefinition
from orchestrator.agents.presets import command_of, environment, preset_of
from orchestrator.process import containment

log = logging.getLogger(__name__)

#: Largest JSON-RPC frame (one line) read from an agent, in bytes.
MAX_FRAME_BYTES = 16 * 1024 * 1024
#: Seconds between two looks at the turn's cancel event.
_CANCEL_POLL = 0.02
#: Bytes of the agent's stderr kept to explain a failure.
_STDERR_TAIL = 2000


@dataclass(frozen=True)
class PromptRun:
    """What a prompt needs: the definition, the session's working directory and the agent's
    home (``home``: its configuration and history), the prompt text, the agent's own
    session id from an earlier prompt (``""``: none) and the fleet's record of the
    conversation so far (``history``: used when the agent cannot load its session)."""

    defn: AgentDefinition
    cwd: str
    home: Path
    prompt: str
    agent_session_id: str = ""
    history: str = ""


@dataclass(frozen=True)
class PromptEnd:
    """How a prompt ended: the agent's ``stopReason`` (ACP), the agent's session id (to load
    next time) and whether the fleet stopped it (``cancelled``)."""

    stop_reason: str
    agent_session_id: str
    cancelled: bool = False


def start_tree(defn: AgentDefinition, cwd: str, home: Path, env: dict[str, str]) -> Any:
    """Start ``defn``'s agent as a contained tree (``containment.start``) with pipes to talk
    to it, its stderr appended to ``home/stderr.log``. Raises ``AgentFailed`` naming what is
    missing."""
    from orchestrator.agents.presets import missing

    lacking = missing(defn, env.get("PATH"), home)
    if lacking:
        raise AgentFailed(f"agent {defn.name!r} cannot run here: {'; '.join(lacking)}")
    argv = command_of(defn)
    with open(home / "stderr.log", "ab") as stderr:
        try:
            return containment.start(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                cwd=cwd,
                env=env,
            )
        except FileNotFoundError:
            raise AgentFailed(
                f"agent {defn.name!r}: {argv[0]!r} was not found on PATH "
                "(`fleet agents check` says what the host lacks)"
            ) from None
        except OSError as exc:
            raise AgentFailed(f"agent {defn.name!r} could not start: {exc}") from None


class _Idle:
    """The sink of an agent between prompts: what it says then is dropped."""

    def text(self, text: str) -> None:
        return None

    def update(self, update: dict[str, Any]) -> bool:
        return False

    def admitted(self) -> bool:
        return False

    def ask(self, ask: Any, timeout: float) -> str | None:
        return None


class LiveAgent:
    """One agent process kept for a session between its prompts. A thread of its own
    starts the contained tree (so the tree's death-with-its-parent binds to that thread),
    serves its pipes on an event loop, and kills the tree when ``close`` stops it. Raises
    ``AgentFailed`` when the agent cannot start or does not answer ``initialize``."""

    def __init__(
        self, defn: AgentDefinition, cwd: str, home: Path, env: dict[str, str], new_id: Any
    ) -> None:
        self.defn, self.cwd, self.home = defn, cwd, home
        self.agent_sid = ""
        self.last_used = time.monotonic()
        self.client = FleetClient(defn, cwd, _Idle(), new_id)
        self.loop = asyncio.new_event_loop()
        self.tree: Any = None
        self.conn: ClientSideConnection | None = None
        self.loads, self.info = False, ""
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._serve, args=(env,), name=f"agent-{defn.name}", daemon=True
        )
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            self.close()
            raise AgentFailed(_with_stderr(str(self._error), home / "stderr.log"))

    def _serve(self, env: dict[str, str]) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.tree = start_tree(self.defn, self.cwd, self.home, env)
            self.loop.run_until_complete(self._connect())
        except BaseException as exc:  # reported by the constructor
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        self.loop.run_forever()
        with contextlib.suppress(Exception):
            if self.conn is not None:
                self.loop.run_until_complete(self.conn.close())
        # What still runs on the loop (the output pump, the connection's readers) ends here,
        # not as tasks destroyed while pending.
        left = asyncio.all_tasks(self.loop)
        for task in left:
            task.cancel()
        with contextlib.suppress(Exception):
            self.loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))

    async def _connect(self) -> None:
        assert self.tree.process.stdin is not None and self.tree.process.stdout is not None
        writer, reader = await _streams(
            self.tree.process.stdin, self.tree.process.stdout, self.client
        )
        self.conn = ClientSideConnection(cast(Client, self.client), writer, reader)
        self.loads, self.info = await _initialize(self.defn, self.conn, self.client)

    def alive(self) -> bool:
        """Whether its process still runs."""
        return self.tree is not None and self.tree.process.poll() is None

    def prompt(self, run: PromptRun, sink: Sink, cancel: threading.Event) -> PromptEnd:
        """Run one prompt, landing what the agent says in ``sink``; ``cancel`` stops it
        (``session/cancel``; the caller then kills the tree). Raises ``AgentFailed``."""
        self.client.sink, self.client.failure, self.client.updates = sink, "", 0
        try:
            ran = asyncio.run_coroutine_threadsafe(self._prompt(run, cancel), self.loop)
            return ran.result()
        except AgentFailed as exc:
            raise AgentFailed(_with_stderr(str(exc), self.home / "stderr.log")) from None
        finally:
            self.client.sink = _Idle()
            self.last_used = time.monotonic()

    async def _prompt(self, run: PromptRun, cancel: threading.Event) -> PromptEnd:
        assert self.conn is not None
        text = run.prompt
        if not self.agent_sid:
            self.agent_sid, text = await _open(run, self.conn, self.client, self.loads)
        return await _prompt(run, self.conn, self.client, self.agent_sid, text, cancel)

    def close(self) -> None:
        """Kill its tree and end its thread (waits for both, a few seconds at most)."""
        if self.tree is not None:
            self.tree.kill()
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
        if self.tree is not None:
            if not self.tree.wait_gone(5):
                log.warning("agent %s: its tree outlived the kill for 5 s", self.defn.name)
            self.tree.close()
        if not self.loop.is_running():
            self.loop.close()


def _with_stderr(message: str, path: Path) -> str:
    try:
        tail = path.read_bytes()[-_STDERR_TAIL:].decode("utf-8", "replace").strip()
    except OSError:
        return message
    last = tail.splitlines()[-1] if tail else ""
    return f"{message}; its last words: {last[:300]}" if last else message


async def _streams(
    stdin: IO[bytes], stdout: IO[bytes], client: FleetClient
) -> tuple[asyncio.StreamWriter, asyncio.StreamReader]:
    """The agent's pipes as asyncio streams. What it writes reaches the connection through
    ``_pump``, which passes on only lines that are JSON objects."""
    loop = asyncio.get_running_loop()
    raw = asyncio.StreamReader(limit=MAX_FRAME_BYTES)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(raw), stdout)
    transport, protocol = await loop.connect_write_pipe(
        lambda: asyncio.streams.FlowControlMixin(), stdin
    )
    writer = asyncio.StreamWriter(transport, protocol, None, loop)
    clean = asyncio.StreamReader(limit=MAX_FRAME_BYTES)
    client.pump = asyncio.ensure_future(_pump(raw, clean, client))
    return writer, clean


async def _pump(
    raw: asyncio.StreamReader, clean: asyncio.StreamReader, client: FleetClient
) -> None:
    """Pass the agent's lines that are JSON objects on to ``clean``; the first that is not
    (or a line over ``MAX_FRAME_BYTES``) fails the agent's prompt (``client.fail``): an agent
    that breaks the protocol is not waited for."""
    try:
        while True:
            try:
                line = await raw.readline()
            except (asyncio.LimitOverrunError, ValueError):
                client.fail(f"the agent wrote a line over {MAX_FRAME_BYTES} bytes")
                return
            if not line:
                return
            if not line.strip():
                continue
            try:
                ok = isinstance(json.loads(line), dict)
            except ValueError:
                ok = False
            if not ok:
                shown = line[:120].decode("utf-8", "replace").strip()
                client.fail(f"the agent wrote what is not JSON-RPC: {shown!r}")
                return
            clean.feed_data(line)
    finally:
        clean.feed_eof()


def _capabilities(defn: AgentDefinition) -> ClientCapabilities:
    fs = preset_of(defn.preset).fs
    return ClientCapabilities(
        fs=FileSystemCapabilities.model_validate({"readTextFile": fs, "writeTextFile": fs}),
        terminal=False,
    )


async def _initialize(
    defn: AgentDefinition, conn: ClientSideConnection, client: FleetClient
) -> tuple[bool, str]:
    """``initialize`` within the definition's start timeout. Returns whether the agent can
    load its sessions, and its name and version as it gave them. Raises ``AgentFailed``
    (also as soon as the agent writes what is not JSON-RPC)."""
    asked = asyncio.ensure_future(
        conn.initialize(
            protocol_version=PROTOCOL_VERSION,
            client_capabilities=_capabilities(defn),
            client_info=Implementation(name="agent-fleet", version="0.1.0"),
        )
    )
    broken = asyncio.ensure_future(client.failed.wait())
    try:
        await asyncio.wait(
            {asked, broken}, timeout=defn.start_timeout_seconds, return_when=asyncio.FIRST_COMPLETED
        )
        if client.failure:
            asked.cancel()
            raise AgentFailed(f"agent {defn.name!r} failed to initialize: {client.failure}")
        if not asked.done():
            asked.cancel()
            raise TimeoutError
        init = asked.result()
    except TimeoutError:
        raise AgentFailed(
            f"agent {defn.name!r} did not answer initialize within {defn.start_timeout_seconds:g} s"
        ) from None
    except AgentFailed:
        raise
    except Exception as exc:
        raise AgentFailed(f"agent {defn.name!r} failed to initialize: {_why(exc)}") from None
    finally:
        broken.cancel()
    info = init.agent_info
    named = f"{info.name} {info.version}" if info else ""
    return bool(init.agent_capabilities and init.agent_capabilities.load_session), named


async def _open(
    run: PromptRun, conn: ClientSideConnection, client: FleetClient, loads: bool
) -> tuple[str, str]:
    """The agent's session loaded (when it can and had one) or a new one. Returns its id
    and the text to prompt (the prompt, after the fleet's record when a new session stands
    in for one the agent had). Raises ``AgentFailed``."""
    if run.agent_session_id and loads:
        client.replaying = True
        try:
            await conn.load_session(cwd=run.cwd, session_id=run.agent_session_id, mcp_servers=[])
            await _replayed(conn, run.agent_session_id)
            return run.agent_session_id, run.prompt
        except Exception as exc:  # an agent that lost its session: start afresh
            log.warning("agent %s could not load its session: %s", run.defn.name, exc)
        finally:
            client.replaying = False
    try:
        made = await conn.new_session(cwd=run.cwd, mcp_servers=[])
    except Exception as exc:
        raise AgentFailed(
            f"agent {run.defn.name!r} failed to start its session: {_why(exc)}"
        ) from None
    text = f"{run.history}\n\n{run.prompt}" if run.history else run.prompt
    return made.session_id, text


async def _replayed(conn: ClientSideConnection, agent_sid: str) -> None:
    """Wait until the updates a ``session/load`` replayed have been handled (dropped): the
    connection hands each to a task of its own, which may still run after the load's answer,
    and would otherwise land in the prompt that follows."""
    tracker = getattr(conn, "_session_updates", None)
    waiting = getattr(tracker, "wait", None)
    if waiting is not None:
        await waiting(agent_sid)
    await asyncio.sleep(0)


async def _prompt(
    run: PromptRun,
    conn: ClientSideConnection,
    client: FleetClient,
    agent_sid: str,
    text: str,
    cancel: threading.Event,
) -> PromptEnd:
    prompt = asyncio.ensure_future(conn.prompt(session_id=agent_sid, prompt=[text_block(text)]))
    while not prompt.done():
        if client.failure:
            prompt.cancel()
            raise AgentFailed(client.failure)
        if cancel.is_set():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.cancel(session_id=agent_sid), 0.2)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(prompt), run.defn.cancel_grace_seconds)
            prompt.cancel()
            return PromptEnd("cancelled", agent_sid, cancelled=True)
        await asyncio.wait({prompt}, timeout=_CANCEL_POLL)
    if client.failure:
        raise AgentFailed(client.failure)
    try:
        answer = prompt.result()
    except AgentFailed:
        raise
    except Exception as exc:
        raise AgentFailed(f"agent {run.defn.name!r} failed the prompt: {_why(exc)}") from None
    return PromptEnd(str(answer.stop_reason), agent_sid)


def _why(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    if isinstance(exc, ConnectionError | EOFError | BrokenPipeError):
        return f"its process ended or closed its output ({text})"
    return text[:300]


@dataclass(frozen=True)
class Checked:
    """What ``check`` found: ``problems`` (empty: the agent started and answered
    ``initialize``), the agent's own name and version when it said them, whether it can load
    its sessions, and how long it took to answer, in seconds."""

    problems: list[str]
    agent_info: str = ""
    load_session: bool = False
    seconds: float = 0.0


def check(defn: AgentDefinition, home: Path, host_env: dict[str, str]) -> Checked:
    """Start ``defn``'s agent (contained, in ``home``), run ``initialize`` and stop it.
    Never raises: what went wrong is in ``Checked.problems``, each a phrase a person can act
    on (a binary not on ``PATH``, ``bwrap`` missing, no answer in time, an exit)."""
    from orchestrator.agents.presets import missing

    lacking = missing(defn, host_env.get("PATH"), home)
    if lacking:
        return Checked(lacking)
    started = time.monotonic()
    try:
        live = LiveAgent(defn, str(home), home, environment(defn, home, host_env), str)
    except AgentFailed as exc:
        return Checked([str(exc)])
    seconds = time.monotonic() - started
    live.close()
    return Checked([], live.info, live.loads, seconds)
