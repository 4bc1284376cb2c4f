"""Child processes that never outlive their owner.

Every process agent-fleet starts (a turn's ``exec`` child, a job, a worker started by the
local runner, the embedded Redis) asks the Linux kernel to signal it when the thread that
started it dies (``PR_SET_PDEATHSIG``), so a ``kill -9`` of the owner cannot leave hidden work
behind. Elsewhere (macOS) the call is skipped and only the owners' own cleanup applies.
"""

from __future__ import annotations

import ctypes
import os
import signal
from collections.abc import Callable

_PR_SET_PDEATHSIG = 1


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
