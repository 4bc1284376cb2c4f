"""The census's item type, a leaf of the domain: the error tree (``SessionActive`` carries
items), the census and every family's module share it without importing each other."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

_LABEL_TEXT = 60


@dataclass(frozen=True)
class ActivityItem:
    """One live item: ``family`` (a registered family's name), ``id`` (turn/job/reminder id, or
    the descendant session id for ``subagent``), a human ``label``, the ``session_id`` that
    owns it, and for jobs the ``host`` running the process. A ``subagent`` item also carries,
    in ``parts``, the descendant's own live items the census found (never on the wire: a stop
    names exactly these, so a late one leaves alone what the descendant started since)."""

    family: str
    id: str
    label: str
    session_id: str
    host: str | None = None
    parts: tuple[ActivityItem, ...] = field(default=(), compare=False, repr=False)

    def to_wire(self) -> dict[str, Any]:
        """``{"family", "id", "label", "sessionId", "host"?}``."""
        out: dict[str, Any] = {
            "family": str(self.family),
            "id": self.id,
            "label": self.label,
            "sessionId": self.session_id,
        }
        if self.host:
            out["host"] = self.host
        return out


def shorten(text: str, limit: int = _LABEL_TEXT) -> str:
    """The first line of ``text``, cut to ``limit`` characters with an ellipsis."""
    first = text.strip().splitlines()[0] if text.strip() else ""
    return first if len(first) <= limit else first[: limit - 1] + "…"
