"""Containment: a process tree the fleet starts on a host, which no descendant can leave.

A process group is no boundary: ``setsid CMD &`` or ``( (CMD &) & )`` leaves it, and a
signal to the group, or the death of its leader, no longer reaches that process. So every
tree the fleet starts (a job, a ``shell`` tool call) runs in a container of its own, in the
first of these modes the host allows (``mode()``; ``FLEET_CONTAINMENT`` picks one):

* ``cgroup``: a cgroup v2 per tree, in this process's scope (``orchestrator/process/cgroups.py``:
  where the hierarchy is mounted, where the scopes are). The child enters its cgroup before it execs
  (``preexec_fn``), so each descendant is born inside; ``cgroup.kill`` kills them all, and the
  tree is alive while ``cgroup.events`` says ``populated 1``. Needs write access to the
  hierarchy (root, or a delegated subtree) and ``cgroup.kill`` (Linux 5.14).
* ``pid-namespace``: the tree runs under ``unshare --pid --fork --kill-child --mount-proc``:
  its command is the init of a PID namespace of its own, and when that init dies (the
  command ended, or ``unshare`` was killed) the kernel kills every other process of the
  namespace. The tree is alive while ``unshare`` is. A tree therefore never outlives its
  command's first process: a background process is killed when the command ends.
* ``subreaper``: neither is available; every process of the tree carries a mark in its
  environment and the starting process is their child subreaper
  (``orchestrator/process/subreaper.py``):
  a process that clears its environment escapes.
* ``process-group``: none of these is possible (no ``/proc``); the tree is its leader's
  process group, which a descendant can leave (``/ready`` and the docs say so).

What dies with the worker: a tree's leader dies with the thread that started it
(``processes.die_with_parent``). In ``cgroup`` mode the rest of the tree is killed by the
worker's watchdog process (``watchdogs.kill_scope_on_parent_death``), which outlives the worker's
``SIGKILL``; should it die too, the next fleet process of the host kills and removes every
scope whose process is gone (``cgroups.scope`` sweeps them).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Any

import psutil

from orchestrator.process import cgroups, subreaper
from orchestrator.process.ownership import is_process, kill_if_ours
from orchestrator.process.processes import die_with_parent

log = logging.getLogger(__name__)

#: The environment variable by which a watchdog learns its worker's scope (a cgroup path).
SCOPE_ENV = "FLEET_CONTAINMENT_SCOPE"
#: Seconds between two looks at whether a tree is gone.
_POLL = 0.02


class Mode(StrEnum):
    """How the fleet's process trees are contained on this host."""

    CGROUP = "cgroup"  #: a cgroup v2 per tree, killed with ``cgroup.kill``
    PID_NAMESPACE = "pid-namespace"  #: a PID namespace per tree, its command as init
    SUBREAPER = "subreaper"  #: marked processes, this process their child subreaper
    PROCESS_GROUP = "process-group"  #: only a process group: a descendant can leave it


def kill_tree_if_ours(pid: int, started: str | float | None, tree: str = "") -> bool:
    """Kill a recorded tree: the process group of ``pid`` if it is still the process that
    started at ``started`` (``ownership.kill_if_ours``), and every other process of the
    tree (``kill_recorded``), which outlives its leader. Returns whether anything of it was
    found (and so killed)."""
    leader = kill_if_ours(pid, started)
    rest = kill_recorded(tree)
    return leader or rest


def kill_recorded(handle: str) -> bool:
    """Kill every process of the tree ``handle`` names (``Tree.handle`` as recorded: a cgroup
    of the fleet's, ``cgroups.kill_handle``, or a tree mark, ``subreaper.kill_marked``); any
    other text names nothing. Returns whether any process was found."""
    if subreaper.is_mark(handle):
        return subreaper.kill_marked(handle)
    return cgroups.kill_handle(handle)


def recorded_alive(handle: str) -> bool:
    """Whether a process of the tree ``handle`` names (as ``kill_recorded``) lives."""
    if subreaper.is_mark(handle):
        return bool(subreaper.marked(handle))
    return cgroups.is_tree_cgroup(handle) and cgroups.populated(handle)


def freeze_recorded(pid: int, started: str | float | None, handle: str = "") -> list[int]:
    """Freeze a recorded tree (as ``kill_tree_if_ours`` names it): ``cgroup.freeze`` of its
    cgroup, else SIGSTOP to the leader's group (only if ``pid`` is still the process that
    started at ``started``), to its descendants and to its marked processes, looked at until a
    look finds no new one. A frozen tree does no work; SIGKILL still ends it. Returns the pids
    stopped by signal (``[]`` for a cgroup, or when nothing of it was found): what
    ``thaw_recorded`` resumes and a kill must also reach."""
    cgroup = cgroups.is_tree_cgroup(handle) and cgroups.populated(handle)
    if cgroup and cgroups.set_frozen(handle, True):
        return []
    stopped: list[int] = []
    if is_process(pid, started):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGSTOP)
    for _ in range(3):  # a process may fork while the tree is read
        found = [p for p in _recorded_pids(pid, started, handle) if p not in stopped]
        if not found:
            break
        for p in found:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p, signal.SIGSTOP)
        stopped.extend(found)
    return stopped


