"""``subagent.stop``."""

from __future__ import annotations

from typing import Any

from orchestrator.subagents import stop_subagents
from workers.app import app
from workers.runtime import get_runtime


@app.task(name="subagent.stop", acks_late=True)
def stop(session_id: str, descendant_ids: list[str]) -> dict[str, Any]:
    """Stop the named running descendants of a session (any depth)."""
    rt = get_runtime()
    return {
        "sessionId": session_id,
        "subagents": stop_subagents(rt.store, rt.dispatcher, session_id, list(descendant_ids)),
    }
