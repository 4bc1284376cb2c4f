"""A frozen turn worker (SIGSTOP by PID) does not hide a running shell command: the command
dies before its step's lease lapses (its exec watchdog, ``orchestrator/execwatch.py``), so
when the census stops counting the turn, no process of it runs (an archive with
``stopActivity`` made meanwhile is quiet over no running process), and the worker, once
resumed, keeps working.

A fleet of this module's own (prefix ``frozenturn:``): one turn worker, no control worker."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

from orchestrator.activity import census
from orchestrator.archive import archive
from orchestrator.families import Family
from orchestrator.sessions import create_session
from orchestrator.turns import get_turn, start_turn
from tests.faults.fleets import PrivateFleet, private_fleet
from tests.helpers import wait_for
from tests.workers.support import sleep_processes

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def private(
    redis_url: str, key_prefix: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[PrivateFleet]:
    with private_fleet(
        redis_url, key_prefix, tmp_path_factory, "frozenturn", [Family.TURN], {}
    ) as f:
        yield f


def test_a_frozen_turn_workers_shell_command_is_dead_once_its_turn_no_longer_counts(
    private: PrivateFleet,
) -> None:
    store, dispatcher = private.store, private.dispatcher
    worker = private.worker(Family.TURN).process.pid
    # Given a turn whose step runs a 121.3 s shell command
    sid = create_session(store, "/tmp/frozen-turn").session_id
    tid = start_turn(store, dispatcher, sid, "exec 121.3\nsay never")
    wait_for(lambda: sleep_processes(worker, "121.3"), 30, message="the shell command to run")

    # When its turn worker is frozen (SIGSTOP by PID; its children are not), and the session
    # is archived with stopActivity (the stop and the step both wait on the frozen worker)
    private.signal(Family.TURN, signal.SIGSTOP)
    try:
        result = archive(store, dispatcher, sid, stop_activity=True)
        assert result.outcome == "archived"
        # Then while the census counts the turn, and once it does not, the check holds: when
        # it stops counting, the command is already dead
        wait_for(lambda: not census(store, sid), 20, message="the census to empty")
        assert not sleep_processes(worker, "121.3"), "the census is empty over a live command"
    finally:
        # When the worker resumes
        private.signal(Family.TURN, signal.SIGCONT)

    # Then the turn ended and the worker keeps working: a new session's turn completes
    wait_for(
        lambda: (t := get_turn(store, tid)) is not None and t.state.value != "cancelling",
        15,
        message="the turn to settle",
    )
    sid2 = create_session(store, "/tmp/frozen-turn").session_id
    tid2 = start_turn(store, dispatcher, sid2, "say back")
    wait_for(
        lambda: (t := get_turn(store, tid2)) is not None and t.state.value == "completed",
        30,
        message="a new turn to complete",
    )
