"""The ledger of one connection's pending ``session/prompt`` requests.

A prompt waits on a future keyed by its turn id; the forwarder (``Streams``) settles it with
the turn's ``stopReason`` once the turn's updates have been sent. A turn may end before its
prompt's future exists (a fast turn): its reason is kept a while and settles the future as
soon as it is made.

A cancel may also come first: the client sees its prompt's ``user_message_chunk`` as soon as
the turn is stored, which can be before the prompt has tracked its turn here. ``cancel``
counts the prompts of the session that have begun and have no turn tracked yet, and each of
them learns it from ``take_cancel`` once its turn is tracked, and stops that turn.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict

#: How many early endings (turn id -> stopReason) are kept for futures not made yet.
_EARLY_ENDINGS = 256


class Prompts:
    """Pending prompts by session and by turn."""

    def __init__(self) -> None:
        self._futures: dict[str, asyncio.Future[str]] = {}  # turnId -> stopReason
        self._count: dict[str, int] = {}  # sessionId -> prompts pending on it
        # sessionId -> the turns of this connection's prompts in flight (what a cancel stops).
        self._turns: dict[str, set[str]] = {}
        self._ended: OrderedDict[str, str] = OrderedDict()
        # turnId -> prompts waiting on it (more than one: a retry with the same key).
        self._waiting: dict[str, int] = {}
        # sessionId -> prompts on it that were cancelled before their turn was tracked.
        self._early: dict[str, int] = {}

    def begin(self, sid: str) -> None:
        """A prompt on ``sid`` starts (before its turn exists)."""
        self._count[sid] = self._count.get(sid, 0) + 1

    def track(self, sid: str, tid: str) -> asyncio.Future[str]:
        """The future the prompt of turn ``tid`` waits on (done if the turn already ended).
        Prompts of one turn (a retry with the first's idempotency key while the first still
        waits) share one future."""
        self._turns.setdefault(sid, set()).add(tid)
        self._waiting[tid] = self._waiting.get(tid, 0) + 1
        shared = self._futures.get(tid)
        if shared is not None:
            return shared
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        if tid in self._ended:
            future.set_result(self._ended.pop(tid))
        else:
            self._futures[tid] = future
        return future

    def cancel(self, sid: str) -> list[str]:
        """The client cancels its prompts on ``sid``: the turns tracked now (sorted), to stop
        at once; each prompt begun and not tracked yet gets ``True`` from ``take_cancel``."""
        tracked = self._turns.get(sid, set())
        untracked = self._count.get(sid, 0) - len(tracked)
        if untracked > 0:
            self._early[sid] = untracked
        return sorted(tracked)

    def take_cancel(self, sid: str) -> bool:
        """After ``track``: whether this prompt was cancelled before its turn was tracked
        (its turn is then to be stopped). Answers ``True`` once per prompt ``cancel``
        counted."""
        left = self._early.get(sid, 0)
        if left <= 0:
            return False
        if left == 1:
            del self._early[sid]
        else:
            self._early[sid] = left - 1
        return True

    def settle(self, tid: str, reason: str) -> None:
        """Turn ``tid`` ended with ``reason``: resolve its prompt (or remember the reason)."""
        future = self._futures.pop(tid, None)
        if future is None:
            self._ended[tid] = reason
            while len(self._ended) > _EARLY_ENDINGS:
                self._ended.popitem(last=False)
        elif not future.done():
            future.set_result(reason)

    def finish(self, sid: str, tid: str | None) -> None:
        """The prompt on ``sid`` (of turn ``tid``, if one was started) is answered."""
        if tid is None:
            self.take_cancel(sid)  # it never got a turn: a cancel counted for it is spent
        elif self._waiting.get(tid, 1) > 1:  # another prompt still waits on this turn
            self._waiting[tid] -= 1
        else:
            self._waiting.pop(tid, None)
            self._futures.pop(tid, None)
            mine = self._turns.get(sid, set())
            mine.discard(tid)
            if not mine:
                self._turns.pop(sid, None)
        left = self._count.get(sid, 1) - 1
        if left > 0:
            self._count[sid] = left
        else:
            self._count.pop(sid, None)
            self._early.pop(sid, None)

    def waiting(self, tid: str) -> int:
        """How many prompts of this connection wait on turn ``tid``."""
        return self._waiting.get(tid, 0)

    def pending(self, sid: str) -> bool:
        """Whether a prompt of this connection waits on ``sid``."""
        return bool(self._count.get(sid))

    def sessions(self) -> set[str]:
        """The sessions prompts of this connection wait on."""
        return set(self._count)
