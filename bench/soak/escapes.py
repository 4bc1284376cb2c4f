"""The ``escape`` fault: processes that leave their process group, and the check that an
archive still leaves none of them alive.

One fault: a fresh session's turn starts a job whose command also starts a ``sleep`` in a
session of its own (``escape``), then runs a ``shell`` call that does the same and double-forks
another (``escape_exec``); once those processes run, the session is archived with
``stopActivity`` (through the traffic's client, so the other checks see the archive). Every
process is a ``sleep`` of a duration unique to the fault (``47.<n>``), found by its exact
command line in ``/proc`` (psutil), never signalled by name: a process of the fault still
alive 5 s after the archive's 200 is a violation, and is then killed by its PID so the soak
goes on clean.
"""

from __future__ import annotations

import contextlib
import itertools
import random
import threading
import time
from dataclasses import dataclass, field

import httpx
import psutil

from bench.soak.checks import Check
from bench.soak.traffic import Traffic

#: Seconds after an archive's 200 by which no process of the session may be alive.
DEADLINE = 5.0
#: Seconds the fault waits for its processes to run before it archives anyway (not counted
#: as run, but checked all the same).
START_WAIT = 15.0


def sleeps(duration: str) -> list[int]:
    """PIDs of the live (not zombie) ``sleep <duration>`` processes of this host."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        with contextlib.suppress(psutil.Error):
            if proc.info["cmdline"] == ["sleep", duration] and proc.info["status"] != "zombie":
                found.append(proc.pid)
    return found


@dataclass
class Escapes:
    """Runs the ``escape`` fault (``__call__``, from the fault schedule) and keeps what each
    run saw: ``runs`` counts faults with processes seen, ``late`` the processes alive 5 s
    after their archive's 200 (as ``session: pids``)."""

    traffic: Traffic
    runs: int = 0
    #: Faults whose processes were not all seen running before the archive (a slow worker),
    #: and faults whose archive was not answered 200 (not checked).
    unseen: int = 0
    unacknowledged: int = 0
    late: list[str] = field(default_factory=list)
    _numbers: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, rng: random.Random) -> str:
        """One fault; returns the session it archived (``""``: skipped, the archive was not
        answered 200)."""
        with self._lock:
            duration = f"47.{next(self._numbers) % 1000:03d}"
        with httpx.Client(base_url=self.traffic.base_url, timeout=10) as client:
            sid = self.traffic.create(client)
            if sid is None:
                return ""
            prompt = f"escape {duration}\nescape_exec {duration}\nsay escaped"
            path = f"/sessions/{sid}/prompt"
            call = self.traffic.call(client, "prompt", [sid], "POST", path, {"prompt": prompt})
            # the job's two sleeps and the shell call's three
            seen = self._wait_for(duration, 5) if call.status == 202 else []
            path = f"/sessions/{sid}/archive"
            body = {"stopActivity": True}
            archived = self.traffic.call(client, "archive_stop", [sid], "POST", path, body)
        acked = time.monotonic()
        if archived.status != 200:
            self.unacknowledged += 1
            self._kill(sleeps(duration))
            return ""
        # Checked whether or not they were seen: one may have started since.
        self.runs += bool(seen)
        self.unseen += not seen
        left = sleeps(duration)
        while left and time.monotonic() - acked < DEADLINE:
            time.sleep(0.1)
            left = sleeps(duration)
        if left:
            self.late.append(f"{sid}: pids {left} alive {DEADLINE:g} s after the archive")
            self._kill(left)
        return sid

    @staticmethod
    def _wait_for(duration: str, count: int) -> list[int]:
        until = time.monotonic() + START_WAIT
        while time.monotonic() < until:
            found = sleeps(duration)
            if len(found) >= count:
                return found
            time.sleep(0.1)
        return []

    @staticmethod
    def _kill(pids: list[int]) -> None:
        for pid in pids:
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).kill()

    def check(self) -> Check:
        """No process of an archived session alive 5 s after its archive's 200."""
        return Check(
            "processes of an archived session alive 5 s after its archive",
            len(self.late),
            f"{self.runs + self.unseen} escape faults (a job and a shell call each leaving "
            f"setsid and double-forked sleeps), {len(self.late)} with a process left; "
            f"{self.unseen} of them archived before all their processes ran (a busy worker: "
            f"{START_WAIT:g} s), {self.unacknowledged} not checked (no 200 to the archive)",
            self.late[:5],
        )
