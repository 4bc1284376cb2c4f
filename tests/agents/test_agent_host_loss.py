"""An agent's turn whose turn worker is SIGKILLed mid-prompt: the agent's whole tree dies
with the worker, and the turn settles through the sweeper as failed, naming why (the prompt
is not given to the agent a second time)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.families import Family
from orchestrator.session.sessions import create_session
from orchestrator.turn.turns import get_turn, start_turn
from tests.agents.fleet_support import agent_fleet, agents_toml, processes_with
from tests.faults.fleets import sweeping
from tests.helpers import wait_for

pytestmark = [pytest.mark.redis, pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def pair(redis_url: str, key_prefix: str, tmp_path_factory: Any) -> Iterator[tuple[Any, Any]]:
    env = sweeping(2.0)
    with agent_fleet(
        redis_url, key_prefix, tmp_path_factory, "agents2", agents_toml(), **env
    ) as made:
        yield made


def test_a_killed_turn_worker_takes_its_agents_tree_and_the_turn_fails(
    pair: tuple[Any, Any], tmp_path: Path
) -> None:
    private, store = pair
    sid = create_session(store, str(tmp_path), agent="tiny").session_id
    seconds = f"300.{uuid.uuid4().int % 10**6}"
    tid = start_turn(private.store, private.dispatcher, sid, f"run: sleep {seconds}")
    wait_for(lambda: processes_with(f"sleep {seconds}"), 30, message="the agent's command")

    # When the turn worker is SIGKILLed
    private.kill(Family.TURN)

    # Then the agent's command dies with it: killed by the worker's watchdog (the exec
    # warden), which may still be starting up on a loaded machine (its SIGTERM waits for it)
    wait_for(lambda: not processes_with(f"sleep {seconds}"), 15, message="the command to die")
    assert not processes_with(str(tmp_path))

    # And once a worker is back, the sweeper settles the turn failed, saying why
    private.restart(Family.TURN)
    turn = wait_for(
        lambda: (t := get_turn(store, tid)) is not None and t.state == "failed" and t,
        60,
        message="the turn to fail",
    )
    assert "not given twice" in turn.error
    assert not processes_with(f"sleep {seconds}")


def test_a_frozen_turn_worker_has_its_agents_tree_killed_when_the_step_lease_lapses(
    pair: tuple[Any, Any], tmp_path: Path
) -> None:
    import signal

    private, store = pair
    sid = create_session(store, str(tmp_path), agent="tiny").session_id
    seconds = f"300.{uuid.uuid4().int % 10**6}"
    tid = start_turn(private.store, private.dispatcher, sid, f"run: sleep {seconds}")
    wait_for(lambda: processes_with(f"sleep {seconds}"), 30, message="the agent's command")

    # When the turn worker freezes (it renews no lease, stops nothing)
    private.signal(Family.TURN, signal.SIGSTOP)
    try:
        # Then its exec warden kills the agent's tree before the step's lease (5 s) lapses
        wait_for(lambda: not processes_with(f"sleep {seconds}"), 15, message="the command to die")
        assert not processes_with(str(tmp_path))
    finally:
        private.signal(Family.TURN, signal.SIGCONT)

    # And the turn ends, failed, once the worker is back
    turn = wait_for(
        lambda: (t := get_turn(store, tid)) is not None and t.state == "failed" and t,
        60,
        message="the turn to fail",
    )
    assert turn.error
