"""A turn of a session run by an external agent: one ``session/prompt``
(``orchestrator/agents/runner.py``), begun and gated like a model step
(``orchestrator/turn/steps.py``), under the same watch, so a stop or an archive is seen
within ``CANCEL_POLL`` s and the agent's whole tree is killed.

What the agent says lands in the turn as built-in turns' does: its message text through the
step's ``_Emit`` (chunks merged), its tool calls, plans and thoughts as updates of the turn
(``record_update``: nothing lands once the turn stopped), its permission requests either
answered by its definition's policy or recorded for a person
(``orchestrator/agents/permissions.py``) and shown in the conversation. Tool calls the agent
left open when the prompt answered are settled (``completed`` when it ended its turn,
``cancelled`` when it was stopped).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator
from typing import Any

from orchestrator.agents import permissions
from orchestrator.agents.client import AgentFailed, PermissionAsk
from orchestrator.agents.definitions import AgentsFileError, UnknownAgent, load
from orchestrator.agents.pool import pool_of
from orchestrator.agents.presets import environment
from orchestrator.agents.runner import PromptEnd, PromptRun
from orchestrator.models import chat
from orchestrator.models.model import ModelError, Role, StopReason
from orchestrator.process import execwatch
from orchestrator.session import scripts as session_scripts
from orchestrator.session.fencing import StepGuard
from orchestrator.storage.store import Store, new_id
from orchestrator.turn.stepwatch import STEP_LEASE_MS
from orchestrator.turn.turn_state import Turn
from orchestrator.turn.turns import record_update

log = logging.getLogger(__name__)

#: Session hash field holding the agent's own session id (what the next prompt loads).
AGENT_SESSION_FIELD = "agentSessionId"
#: Session hash field naming the worker's agent pool that holds the session's agent process
#: (``orchestrator/agents/pool.py``): another pool's process no longer knows the conversation.
HOLDER_FIELD = "agentHolder"
#: Turn hash field set when its prompt is given to the agent: a step run again (its worker
#: was lost) finds it and fails the turn rather than prompt the agent twice.
PROMPTED_FIELD = "agentPrompted"
#: Most characters of the fleet's record replayed to an agent that cannot load its session.
MAX_HISTORY_CHARS = 20_000


class _Sink:
    """The turn's side of an agent's prompt (``orchestrator.agents.client.Sink``)."""

    def __init__(
        self,
        store: Store,
        session_id: str,
        guard: StepGuard,
        emit: Any,
        cancel: threading.Event,
    ) -> None:
        self.store, self.session_id, self.guard = store, session_id, guard
        self.emit, self.cancel = emit, cancel
        self.open_calls: dict[str, str] = {}  # toolCallId -> its last status

    def text(self, text: str) -> None:
        try:
            self.emit(text)
        except ModelError as exc:
            raise AgentFailed(str(exc)) from None

    def update(self, update: dict[str, Any]) -> bool:
        self.emit.flush()
        call = update.get("toolCallId")
        if isinstance(call, str):
            status = str(update.get("status") or self.open_calls.get(call, "pending"))
            self.open_calls[call] = status
        landed = record_update(
            self.store,
            self.session_id,
            {**update, "turnId": self.guard.turn_id},
            token=self.guard.token,
        )
        return landed

    def admitted(self) -> bool:
        if self.cancel.is_set():
            return False
        verdict = session_scripts.gate_admit(self.store, session_id=self.session_id)
        return verdict is session_scripts.Verdict.OK

    def ask(self, ask: PermissionAsk, timeout: float) -> str | None:
        waiting = permissions.new_pending(
            ask.request_id, self.guard.turn_id, ask.tool_call, ask.options, timeout
        )
        call_id = str(ask.tool_call.get("toolCallId", ""))
        pending = {
            "requestId": ask.request_id,
            "options": ask.options,
            "expiresAt": waiting.expires_at,
            "state": "pending",
        }
        # Recorded before it is told, so a client that hears of it finds it; waited for (and
        # its record removed) however the telling ends.
        permissions.record(self.store, self.session_id, waiting)
        told = False
        try:
            told = self.update(_permission_update(call_id, pending))
        finally:
            timeout = timeout if told else 0.0
            chosen = permissions.wait_for_answer(
                self.store, self.session_id, waiting, timeout, self.cancel
            )
        self.update(
            _permission_update(
                call_id,
                {
                    "requestId": ask.request_id,
                    "state": "answered",
                    "outcome": chosen or "cancelled",
                },
            )
        )
        return chosen

    def settle(self, status: str) -> None:
        """Settle every tool call the agent left open with ``status``."""
        for call, last in list(self.open_calls.items()):
            if last not in ("completed", "failed"):
                self.update(
                    {"sessionUpdate": "tool_call_update", "toolCallId": call, "status": status}
                )


def _permission_update(call_id: str, permission: dict[str, Any]) -> dict[str, Any]:
    return {
        "sessionUpdate": "tool_call_update",
        "toolCallId": call_id,
        "_meta": {"agentFleet": {"permission": permission}},
    }


def run_agent_prompt(
    store: Store,
    session_id: str,
    agent: str,
    prompt: str,
    guard: StepGuard,
    emit: Any,
    cancel: threading.Event,
) -> PromptEnd:
    """Run ``prompt`` on the session's ``agent`` and land what it says in the turn
    ``guard`` names. Returns how the prompt ended. Raises ``ModelError`` (the turn fails,
    naming why: an unknown agent, an agent that broke the turn)."""
    try:
        defn = load(store.settings.agents_file).get(agent)
    except (UnknownAgent, AgentsFileError) as exc:
        raise ModelError(exc.message) from None
    if not store.redis.hsetnx(store.keys.turn(guard.turn_id), PROMPTED_FIELD, guard.token):
        raise ModelError(
            "the prompt was given to the agent by a worker that was lost or stopped, and the "
            "agent died with it; it is not given twice (its side effects may have happened)"
        )
    sink = _Sink(store, session_id, guard, emit, cancel)
    key = store.keys.session(session_id)
    cwd, agent_sid, holder = store.redis.hmget(key, "cwd", AGENT_SESSION_FIELD, HOLDER_FIELD)
    pool = pool_of(store)
    held_here = holder == pool.instance
    home = store.settings.state_dir / "agents" / session_id
    run = PromptRun(
        defn,
        str(cwd or "/"),
        home,
        prompt,
        str(agent_sid or ""),
        "" if agent_sid else _history(store, session_id),
    )
    try:
        env = environment(defn, home, dict(os.environ))
        end = pool.run(
            session_id,
            run,
            sink,
            cancel,
            env,
            new_id,
            held_here=held_here,
            watching=lambda tree: _watched(store, guard, tree),
        )
    except AgentFailed as exc:
        sink.settle("failed")
        raise ModelError(str(exc)) from None
    sink.settle("cancelled" if end.cancelled else "completed")
    store.redis.hset(
        key, mapping={AGENT_SESSION_FIELD: end.agent_session_id, HOLDER_FIELD: pool.instance}
    )
    return end


@contextlib.contextmanager
def _watched(store: Store, guard: StepGuard, tree: Any) -> Iterator[None]:
    """Have the agent's tree watched by this worker's exec warden while the prompt runs
    (``orchestrator/process/execwatch.py``): should the worker freeze past the step's
    lease, the warden, a process of its own, kills the tree."""
    warden, key = execwatch.warden(store), None
    try:
        key = warden.watch(guard.turn_id, guard.token, STEP_LEASE_MS, tree.pid, tree.handle)
    except OSError as exc:  # watched by the step alone
        log.warning("exec warden of turn %s not started: %s", guard.turn_id, exc)
    try:
        yield
    finally:
        warden.drop(key)


def _history(store: Store, session_id: str) -> str:
    """The fleet's record of the conversation before this prompt, as text for an agent that
    has no session of its own to load (``""``: nothing was said yet)."""
    said = [m for m in chat.conversation(store, session_id) if m.text]
    lines = [f"{'User' if m.role is Role.USER else 'You'}: {m.text}" for m in said[:-1]]
    if not lines:
        return ""
    text = "\n".join(lines)[-MAX_HISTORY_CHARS:]
    return f"The conversation so far (from the fleet's record):\n{text}"


def prompt_agent(
    store: Store, turn: Turn, agent: str, emit: Any, cancel: threading.Event
) -> StopReason | None:
    """The step of a turn run by ``agent``: one prompt. Returns why it ended (``None``: it
    was stopped, or the turn no longer runs; the text held back is dropped or landed by the
    caller). Raises ``ModelError`` (the agent failed the turn)."""
    end = run_agent_prompt(store, turn.session_id, agent, turn.prompt, emit.guard, emit, cancel)
    if end.cancelled or cancel.is_set() or end.stop_reason == StopReason.CANCELLED.value:
        emit.flush()
        return None
    try:
        return StopReason(end.stop_reason)
    except ValueError:
        return StopReason.END_TURN
