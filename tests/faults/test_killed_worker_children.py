"""A SIGKILLed worker leaves no process of its work behind, so an archive never hides running
work: a job's whole process tree dies with its job worker, a shell tool's whole tree dies with
its turn worker, and the resumed step runs the command again only once the lost copy's is gone
(never two at once), settling the lost copy's tool call ``failed``.

The module runs workers of its own (prefix ``orphans:``): a visibility timeout of 10 minutes,
so only the sweeper resumes a lost step (``FLEET_TURN_STUCK_SECONDS=2``, a pass every 0.5 s),
and a 2 s job lease. Each test's command carries its own odd duration (``sleep 91.234``), by
which its processes are found (``psutil``); what a test leaves is killed by those exact PIDs.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from typing import Any

import psutil
import pytest

from orchestrator.archiving.archive import archive
from orchestrator.families import Family
from orchestrator.job import jobs
from orchestrator.session.sessions import create_session
from orchestrator.turn.turns import start_turn
from tests.faults.fleets import PrivateFleet, private_fleet, sweeping
from tests.helpers import STARTUP_TIMEOUT, stopping_on_purpose, wait_for
from tests.workers.support import history, requests_of, wait_job_pid

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def private(
    redis_url: str, key_prefix: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[PrivateFleet]:
    env = sweeping(2, FLEET_JOB_LEASE_SECONDS="2")
    families = [Family.TURN, Family.JOB]
    with private_fleet(redis_url, key_prefix, tmp_path_factory, "orphans", families, env) as fleet:
        yield fleet


def marked(marker: str) -> list[psutil.Process]:
    """Live (not zombie) processes whose command line holds ``marker``."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmdline = proc.info["cmdline"] or []
        if proc.info["status"] != psutil.STATUS_ZOMBIE and any(marker in a for a in cmdline):
            found.append(proc)
    return found


def sleeps(marker: str) -> list[psutil.Process]:
    """Live ``sleep <marker>`` processes."""
    return [p for p in marked(marker) if p.info["cmdline"] == ["sleep", marker]]


@contextlib.contextmanager
def killing_leftovers(marker: str) -> Iterator[None]:
    """Kill, by PID, whatever process holding ``marker`` the test leaves behind."""
    try:
        yield
    finally:
        for proc in marked(marker):
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()


def kill_turn_worker(private: PrivateFleet) -> None:
    """Start a second turn worker, wait for it, then SIGKILL the first by PID and reap it."""
    old = private.worker(Family.TURN)
    private.fleet.start_worker(Family.TURN, f"orphans-{len(private.fleet.workers)}")
    private.fleet.wait_ready(STARTUP_TIMEOUT)
    stopping_on_purpose(old.process.pid, signal.SIGKILL)
    old.process.send_signal(signal.SIGKILL)
    old.process.wait(10)
    private.fleet.workers.remove(old)


def tool_calls(store: Any, sid: str) -> dict[str, str]:
    """Each tool call of the conversation by id: its last status."""
    found: dict[str, str] = {}
    for update in history(store, sid):
        if update["sessionUpdate"] in ("tool_call", "tool_call_update"):
            found[update["toolCallId"]] = update["status"]
    return found


def test_a_jobs_whole_process_tree_dies_with_its_sigkilled_job_worker(
    private: PrivateFleet,
) -> None:
    store, dispatcher = private.store, private.dispatcher
    marker = "91.234"
    with killing_leftovers(marker):
        # Given a job running a command (timeout -> /bin/sh -> sleep)
        sid = create_session(store, "/tmp/orphans").session_id
        cmd = f"sleep {marker}; true"
        jobs.create_job(store, dispatcher, sid, 300, cmd, command=cmd)
        wait_for(lambda: sleeps(marker), message="the job's sleep")

        # When its job worker is SIGKILLed by PID
        private.kill(Family.JOB)

        # Then no process of the job runs on
        wait_for(lambda: not marked(marker), 20, message="the job's processes to die")
    private.restart(Family.JOB)


