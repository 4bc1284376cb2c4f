"""The exec watchdog: a turn's shell command never outlives its step's lease.

A ``shell`` tool call runs its command as a child of the turn worker (``tools._run_shell``,
under coreutils ``timeout``, which dies with the worker). A *frozen* worker (SIGSTOP, a
stalled VM thread) stops refreshing its step's lease (``Keys.step_lease``), and once the
lease lapses the census counts the turn as not live (``turn.lua``: a ``cancelling`` turn
without its lease is stale), but freezing a process does not freeze its children: the command
would run on, hidden. So each command gets this watchdog, a child process of the worker that
the worker's freeze does not reach (it dies with the worker's thread by
``PR_SET_PDEATHSIG``):

* every ``1/8`` lease it reads the lease (its value, the step copy's token, and its remaining
  TTL) and keeps the local (monotonic) time it lapses, as last read;
* once less than a third of a lease is left (the step watch refreshes it every second of a
  five-second lease), or the lease is gone or held by another copy of the step, it kills the
  command's process group (SIGKILL, only after the pid is verified by its start time,
  ``ownership.kill_if_ours``) and exits. When Redis cannot be read it judges by the lapse time
  it last read, since the server's TTL keeps running;
* it exits when the command's process is gone (the tool stops it as well once the command
  ends).

Run as ``python -m orchestrator.execwatch TURN_ID TOKEN LEASE_MS PID PID_START``; the store is
the settings' (``FLEET_REDIS_URL``, ``FLEET_KEY_PREFIX``: the URL never goes on a command
line). Imports no Celery. The same rule as the job watchdog (``orchestrator/jobwatch.py``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import time

from orchestrator.errors import StoreUnavailable
from orchestrator.ownership import is_process, kill_if_ours, process_start
from orchestrator.processes import die_with_parent
from orchestrator.settings import get_settings
from orchestrator.store import Store, retried

log = logging.getLogger(__name__)


@retried
def _read(store: Store, turn_id: str) -> tuple[str | None, int]:
    """The step lease's value (the owning copy's token) and remaining TTL in ms (< 0: none)."""
    pipe = store.redis.pipeline(transaction=False)
    pipe.get(store.keys.step_lease(turn_id))
    pipe.pttl(store.keys.step_lease(turn_id))
    token, ttl = pipe.execute()
    return token, int(ttl)


class ExecWatch:
    """Watches one command (``pid``, started at ``started``) of the step copy ``token`` of
    turn ``turn_id`` (see the module docstring); ``poll`` does one pass."""

    def __init__(
        self, store: Store, turn_id: str, token: str, lease_ms: int, pid: int, started: str
    ) -> None:
        self.store = store
        self.turn_id = turn_id
        self.token = token
        self.pid = pid
        self.started = started
        self.margin = lease_ms / 3000
        self.interval = max(0.05, lease_ms / 8000)
        #: Monotonic seconds at which the lease lapses, as last read.
        self.lapses = time.monotonic() + lease_ms / 1000

    def poll(self) -> bool:
        """One pass. Returns whether the watch is over (the command is gone or was killed)."""
        if not is_process(self.pid, self.started):
            return True
        now = time.monotonic()
        try:
            token, ttl_ms = _read(self.store, self.turn_id)
        except StoreUnavailable as exc:  # the TTL runs on in the server: judge by last read
            log.warning("exec watchdog of turn %s cannot read the store: %s", self.turn_id, exc)
        else:
            held = token == self.token and ttl_ms > 0
            self.lapses = now + ttl_ms / 1000 if held else float("-inf")
        if self.lapses - now >= self.margin:
            return False
        if kill_if_ours(self.pid, self.started):
            log.warning(
                "turn %s: its step's lease ran out (worker frozen?): shell command killed (pid %d)",
                self.turn_id,
                self.pid,
            )
        return True

    def run(self) -> None:
        """Poll every ``interval`` seconds until the watch is over."""
        while True:
            try:
                if self.poll():
                    return
            except Exception as exc:  # contained: one bad read must not end the watch
                log.warning("exec watchdog: %s", exc)
            time.sleep(self.interval)


def start(
    store: Store, turn_id: str, token: str, lease_ms: int, pid: int
) -> subprocess.Popen[bytes] | None:
    """Start the watchdog of command ``pid`` as a child process of the caller's thread (it
    dies with that thread, ``PR_SET_PDEATHSIG``), in a session of its own. ``None`` when the
    command's start time cannot be read (it is already gone). Raises ``OSError``."""
    started = process_start(pid)
    if started is None:
        return None
    env = {**os.environ, "FLEET_REDIS_URL": store.url, "FLEET_KEY_PREFIX": store.keys.prefix}
    argv = [turn_id, token, str(lease_ms), str(pid), repr(started)]
    return subprocess.Popen(
        [sys.executable, "-P", "-m", "orchestrator.execwatch", *argv],
        stdin=subprocess.DEVNULL,
        env=env,
        preexec_fn=die_with_parent(),
    )


def stop(watch: subprocess.Popen[bytes] | None) -> None:
    """End a watchdog ``start`` returned (its command is over)."""
    if watch is None:
        return
    with contextlib.suppress(ProcessLookupError):
        watch.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        watch.wait(5)


def main(argv: list[str]) -> None:
    """``TURN_ID TOKEN LEASE_MS PID PID_START``: watch that command until it is over."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s execwatch %(message)s")
    settings = get_settings()
    if not settings.redis_url:
        raise SystemExit("execwatch: FLEET_REDIS_URL is not set")
    turn_id, token, lease_ms, pid, started = argv[:5]
    store = Store(settings.redis_url, settings.key_prefix)
    ExecWatch(store, turn_id, token, int(lease_ms), int(pid), started).run()


if __name__ == "__main__":  # pragma: no cover - the shell tool's child process
    main(sys.argv[1:])
