"""Containment (``orchestrator/process/containment.py``): a process that leaves its process group
(``setsid CMD &``, ``( (CMD &) & )``) still belongs to its job or tool call, keeps it live
while it runs, and dies with it.

Driven with real ``setsid`` children: each test's escaping process is ``sleep <odd
duration>``, found among the host's processes by that exact command line and, whatever the
test leaves, killed by its PID.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import psutil
import pytest

from orchestrator.archiving import archive
from orchestrator.census.activity import census
from orchestrator.job import jobs
from orchestrator.job.jobs import JobState
from orchestrator.job.jobsupervisor import JobSupervisor
from orchestrator.models.model import Emit, StepAnswer, StepRequest, StopReason, ToolCall
from orchestrator.process import cgroups, containment
from orchestrator.session import sessions
from orchestrator.storage.store import Store
from orchestrator.turn import turns
from tests.helpers import RecordingDispatcher, wait_for
from tests.orchestrator.support import run_turn

pytestmark = pytest.mark.timeout(60)

#: The seconds within which no process of an archived session may be left.
ARCHIVE_DEADLINE = 5.0


def sleeps(marker: str) -> list[int]:
    """PIDs of the live (not zombie) ``sleep <marker>`` processes of this host."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        if proc.info["cmdline"] == ["sleep", marker] and proc.info["status"] != "zombie":
            found.append(proc.pid)
    return found


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@contextlib.contextmanager
def leftovers_killed(*markers: str) -> Iterator[None]:
    """Kill, by PID, every ``sleep <marker>`` the test leaves behind."""
    try:
        yield
    finally:
        for marker in markers:
            for pid in sleeps(marker):
                with contextlib.suppress(psutil.NoSuchProcess):
                    psutil.Process(pid).kill()


@pytest.fixture
def supervisor(store: Store) -> Iterator[JobSupervisor]:
    sup = JobSupervisor(store, "host-contain", lease_ms=10_000, grace_seconds=1)
    yield sup
    sup.shutdown()


@pytest.fixture
def sid(store: Store, cwd: str) -> str:
    return sessions.create_session(store, cwd).session_id


def job_state(store: Store, jid: str) -> str | None:
    found: str | None = store.redis.hget(store.keys.job(jid), "state")
    return found


# ---------------------------------------------------------------------------------- the API


def test_the_cgroup_v2_hierarchy_is_found_in_the_mount_table_wherever_it_is_mounted() -> None:
    hybrid = (
        "tmpfs /sys/fs/cgroup tmpfs rw 0 0\n"
        "cgroup /sys/fs/cgroup/memory cgroup rw,memory 0 0\n"
        "cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0\n"
    )
    assert cgroups.cgroup2_mount(hybrid) == "/sys/fs/cgroup/unified"
    assert cgroups.cgroup2_mount("cgroup2 /sys/fs/cgroup cgroup2 rw 0 0\n") == "/sys/fs/cgroup"
    assert cgroups.cgroup2_mount("cgroup /sys/fs/cgroup/cpu cgroup rw 0 0\n") is None
    assert cgroups.own_cgroup("1:cpu:/\n0::/a/b\n") == "/a/b"


@pytest.mark.parametrize("mode", [containment.Mode.CGROUP, containment.Mode.PID_NAMESPACE])
def test_a_tree_is_alive_while_an_escaped_process_is_and_its_kill_reaches_it(
    mode: containment.Mode,
) -> None:
    if mode is containment.Mode.CGROUP and containment.mode() is not mode:
        pytest.skip("no cgroup v2 scope can be made on this host")
    marker = "41.7177" if mode is containment.Mode.CGROUP else "41.7178"
    with leftovers_killed(marker):
        # Given a tree whose command leaves a process in a session of its own, then waits
        tree = containment.start(["/bin/sh", "-c", f"setsid sleep {marker} & sleep 30"], using=mode)
        [escaped] = wait_for(lambda: sleeps(marker), message="the escaped sleep")
        # Then the tree is alive
        assert tree.alive()
        # When the whole tree is killed
        tree.close()
        # Then no process of it is left, the escaped one included
        assert not tree.alive()
        wait_for(lambda: not alive(escaped), 2, message="the escaped process to die")


SUBREAPER_PROBE = """
import json, sys, time
from orchestrator.process import containment
mode = containment.Mode.SUBREAPER
tree = containment.start(["/bin/sh", "-c", sys.argv[1]], using=mode)
tree.process.wait(10)  # the command ended, its escaped processes run on
deadline = time.monotonic() + 10
while len(tree.pids()) < 2 and time.monotonic() < deadline:
    time.sleep(0.02)
seen, alive = tree.pids(), tree.alive()
tree.close()
print(json.dumps({"mode": tree.mode, "seen": seen, "alive": alive, "after": tree.pids()}))
"""