def test_a_jobs_setsid_process_dies_with_its_sigkilled_job_worker(private: PrivateFleet) -> None:
    store, dispatcher = private.store, private.dispatcher
    marker, escaping = "91.456", "91.567"
    with killing_leftovers(marker), killing_leftovers(escaping):
        # Given a job whose command leaves a process in a session of its own
        sid = create_session(store, "/tmp/orphans").session_id
        cmd = f"setsid sleep {escaping} & sleep {marker}"
        jobs.create_job(store, dispatcher, sid, 300, cmd, command=cmd)
        wait_for(lambda: sleeps(escaping) and sleeps(marker), message="the job's sleeps")

        # When its job worker is SIGKILLed by PID
        private.kill(Family.JOB)

        # Then neither the job's command nor the process that left its group runs on
        wait_for(lambda: not marked(marker), 20, message="the job's command to die")
        wait_for(lambda: not sleeps(escaping), 20, message="the escaped process to die")
    private.restart(Family.JOB)


def test_a_default_job_dies_with_its_sigkilled_job_worker(private: PrivateFleet) -> None:
    store, dispatcher = private.store, private.dispatcher
    # Given a job running the supervisor's own command (a plain sleep)
    sid = create_session(store, "/tmp/orphans").session_id
    jid = jobs.create_job(store, dispatcher, sid, 91.345, "default")
    pid = wait_job_pid(store, jid)
    proc = psutil.Process(pid)
    try:
        # When its job worker is SIGKILLed by PID
        private.kill(Family.JOB)
        # Then it dies too
        wait_for(lambda: not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE, 20)
    finally:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    private.restart(Family.JOB)


def test_a_shell_tools_process_dies_with_its_sigkilled_turn_worker_and_archive_sees_it(
    private: PrivateFleet,
) -> None:
    store, dispatcher = private.store, private.dispatcher
    marker = "92.345"
    with killing_leftovers(marker):
        # Given a turn whose step runs the shell tool (sleep 92.345)
        sid = create_session(store, "/tmp/orphans").session_id
        start_turn(store, dispatcher, sid, f"say before\nexec {marker}\nsay after")
        worker = psutil.Process(private.worker(Family.TURN).process.pid)
        [first] = wait_for(
            lambda: sleeps(marker), STARTUP_TIMEOUT, message="the shell tool's child"
        )
        # (and the worker's exec warden, which watches it)
        [warden] = wait_for(
            lambda: [
                p
                for p in worker.children()
                if "orchestrator.process.execwatch" in " ".join(p.cmdline())
            ],
            STARTUP_TIMEOUT,
            message="the turn worker's exec warden",
        )

        # When its turn worker is SIGKILLed by PID
        kill_turn_worker(private)

        # Then the tool's child dies too, and so does the warden (and an archive that stops
        # the session's work, once the sweeper settled what it can, hides nothing)
        wait_for(lambda: not first.is_running(), 20, message="the shell child to die")
        wait_for(lambda: not warden.is_running(), 20, message="the exec warden to die")
        archive(store, dispatcher, sid, stop_activity=True)
        wait_for(lambda: not marked(marker), 30, message="no process of the session left")


def test_a_resumed_step_settles_the_lost_copys_tool_call_failed_and_never_runs_it_twice(
    private: PrivateFleet,
) -> None:
    store, dispatcher = private.store, private.dispatcher
    marker = "93.456"
    with killing_leftovers(marker):
        # Given a turn whose step runs the shell tool (sleep 93.456)
        sid = create_session(store, "/tmp/orphans").session_id
        tid = start_turn(store, dispatcher, sid, f"say before\nexec {marker}\nsay after")
        leaders = {
            p.pid for p in wait_for(lambda: sleeps(marker), STARTUP_TIMEOUT, message="the child")
        }
        [lost_call] = tool_calls(store, sid)

        def one_copy_at_most() -> bool:
            # The resumed copy's command never runs beside the lost copy's.
            found = sleeps(marker)
            assert len(found) <= 1, [p.pid for p in found]
            leaders.update(p.pid for p in found)
            return len(leaders) == 2

        # When its turn worker is SIGKILLed by PID and the sweeper resumes the step
        kill_turn_worker(private)
        wait_for(one_copy_at_most, 40, interval=0.02, message="the resumed copy's command")
        assert requests_of(store, sid, tid) == [0, 1, 1]

        # Then the lost copy's tool call ends failed, and the resumed copy's is in progress
        calls = tool_calls(store, sid)
        assert calls[lost_call] == "failed"
        assert sorted(calls.values()) == ["failed", "in_progress"]
        settled = [u for u in history(store, sid) if u.get("toolCallId") == lost_call][-1]
        assert "lost" in settled["content"][0]["content"]["text"]
        archive(store, dispatcher, sid, stop_activity=True)
        wait_for(lambda: not marked(marker), 30, message="no process of the session left")
