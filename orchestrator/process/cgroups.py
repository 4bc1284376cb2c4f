"""The cgroup v2 side of containment (``orchestrator/process/containment.py``): where the hierarchy
is, this process's scope, and the cgroups of process trees: whether one is populated, its
pids, killing it (``cgroup.kill``) and removing it.

The hierarchy is found in the mount table (the ``cgroup2`` entry of ``/proc/self/mounts``):
at ``/sys/fs/cgroup`` alone, or at ``/sys/fs/cgroup/unified`` in the hybrid layout beside the
v1 controllers; its place is never assumed. Each fleet process has a scope
``w<pid>-<start time>`` under ``agent-fleet`` in its own cgroup; its trees' cgroups
(``t-<random>``) are made in it. The first process to make its scope kills and removes the
scopes of processes that are gone.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from pathlib import Path

import psutil

from orchestrator.process.ownership import is_process, process_start

log = logging.getLogger(__name__)

#: The directory, under this process's own cgroup, holding the scopes (a process may only
#: make cgroups inside its own, delegated one).
DEFAULT_PARENT = "agent-fleet"
#: Seconds between two looks at whether a cgroup emptied.
_POLL = 0.02


def _proc_text(path: str) -> str | None:
    """The text of a ``/proc`` file; ``None`` when it cannot be read."""
    try:
        return Path(path).read_text()
    except OSError:
        return None


def cgroup2_mount(mounts: str | None = None) -> str | None:
    """Where the cgroup v2 hierarchy is mounted, read from ``mounts`` (the text of
    ``/proc/self/mounts`` by default); ``None`` when it is not."""
    mounts = _proc_text("/proc/self/mounts") if mounts is None else mounts
    if mounts is None:
        return None
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[2] == "cgroup2":
            return fields[1].replace("\\040", " ")
    return None


def own_cgroup(text: str | None = None) -> str | None:
    """This process's cgroup v2 path (``0::/path`` of ``/proc/self/cgroup``, or ``text``)."""
    text = _proc_text("/proc/self/cgroup") if text is None else text
    if text is None:
        return None
    for line in text.splitlines():
        if line.startswith("0::"):
            return line[3:].strip() or "/"
    return None


def _parent_dir() -> Path | None:
    """The directory the scopes live in, or ``None`` when there is no cgroup v2 here."""
    mount = cgroup2_mount()
    if mount is None:
        return None
    relative = f"{own_cgroup() or '/'}/{DEFAULT_PARENT}"
    return Path(mount) / relative.strip("/")


_scopes: dict[int, Path] = {}
_scope_lock = threading.Lock()


def scope() -> Path | None:
    """This process's scope, the cgroup its trees' cgroups are made in (made by the first
    call in each process, which also sweeps the scopes of processes that are gone); ``None``
    when it cannot be made."""
    pid = os.getpid()
    with _scope_lock:
        found = _scopes.get(pid)
        if found is not None:
            return found
        parent = _parent_dir()
        started = process_start(pid)
        if parent is None or started is None:
            return None
        try:
            parent.mkdir(parents=True, exist_ok=True)
            path = parent / f"w{pid}-{started!r}"
            path.mkdir(exist_ok=True)
        except OSError as exc:
            log.info("no cgroup scope under %s: %s", parent, exc)
            return None
        if not (path / "cgroup.kill").exists():
            with contextlib.suppress(OSError):
                path.rmdir()
            return None
        _sweep(parent, keep=path)
        _scopes[pid] = path
        return path


def _sweep(parent: Path, *, keep: Path) -> None:
    """Kill and remove the scopes under ``parent`` whose process is gone."""
    for entry in parent.glob("w*-*"):
        if entry == keep:
            continue
        owner, _, started = entry.name[1:].partition("-")
        if owner.isdigit() and is_process(int(owner), started) and not _zombie(int(owner)):
            continue
        if kill_cgroup(entry):
            log.warning("killed what was left in the scope of a gone process: %s", entry)
        remove_cgroup(entry)


def _zombie(pid: int) -> bool:
    """Whether ``pid`` has exited and waits to be reaped (its scope's owner is gone: a worker
    SIGKILLed a moment ago is a zombie until its parent reaps it)."""
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def kill_cgroup(path: Path | str, wait: float = 5.0) -> bool:
    """Kill every process of the cgroup ``path`` and of its descendants (``cgroup.kill``) and
    wait up to ``wait`` seconds for it to empty. Returns whether any process was in it.
    Never raises."""
    cg = Path(path)
    if not populated(cg):
        return False
    try:
        (cg / "cgroup.kill").write_text("1")
    except OSError as exc:
        log.warning("cgroup %s not killed: %s", cg, exc)
        return True
    deadline = time.monotonic() + wait
    while populated(cg) and time.monotonic() < deadline:
        time.sleep(_POLL)
    return True


def remove_cgroup(path: Path | str) -> None:
    """Remove the empty cgroup ``path`` and its empty descendants. Never raises."""
    cg = Path(path)
    for sub in sorted((p for p in cg.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        with contextlib.suppress(OSError):
            sub.rmdir()
    with contextlib.suppress(OSError):
        cg.rmdir()


def populated(path: Path | str) -> bool:
    """Whether a process lives in the cgroup ``path`` or below it (``False`` when it does not
    exist)."""
    try:
        events = (Path(path) / "cgroup.events").read_text()
    except OSError:
        return False
    return "populated 1" in events


def cgroup_pids(path: Path | str) -> list[int]:
    """The pids of the cgroup ``path`` and of its descendants (empty when it does not
    exist)."""
    found: list[int] = []
    root = Path(path)
    for procs in [root / "cgroup.procs", *root.rglob("*/cgroup.procs")]:
        with contextlib.suppress(OSError):
            found.extend(int(w) for w in procs.read_text().split())
    return found


def is_tree_cgroup(handle: str) -> bool:
    """Whether ``handle`` names a tree's cgroup of this host's fleet (a ``t-*`` directory in a
    ``w*`` scope inside the cgroup v2 hierarchy), so it may be killed on a record's word."""
    mount = cgroup2_mount()
    if not handle or mount is None:
        return False
    path = Path(handle)
    return (
        path.name.startswith("t-")
        and path.parent.name.startswith("w")
        and ".." not in path.parts
        and path.is_relative_to(mount)
    )


def set_frozen(path: Path | str, frozen: bool) -> bool:
    """Freeze (``cgroup.freeze`` = 1) or thaw (0) the cgroup ``path`` and its descendants.
    Returns whether it was written. Never raises."""
    try:
        (Path(path) / "cgroup.freeze").write_text("1" if frozen else "0")
    except OSError as exc:
        log.warning("cgroup %s not %s: %s", path, "frozen" if frozen else "thawed", exc)
        return False
    return True


def is_frozen(path: Path | str) -> bool:
    """Whether the cgroup ``path`` is asked to be frozen (``cgroup.freeze`` reads 1)."""
    try:
        return (Path(path) / "cgroup.freeze").read_text().strip() == "1"
    except OSError:
        return False


def kill_handle(handle: str) -> bool:
    """Kill the tree whose cgroup is ``handle`` (``Tree.handle``, as recorded) if it is one
    (``is_tree_cgroup``), and remove its cgroup. Returns whether any process was in it."""
    if not is_tree_cgroup(handle):
        return False
    killed = kill_cgroup(handle)
    remove_cgroup(handle)
    return killed
