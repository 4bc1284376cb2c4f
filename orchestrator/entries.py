"""The JSON entries the fleet writes from Python and from its Lua scripts, each shape written
once: lifecycle events (``events.py``) and audit entries' ``detail`` (``audit.py``).

A ``Shape`` lists an entry's fields in order, each a constant or a slot filled when the entry
is built (``STR``, ``INT``, ``BOOL``, ``RAW``). ``Shape.render`` builds it in Python;
``Shape.lua_format`` gives the same text as a Lua ``string.format`` template, from which
``orchestrator/storage/luarules.py`` generates one Lua builder per shape (``event_archived(sid,
n)``), so Python and the scripts cannot disagree on a shape.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import Enum, StrEnum
from typing import Any


class Slot(Enum):
    """A field filled when the entry is built, and how the Lua template writes it."""

    #: A string written as is between quotes (ids and words: nothing to escape).
    STR = "str"
    #: An integer.
    INT = "int"
    #: A boolean (the Lua builder takes a Lua boolean).
    BOOL = "bool"
    #: JSON text inserted as is (Python's ``render`` takes it as JSON text too).
    RAW = "raw"

    @property
    def directive(self) -> str:
        """Its ``string.format`` directive."""
        return "%d" if self is Slot.INT else "%s"


STR, INT, BOOL, RAW = Slot.STR, Slot.INT, Slot.BOOL, Slot.RAW


class CallStatus(StrEnum):
    """A tool call's ``status`` in its conversation updates (ACP ``ToolCallStatus``)."""

    IN_PROGRESS = "in_progress"  #: launched, no result yet
    COMPLETED = "completed"  #: ended with its result
    FAILED = "failed"  #: ended with an error, or settled after its step was lost
    CANCELLED = "cancelled"  #: settled by a stop or an archive of its turn


# Characters never found in an entry's values, marking the slots while the template is built.
_MARKS = tuple(chr(c) for c in range(0x10, 0x20))


@dataclass(frozen=True)
class Shape:
    """One JSON entry's form: ``fields`` in order, ``(name, constant or Slot)``; ``compact``
    for ``audit.detail_json``'s form (no spaces, keys sorted), else ``json.dumps``'s default
    (``events.payload``'s form)."""

    fields: tuple[tuple[str, Any], ...]
    compact: bool = False

    @property
    def slots(self) -> tuple[tuple[str, Slot], ...]:
        """The ``(name, Slot)`` fields, in the order the builders take them."""
        return tuple((n, v) for n, v in self.fields if isinstance(v, Slot))

    def _dumps(self, doc: dict[str, Any]) -> str:
        if self.compact:
            return json.dumps(doc, separators=(",", ":"), sort_keys=True)
        return json.dumps(doc)

    def render(self, *values: Any) -> str:
        """The entry with ``values`` in its slots (``slots``' order; a ``RAW`` one as JSON
        text). Raises ``ValueError`` when the count of values is not the count of slots."""
        if len(values) != len(self.slots):
            raise ValueError(f"{len(self.slots)} values expected, {len(values)} given")
        it = iter(values)
        doc: dict[str, Any] = {}
        for name, v in self.fields:
            if v is RAW:
                doc[name] = json.loads(next(it))
            elif isinstance(v, Slot):
                doc[name] = next(it)
            else:
                doc[name] = v
        return self._dumps(doc)

    def lua_format(self) -> str:
        """The entry as a ``string.format`` template (Lua's, or Python's ``%``), one
        directive per slot in ``slots``' order; a literal ``%`` is doubled."""
        marks = dict(zip((n for n, _ in self.slots), _MARKS, strict=False))
        doc = {n: (marks[n] if isinstance(v, Slot) else v) for n, v in self.fields}
        text = self._dumps(doc).replace("%", "%%")
        for name, slot in self.slots:
            quoted = json.dumps(marks[name])
            text = text.replace(quoted, f'"{slot.directive}"' if slot is STR else slot.directive)
        return text


def event(kind: str, *fields: tuple[str, Any]) -> Shape:
    """The shape of an event of ``kind``: ``{"type": kind, "sessionId", *fields}``."""
    return Shape((("type", kind), ("sessionId", STR), *fields))


def payload(kind: str, session_id: str, fields: dict[str, Any]) -> str:
    """An event as published (``events.publish_many``): JSON ``{"type": kind, "sessionId":
    session_id, **fields}``."""
    return json.dumps({"type": kind, "sessionId": session_id, **fields})


def detail_json(detail: dict[str, Any]) -> str:
    """An audit entry's ``detail`` as stored: compact JSON, keys sorted."""
    return json.dumps(detail, separators=(",", ":"), sort_keys=True)


def detail(*fields: tuple[str, Any]) -> Shape:
    """The shape of an audit entry's ``detail`` in ``detail_json``'s form."""
    return Shape(tuple(fields), compact=True)


#: The events the scripts emit themselves (``emit_event`` in ``_lib.lua``), by the name of
#: their Lua builder (``event_<name>``, arguments in slot order).
SCRIPT_EVENTS: dict[str, Shape] = {
    "archived": event("archived", ("archived", True), ("historyLength", INT)),
    "update": event("update", ("update", RAW)),
    "turn": event("turn", ("turnId", STR), ("state", STR), ("stopReason", STR)),
    #: A turn's end, whose ``stopReason`` may be null (a failed turn): given as JSON.
    "turn_end": event("turn", ("turnId", STR), ("state", STR), ("stopReason", RAW)),
    "deleted": event("deleted"),
}

#: The ``detail`` of the audit entries the scripts write, by the name of their Lua builder
#: (``detail_<name>``).
SCRIPT_DETAILS: dict[str, Shape] = {
    "archived": detail(("archivedCount", INT), ("stopActivity", BOOL), ("stoppedTurns", INT)),
    "already_archived": detail(("stopActivity", BOOL)),
    "deleted": detail(("deletedCount", INT)),
    "unarchived": detail(("restoredCount", INT)),
    "refused_ancestor": detail(("archivedAncestor", STR)),
    "ancestor": detail(("ancestorId", STR)),
}
