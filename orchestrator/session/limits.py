"""The ``FLEET_MAX_*`` limits on what turns may start: jobs per session and per host,
reminders per session, subagent depth and live subagents per session.

Each limit is counted in the same Lua script that would store the new item (never read, then
write), which answers ``limit:<count>`` (or ``{'limit', kind, count}``) instead of storing it;
the Python side turns that answer into ``LimitReached`` naming the setting, its value and the
count. In a turn's step the error becomes the tool call's ``failed`` result and the turn goes
on (``orchestrator/turn/tools.py``); the per-host cap is checked by the job worker when it takes a
job, which then ends ``refused`` with the same message as its ``reason``.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.errors import LimitReached
from orchestrator.settings import FleetSettings


@dataclass(frozen=True)
class Limit:
    """One limit: its environment variable, its ``FleetSettings`` field and what the count
    means, ``%d`` standing for it (``%d live jobs in the session``)."""

    env: str
    field: str
    what: str

    def maximum(self, settings: FleetSettings) -> int:
        """The configured value in ``settings`` (a ``Store.settings``)."""
        return int(getattr(settings, self.field))

    def reached(self, maximum: int, count: int) -> LimitReached:
        """The error for a refusal at ``count`` with the limit at ``maximum``; its message is
        ``template(maximum) % count``."""
        return LimitReached(self.env, maximum, count, self.what % count)

    def template(self, maximum: int) -> str:
        """The refusal's text with ``%d`` for the count, for a script that writes it
        (``limit FLEET_X=N reached (%d live jobs ...)``)."""
        return f"limit {self.env}={maximum} reached ({self.what})"


JOBS_PER_SESSION = Limit(
    "FLEET_MAX_JOBS_PER_SESSION", "max_jobs_per_session", "%d live jobs in the session"
)
JOBS_PER_HOST = Limit("FLEET_MAX_JOBS_PER_HOST", "max_jobs_per_host", "%d live jobs on the host")
REMINDERS_PER_SESSION = Limit(
    "FLEET_MAX_REMINDERS_PER_SESSION", "max_reminders_per_session", "%d live reminders"
)
SUBAGENT_DEPTH = Limit(
    "FLEET_MAX_SUBAGENT_DEPTH", "max_subagent_depth", "the spawning session is at depth %d"
)
SUBAGENTS_PER_SESSION = Limit(
    "FLEET_MAX_SUBAGENTS_PER_SESSION", "max_subagents_per_session", "%d live subagents"
)
