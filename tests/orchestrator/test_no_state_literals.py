"""No Lua script spells a turn, job or reminder state: each names it through the generated
prelude (``TURN.RUNNING``, ``JOB.STARTING``, ``REMINDER.ARMED``,
``orchestrator/storage/luarules.py``),
so the Python enums are the one place a state is written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from orchestrator.states import JobState, ReminderState, TurnState
from orchestrator.storage import lualink

pytestmark = pytest.mark.unit

PACKAGE_DIR = Path(__file__).resolve().parents[2] / "orchestrator"

#: State names the scripts also spell with another meaning, never as the state: ``deleted``
#: (the session hash's field, a reply, an audit outcome), ``stopped`` (a creating script's
#: reply), ``refused`` (an audit outcome of unarchive.lua).
OTHER_MEANINGS = frozenset({"deleted", "stopped", "refused"})

#: (script, name) where the name means something else in that script only: ``queued``, the
#: broker scan's verdict on a step's message (waiting in the queue).
OTHER_MEANINGS_IN = frozenset({("turn_broker_scan.lua", "queued"), ("turn_sweep.lua", "queued")})

STATES = (
    {s.value for s in TurnState} | {s.value for s in JobState} | {s.value for s in ReminderState}
) - OTHER_MEANINGS


def _scripts() -> list[Path]:
    return sorted(PACKAGE_DIR.glob("**/*.lua"))


def quoted_states(name: str, text: str) -> list[str]:
    """The quoted state names in ``text``'s code (comments left out), as ``line: 'name'``."""
    found = []
    pattern = re.compile(r"""(['"])([a-z_]+)\1""")
    for n, line in enumerate(lualink._code(text).splitlines(), start=1):
        for m in pattern.finditer(line):
            word = m.group(2)
            if word in STATES and (name, word) not in OTHER_MEANINGS_IN:
                found.append(f"{n}: {m.group(0)}")
    return found


def test_the_check_reads_every_script_and_finds_a_spelled_state() -> None:
    names = {p.name for p in _scripts()}
    assert {"_lib.lua", "turn_cancel.lua", "job.lua", "turn.lua"} <= names
    code = "if st == 'running' then -- 'queued' in a comment\nreturn \"armed\" end"
    assert quoted_states("x.lua", code) == ["1: 'running'", '2: "armed"']
    assert quoted_states("x.lua", "if st == TURN.RUNNING then return 1 end") == []


def test_no_script_spells_a_state() -> None:
    spelled = {
        str(path.relative_to(PACKAGE_DIR)): quoted_states(path.name, path.read_text("utf-8"))
        for path in _scripts()
    }
    assert {name: found for name, found in spelled.items() if found} == {}
