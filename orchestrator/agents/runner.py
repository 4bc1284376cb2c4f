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


def run_prompt(
    run: PromptRun,
    sink: Sink,
    cancel: threading.Event,
    host_env: dict[str, str],
    new_id: Any,
) -> PromptEnd:
    """Run ``run`` to its end in this thread (the step's): start the agent, prompt it, kill
    its tree. ``cancel`` stops it (``session/cancel``, then the kill). Raises
    ``AgentFailed``."""
    env = environment(run.defn, run.home, host_env)
    argv = command_of(run.defn)
    stderr_path = run.home / "stderr.log"
    with open(stderr_path, "ab") as stderr:
        try:
            tree = containment.start(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                cwd=run.cwd,
                env=env,
            )
        except FileNotFoundError:
            raise AgentFailed(
                f"agent {run.defn.name!r}: {argv[0]!r} was not found on PATH "
                "(`fleet agents check` says what the host lacks)"
            ) from None
        except OSError as exc:
            raise AgentFailed(f"agent {run.defn.name!r} could not start: {exc}") from None
    try:
        return asyncio.run(_drive(run, tree, sink, cancel, new_id))
    except AgentFailed as exc:
        raise AgentFailed(_with_stderr(str(exc), stderr_path)) from None
    finally:
        tree.kill()
        if not tree.wait_gone(5):
            log.warning("agent %s: its tree outlived the kill for 5 s", run.defn.name)
        tree.close()


def _with_stderr(message: str, path: Path) -> str:
    try:
        tail = path.read_bytes()[-_STDERR_TAIL:].decode("utf-8", "replace").strip()
    except OSError:
        return message
    last = tail.splitlines()[-1] if tail else ""
    return f"{message}; its last words: {last[:300]}" if last else message


async def _streams(
    stdin: IO[bytes], stdout: IO[bytes]
) -> tuple[asyncio.StreamWriter, asyncio.StreamReader]:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=MAX_FRAME_BYTES)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), stdout)
    transport, protocol = await loop.connect_write_pipe(
        lambda: asyncio.streams.FlowControlMixin(), stdin
    )
    writer = asyncio.StreamWriter(transport, protocol, None, loop)
    return writer, reader


async def _drive(
    run: PromptRun, tree: containment.Tree, sink: Sink, cancel: threading.Event, new_id: Any
) -> PromptEnd:
    assert tree.process.stdin is not None and tree.process.stdout is not None
    writer, reader = await _streams(tree.process.stdin, tree.process.stdout)
    client = FleetClient(run.defn, run.cwd, sink, new_id)
    conn = ClientSideConnection(cast(Client, client), writer, reader)
    try:
        agent_sid, text = await _open(run, conn, client)
        return await _prompt(run, conn, client, agent_sid, text, cancel)
    finally:
        with contextlib.suppress(Exception):
            await conn.close()


async def _open(run: PromptRun, conn: ClientSideConnection, client: FleetClient) -> tuple[str, str]:
    """``initialize``, then the agent's session loaded or a new one. Returns its id and the
    text to prompt (the prompt, after the fleet's record when the agent could not load)."""
    fs = preset_of(run.defn.preset).fs
    caps = ClientCapabilities(
        fs=FileSystemCapabilities.model_validate({"readTextFile": fs, "writeTextFile": fs}),
        terminal=False,
    )
    try:
        init = await asyncio.wait_for(
            conn.initialize(
                protocol_version=PROTOCOL_VERSION,
                client_capabilities=caps,
                client_info=Implementation(name="agent-fleet", version="0.1.0"),
            ),
            run.defn.start_timeout_seconds,
        )
        if (
            run.agent_session_id
            and init.agent_capabilities
            and init.agent_capabilities.load_session
        ):
            client.replaying = True
            try:
                await conn.load_session(
                    cwd=run.cwd, session_id=run.agent_session_id, mcp_servers=[]
                )
                return run.agent_session_id, run.prompt
            except Exception as exc:  # an agent that lost its session: start afresh
                log.warning("agent %s could not load its session: %s", run.defn.name, exc)
            finally:
                client.replaying = False
        made = await conn.new_session(cwd=run.cwd, mcp_servers=[])
    except TimeoutError:
        raise AgentFailed(
            f"agent {run.defn.name!r} did not answer initialize within "
            f"{run.defn.start_timeout_seconds:g} s"
        ) from None
    except AgentFailed:
        raise
    except Exception as exc:
        raise AgentFailed(
            f"agent {run.defn.name!r} failed to start its session: {_why(exc)}"
        ) from None
    text = run.prompt
    if run.history:
        text = f"{run.history}\n\n{run.prompt}"
    return made.session_id, text


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

    lacking = missing(defn, host_env.get("PATH"))
    if lacking:
        return Checked(lacking)
    env = environment(defn, home, host_env)
    started = time.monotonic()
    try:
        tree = containment.start(
            command_of(defn),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=str(home),
            env=env,
        )
    except OSError as exc:
        return Checked([f"{command_of(defn)[0]} could not start: {exc}"])
    try:
        return asyncio.run(_initialize_only(defn, tree, started))
    finally:
        tree.kill()
        tree.close()


async def _initialize_only(
    defn: AgentDefinition, tree: containment.Tree, started: float
) -> Checked:
    assert tree.process.stdin is not None and tree.process.stdout is not None
    writer, reader = await _streams(tree.process.stdin, tree.process.stdout)
    conn = ClientSideConnection(cast(Client, _Silent()), writer, reader)
    try:
        init = await asyncio.wait_for(
            conn.initialize(
                protocol_version=PROTOCOL_VERSION,
                client_info=Implementation(name="agent-fleet", version="0.1.0"),
            ),
            defn.start_timeout_seconds,
        )
    except TimeoutError:
        return Checked([f"no answer to initialize within {defn.start_timeout_seconds:g} s"])
    except Exception as exc:
        return Checked([f"initialize failed: {_why(exc)}"])
    finally:
        with contextlib.suppress(Exception):
            await conn.close()
    info = init.agent_info
    caps = init.agent_capabilities
    return Checked(
        [],
        f"{info.name} {info.version}" if info else "",
        bool(caps and caps.load_session),
        time.monotonic() - started,
    )


class _Silent:
    """A client that offers nothing (``check`` only initializes)."""

    async def session_update(self, *_: Any, **__: Any) -> None:
        return None
