"""The agent processes a turn worker keeps between prompts, one per session.

A session's first prompt on a worker starts its agent (``runner.LiveAgent``); when the
prompt ends the process stays, idle, for its definition's ``idle_seconds``, and the next
prompt of the session that this worker runs reuses it (no start, no ``session/load``). The
process is killed:

- when a prompt is stopped (a cancel, an archive: ``session/cancel`` then the kill, since
  agents leave their running commands behind) or fails;
- when it has been idle ``idle_seconds`` (looked at by a thread of the pool; no Redis);
- when the session's lineage is archived or deleted while it is idle: the pool listens to
  the gate's closures (``orchestrator/session/gate.py``) while it holds agents, and asks
  the gate before it stops one, so an archived session has no agent running;
- when another worker ran the session's last prompt (its process no longer knows the
  conversation): the session records which pool holds its agent (``agentHolder``);
- with the worker (the tree is contained and dies with the thread that started it);
- while a prompt runs, by the worker's exec warden if the worker freezes (a SIGSTOP, a stall)
  past the step's lease: the tree is watched as a ``shell`` tool call's is.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

from orchestrator.agents.client import AgentFailed, Sink
from orchestrator.agents.runner import LiveAgent, PromptEnd, PromptRun
from orchestrator.session import gate
from orchestrator.session import scripts as session_scripts
from orchestrator.storage.store import Store

log = logging.getLogger(__name__)

#: Longest wait between two looks at the idle agents, in seconds.
_REAP_EVERY = 5.0


class AgentPool:
    """The agents of one worker process (``instance``: its id, recorded on the sessions
    whose agent it holds)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.instance = uuid.uuid4().hex
        self._idle: dict[str, LiveAgent] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._reaper: threading.Thread | None = None
        self._listening = False

    def run(
        self,
        session_id: str,
        run: PromptRun,
        sink: Sink,
        cancel: threading.Event,
        env: dict[str, str],
        new_id: Any,
        *,
        held_here: bool,
        watching: Callable[[Any], AbstractContextManager[Any]] = nullcontext,
    ) -> PromptEnd:
        """Run ``run`` on the session's agent: the idle one this pool holds when the
        session's last prompt ran here (``held_here``) on the same definition and cwd, else
        a new one. The prompt runs inside ``watching(tree)`` (the agent's contained tree:
        the step has it watched by the worker's exec warden, which kills it if the worker
        freezes past the step's lease). Raises ``AgentFailed``."""
        with self._lock:
            live = self._idle.pop(session_id, None)
        if live is not None and not (
            held_here and live.alive() and live.defn == run.defn and live.cwd == run.cwd
        ):
            live.close()
            live = None
        if live is None:
            live = LiveAgent(run.defn, run.cwd, run.home, env, new_id)
        try:
            with watching(live.tree):
                end = live.prompt(run, sink, cancel)
        except AgentFailed:
            live.close()
            raise
        if end.cancelled or cancel.is_set() or not live.alive():
            live.close()
            return end
        with self._lock:
            self._idle[session_id] = live
        self._started()
        return end

    def idle(self) -> list[str]:
        """The sessions whose agent this pool holds idle."""
        with self._lock:
            return list(self._idle)

    def stop(self, session_id: str) -> bool:
        """Kill the session's idle agent, if this pool holds one. Returns whether it did."""
        with self._lock:
            live = self._idle.pop(session_id, None)
        if live is None:
            return False
        live.close()
        return True

    def close(self) -> None:
        """Kill every idle agent (the worker is shutting down)."""
        for sid in self.idle():
            self.stop(sid)
        self._wake.set()

    def _started(self) -> None:
        with self._lock:
            if self._reaper is None or not self._reaper.is_alive():
                self._reaper = threading.Thread(target=self._reap, name="agent-pool", daemon=True)
                self._reaper.start()
            if not self._listening:
                gate.listen(self.store, self._closed)
                self._listening = True

    def _reap(self) -> None:
        while True:
            with self._lock:
                agents = dict(self._idle)
            if not agents:
                with self._lock:
                    if not self._idle:
                        gate.unlisten(self.store, self._closed)
                        self._listening = False
                        self._reaper = None
                        return
            now = time.monotonic()
            wait = _REAP_EVERY
            for sid, live in agents.items():
                left = live.defn.idle_seconds - (now - live.last_used)
                if left <= 0 or not live.alive():
                    self._stop_if(sid, live)
                else:
                    wait = min(wait, left)
            self._wake.wait(max(wait, 0.05))
            self._wake.clear()

    def _stop_if(self, sid: str, live: LiveAgent) -> None:
        with self._lock:
            if self._idle.get(sid) is not live:
                return
            del self._idle[sid]
        live.close()

    def _closed(self, ids: frozenset[str] | None) -> None:
        """A gate closure (``ids``; ``None``: look at every session): stop the idle agents
        of sessions the gate now refuses, on a thread of their own (this one is the feed's),
        and remove the home of a deleted one."""
        held = self.idle()
        chosen = held if ids is None else [sid for sid in held if sid in ids]
        if chosen:
            threading.Thread(target=self._offline, args=(chosen,), daemon=True).start()

    def _offline(self, sids: list[str]) -> None:
        for sid in sids:
            try:
                verdict = session_scripts.gate_admit(self.store, session_id=sid)
            except Exception as exc:  # the gate unread: the idle timeout still applies
                log.warning("agent of %s kept: the gate could not be read: %s", sid, exc)
                continue
            if verdict is session_scripts.Verdict.OK:
                continue
            if self.stop(sid):
                log.info("agent of %s stopped: its session is %s", sid, verdict.value)
            if verdict in (session_scripts.Verdict.DELETED, session_scripts.Verdict.MISSING):
                remove_home(self.store.settings.state_dir, sid)


def remove_home(state_dir: Path, session_id: str) -> None:
    """Remove a deleted session's agent home on this host (``state_dir/agents/<id>``), if
    there is one: its configuration and the agent's own history."""
    shutil.rmtree(state_dir / "agents" / session_id, ignore_errors=True)


_pools: dict[int, AgentPool] = {}
_pools_lock = threading.Lock()


def pool_of(store: Store) -> AgentPool:
    """This process's pool for ``store`` (made on first use)."""
    with _pools_lock:
        found = _pools.get(id(store))
        if found is None:
            found = _pools[id(store)] = AgentPool(store)
        return found


def close_all() -> None:
    """Kill every idle agent of this process (at worker shutdown)."""
    with _pools_lock:
        pools = list(_pools.values())
    for found in pools:
        found.close()