def test_a_subreaper_tree_finds_its_escaped_processes_by_their_mark_and_kills_them() -> None:
    # In a process of its own: it becomes a child subreaper
    marker = "41.7176"
    with leftovers_killed(marker):
        # Given a tree whose command leaves two processes (setsid, double fork) and ends
        command = f"setsid sleep {marker} & ( (sleep {marker} &) & )"
        done = subprocess.run(
            [sys.executable, "-c", SUBREAPER_PROBE, command],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        found = json.loads(done.stdout)
        # Then the tree was alive by them, and none of them is left once it is closed
        assert found["mode"] == "subreaper"
        assert len(found["seen"]) == 2 and found["alive"], found
        assert found["after"] == [] and not any(alive(pid) for pid in found["seen"])
        assert sleeps(marker) == []


def test_a_cgroup_tree_outlives_its_leader_while_an_escaped_process_runs() -> None:
    if containment.mode() is not containment.Mode.CGROUP:
        pytest.skip("no cgroup v2 scope can be made on this host")
    marker = "41.7179"
    with leftovers_killed(marker):
        # Given a command that double-forks a process away and ends
        tree = containment.start(["/bin/sh", "-c", f"( (sleep {marker} &) & )"])
        tree.process.wait(10)
        [escaped] = wait_for(lambda: sleeps(marker), message="the escaped sleep")
        # Then the tree lives on with that process alone
        assert tree.alive() and tree.pids() == [escaped]
        # And a kill by its recorded handle reaches it, and removes its cgroup
        assert cgroups.kill_handle(tree.handle)
        assert not alive(escaped) and not tree.alive()
        assert tree.cgroup is not None and not tree.cgroup.exists()


def test_a_handle_outside_the_fleets_scopes_is_never_killed() -> None:
    assert not cgroups.is_tree_cgroup("")
    assert not cgroups.is_tree_cgroup("/sys/fs/cgroup/unified")
    assert not cgroups.is_tree_cgroup("/tmp/w1-2/t-abc")
    assert not cgroups.kill_handle("/tmp/w1-2/t-abc")


# ----------------------------------------------------------------------------------- jobs


def escaping_job(store: Store, sup: JobSupervisor, sid: str, command: str) -> tuple[str, int]:
    """A job of ``sid`` running ``command`` under ``sup``, the duration of the command's
    first ``sleep`` marking the process it leaves: ``(job id, that process's pid)``."""
    marker = command.split("sleep ")[1].split()[0]
    jid = jobs.create_job(store, RecordingDispatcher(), sid, 600, command, command=command)
    assert sup.start(sid, jid) == "running"
    [escaped] = wait_for(lambda: sleeps(marker), message="the escaped sleep")
    return jid, escaped


def test_an_archived_jobs_setsid_process_dies_and_activity_is_empty_only_once_it_is_gone(
    store: Store, sid: str, supervisor: JobSupervisor
) -> None:
    marker = "777.123"
    with leftovers_killed(marker):
        # Given a job whose command leaves a process in a session of its own
        jid, escaped = escaping_job(store, supervisor, sid, f"setsid sleep {marker} & sleep 600")
        assert [a.id for a in census(store, sid)] == [jid]

        # When its session is archived with stopActivity (the host hears the gate's closure)
        archive.archive(store, RecordingDispatcher(), sid, stop_activity=True)

        # Then the census never reads empty while that process lives, and it is gone in 5 s
        deadline = time.monotonic() + ARCHIVE_DEADLINE
        while alive(escaped):
            assert census(store, sid) != [], "activity empty while the job's process runs"
            assert time.monotonic() < deadline, "the job's escaped process outlived the archive"
            time.sleep(0.02)
        wait_for(lambda: job_state(store, jid) == JobState.STOPPED, 5, message="job stopped")
        assert census(store, sid) == []


def test_a_job_whose_command_ended_runs_while_the_process_it_left_runs(
    store: Store, sid: str, supervisor: JobSupervisor
) -> None:
    if containment.mode() is not containment.Mode.CGROUP:
        pytest.skip("only a cgroup outlives the command's first process")
    marker = "1.4321"
    with leftovers_killed(marker):
        # Given a job whose command starts a setsid process and ends at once
        jid, escaped = escaping_job(store, supervisor, sid, f"setsid sleep {marker} &")
        # Then the job runs, and counts as live, until that process ended
        while alive(escaped):
            assert job_state(store, jid) == JobState.RUNNING
            assert census(store, sid) != []
            time.sleep(0.05)
        wait_for(lambda: job_state(store, jid) == JobState.EXITED, 5, message="job exited")


# ----------------------------------------------------------------------------- tool calls


class ShellOnce:
    """A model whose first step runs ``command`` with the shell tool and whose second ends
    the turn."""

    def __init__(self, command: str) -> None:
        self.command = command

    def step(self, request: StepRequest, cancel: threading.Event, emit: Emit) -> StepAnswer:
        if request.index == 0:
            args = json.dumps({"command": self.command, "timeout_seconds": 30})
            return StepAnswer(tool_calls=(ToolCall("shell", args),))
        emit("done")
        return StepAnswer(stop=StopReason.END_TURN)


@pytest.mark.parametrize(
    ("template", "marker"),
    [("setsid sleep {} &", "778.123"), ("( (sleep {} &) & )", "779.123")],
    ids=["setsid", "double-fork"],
)
def test_a_shell_tool_calls_escaped_process_ends_with_the_call(
    store: Store, recorder: RecordingDispatcher, sid: str, template: str, marker: str
) -> None:
    with leftovers_killed(marker):
        # Given a turn whose shell tool call leaves a process behind and ends at once
        seen: list[int] = []
        stop_looking = threading.Event()

        def look() -> None:  # its pid, seen while the call runs
            while not stop_looking.is_set() and not seen:
                seen.extend(sleeps(marker))
                time.sleep(0.005)

        looker = threading.Thread(target=look, daemon=True)
        looker.start()
        # When the turn completes
        tid = run_turn(store, recorder, sid, ShellOnce(template.format(marker)), "run it")
        stop_looking.set()
        looker.join(5)
        turn = turns.get_turn(store, tid)
        assert turn is not None and turn.state.value == "completed"
        # Then nothing of the call runs on: the process it left was killed with the call
        wait_for(lambda: not sleeps(marker), 2, message="no process of the tool call left")
        assert not any(alive(pid) for pid in seen)
        # And an archive finds nothing to stop
        archive.archive(store, recorder, sid, stop_activity=True)
        assert census(store, sid) == [] and not sleeps(marker)
