"""The rules the scripts share with Python are generated from the Python definitions
(``orchestrator/storage/luarules.py``, ``orchestrator/entries.py``): states, the turn transition
table,
stop reasons and the JSON entries the scripts write."""

from __future__ import annotations

import json
import re

import pytest

from orchestrator import entries
from orchestrator.states import (
    STOP_REASON,
    TRANSITIONS,
    JobState,
    ReminderState,
    TurnState,
)
from orchestrator.storage import lualink, luarules

pytestmark = pytest.mark.unit

SAMPLES = {entries.STR: "sess_1", entries.INT: 7, entries.BOOL: True, entries.RAW: '{"a": 1}'}
#: What the Lua builder's string.format gets for each sample (tostring(true) for a BOOL).
LUA_ARGS = {entries.STR: "sess_1", entries.INT: 7, entries.BOOL: "true", entries.RAW: '{"a": 1}'}


def _table(name: str) -> str:
    """The generated statement that defines ``name``, comments left out."""
    (text,) = [st.text for st in lualink.statements(luarules.lua_rules()) if name in st.defines]
    return lualink._code(text)


def test_each_state_table_holds_its_enum_by_member_name() -> None:
    for name, enum in (("TURN", TurnState), ("JOB", JobState), ("REMINDER", ReminderState)):
        pairs = dict(re.findall(r"(\w+) = '(\w+)'", _table(name)))
        assert pairs == {m.name: m.value for m in enum}


def test_the_transition_table_is_turns_transitions() -> None:
    rows = re.findall(r"^  \['(\w+)'\] = \{(.*)\},$", _table("TURN_NEXT"), re.M)
    table = {src: set(re.findall(r"\['(\w+)'\] = true", targets)) for src, targets in rows}
    assert table == {s.value: {t.value for t in to} for s, to in TRANSITIONS.items()}


def test_the_stop_reasons_are_turns_stop_reasons() -> None:
    pairs = dict(re.findall(r"\['(\w+)'\] = '(\w+)'", _table("STOP_REASON")))
    assert pairs == {s.value: r for s, r in STOP_REASON.items()}


def test_each_lua_builder_writes_what_python_renders() -> None:
    source = luarules.lua_rules()
    for prefix, shapes in (("event", entries.SCRIPT_EVENTS), ("detail", entries.SCRIPT_DETAILS)):
        for name, shape in shapes.items():
            slots = [slot for _, slot in shape.slots]
            assert f"local function {prefix}_{name}(" in source
            # Lua's string.format and Python's % agree on %s and %d
            lua = shape.lua_format() % tuple(LUA_ARGS[s] for s in slots)
            assert lua == shape.render(*(SAMPLES[s] for s in slots)), name
            json.loads(lua)


def test_an_event_shape_is_the_published_payload() -> None:
    turn = entries.SCRIPT_EVENTS["turn"].render("s1", "t1", "cancelled", "cancelled")
    fields = {"turnId": "t1", "state": "cancelled", "stopReason": "cancelled"}
    assert turn == entries.payload("turn", "s1", fields)
    assert entries.SCRIPT_DETAILS["archived"].render(2, False, 1) == entries.detail_json(
        {"stoppedTurns": 1, "archivedCount": 2, "stopActivity": False}
    )


def test_a_shape_refuses_a_wrong_count_of_values_and_doubles_a_percent() -> None:
    with pytest.raises(ValueError, match="2 values expected"):
        entries.SCRIPT_EVENTS["archived"].render("s1")
    shape = entries.Shape((("note", "100%"), ("n", entries.INT)))
    assert shape.lua_format() % (3,) == shape.render(3)


def test_the_rules_are_prelude_statements_each_defining_its_name() -> None:
    defined = [st.defines for st in lualink.statements(luarules.lua_rules())]
    names = set().union(*defined)
    assert all(len(d) == 1 for d in defined)
    assert {"TURN", "JOB", "REMINDER", "CALL", "TURN_NEXT", "turn_may", "STOP_REASON"} <= names
    assert {"CANCELLED_BY", "event_archived", "detail_ancestor"} <= names


def test_a_lua_string_escapes_quotes_and_backslashes() -> None:
    assert luarules.lua_string("it's a \\ path\n") == "'it\\'s a \\\\ path\\n'"
