"""The step gate: asked before every model step; refuses steps of archived lineages.

Like a dramatiq middleware veto, ``admit`` raises a typed ``StepRefused`` and the step runner
ends the turn ``blocked`` without a model request. It costs one Redis round trip whatever the
lineage depth (``scripts/gate.lua`` reads the session's stored ancestor list and the archived
set server-side). If Redis cannot be read the gate fails closed: ``StoreUnavailable``
propagates and the caller retries the step later instead of running it.
"""

from __future__ import annotations

from orchestrator.store import Store


class StepRefused(Exception):
    """Raised when a step may not run: ``reason`` is ``archived``, ``deleted`` or ``missing``;
    ``holder`` is the archived session (the session itself or an ancestor)."""

    def __init__(self, session_id: str, reason: str, holder: str | None = None) -> None:
        super().__init__(
            f"step for {session_id} refused: {reason}" + (f" ({holder})" if holder else "")
        )
        self.session_id = session_id
        self.reason = reason
        self.holder = holder


def admit(store: Store, session_id: str) -> None:
    """Return if a model step of ``session_id`` may run now.

    Raises ``StepRefused`` when the session or an ancestor is archived, or the session is
    deleted or unknown; ``StoreUnavailable`` when Redis cannot answer (fail closed).
    """
    verdict: str = store.run("gate", [session_id])
    if verdict == "ok":
        return
    if verdict.startswith("archived:"):
        raise StepRefused(session_id, "archived", verdict.split(":", 1)[1])
    raise StepRefused(session_id, verdict)
