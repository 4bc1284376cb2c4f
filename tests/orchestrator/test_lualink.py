"""A script runs after only the prelude definitions it reaches
(``orchestrator/storage/lualink.py``)."""

from __future__ import annotations

import re

import pytest

from orchestrator.families import registry
from orchestrator.storage import lualink
from orchestrator.storage.store import Store, _prelude, _script_paths

PRELUDE = """\
local P = ARGV[1]
local K = {}
K.turn = function(a0) return P .. 'turn:' .. a0 end
K.archived = P .. 'archived'
K.unused = P .. 'unused'
-- base: the first helper.
-- (mentions unused_helper in a comment only)
local function base(x) return x end

local function helper(x)
  -- a comment at column 0 follows, inside the function
-- still inside
  return base(x) .. K.turn(x)
end
local function unused_helper() return 'never' end
local FAMILIES = {}
local function family(name, spec)
  spec.name = name
  FAMILIES[#FAMILIES + 1] = spec
end
local function each_family()
  local out = {}
  for _, f in ipairs(FAMILIES) do out[#out + 1] = f.verdict() end
  return out
end
local function turn_verdict() return 'live' end
family('turn', {
  verdict = turn_verdict,
})
family('job', {
  verdict = function() return K.archived end,
})
"""


def linked(body: str) -> str:
    return lualink.link(lualink.statements(PRELUDE), body)


def test_a_body_gets_what_it_reaches_in_prelude_order_and_nothing_else() -> None:
    source = linked("return helper(ARGV[2])")
    # helper, and through it base, K.turn, K and P; in the prelude's order
    expected = ["local P", "local K", "K.turn =", "local function base", "local function helper"]
    positions = [source.index(text) for text in expected]
    assert positions == sorted(positions)
    # The body comes last, and a comment mentioning a name does not keep it
    assert source.endswith("return helper(ARGV[2])")
    assert "unused_helper()" not in source
    assert "K.unused" not in source and "K.archived" not in source
    assert "FAMILIES" not in source
    # A column-0 comment inside a function stays inside it
    assert "-- still inside\n  return base(x)" in source


def test_a_table_that_is_reached_keeps_every_registration_into_it() -> None:
    source = linked("return each_family()")
    # Both registrations, the functions and keys they use, and the function they call
    for text in ("family('turn'", "family('job'", "local function turn_verdict", "K.archived ="):
        assert text in source, text
    assert source.index("local FAMILIES") < source.index("local function family")
    assert source.index("local function family") < source.index("family('turn'")
    assert "local function helper" not in source


def test_a_double_dash_inside_a_string_is_not_a_comment() -> None:
    source = linked("local sep = '--' .. \"x--\" return helper(sep) -- not: unused_helper()")
    assert "local function helper" in source
    assert "local function unused_helper" not in source
    with pytest.raises(ValueError, match="long bracket"):
        linked("return [[ helper ]]")


def test_a_body_that_reaches_nothing_runs_alone() -> None:
    assert linked("return 1").strip() == "return 1"


def test_a_prelude_statement_that_neither_defines_nor_registers_is_refused() -> None:
    with pytest.raises(ValueError, match="neither defines nor registers"):
        lualink.statements("local P = ARGV[1]\nP = P .. 'x'\n")
    with pytest.raises(ValueError, match="indented"):
        lualink.statements("  return 1\n")


def _prelude_names() -> set[str]:
    return {name for st in _prelude(registry.version()) for name in st.defines}


def test_every_script_defines_every_prelude_name_it_uses() -> None:
    # A name of the prelude used by a script's linked source (outside comments) is defined in
    # it: nothing the script reaches was dropped
    names = _prelude_names()
    word = re.compile(r"\bK\.[A-Za-z_]\w*|[A-Za-z_]\w*")
    for path in sorted(_script_paths().values()):
        if path.name.startswith("_"):
            continue
        source = lualink.link(_prelude(registry.version()), path.read_text(encoding="utf-8"))
        defined = {
            name for st in _prelude(registry.version()) if st.text in source for name in st.defines
        }
        code = "\n".join(line.split("--", 1)[0] for line in source.splitlines())
        used = set(word.findall(code)) & names
        assert used <= defined, (path.name, sorted(used - defined))


def test_the_gate_script_holds_only_the_gate_rule(store: Store) -> None:
    source = store.script("gate_admit").script
    assert "local function gate_refusal" in source
    for unrelated in ("stop_turns_for_archive", "local FAMILIES", "emit_event", "K.audit_all ="):
        assert unrelated not in source, unrelated
    # And it runs: an unknown session is 'missing'
    assert store.run("gate_admit", ["sess_" + "0" * 32]) == "missing"


def test_the_generated_rules_run_and_build_what_python_builds(store: Store) -> None:
    from orchestrator import entries
    from orchestrator.storage import luarules

    lua = luarules.lua_rules() + (
        "return {event_archived('s1', 3), detail_archived(2, true, 1), event_deleted('s2'),"
        " tostring(turn_may(TURN.QUEUED, TURN.RUNNING)),"
        " tostring(turn_may(TURN.CANCELLED, TURN.RUNNING)), STOP_REASON[TURN.COMPLETED]}"
    )
    assert store.redis.eval(lua, 0) == [
        entries.SCRIPT_EVENTS["archived"].render("s1", 3),
        entries.SCRIPT_DETAILS["archived"].render(2, True, 1),
        entries.SCRIPT_EVENTS["deleted"].render("s2"),
        "true",
        "false",
        "end_turn",
    ]