def thaw_recorded(handle: str, stopped: list[int]) -> None:
    """Resume a tree ``freeze_recorded`` froze: thaw its cgroup, SIGCONT the ``stopped``
    pids (those still the same processes: none of them can have ended and been replaced
    while stopped, short of a SIGKILL)."""
    if cgroups.is_tree_cgroup(handle) and cgroups.is_frozen(handle):
        cgroups.set_frozen(handle, False)
    for p in stopped:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(p, signal.SIGCONT)


def kill_frozen(pid: int, started: str | float | None, handle: str, stopped: list[int]) -> bool:
    """Kill a tree ``freeze_recorded`` froze (``kill_tree_if_ours``, and SIGKILL to each of
    the ``stopped`` pids that left the leader's group). Returns whether anything was found."""
    found = kill_tree_if_ours(pid, started, handle)
    for p in stopped:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(p, signal.SIGKILL)
            found = True
    return found


def _recorded_pids(pid: int, started: str | float | None, handle: str) -> list[int]:
    """The live processes of a recorded tree outside a cgroup: the leader (if ours) and its
    descendants, and the processes carrying its mark."""
    found: list[int] = []
    if is_process(pid, started):
        with contextlib.suppress(psutil.Error):
            leader = psutil.Process(pid)
            found = [pid, *(c.pid for c in leader.children(recursive=True))]
    if subreaper.is_mark(handle):
        found.extend(p for p in subreaper.marked(handle) if p not in found)
    return found


_mode: dict[str, Mode] = {}


