"""One poll for every step a process has in flight, and each step's watch (``StepWatch``).

A step in flight must see a stop (a cancel, an archive) within ``CANCEL_POLL`` seconds and
keep its lease alive. Each watch polling on its own thread made, with a hundred steps in
flight in one worker, two thousand script calls a second and a hundred lease writes (each an
fsync on an append-only store), which starved the worker's own consumer of the CPU and
delayed every stop's delivery. The process's watches of one store share one thread instead:
every ``CANCEL_POLL`` s one ``turn_watch_many.lua`` call reads every watched turn's state (and,
every ``REFRESH`` s, refreshes every lease), then each watch is told what its turn is. An
archive does not wait for that poll: while the thread runs it listens for the gate's closures
(``gate.listen``), and one that names the session of a watched step polls at once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

from orchestrator.errors import StepSuperseded, StoreUnavailable
from orchestrator.models.model import Cancel
from orchestrator.session import gate
from orchestrator.session.fencing import StepGuard
from orchestrator.storage.sharing import PerStore, Shared
from orchestrator.storage.store import Store
from orchestrator.turn import scripts
from orchestrator.turn.turn_state import TurnState

log = logging.getLogger(__name__)


class Watched(Protocol):
    """What the shared poll needs of a watch: its turn, token and lease, and where to say
    what it saw (``seen`` returns whether the watch is done)."""

    session_id: str
    turn_id: str
    token: str
    lease_ms: int

    def tick(self) -> bool:
        """Before the poll: whether the watch is done without it (its worker shuts down)."""
        ...

    def seen(self, state: str) -> bool:
        """The turn's state as polled; returns whether the watch is done."""
        ...


class _Poll(Shared[Watched]):
    """The shared poll of one store: a thread that runs while watches are registered."""

    def __init__(self, store: Store, every: float, refresh: float) -> None:
        super().__init__("step-watch")
        self.store = store
        self.every = every
        self.refresh = refresh
        #: Set to poll before ``every`` is up (a gate closure names a watched step's session).
        self._wake = threading.Event()
        self._listener: gate.Listener = self._on_closed  # one object: unlisten finds it

    def _on_closed(self, closed: frozenset[str] | None) -> None:
        """A gate closure heard: poll now if it names a watched step's session (``None``,
        a subscription made again, changes nothing: the next poll reads every turn)."""
        if closed is not None and any(w.session_id in closed for w in self.members()):
            self._wake.set()

    def serve(self) -> None:
        gate.listen(self.store, self._listener)
        try:
            self._poll()
        finally:
            gate.unlisten(self.store, self._listener)

    def _poll(self) -> None:
        refreshed = time.monotonic()
        while True:
            self._wake.wait(self.every)
            self._wake.clear()
            if self.finished():
                return
            refresh = time.monotonic() - refreshed >= self.refresh
            live = []
            for w in self.members():
                if w.tick():
                    self.remove(w)
                else:
                    live.append(w)
            if not live:
                continue
            watches = [(w.turn_id, w.lease_ms if refresh else None, w.token) for w in live]
            try:
                states = scripts.turn_watch_many(self.store, watches=watches)
            except StoreUnavailable as exc:  # a blip must not end the watch: leases outlive it
                log.debug("step watch poll: %s", exc)
                continue
            if refresh:
                refreshed = time.monotonic()
            for w, state in zip(live, states, strict=True):
                if w.seen(state):
                    self.remove(w)


_polls: PerStore[_Poll] = PerStore()


def watch(store: Store, watched: Watched, every: float, refresh: float) -> None:
    """Poll ``watched`` with every other watch of ``store`` in this process, every ``every``
    seconds, refreshing leases every ``refresh`` seconds (the first watch of the store sets
    both), until it says it is done or ``unwatch`` is called."""
    _polls.get(store, lambda s: _Poll(s, every, refresh)).add(watched)


def unwatch(store: Store, watched: Watched) -> None:
    """Stop polling ``watched`` (idempotent)."""
    poll = _polls.find(store)
    if poll is not None:
        poll.remove(watched)


#: A step's lease lasts this long unless refreshed (ms); refreshed every ``_REFRESH`` s.
STEP_LEASE_MS = 5_000
_REFRESH = 1.0
#: How often a step in flight looks for a stop (seconds).
CANCEL_POLL = 0.05


class StepWatch:
    """Keeps this copy's lease alive, lands streamed text held back (``flush``), and sets
    ``cancel`` once the turn stops running (``stopped``), another copy of the step began
    (``superseded``) or the worker starts to shut down (``handed_off``), polled every
    ``CANCEL_POLL`` s by the process's one shared poll (``watch``): a stop
    is seen through the store, whatever message its worker consumes.
    """

    def __init__(
        self,
        store: Store,
        guard: StepGuard,
        stopping: threading.Event | None,
        flush: Callable[[], None],
        session_id: str,
    ) -> None:
        self.store = store
        self.session_id = session_id
        self.flush = flush
        self.guard = guard
        self.stopping = stopping
        self.cancel = Cancel()
        self.stopped = False
        self.superseded = False
        self.handed_off = False
        self.turn_id = guard.turn_id
        self.token = guard.token
        self.lease_ms = STEP_LEASE_MS
        self._lock = threading.Lock()
        self._closed = False

    def __enter__(self) -> StepWatch:
        # One shared poll per process for all its steps in flight (orchestrator/turn/stepwatch.py).
        watch(self.store, self, CANCEL_POLL, _REFRESH)
        return self

    def __exit__(self, *exc: object) -> None:
        unwatch(self.store, self)
        with self._lock:  # a poll still under way changes nothing from here on
            self._closed = True

    def tick(self) -> bool:
        """Before each poll: lands the text held back, then a worker shutting down hands the
        step on (done)."""
        with self._lock:
            if self._closed:
                return True
        try:
            self.flush()
        except (StepSuperseded, StoreUnavailable) as exc:  # seen by the poll that follows
            log.debug("held-back text of %s not landed: %s", self.guard.turn_id, exc)
        with self._lock:
            if self._closed:
                return True
            if self.stopping is not None and self.stopping.is_set():
                self.handed_off = True
                self.cancel.set()
                return True
            return False

    def seen(self, state: str) -> bool:
        """The turn's state as polled: anything but running cancels the step (done)."""
        with self._lock:
            if self._closed:
                return True
            if state == TurnState.RUNNING.value:
                return False
            self.superseded = state == "superseded"
            self.stopped = not self.superseded
            self.cancel.set()
            return True
