"""What a bulk archive answers (``orchestrator.archiving.bulk``): one outcome per session, and the
totals."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from orchestrator.archiving.stops import StopReport
from orchestrator.census.activity import ActivityItem
from orchestrator.errors import quoted_id

#: Outcomes, in the order totals are listed.
OUTCOMES = ("archived", "already_archived", "refused", "not_found", "skipped")


@dataclass
class BulkItem:
    """One session's outcome; ``activity`` holds the live items of a refused session."""

    session_id: str
    outcome: str
    activity: list[ActivityItem] | None = None

    def to_wire(self) -> dict[str, Any]:
        """``{"sessionId", "outcome", "activity"?}``; a malformed ``sessionId`` (``not_found``)
        quoted by its first 80 characters, as a single archive's 404 quotes it."""
        out: dict[str, Any] = {"sessionId": quoted_id(self.session_id), "outcome": self.outcome}
        if self.activity is not None:
            out["activity"] = [item.to_wire() for item in self.activity]
        return out


@dataclass
class BulkResult:
    """Outcome of a bulk archive: one ``BulkItem`` per selected session, in order."""

    results: list[BulkItem]
    dry_run: bool
    stop_activity: bool
    batches: int
    stop_report: StopReport = field(default_factory=StopReport)

    @property
    def totals(self) -> dict[str, int]:
        """Sessions per outcome, plus ``selected`` (all of them)."""
        counts = Counter(item.outcome for item in self.results)
        out = {outcome: counts.get(outcome, 0) for outcome in OUTCOMES}
        out["selected"] = len(self.results)
        return out

    def to_wire(self) -> dict[str, Any]:
        """The JSON answer of ``POST /sessions/archive`` and ``fleet archive --bulk --json``."""
        return {
            "totals": self.totals,
            "results": [item.to_wire() for item in self.results],
            "dryRun": self.dry_run,
            "stopActivity": self.stop_activity,
            "batches": self.batches,
            "stopDispatch": {
                "sent": self.stop_report.sent,
                "failed": [{"family": f, "error": e} for f, e in self.stop_report.failed],
            },
        }
