"""The last resort of containment (``containment.Mode.SUBREAPER``): marked processes and a
child subreaper.

Where no cgroup v2 can be written and no PID namespace made, a tree's leader is started with
``FLEET_TREE=<scope>/<tree>`` in its environment, which every descendant inherits, and the
starting process becomes a child subreaper (``PR_SET_CHILD_SUBREAPER``): an orphan of the
tree is reparented to it instead of to pid 1, and it reaps the orphans it knows. A tree's
processes are those whose environment (``/proc/<pid>/environ``) holds its mark; the scope
``w<pid>-<start time>`` names the process that started it, so a watchdog, or the next fleet
process of the host, can kill what a dead worker left. Honest limit: a process that clears or
replaces its environment (``env -i``) before it leaves its group escapes; ``/ready`` says which
mode is in force.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import threading

from orchestrator.process.ownership import is_process, process_start

#: The environment variable holding a process's tree mark.
MARK_ENV = "FLEET_TREE"
#: A tree's mark: ``w<pid>-<start time>/t-<12 hex digits>``.
_MARK = re.compile(r"w\d+-[0-9.]+/t-[0-9a-f]{12}")
_PR_SET_CHILD_SUBREAPER = 36

_scopes: dict[int, str] = {}
_lock = threading.Lock()


def is_mark(text: str) -> bool:
    """Whether ``text`` is a tree's mark."""
    return bool(_MARK.fullmatch(text))


def scope() -> str | None:
    """This process's scope mark (made by the first call in each process, which makes it a
    child subreaper and kills what processes that are gone left marked); ``None`` when this
    cannot be done here (no ``/proc``, no ``prctl``)."""
    pid = os.getpid()
    with _lock:
        found = _scopes.get(pid)
        if found is not None:
            return found
        started = process_start(pid)
        if started is None or not os.path.isdir("/proc/self"):
            return None
        try:
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1) != 0:
                return None
        except OSError:
            return None
        found = f"w{pid}-{started!r}"
        _scopes[pid] = found
    _sweep(found)
    return found


def _environ_marks() -> dict[int, str]:
    """``{pid: mark}`` of the live processes of this host that carry a mark (a zombie's
    environment reads empty)."""
    needle = f"{MARK_ENV}=".encode()
    found: dict[int, str] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as env:
                data = env.read()
        except OSError:
            continue
        for item in data.split(b"\0"):
            if item.startswith(needle):
                found[int(entry.name)] = item[len(needle) :].decode(errors="replace")
                break
    return found


def marked(mark: str) -> list[int]:
    """The live processes of tree ``mark``, or of every tree of scope ``mark`` when it ends
    with ``/``."""
    return [
        pid
        for pid, found in _environ_marks().items()
        if (found.startswith(mark) if mark.endswith("/") else found == mark)
    ]


def kill_marked(mark: str) -> bool:
    """SIGKILL every process of ``marked(mark)``; returns whether there was any."""
    pids = marked(mark)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    reap(pids)
    return bool(pids)


def reap(pids: list[int] | set[int]) -> None:
    """Reap those of ``pids`` that are this process's ended children (adopted orphans)."""
    for pid in pids:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)


def _sweep(keep: str) -> None:
    """Kill the marked processes whose scope's process is gone."""
    owners: dict[str, bool] = {}
    for pid, mark in _environ_marks().items():
        scope_name = mark.partition("/")[0]
        if scope_name == keep:
            continue
        if scope_name not in owners:
            owner, _, started = scope_name[1:].partition("-")
            owners[scope_name] = owner.isdigit() and is_process(int(owner), started)
        if not owners[scope_name]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
