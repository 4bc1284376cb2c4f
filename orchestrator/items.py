"""The census's item type, a leaf of the domain: the error tree (``SessionActive`` carries
items) and every family's code share it without importing each other."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from orchestrator.families import Family


@dataclass(frozen=True)
class ActivityItem:
    """One live item: ``family``, ``id`` (turn/job/reminder id, or the descendant session id
    for ``subagent``), a human ``label``, the ``session_id`` that owns it, and for jobs the
    ``host`` running the process. A ``subagent`` item also carries, in ``parts``, the
    descendant's own live items the census found (never on the wire: a stop names exactly
    these, so a late one leaves alone what the descendant started since)."""

    family: Family
    id: str
    label: str
    session_id: str
    host: str | None = None
    parts: tuple[ActivityItem, ...] = field(default=(), compare=False, repr=False)

    def to_wire(self) -> dict[str, Any]:
        """``{"family", "id", "label", "sessionId", "host"?}``."""
        out: dict[str, Any] = {
            "family": self.family.value,
            "id": self.id,
            "label": self.label,
            "sessionId": self.session_id,
        }
        if self.host:
            out["host"] = self.host
        return out
