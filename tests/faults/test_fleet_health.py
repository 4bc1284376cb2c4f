"""A worker the tests rely on that dies (killed by something other than the test) is named at
once, with its log's last lines, by the next wait, instead of every wait running out its
timeout; before the next test it is restarted, and a warning says so.

The module runs a reminder worker of its own (run prefix + ``health:``) and SIGKILLs it by PID,
as another program on the machine would."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

from orchestrator.families import Family
from tests.faults.fleets import PrivateFleet, private_fleet
from tests.helpers import WorkerRestarted, revive, wait_for
from tests.workers.support import process_alive

# A wait that ran out its timeout (600 s) would be cut off by this limit and fail the test.
pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def private(
    redis_url: str, key_prefix: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[PrivateFleet]:
    with private_fleet(
        redis_url, key_prefix, tmp_path_factory, "health", [Family.REMINDER], {}
    ) as fleet:
        yield fleet


def last_log_line(private: PrivateFleet) -> str:
    w = private.worker(Family.REMINDER)
    lines = [line for line in w.log_path.read_text(errors="replace").splitlines() if line]
    assert lines, f"{w.log_path} is empty"
    return lines[-1]


def test_a_wait_fails_at_once_naming_a_worker_killed_behind_the_tests_back(
    private: PrivateFleet,
) -> None:
    # Given a live reminder worker that has logged its start
    w = private.worker(Family.REMINDER)
    pid, last = w.process.pid, last_log_line(private)

    # When another program SIGKILLs it, while the test waits for something only workers do
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(pytest.fail.Exception) as failed:
        wait_for(lambda: False, timeout=600, message="a reminder to fire")

    # Then the wait fails without running out its timeout, naming the worker, how it ended
    # and what it logged last
    text = str(failed.value)
    assert "timed out" not in text, text
    assert f"reminder worker reminder@health (pid {pid}) of the health fleet" in text, text
    assert "signal SIGKILL" in text and "a reminder to fire" in text, text
    assert last in text, text


def test_a_dead_worker_is_restarted_before_the_next_test_with_a_warning(
    private: PrivateFleet,
) -> None:
    # Given a worker SIGKILLed behind the test's back
    old = private.worker(Family.REMINDER)
    os.kill(old.process.pid, signal.SIGKILL)
    old.process.wait(10)

    # When the fleet is revived (as the suite does before each test that relies on it)
    with pytest.warns(WorkerRestarted, match=rf"reminder@health \(pid {old.process.pid}\)"):
        said = revive(private.fleet, "health")

    # Then a new worker runs, and a wait goes on to its end without complaint
    assert said and "signal SIGKILL" in said[0]
    new = private.worker(Family.REMINDER)
    assert new.process.pid != old.process.pid and process_alive(new.process.pid)
    polls = iter(range(3))
    assert wait_for(lambda: next(polls) == 2, timeout=600, message="three polls")


def test_a_worker_the_test_stops_on_purpose_is_not_reported(private: PrivateFleet) -> None:
    # Given a live worker, killed by the test through its fleet
    private.restart(Family.REMINDER)
    pid = private.worker(Family.REMINDER).process.pid
    private.kill(Family.REMINDER)
    assert not process_alive(pid)

    # Then waits go on as usual: its end is what the test asked for
    polls = iter(range(3))
    assert wait_for(lambda: next(polls) == 2, timeout=600, message="three polls")
    private.restart(Family.REMINDER)
