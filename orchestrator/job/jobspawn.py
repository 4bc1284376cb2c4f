"""Spawning: a claimed job's process tree, forked contained.

The job's command (a stored shell command under coreutils' ``timeout``, or the supervisor's own
command for ``seconds``) is started by ``containment.start``: in a cgroup of its own or a PID
namespace, which no descendant can leave, its leader dying with the forking thread
(``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass

from orchestrator.process import containment
from orchestrator.process.processes import KILL_GRACE_SECONDS, die_with_parent, under_timeout


@dataclass
class RunningJob:
    """A job whose process tree runs here."""

    job_id: str
    session_id: str
    tree: containment.Tree
    #: Monotonic seconds after which what is left of the tree is killed (its time limit).
    deadline: float = float("inf")
    #: Set (under the supervisor's lock) before a stop signals the process, so the reaper,
    #: which may see it end first, leaves recording its end to the stop (``stopped``).
    stopping: bool = False
    #: Monotonic seconds a renewal first found its lease lapsed and its tree frozen by the
    #: watchdog (``None``: not so).
    frozen_lapsed_at: float | None = None

    @property
    def process(self) -> subprocess.Popen[bytes]:
        """The tree's leader."""
        return self.tree.process


def spawn(
    session_id: str,
    job_id: str,
    seconds: float,
    command: str,
    *,
    default: Callable[[float], list[str]],
    grace: float,
) -> RunningJob:
    """Fork a job's process tree, contained, its output discarded. A stored ``command`` runs
    with ``/bin/sh`` under coreutils' ``timeout``, which stops it after ``seconds`` and takes its
    whole tree down with this worker; without one, ``default(seconds)`` is the argv. Its
    deadline (monotonic seconds) is ``seconds`` plus ``grace`` and the kill grace from now, none
    when ``seconds`` is 0. Raises ``OSError`` when the process cannot be started."""
    if command:
        argv, preexec = under_timeout(["/bin/sh", "-c", command], seconds)
    else:
        argv, preexec = default(seconds), die_with_parent()
    tree = containment.start(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=preexec,
    )
    limit = seconds + grace + KILL_GRACE_SECONDS if seconds > 0 else float("inf")
    return RunningJob(job_id, session_id, tree, deadline=time.monotonic() + limit)
