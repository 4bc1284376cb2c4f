"""A one-step scripted turn costs Redis at most ``MAX_COMMANDS`` commands, Celery's included
(about 57 are measured: benchmark 13 lists them by command).

Measured as benchmark 13 measures it (``bench/step_cost.py``): a private ``redis-server``
serving one host's real turn workers and nothing else, ``INFO commandstats`` read before and
after ``N`` turns of ``say hello`` run one after the other (from ``turns.start_turn`` to the
turn's ``turn`` event), the idle fleet's rate over as long subtracted. A regression that adds
a command to every step shows here.
"""

from __future__ import annotations

import pytest

from bench.step_cost import turn_fleet

pytestmark = pytest.mark.redis

#: Commands one one-step turn may cost (the goal is 40: docs/benchmarks.md, benchmark 13).
MAX_COMMANDS = 60
#: Turns measured.
N = 20


def test_a_one_step_turn_costs_at_most_max_commands() -> None:
    # Given one host's turn workers on a Redis of their own, warm
    with turn_fleet() as fleet:
        # When N one-step turns run one after the other
        cost = fleet.cost(N)

    # Then each cost at most MAX_COMMANDS commands, the idle rate subtracted
    breakdown = {name: round(calls, 2) for name, calls in cost.by_command.items()}
    print(f"per turn {cost.per_turn:.1f}, idle {cost.idle_per_second:.1f}/s, {breakdown}")
    assert cost.per_turn <= MAX_COMMANDS, (cost.per_turn, cost.idle_per_second, breakdown)
