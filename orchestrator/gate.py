"""The step gate: asked before every model step; refuses steps of archived lineages.

Like a dramatiq middleware veto, ``admit`` raises a typed ``StepRefused`` and the step runner
ends the turn ``blocked`` without a model request.

It costs one Redis round trip whatever the lineage depth, and reads only the session's own
entries: the archive state is materialized down the tree when it is written, so the gate never
walks the lineage. The invariant the scripts keep, atomically, is: *a session with an archived
ancestor is itself in the archived set.* Archiving marks the whole subtree
(``archive.lua``); a child created under an archived lineage is born archived
(``create_session.lua``); unarchiving a session whose ancestor is archived is refused
(``unarchive.lua``). Writes are rare and reads are per step, so the cost sits on the write side.

The rule itself is written once, in Lua (``gate_refusal`` in ``scripts/_lib.lua``): the step
runner applies it inside the script that begins the step (``turn_begin_step.lua``), so no step
is admitted once an archive commits, and ``admit`` asks the same rule through a one-line
script.

If Redis cannot be read the gate fails closed: ``StoreUnavailable`` propagates and the caller
retries the step later instead of running it.
"""

from __future__ import annotations

from orchestrator.sessions import SESSION_ID_RE
from orchestrator.store import Store


class StepRefused(Exception):
    """Raised when a step may not run: ``reason`` is ``archived``, ``deleted`` or ``missing``;
    ``holder`` is the archived session (the session itself: see the module docstring)."""

    def __init__(self, session_id: str, reason: str, holder: str | None = None) -> None:
        detail = f" ({holder})" if holder else ""
        super().__init__(f"step for {session_id} refused: {reason}{detail}")
        self.session_id = session_id
        self.reason = reason
        self.holder = holder


def admit(store: Store, session_id: str) -> None:
    """Return if a model step of ``session_id`` may run now.

    Raises ``StepRefused`` when the session (hence also when any ancestor) is archived, or the
    session is deleted or unknown; ``StoreUnavailable`` when Redis cannot answer (fail closed).
    """
    if not isinstance(session_id, str) or not SESSION_ID_RE.fullmatch(session_id):
        raise StepRefused(str(session_id), "missing")
    verdict = store.run("gate_admit", [session_id])
    if verdict != "ok":
        raise refusal(session_id, str(verdict))


def refusal(session_id: str, reason: str) -> StepRefused:
    """The typed veto for a refusal ``reason`` the gate's rule gave (``archived``, ``deleted``,
    ``missing``); an archived session holds its own refusal (see the module docstring)."""
    return StepRefused(session_id, reason, session_id if reason == "archived" else None)


def verdicts(store: Store, session_ids: list[str]) -> dict[str, str]:
    """The gate's verdict on each of ``session_ids`` in one round trip (``gate_many.lua``):
    ``{sessionId: "ok" | "archived" | "deleted" | "missing"}``; a malformed id is
    ``missing``. Raises ``StoreUnavailable``."""
    wanted = [s for s in dict.fromkeys(session_ids) if isinstance(s, str)]
    valid = [s for s in wanted if SESSION_ID_RE.fullmatch(s)]
    replies = store.run("gate_many", valid) if valid else []
    found = dict(zip(valid, (str(v) for v in replies), strict=True))
    return {s: found.get(s, "missing") for s in wanted}