def _pid_namespace_works() -> bool:
    unshare = shutil.which("unshare")
    if unshare is None:
        return False
    try:
        done = subprocess.run(
            [unshare, *_UNSHARE, "true"], capture_output=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


_UNSHARE = ["--pid", "--fork", "--kill-child", "--mount-proc", "--"]


#: The mode ``choose`` was given (``FLEET_CONTAINMENT``'s value): ``auto`` until then.
_wanted: dict[str, str] = {"mode": "auto"}


def choose(wanted: str) -> None:
    """Set the containment mode this process asks for, ``FLEET_CONTAINMENT``'s value
    (``auto``, ``cgroup``, ``pid-namespace``, ``subreaper`` or ``process-group``): called by
    each entry point with its settings before a tree starts; ``mode()`` decides again on its
    next call when the value changed. Raises ``ValueError`` for another name."""
    if wanted != "auto":
        Mode(wanted)
    if _wanted["mode"] != wanted:
        _wanted["mode"] = wanted
        _mode.clear()


def mode() -> Mode:
    """The containment mode in force in this process (detected once; ``choose`` names one,
    ``auto`` the first the host allows: ``cgroup``, ``pid-namespace``, ``subreaper``,
    ``process-group``)."""
    found = _mode.get("mode")
    if found is not None:
        return found
    wanted = _wanted["mode"]
    if wanted != "auto":
        found = Mode(wanted)
    elif cgroups.scope() is not None:
        found = Mode.CGROUP
    elif _pid_namespace_works():
        found = Mode.PID_NAMESPACE
    elif subreaper.scope() is not None:
        found = Mode.SUBREAPER
    else:
        found = Mode.PROCESS_GROUP
    if found is Mode.CGROUP and cgroups.scope() is None:
        log.error("FLEET_CONTAINMENT=cgroup, but no cgroup v2 scope can be made here")
    _mode["mode"] = found
    log.info("process trees are contained by %s", found.value)
    return found


def _enter(cgroup: Path, then: Callable[[], None] | None) -> Callable[[], None]:
    procs = str(cgroup / "cgroup.procs")

    def _preexec() -> None:  # pragma: no cover - runs in the child between fork and exec
        # Before anything else: from here on each process the child makes is born inside.
        fd = os.open(procs, os.O_WRONLY)
        try:
            os.write(fd, b"0")
        finally:
            os.close(fd)
        if then is not None:
            then()

    return _preexec


class Tree:
    """One contained process tree (``start``): its leader ``process`` and the container
    (``mode``; ``handle`` names its cgroup or its mark, ``""`` in the other modes)."""

    def __init__(
        self,
        process: subprocess.Popen[bytes],
        mode: Mode,
        cgroup: Path | None,
        mark: str = "",
    ) -> None:
        self.process = process
        self.mode = mode
        self.cgroup = cgroup
        self.mark = mark
        #: Orphans of the tree adopted by this process (``subreaper`` mode), to be reaped.
        self._adopted: set[int] = set()

    @property
    def pid(self) -> int:
        """The leader's pid."""
        return self.process.pid

    @property
    def handle(self) -> str:
        """What names this tree for another process (its cgroup's path, its mark, or
        ``""``): ``kill_recorded`` takes it."""
        return str(self.cgroup) if self.cgroup is not None else self.mark

    def pids(self) -> list[int]:
        """The pids of the tree's live processes (the leader's descendants, outside
        ``cgroup`` mode)."""
        if self.cgroup is not None:
            return cgroups.cgroup_pids(self.cgroup)
        if self.mark:
            found = subreaper.marked(self.mark)
            me = os.getpid()
            for pid in found:
                with contextlib.suppress(psutil.Error):
                    if pid != self.pid and psutil.Process(pid).ppid() == me:
                        self._adopted.add(pid)
            return found
        if self.process.poll() is not None:
            return []
        try:
            leader = psutil.Process(self.pid)
            return [self.pid, *(p.pid for p in leader.children(recursive=True))]
        except psutil.Error:
            return []

    def alive(self) -> bool:
        """Whether any process of the tree lives (a leader that ended is reaped)."""
        leader = self.process.poll() is None
        if self.cgroup is not None:
            return cgroups.populated(self.cgroup)
        if self.mark:
            subreaper.reap(self._adopted)
            return leader or bool(self.pids())
        if leader or self.mode is Mode.PID_NAMESPACE:
            return leader
        try:  # the leader's group may outlive it
            os.killpg(self.pid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    def frozen(self) -> bool:
        """Whether the tree is frozen (``freeze_recorded``: its cgroup asked to freeze, or
        its leader stopped by a signal)."""
        if self.cgroup is not None:
            return cgroups.is_frozen(self.cgroup)
        with contextlib.suppress(psutil.Error):
            return bool(psutil.Process(self.pid).status() == psutil.STATUS_STOPPED)
        return False

    def signal(self, sig: int) -> None:
        """Send ``sig`` to every process of the tree (the leader's group outside ``cgroup``
        mode)."""
        if self.cgroup is not None or self.mark:
            for pid in self.pids():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)

    def kill(self) -> None:
        """SIGKILL every process of the tree (does not wait)."""
        if self.cgroup is not None and cgroups.populated(self.cgroup):
            try:
                (self.cgroup / "cgroup.kill").write_text("1")
            except OSError as exc:
                log.warning("tree %s not killed by its cgroup: %s", self.cgroup, exc)
        self.signal(signal.SIGKILL)

    def wait_gone(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for every process of the tree to end. Returns
        whether they did."""
        deadline = time.monotonic() + timeout
        while self.alive():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if self.process.poll() is None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.process.wait(min(_POLL, left))
            else:
                time.sleep(min(_POLL, left))
        return True

    def stop(self, grace: float) -> bool:
        """Stop the whole tree: SIGTERM to each process, SIGKILL to all that remain after
        ``grace`` seconds; then remove its cgroup. Returns whether SIGTERM sufficed."""
        self.signal(signal.SIGTERM)
        polite = self.wait_gone(grace)
        self.close()
        return polite

    def close(self) -> None:
        """Kill what is left of the tree, wait for it (up to 5 s) and remove its cgroup."""
        # A scan of marks is not atomic (a process may fork while /proc is read), so a
        # marked tree is looked at again until a look finds none of it.
        for _ in range(3 if self.mark else 1):
            if not self.alive():
                break
            self.kill()
            self.wait_gone(5)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(5)
        if self.cgroup is not None:
            cgroups.remove_cgroup(self.cgroup)
        subreaper.reap(self._adopted)


def start(
    argv: list[str],
    *,
    preexec_fn: Callable[[], None] | None = None,
    using: Mode | None = None,
    **popen: Any,
) -> Tree:
    """Start ``argv`` (``subprocess.Popen`` with ``popen``) as a contained tree (see the
    module docstring), in mode ``using`` (default: ``mode()``). ``preexec_fn`` runs in the
    child after it entered its container. In
    ``pid-namespace`` mode the leader is ``unshare``, which dies (SIGKILL) with the thread
    that started it whatever ``preexec_fn`` asks. Raises ``OSError``."""
    found = using or mode()
    home = cgroups.scope() if found is Mode.CGROUP else None
    if home is not None:
        cgroup = home / f"t-{uuid.uuid4().hex[:12]}"
        cgroup.mkdir()
        try:
            proc = subprocess.Popen(argv, preexec_fn=_enter(cgroup, preexec_fn), **popen)
        except BaseException:
            cgroups.remove_cgroup(cgroup)
            raise
        return Tree(proc, found, cgroup)
    if found is Mode.PID_NAMESPACE:
        unshare = shutil.which("unshare") or "unshare"
        proc = subprocess.Popen([unshare, *_UNSHARE, *argv], preexec_fn=die_with_parent(), **popen)
        return Tree(proc, found, None)
    home_mark = subreaper.scope() if found is Mode.SUBREAPER else None
    if home_mark is not None:
        mark = f"{home_mark}/t-{uuid.uuid4().hex[:12]}"
        env = {**(popen.pop("env", None) or os.environ), subreaper.MARK_ENV: mark}
        proc = subprocess.Popen(argv, preexec_fn=preexec_fn, env=env, **popen)
        return Tree(proc, found, None, mark)
    proc = subprocess.Popen(argv, preexec_fn=preexec_fn, **popen)
    return Tree(proc, Mode.PROCESS_GROUP, None)
