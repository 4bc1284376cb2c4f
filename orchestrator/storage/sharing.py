"""One thread per process and store, shared by whoever needs it while anyone does.

The step watch (``orchestrator/turn/stepwatch.py``) and the gate's closure feed
(``orchestrator/session/gate.py``) each serve many members (steps in flight, listeners) of one store
from a single daemon thread, which starts with the first member and ends when none is left.
``Shared`` is that thread and its members; ``PerStore`` keeps one instance per store.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from orchestrator.storage.store import Store

M = TypeVar("M")
S = TypeVar("S")


class Shared(Generic[M]):
    """Members (told apart by identity) served by one daemon thread named ``name``, which
    runs ``serve`` from the first ``add`` until ``serve`` returns (it should once
    ``finished`` says no member is left); a later ``add`` starts it again."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._members: dict[int, M] = {}
        self._thread: threading.Thread | None = None

    def add(self, member: M) -> None:
        with self._lock:
            self._members[id(member)] = member
            if self._thread is None:
                self._thread = threading.Thread(target=self.serve, name=self.name, daemon=True)
                self._thread.start()

    def remove(self, member: M) -> None:
        """Stop serving ``member`` (idempotent)."""
        with self._lock:
            self._members.pop(id(member), None)

    def members(self) -> list[M]:
        """The members now, in the order they were added."""
        with self._lock:
            return list(self._members.values())

    def finished(self) -> bool:
        """Whether no member is left; if so the thread counts as ended (the caller, ``serve``,
        must return), so the next ``add`` starts a new one."""
        with self._lock:
            if self._members:
                return False
            self._thread = None
            return True

    def serve(self) -> None:
        """The thread's work; returns once ``finished``."""
        raise NotImplementedError


class PerStore(Generic[S]):
    """One ``S`` per store in this process, made by the first ``get``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._made: dict[int, tuple[Store, S]] = {}

    def get(self, store: Store, make: Callable[[Store], S]) -> S:
        """The store's ``S``, made by ``make(store)`` if there is none yet (a later call's
        ``make`` is not used)."""
        with self._lock:
            found = self._made.get(id(store))
            if found is None or found[0] is not store:
                found = self._made[id(store)] = (store, make(store))
            return found[1]

    def find(self, store: Store) -> S | None:
        """The store's ``S`` if one was made, without making it."""
        with self._lock:
            found = self._made.get(id(store))
        return found[1] if found is not None and found[0] is store else None
