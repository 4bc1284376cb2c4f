"""The turn sweeper in every turn worker (``workers.periodic``): ``orchestrator.turn.sweeper.sweep``
``SWEEPS_PER_STUCK`` times per ``FLEET_TURN_STUCK_SECONDS``, so a turn whose step was lost is
resumed or ended while at least one turn worker is up. Sweepers on several workers overlap
harmlessly: each turn is decided by one script that re-scores what it resumed."""

from __future__ import annotations

import logging

from orchestrator.turn import sweeper
from workers.periodic import every
from workers.runtime import Runtime

log = logging.getLogger(__name__)

#: Sweeper passes per ``FLEET_TURN_STUCK_SECONDS`` (every 5 s for the default 30 s): a lost
#: step is noticed at most a sixth of that bound late.
SWEEPS_PER_STUCK = 6


@every("turn", "turn-sweeper", lambda s: s.turn_stuck_seconds / SWEEPS_PER_STUCK)
def sweep_turns(rt: Runtime) -> None:
    """One sweeper pass; logs what it changed."""
    settings = rt.settings
    report = sweeper.sweep(
        rt.store,
        rt.dispatcher,
        stuck_seconds=settings.turn_stuck_seconds,
    )
    if any(report.totals.values()):
        log.info(
            "turn sweep: %s",
            ", ".join(f"{action} {n}" for action, n in report.totals.items() if n),
        )
