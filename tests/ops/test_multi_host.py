"""Several job hosts on one machine: ``fleet up --hosts 3``.

``fleet up --hosts 3`` runs, on its own key prefix, one worker per family and three job workers
with distinct host names (``mh-1`` .. ``mh-3``). Prompts start background jobs until each host
runs one; archiving one session with ``stopActivity`` must stop its job on exactly the host that
owns it: that host's worker log records the stop, the two others never hear of the job, and
the other sessions' job processes keep running.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest
import redis
from celery import Celery

from orchestrator.archiving.archive import archive
from orchestrator.census.activity import census
from orchestrator.families import Family
from orchestrator.session.sessions import create_session
from orchestrator.settings import FleetSettings
from orchestrator.storage.keys import Keys
from orchestrator.storage.store import Store
from orchestrator.turn.turns import start_turn
from tests.helpers import wait_for
from tests.workers.support import job_record, process_alive, wait_gone, wait_job_pid
from workers.app import configure
from workers.dispatch import CeleryDispatcher

pytestmark = pytest.mark.timeout(120)

HOSTNAME = "mh"
HOSTS = [f"{HOSTNAME}-{i}" for i in (1, 2, 3)]
#: Each job sleeps this odd duration, so its processes are told apart from everyone else's.
JOB_SECONDS = "62.9"
#: Prompts to try before giving up on seeing every host take a job.
MAX_PROMPTS = 18


@dataclass
class ThreeHosts:
    """A running ``fleet up --hosts 3`` on its own key prefix, with a store and a dispatcher
    for that prefix."""

    process: subprocess.Popen[bytes]
    output: Path
    logs: Path
    prefix: str
    store: Store
    dispatcher: CeleryDispatcher
    sessions: list[str] = field(default_factory=list)
    pids: list[int] = field(default_factory=list)

    def log(self, host: str) -> str:
        return (self.logs / f"job@{host}.log").read_text(errors="replace")


@pytest.fixture(scope="module")
def three_hosts(
    redis_url: str, key_prefix: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ThreeHosts]:
    """``fleet up --hosts 3 --no-api`` against the test Redis under ``<run prefix>hosts3:``
    (deleted with the run's keys). At teardown every session it made is archived with its work
    stopped, ``fleet up`` gets SIGTERM (its Ctrl-C) and any job process left is killed."""
    prefix = f"{key_prefix}hosts3:"
    tmp = tmp_path_factory.mktemp("hosts3")
    env = dict(
        os.environ,
        FLEET_REDIS_URL=redis_url,
        FLEET_KEY_PREFIX=prefix,
        FLEET_HOSTNAME=HOSTNAME,
        FLEET_STATE_DIR=str(tmp / "state"),
        COLUMNS="200",
        PYTHONUNBUFFERED="1",
    )
    output = tmp / "up.log"
    with open(output, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "api.cli", "up", "--hosts", "3", "--no-api"],
            env=env,
            cwd=tmp,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    # A Celery app of its own, configured for the fresh prefix (broker keys included), so this
    # process's dispatcher talks to the three-host fleet and not to the run's fleet.
    app = Celery("agent_fleet_hosts3", set_as_current=False)
    configure(app, FleetSettings(redis_url=redis_url, key_prefix=prefix))
    hosts = ThreeHosts(
        proc,
        output,
        tmp / "state" / "logs",
        prefix,
        Store(redis_url, prefix),
        CeleryDispatcher(app),
    )
    try:

        def up() -> bool:
            if proc.poll() is not None:
                pytest.fail(f"fleet up exited with {proc.returncode}:\n{output.read_text()}")
            return "job workers on" in output.read_text()

        wait_for(up, 90, 0.1, message="`fleet up --hosts 3` to be ready")
        yield hosts
    finally:
        try:
            # Best effort: a failing test has already reported what went wrong.
            with contextlib.suppress(Exception, pytest.fail.Exception):
                for sid in hosts.sessions:
                    archive(hosts.store, hosts.dispatcher, sid, stop_activity=True)
                wait_for(
                    lambda: not any(census(hosts.store, sid) for sid in hosts.sessions),
                    10,
                    message="the three-host sessions to drain",
                )
        finally:
            stop_fleet_up(proc, hosts.pids)
            hosts.store.close()
            app.close()


def stop_fleet_up(proc: subprocess.Popen[bytes], job_pids: list[int]) -> None:
    """Ctrl-C for ``fleet up`` (SIGTERM), then SIGKILL for whatever is left of its process
    group (its workers, should it have died before stopping them) and for the job processes
    the test started (each runs in a session of its own)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # its own group: start_new_session=True
    for pid in job_pids:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            job = psutil.Process(pid)
            # a job runs its command under coreutils' timeout: timeout N /bin/sh -c "sleep S"
            if job.cmdline()[-1:] == [f"sleep {JOB_SECONDS}"]:
                os.killpg(pid, signal.SIGKILL)  # the job leads its own process group


def prompt_a_job(hosts: ThreeHosts, n: int) -> tuple[str, str, str, int]:
    """Prompt a new session to start a background job and wait until a host runs it.
    Returns ``(session id, job id, host, pid)``."""
    sid = create_session(hosts.store, "/tmp").session_id
    hosts.sessions.append(sid)
    start_turn(hosts.store, hosts.dispatcher, sid, f"run {JOB_SECONDS}")

    def only_the_job() -> list[Any]:
        # The turn ends after its one step; then the job is the session's only live item.
        items = census(hosts.store, sid)
        return items if [i.family for i in items] == [Family.JOB] else []

    [item] = wait_for(only_the_job, 15, message=f"prompt #{n}'s job to be the only live item")
    pid = wait_job_pid(hosts.store, item.id)
    hosts.pids.append(pid)
    return sid, item.id, job_record(hosts.store, item.id)["host"], pid


def test_fleet_up_runs_three_job_hosts_and_a_job_stop_reaches_only_the_owner(
    three_hosts: ThreeHosts, redis_url: str
) -> None:
    hosts = three_hosts
    # Given `fleet up --hosts 3`: three job worker processes with distinct host names, each
    # alive (its heartbeat is in Redis)
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        beats = client.keys(Keys(hosts.prefix).worker_heartbeats("job"))
    finally:
        client.close()
    assert {str(b).rsplit(":", 1)[1] for b in beats} == {f"job@{h}" for h in HOSTS}
    # A worker's child caught between its fork and its exec (a job starting) shows the
    # worker's own command line: only processes whose parent is not such a worker count.
    workers = [
        p.cmdline()
        for p in psutil.Process(hosts.process.pid).children(recursive=True)
        if "--family" in p.cmdline()
        and p.cmdline()[p.cmdline().index("--family") + 1] == "job"
        and p.parent().cmdline() != p.cmdline()
    ]
    assert sorted(c[c.index("--host") + 1] for c in workers) == HOSTS

    # And prompted jobs running on every host (the hosts share the job queue)
    placed: dict[str, tuple[str, str, int]] = {}
    for n in range(MAX_PROMPTS):
        sid, jid, host, pid = prompt_a_job(hosts, n)
        placed.setdefault(host, (sid, jid, pid))
        if len(placed) == len(HOSTS):
            break
    else:
        pytest.fail(f"{MAX_PROMPTS} jobs all landed on {sorted(placed)}")
    assert set(placed) == set(HOSTS)
    owner = HOSTS[1]
    sid, jid, pid = placed[owner]
    others = {h: placed[h] for h in HOSTS if h != owner}
    [item] = census(hosts.store, sid)
    assert (item.id, item.host) == (jid, owner)

    # When the session whose job runs on the middle host is archived with stopActivity
    result = archive(hosts.store, hosts.dispatcher, sid, stop_activity=True)

    # Then exactly one job stop is sent, and the owning host stops the process and logs it
    assert result.outcome == "archived"
    assert result.stop_report.sent == {"job": 1}
    wait_gone(pid)
    wait_for(lambda: job_record(hosts.store, jid)["state"] == "stopped", 15, message="job stopped")
    wait_for(
        lambda: f"job {jid} stopped (pid {pid})" in hosts.log(owner),
        15,
        message=f"{owner}'s log to record the stop",
    )

    # And the two other hosts never heard of that job, and their jobs still run
    for host, (other_sid, other_jid, other_pid) in others.items():
        assert jid not in hosts.log(host), host
        assert process_alive(other_pid), host
        assert job_record(hosts.store, other_jid)["state"] == "running", host
        assert [(i.id, i.host) for i in census(hosts.store, other_sid)] == [(other_jid, host)]
