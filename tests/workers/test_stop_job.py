"""Stopping background jobs on real job workers: two job hosts (``test-1``, ``test-2``) both
take jobs from the shared ``job`` queue, and a stop must reach exactly the host that owns the
job's process."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from orchestrator.archiving.archive import archive
from orchestrator.census.activity import census
from orchestrator.job import jobs
from orchestrator.job import scripts as job_scripts
from orchestrator.storage.store import iso, new_id, now_ms
from tests.helpers import wait_for
from tests.workers.support import (
    job_record,
    job_workers,
    log_text,
    process_alive,
    sleep_processes,
    wait_gone,
    wait_job_pid,
    wait_log,
)

pytestmark = pytest.mark.timeout(60)

#: Jobs to try before giving up on seeing both hosts take one.
MAX_JOBS = 12


@contextmanager
def _held_supervisor(store: Any, rt: Any) -> Iterator[tuple[Any, threading.Event]]:
    """This process acting as a job worker: a real ``JobSupervisor`` installed as the
    runtime's (so the real ``job.stop`` task code uses it), whose every fork is held back
    until the event it yields with is set. Restored and shut down after the block."""
    from orchestrator.job.jobsupervisor import JobSupervisor

    release = threading.Event()

    def held_command(seconds: float) -> list[str]:
        release.wait(10)
        return ["sleep", f"{seconds:g}"]

    # The lease outlasts a held fork (~2 s): a job whose lease lapsed counts as lost and is
    # killed at its first renewal, which is not a race these tests are about.
    sup = JobSupervisor(store, rt.host, lease_ms=10_000, grace_seconds=1, command=held_command)
    saved, rt.supervisor = rt.supervisor, sup
    try:
        yield sup, release
    finally:
        release.set()
        sup.shutdown()
        rt.supervisor = saved


def _starting_job(store: Any, sid: str, seconds: float) -> str:
    """A stored ``starting`` job of ``sid`` whose start request was never sent: its id."""
    jid = new_id("job")
    label = f"sleep {seconds:g}s"
    job_scripts.job_create(
        store,
        job_id=jid,
        session_id=sid,
        label=label,
        seconds=seconds,
        now_iso=iso(now_ms()),
        start_timeout_ms=30_000,
        guard=None,
        max_live=16,
        command="",
    )
    return jid


def jobs_on_both_hosts(store: Any, dispatcher: Any, sessions: Any) -> dict[str, tuple[str, str]]:
    """Start one job per new session until each job host runs one. Returns
    ``{host: (session id, job id)}`` for the first job each host took."""
    hosts: dict[str, tuple[str, str]] = {}
    for n in range(MAX_JOBS):
        sid = sessions.new()
        jid = jobs.create_job(store, dispatcher, sid, 64.3, f"sleep 64.3s #{n}")
        wait_job_pid(store, jid)
        host = job_record(store, jid)["host"]
        hosts.setdefault(host, (sid, jid))
        if len(hosts) == 2:
            return hosts
    pytest.fail(f"{MAX_JOBS} jobs all landed on {sorted(hosts)}")


def test_a_job_stop_reaches_only_the_host_that_runs_the_job(
    fleet: Any, store: Any, dispatcher: Any, sessions: Any
) -> None:
    # Given two sessions, each with a running job, on different hosts
    owner_host, other_host = fleet.job_host_names()
    placed = jobs_on_both_hosts(store, dispatcher, sessions)
    sid, jid = placed[owner_host]
    other_sid, other_jid = placed[other_host]
    pid = int(job_record(store, jid)["pid"])
    other_pid = int(job_record(store, other_jid)["pid"])
    [item] = census(store, sid)
    assert (item.family.value, item.id, item.host) == ("job", jid, owner_host)
    logs = {w.host: w for w in job_workers(fleet)}

    # When the first session is archived with stop_activity
    result = archive(store, dispatcher, sid, stop_activity=True)

    # Then its job is stopped by its own host, and its process is gone
    assert result.stop_report.sent == {"job": 1}
    wait_gone(pid)
    wait_for(lambda: job_record(store, jid)["state"] == "stopped", 15, message="job stopped")
    wait_log(logs[owner_host], f"job {jid} stopped (pid {pid})")

    # And the other session's job still runs, on the other host, which never heard of the stop
    assert process_alive(other_pid)
    assert job_record(store, other_jid)["state"] == "running"
    assert [i.id for i in census(store, other_sid)] == [other_jid]
    assert jid not in log_text(logs[other_host])


def test_a_job_no_worker_has_taken_yet_is_stopped_before_it_starts_and_never_starts(
    fleet: Any, store: Any, dispatcher: Any, sessions: Any
) -> None:
    # Given a stored job whose start request has not been sent yet
    sid = sessions.new()
    jid = _starting_job(store, sid, 65.3)
    [item] = census(store, sid)
    assert (item.family.value, item.host) == ("job", None)

    # When the session is archived with stop_activity
    archive(store, dispatcher, sid, stop_activity=True)

    # Then a job worker marks it stopped
    wait_for(lambda: job_record(store, jid)["state"] == "stopped", 15, message="job stopped")
    assert not census(store, sid)

    # When its start request arrives afterwards
    dispatcher.send("job.run", [sid, jid], "job")

    # Then no worker starts it
    wait_for(
        lambda: any(f"job {jid} not started: stopped" in log_text(w) for w in job_workers(fleet)),
        15,
        message="a job worker to turn the start down",
    )
    assert job_record(store, jid)["pid"] == ""
    assert not any(sleep_processes(w.process.pid, "65.3") for w in job_workers(fleet))


def test_a_stop_that_races_the_fork_of_a_job_process_still_ends_the_process(
    fleet: Any, store: Any, sessions: Any, worker_runtime: Any
) -> None:
    # Given this process acting as a job worker (the real job.stop task code and a real
    # JobSupervisor), whose fork of a claimed job is held back until released
    from workers.tasks import job as job_tasks

    with _held_supervisor(store, worker_runtime) as (sup, release):
        # The moment the stop task asks the supervisor which jobs are its own: the fork is
        # released only after it, so the stop has surely seen the job before its process
        # existed.
        looked = threading.Event()
        for name in ("owned", "pids"):
            if hasattr(sup, name):
                setattr(sup, name, _signalling(getattr(sup, name), looked))
        sid = sessions.new()
        jid = _starting_job(store, sid, 66.3)
        starter = threading.Thread(target=sup.start, args=(sid, jid), daemon=True)
        starter.start()
        wait_for(
            lambda: job_record(store, jid)["state"] == "running", 5, message="job claimed here"
        )

        # When a stop for it arrives before the process exists, and the fork goes on
        outcome: dict[str, Any] = {}
        stopper = threading.Thread(
            target=lambda: outcome.update(job_tasks.stop(sid, [jid])), daemon=True
        )
        stopper.start()
        assert looked.wait(10), "the stop task never asked which jobs run here"
        # The stop waits for the fork it raced (a stop that does not wait returns within a
        # few Redis calls, long before this).
        stopper.join(2)
        release.set()
        stopper.join(15)
        starter.join(15)

        # Then the job's process was stopped, not left running behind a "stopped" record
        wait_for(
            lambda: not sleep_processes(os.getpid(), "66.3"),
            5,
            message=f"the job's process to end (stop said {outcome.get('jobs')})",
        )
        assert outcome["jobs"] == {jid: "stopped"}
        assert job_record(store, jid)["state"] == "stopped"


def _signalling(method: Any, event: threading.Event) -> Any:
    """``method``, which also sets ``event`` each time it is called."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        result = method(*args, **kwargs)
        event.set()
        return result

    return wrapper


def test_a_job_claimed_here_just_after_the_stop_looked_is_still_stopped(
    fleet: Any, store: Any, sessions: Any, worker_runtime: Any
) -> None:
    # Given this process acting as a job worker, and a starting job whose job.run is taken by
    # this worker just after the stop task looked at the jobs it runs (its claim lands between
    # that look and the stop's reading of the job; its fork is held back a moment)
    from workers.tasks import job as job_tasks

    with _held_supervisor(store, worker_runtime) as (sup, release):
        sid = sessions.new()
        jid = _starting_job(store, sid, 67.3)
        looked = sup.owned

        def owned_then_claimed() -> set[str]:
            before = looked()
            threading.Thread(target=sup.start, args=(sid, jid), daemon=True).start()
            wait_for(lambda: job_record(store, jid)["state"] == "running", 5, message="claim")
            release.set()
            return before

        sup.owned = owned_then_claimed

        # When the stop runs
        outcome = job_tasks.stop(sid, [jid])

        # Then the job's process is stopped here, not left running behind the stop
        assert outcome["jobs"] == {jid: "stopped"}
        wait_for(lambda: not sleep_processes(os.getpid(), "67.3"), 5, message="no job process")
        assert job_record(store, jid)["state"] == "stopped"
