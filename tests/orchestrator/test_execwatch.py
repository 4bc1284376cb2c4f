"""The exec warden (``orchestrator/process/execwatch.py``) against real Redis and real processes:
one
warden process per worker process watches every shell command of its steps, kills only the
commands whose step lease runs low or changes hands, and is started again, with what it
watched, when it dies."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from orchestrator.process.execwatch import SILENCE, Warden
from orchestrator.process.processes import die_with_parent
from orchestrator.storage.store import Store
from tests.helpers import wait_for

LEASE_MS = 1500  # a third (0.5 s) is the margin; polled every 0.19 s


@pytest.fixture
def warden(store: Store) -> Iterator[Warden]:
    made = Warden(store)
    yield made
    made.close()


@pytest.fixture
def commands() -> Iterator[list[subprocess.Popen[bytes]]]:
    made: list[subprocess.Popen[bytes]] = []
    yield made
    for proc in made:
        proc.kill()
        proc.wait(5)


def command(commands: list[subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    """A shell tool's command stand-in: leads its own process group, as under ``timeout``."""
    proc = subprocess.Popen(["sleep", "60"], preexec_fn=die_with_parent())
    commands.append(proc)
    return proc


def lease(store: Store, turn_id: str, token: str, ms: int = 60_000) -> None:
    store.redis.set(store.keys.step_lease(turn_id), token, px=ms)


def watched(
    store: Store, warden: Warden, commands: list[subprocess.Popen[bytes]], turn_id: str
) -> subprocess.Popen[bytes]:
    """A command of turn ``turn_id``'s step copy ``tok`` (which holds its lease), watched."""
    lease(store, turn_id, "tok")
    proc = command(commands)
    assert warden.watch(turn_id, "tok", LEASE_MS, proc.pid) is not None
    return proc


def lease_runs_low(store: Store, turn_id: str) -> None:
    """Less than a third of the lease left: its worker stopped renewing it."""
    store.redis.pexpire(store.keys.step_lease(turn_id), 200)


def test_one_warden_watches_every_command_and_kills_only_the_one_whose_lease_ran_low(
    store: Store, warden: Warden, commands: list[subprocess.Popen[bytes]]
) -> None:
    # Given two commands of two turns, each step copy holding its lease
    lease(store, "turn-a", "tok-a")
    lease(store, "turn-b", "tok-b")
    a, b = command(commands), command(commands)
    assert warden.watch("turn-a", "tok-a", LEASE_MS, a.pid) is not None
    first = warden.pid
    assert warden.watch("turn-b", "tok-b", LEASE_MS, b.pid) is not None
    # Then one warden process watches both
    assert first is not None and warden.pid == first
    # When turn a's lease has less than a third left (its worker stopped renewing it)
    store.redis.pexpire(store.keys.step_lease("turn-a"), 300)
    # Then a's process group is killed, and b runs on
    assert a.wait(10) == -signal.SIGKILL
    assert b.poll() is None
    # When turn b's lease is taken by another copy of its step
    lease(store, "turn-b", "tok-other")
    # Then b is killed too, by the same warden
    assert b.wait(10) == -signal.SIGKILL
    assert warden.pid == first


def test_a_warden_started_ahead_serves_the_first_command(
    store: Store, warden: Warden, commands: list[subprocess.Popen[bytes]]
) -> None:
    # Given a warden started before any command (as a turn worker starts it when ready)
    warden.start()
    wait_for(lambda: warden._beaten, 30, message="the warden's first beat")
    ahead = warden.pid
    warden.start()  # a second start keeps it
    assert ahead is not None and warden.pid == ahead
    # When the first command is watched and its lease runs low, that warden kills it
    proc = watched(store, warden, commands, "turn-w")
    lease_runs_low(store, "turn-w")
    assert proc.wait(10) == -signal.SIGKILL
    assert warden.pid == ahead


def test_a_dropped_command_is_no_longer_watched(
    store: Store, warden: Warden, commands: list[subprocess.Popen[bytes]]
) -> None:
    # Given a watched command whose step ended: the tool drops it
    lease(store, "turn-d", "tok")
    proc = command(commands)
    warden.drop(warden.watch("turn-d", "tok", LEASE_MS, proc.pid))
    # And a second command keeps the warden busy
    other = watched(store, warden, commands, "turn-e")
    # When the first turn's lease is gone
    store.redis.delete(store.keys.step_lease("turn-d"))
    # Then the second's lease going low still kills it, and the dropped one lives
    lease_runs_low(store, "turn-e")
    assert other.wait(10) == -signal.SIGKILL
    assert proc.poll() is None


def test_a_killed_warden_is_started_again_with_what_it_watched(
    store: Store, warden: Warden, commands: list[subprocess.Popen[bytes]]
) -> None:
    # Given a watched command
    proc = watched(store, warden, commands, "turn-k")
    dead = warden.pid
    assert dead is not None
    # When its warden is killed (SIGKILL by its pid), and the tool's loop checks on it
    os.kill(dead, signal.SIGKILL)
    wait_for(lambda: warden.pid is None, 10, message="the warden to be reaped")
    warden.ensure()
    # Then a new warden runs, and it watches the command it was never told of again
    assert warden.pid not in (None, dead)
    lease_runs_low(store, "turn-k")
    assert proc.wait(10) == -signal.SIGKILL


