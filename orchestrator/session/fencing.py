"""Fencing tokens: which copy of a step may still write.

The same step of a turn can run twice: its worker freezes (SIGSTOP, a long GC pause, a VM
stall) longer than the step's lease, and the sweeper or a broker redelivery begins it again on
another worker; the frozen worker then resumes. Each copy begins with a fresh token
(``new_token``), which ``turn_begin_step.lua`` stores as the lease's value (``Keys.step_lease``)
and as the turn's ``stepToken``. Every write a step makes carries its ``StepGuard`` and is
conditional, in the script that writes, on the turn still running and on the copy still
owning the step (``holds_step``/``step_owns`` in ``storage/_lib.lua``):

- the lease holds the copy's token: it owns the step;
- the lease is gone (it lapsed) and no other copy began since (``stepToken`` is still its
  token; an advance of the turn clears it): it owns the step and re-takes the lease in the
  same script, so a copy that begins later finds the lease and is dropped as ``inflight``;
- otherwise (the lease holds another token, or another copy began and moved on): it is
  superseded, for good. It writes nothing more, neither advances nor ends the turn, and its
  watch cancels it and drops its output (outcome ``superseded``).

Stops (archive, user cancel, the sweeper's settle) act on the turn, not on a step, and take
no token. The rule is the classic fencing token (Kleppmann, "How to do distributed locking",
2016), with the turn's ``stepToken`` as the monotonic part: only the last copy to begin wins.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass


def new_token() -> str:
    """A fresh fencing token for one copy of a step: 32 hex characters (a random UUID)."""
    return uuid.uuid4().hex


@dataclass(frozen=True)
class StepGuard:
    """The copy of a step a write is made for: its turn's id and the token it began with."""

    turn_id: str
    token: str

    @staticmethod
    def argv(guard: StepGuard | None) -> list[str]:
        """``[guardTid, guardToken]`` for a launch script, ``["", ""]`` for a write no step
        makes (guarded by nothing)."""
        return [guard.turn_id, guard.token] if guard is not None else ["", ""]
