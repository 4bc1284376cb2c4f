"""``archive.auto``: one run of the auto-archive policy, on the ``maintenance`` queue (which
reminder workers consume); ``fleet beat`` schedules it."""

from __future__ import annotations

import logging
from typing import Any

from orchestrator import bulk
from orchestrator.errors import InvalidParams
from workers.app import app
from workers.runtime import get_runtime

log = logging.getLogger(__name__)

#: Most archived ids a run's result lists (the totals count all of them).
_LISTED = 100


@app.task(name="archive.auto", acks_late=True)
def auto(idle_seconds: float | None = None, cwd: str | None = None) -> dict[str, Any]:
    """Archive sessions idle longer than ``idle_seconds`` (default: this worker's
    ``FLEET_AUTO_ARCHIVE_IDLE_SECONDS``) with no live work; ``cwd`` narrows the run to one
    directory. Overlapping runs are harmless: each session is checked and written atomically."""
    rt = get_runtime()
    try:
        result = bulk.auto_archive(rt.store, rt.dispatcher, idle_seconds=idle_seconds, cwd=cwd)
    except InvalidParams as exc:
        log.info("auto-archive skipped: %s", exc.message)
        return {"outcome": "off", "message": exc.message}
    archived = [i.session_id for i in result.results if i.outcome == "archived"]
    return {"outcome": "ran", "totals": result.totals, "archived": archived[:_LISTED]}
