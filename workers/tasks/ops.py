"""``ops.ping``: a task that does nothing but count itself, optionally after asking the gate.

Used to check that a family's workers answer, and by the benchmarks to measure what the gate
costs against the same workers running ungated no-op tasks.
"""

from __future__ import annotations

from typing import Any

from celery import shared_task

from orchestrator.errors import FleetError
from orchestrator.session.gate import StepRefused, admit
from orchestrator.storage.store import translated
from workers.runtime import get_runtime


@shared_task(name="ops.ping")
def ping(session_id: str | None, counter: str, gated: bool = False) -> dict[str, Any]:
    """Increment the counter ``Keys.ops_counter(counter)``; with ``gated``, ask the gate for
    ``session_id`` first and count only admitted pings."""
    rt = get_runtime()
    if gated and session_id:
        try:
            admit(rt.store, session_id)
        except (StepRefused, FleetError) as exc:
            return {"sessionId": session_id, "outcome": type(exc).__name__}
    with translated():
        rt.store.redis.incr(rt.store.keys.ops_counter(counter))
    return {"sessionId": session_id, "outcome": "pong"}
