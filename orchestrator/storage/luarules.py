"""The rules the Lua scripts share with Python, generated from the Python definitions.

``lua_rules`` is part of every script's prelude (``orchestrator.storage.store``), after the key
builders of ``keys.lua_prelude``: the scripts name states, transitions, stop reasons and the
JSON entries they write through it, never by spelling them, so each is written once, here in
Python:

- ``TURN``, ``JOB``, ``REMINDER``: the states of ``states.TurnState``, ``states.JobState`` and
  ``states.ReminderState`` by member name (``TURN.RUNNING == 'running'``); ``CALL``: the
  tool call statuses of ``entries.CallStatus``;
- ``TURN_NEXT[from][to]``: ``states.TRANSITIONS`` (true where the move is allowed), and
  ``turn_may(from, to)`` reading it;
- ``STOP_REASON[state]``: ``states.STOP_REASON``; ``CANCELLED_BY``: the ``cancelledBy`` values
  (``ARCHIVE``, ``DELETE``);
- ``event_<name>(...)`` for each shape of ``entries.SCRIPT_EVENTS`` and ``detail_<name>(...)``
  for each of ``entries.SCRIPT_DETAILS``: the entry's JSON, its slots as arguments in order
  (a ``BOOL`` slot takes a Lua boolean).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from enum import StrEnum

from orchestrator import entries
from orchestrator.states import (
    CANCELLED_BY_ARCHIVE,
    CANCELLED_BY_DELETE,
    STOP_REASON,
    TRANSITIONS,
    JobState,
    ReminderState,
    TurnState,
)


def lua_string(text: str) -> str:
    """``text`` as a single-quoted Lua string literal."""
    escaped = text.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n")
    return f"'{escaped}'"


def _table(name: str, doc: str, mapping: Mapping[str, str], *, names: bool = False) -> str:
    """A Lua table of strings; with ``names`` its keys are Lua names (``TURN.RUNNING``)."""
    keys = {k: (k if names else f"[{lua_string(k)}]") for k in mapping}
    pairs = ", ".join(f"{keys[k]} = {lua_string(v)}" for k, v in mapping.items())
    return f"-- {doc}\nlocal {name} = {{{pairs}}}"


def _enum_table(name: str, doc: str, members: Iterable[StrEnum]) -> str:
    return _table(name, doc, {m.name: m.value for m in members}, names=True)


def _builder(name: str, shape: entries.Shape) -> str:
    params = [f"a{i}" for i in range(len(shape.slots))]
    args = [
        f"tostring({p})" if slot is entries.BOOL else p
        for p, (_, slot) in zip(params, shape.slots, strict=True)
    ]
    call = ", ".join([lua_string(shape.lua_format()), *args])
    return f"local function {name}({', '.join(params)}) return string.format({call}) end"


@functools.cache
def lua_rules() -> str:
    """The Lua definitions listed in the module's docstring, one top-level statement each (as
    ``orchestrator/storage/lualink.py`` reads them)."""
    out = [
        _enum_table("TURN", "Turn states (states.TurnState).", TurnState),
        _enum_table("JOB", "Job states (states.JobState).", JobState),
        _enum_table("REMINDER", "Reminder states (states.ReminderState).", ReminderState),
        _enum_table("CALL", "Tool call statuses (entries.CallStatus).", entries.CallStatus),
    ]
    rows = []
    for src, targets in TRANSITIONS.items():
        allowed = ", ".join(f"[{lua_string(t.value)}] = true" for t in sorted(targets))
        rows.append(f"  [{lua_string(src.value)}] = {{{allowed}}},")
    out.append(
        "-- The turn transitions (states.TRANSITIONS): TURN_NEXT[from][to] is true when a turn\n"
        "-- may move from `from` to `to`.\nlocal TURN_NEXT = {\n" + "\n".join(rows) + "\n}"
    )
    out.append(
        "-- Whether a turn in state `from` may move to `to` (TURN_NEXT).\n"
        "local function turn_may(from, to)\n"
        "  local allowed = TURN_NEXT[from]\n"
        "  return allowed ~= nil and allowed[to] == true\n"
        "end"
    )
    out.append(
        _table(
            "STOP_REASON",
            "ACP stopReason of each terminal turn state (states.STOP_REASON).",
            {s.value: r for s, r in STOP_REASON.items()},
        )
    )
    out.append(
        _table(
            "CANCELLED_BY",
            "A stopped turn's cancelledBy (states.CANCELLED_BY_ARCHIVE, CANCELLED_BY_DELETE).",
            {"ARCHIVE": CANCELLED_BY_ARCHIVE, "DELETE": CANCELLED_BY_DELETE},
            names=True,
        )
    )
    for name, shape in entries.SCRIPT_EVENTS.items():
        doc = f"-- The `{name}` event's JSON (entries.SCRIPT_EVENTS).\n"
        out.append(doc + _builder(f"event_{name}", shape))
    for name, shape in entries.SCRIPT_DETAILS.items():
        doc = f"-- The `{name}` audit detail's JSON (entries.SCRIPT_DETAILS).\n"
        out.append(doc + _builder(f"detail_{name}", shape))
    return "\n".join(out) + "\n"
