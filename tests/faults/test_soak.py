"""The short fault soak (``bench/soak``), as CI runs it: 50 s of traffic over the HTTP API
while Redis, every worker and the API are killed, stopped and squeezed, their connections
frozen and their writes refused (``NOREPLICAS``), and sessions' processes leave their process
groups, then at most 30 s to settle, with a fixed seed. About two minutes of wall clock on two
cores.

The schedule runs every fault kind once (in a seeded order) before it draws kinds by weight
(``bench.soak.faults``), so a phase that fits ten faults has run all ten; the test checks
that every kind ran."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.soak.faults import KINDS

pytestmark = [pytest.mark.slow, pytest.mark.integration]

SEED = 7359
FAULT_SECONDS = 50
SETTLE_SECONDS = 30


def test_a_short_fault_soak_finds_no_violation(tmp_path: Path) -> None:
    # Given a private Redis, a worker per family, the API and beat, started by the soak
    # When 50 s of seeded traffic meets seeded faults of every kind, every fault is released,
    #   and the fleet gets at most 30 s to settle
    cmd = [
        sys.executable, "-m", "bench.soak",
        "--minutes", str(FAULT_SECONDS / 60),
        "--settle", str(SETTLE_SECONDS),
        "--seed", str(SEED),
        "--sessions", "16",
        "--state-dir", str(tmp_path / "soak"),
        "--json",
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    # Then every check counts zero violations (the table is in the failure message)
    assert done.stdout, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert len(result["checks"]) == 8, done.stderr[-3000:]
    assert set(KINDS) <= set(result["faults"]), (result["faults"], done.stderr[-3000:])
    assert result["violations"] == 0, done.stderr[-4000:]
    assert done.returncode == 0, done.stderr[-3000:]
