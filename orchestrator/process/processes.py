"""Child processes that never outlive their owner.

Every process agent-fleet starts (a turn's ``exec`` child, a job, a worker started by the
local runner, the embedded Redis) asks the Linux kernel to signal it when the thread that
started it dies (``PR_SET_PDEATHSIG``), so a ``kill -9`` of the owner cannot leave hidden work
behind. Elsewhere (macOS) the call is skipped and only the owners' own cleanup applies.

The signal reaches one process only: a child that forks (``/bin/sh -c CMD`` running ``CMD``)
would leave its own children behind. So a command run through a shell runs under coreutils
``timeout`` (``under_timeout``), which leads the process group and, on the SIGTERM it gets
when its owner dies, sends SIGTERM to its whole group, then SIGKILL after a grace.
"""

from __future__ import annotations

import ctypes
import os
import signal
from collections.abc import Callable

_PR_SET_PDEATHSIG = 1

#: Seconds a command under ``timeout`` has, once signalled, before its group gets SIGKILL.
KILL_GRACE_SECONDS = 1.0


def die_with_parent(sig: int = signal.SIGKILL, *, new_session: bool = True) -> Callable[[], None]:
    """A ``preexec_fn`` for ``subprocess.Popen``: the child gets ``sig`` when its parent
    thread dies, and with ``new_session`` it leads its own process group (so a stop can signal
    the whole group)."""

    def _preexec() -> None:  # pragma: no cover - runs in the child between fork and exec
        if new_session:
            os.setsid()
        try:
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, sig)
        except OSError:
            pass
        # The parent may have died between fork and prctl: then nobody would signal us.
        if os.getppid() == 1:
            os.kill(os.getpid(), sig)

    return _preexec


def under_timeout(
    argv: list[str], seconds: float = 0, grace: float = KILL_GRACE_SECONDS
) -> tuple[list[str], Callable[[], None]]:
    """``argv`` run under coreutils ``timeout`` (not ``--foreground``), with its ``preexec_fn``:
    returns (argv, preexec_fn) for ``subprocess.Popen``. ``timeout`` leads its own session and
    gets SIGTERM when its parent thread dies (``die_with_parent``); on SIGTERM, or after
    ``seconds`` (``0``: no time limit), it sends SIGTERM to the whole process group, and
    SIGKILL to it ``grace`` seconds later if the command still runs."""
    wrapped = ["timeout", "-k", f"{grace:g}", f"{seconds:g}", *argv]
    return wrapped, die_with_parent(signal.SIGTERM)