def test_a_frozen_warden_is_replaced_at_the_next_command_instead_of_blocking_it(
    store: Store, warden: Warden, commands: list[subprocess.Popen[bytes]]
) -> None:
    # Given a warden frozen (SIGSTOP by its pid) with its pipe full
    first = watched(store, warden, commands, "turn-f")
    frozen = warden.pid
    assert frozen is not None
    os.kill(frozen, signal.SIGSTOP)
    try:
        proc = warden._proc
        assert proc is not None and proc.stdin is not None
        while proc.stdin.write(b" " * 4096):  # as many lines as it never read
            pass
        # When the next command is watched: the call returns at once with a new warden
        second = watched(store, warden, commands, "turn-g")
        assert warden.pid not in (None, frozen)
        with pytest.raises(ProcessLookupError):  # the frozen one was killed
            os.kill(frozen, 0)
        # Then the new warden watches both commands
        lease_runs_low(store, "turn-f")
        lease_runs_low(store, "turn-g")
        assert first.wait(10) == -signal.SIGKILL
        assert second.wait(10) == -signal.SIGKILL
    finally:
        with contextlib.suppress(ProcessLookupError):  # replaced: killed and reaped
            os.kill(frozen, signal.SIGCONT)


def test_a_warden_stopped_without_a_full_pipe_is_replaced_once_its_beats_stop(
    store: Store, warden: Warden, commands: list[subprocess.Popen[bytes]]
) -> None:
    # Given a watched command whose warden has beaten (it is up)
    proc = watched(store, warden, commands, "turn-s")
    wait_for(lambda: warden._beaten, 30, message="the warden's first beat")
    frozen = warden.pid
    assert frozen is not None
    # When the warden is frozen (SIGSTOP by its pid) while the tool's loop checks on it
    os.kill(frozen, signal.SIGSTOP)
    try:
        warden.ensure()
        assert warden.pid == frozen  # not yet: SILENCE has not passed
        # Then once SILENCE passes without a beat it is killed and replaced
        wait_for(
            lambda: (warden.ensure(), warden.pid)[1] not in (None, frozen),
            SILENCE + 10,
            message="the silent warden to be replaced",
        )
        with pytest.raises(ProcessLookupError):
            os.kill(frozen, 0)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(frozen, signal.SIGCONT)
    # And the new warden watches the command it was never told of again
    lease_runs_low(store, "turn-s")
    assert proc.wait(10) == -signal.SIGKILL


def test_a_healthy_warden_is_kept_however_long_it_watches(
    store: Store, warden: Warden, commands: list[subprocess.Popen[bytes]]
) -> None:
    watched(store, warden, commands, "turn-h")
    wait_for(lambda: warden._beaten, 30, message="the warden's first beat")
    first = warden.pid
    deadline = time.monotonic() + SILENCE * 1.5
    while time.monotonic() < deadline:  # the tool's loop, for longer than SILENCE
        warden.ensure()
        time.sleep(0.05)
    assert warden.pid == first


def test_the_wardens_log_lines_follow_fleet_log_format(store: Store) -> None:
    # Given a warden run as a worker runs it, with JSON logs, sent a line it cannot read
    env = {
        **os.environ,
        "FLEET_REDIS_URL": store.url,
        "FLEET_KEY_PREFIX": store.keys.prefix,
        "FLEET_LOG_FORMAT": "json",
    }
    proc = subprocess.Popen(
        [sys.executable, "-P", "-m", "orchestrator.process.execwatch"],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
    )
    _, err = proc.communicate(b"not json\n", timeout=60)
    # Then its warning is one JSON line
    [line] = [line for line in err.decode().splitlines() if line.strip()]
    record = json.loads(line)
    assert record["level"] == "WARNING" and "bad request line" in record["message"], record
    logger = (record["logger"], record["family"])
    assert logger == ("orchestrator.process.execwatch", "turn"), record


def test_the_warden_ends_when_its_worker_closes_its_pipe(
    store: Store, warden: Warden, commands: list[subprocess.Popen[bytes]]
) -> None:
    proc = watched(store, warden, commands, "turn-c")
    started = warden._proc
    assert started is not None
    warden.close()
    assert started.wait(10) == 0
    assert proc.poll() is None  # closing the pipe kills nothing


def test_a_bad_request_line_does_not_end_the_warden(
    store: Store, warden: Warden, commands: list[subprocess.Popen[bytes]]
) -> None:
    proc = watched(store, warden, commands, "turn-x")
    running = warden._proc
    assert running is not None and running.stdin is not None
    running.stdin.write(b'{"nonsense": 1}\nnot json\n{"watch": [1]}\n')
    lease_runs_low(store, "turn-x")
    assert proc.wait(10) == -signal.SIGKILL
    assert warden.pid == running.pid


def test_a_command_already_gone_is_not_watched(store: Store, warden: Warden) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait(5)
    assert warden.watch("turn-z", "tok", LEASE_MS, gone.pid) is None
    assert warden.pid is None  # no warden started for nothing
