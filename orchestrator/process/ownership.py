"""Which job worker and which process a job belongs to, so a stop signals only its own.

Stops reach a job through its host name (``control_queue(job, host)``), and a pid means
nothing outside its pid namespace. Two rules make a stop exact:

* **One live worker per host name.** A job worker holds a lease on its host name
  (``Keys.job_host``, ``process/job_host_claim.lua``), renewed by a thread every third of the
  lease. A second worker with the same name waits at most one lease for the key to lapse (the
  holder may have just died) and is then refused with ``HostHeld``, naming the holder
  (instance id, pid, since).
* **A job names its worker instance and its process.** The claiming worker's instance id
  (``<host>/<random>``, one per worker process) is stored with the job, and the process's pid
  with its start time (``pidStart``: psutil's ``create_time``). A worker that does not run the
  job itself signals its pid only when a process with that pid exists here *and* started at
  that time (``is_process``); otherwise the pid is someone else's and nothing is signalled.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import uuid

import psutil
from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_fixed

from orchestrator.errors import HostHeld, StoreUnavailable
from orchestrator.process import scripts
from orchestrator.storage.store import Store

log = logging.getLogger(__name__)

#: Two start times within this many seconds are the same (psutil derives them from clock
#: ticks and the boot time, so the same process always reads the same value).
_START_TOLERANCE = 0.001


def new_instance(host: str) -> str:
    """A fresh worker instance id: ``<host>/<12 hex digits>``."""
    return f"{host}/{uuid.uuid4().hex[:12]}"


def process_start(pid: int) -> float | None:
    """Start time (epoch seconds, psutil ``create_time``) of the process ``pid`` in this pid
    namespace, or ``None`` when there is none (or it cannot be read)."""
    try:
        return float(psutil.Process(pid).create_time())
    except (psutil.Error, ValueError):
        return None


def is_process(pid: int, started: str | float | None) -> bool:
    """Whether ``pid`` here is the process that started at ``started`` (as recorded in
    ``pidStart``). False when either is unknown: an unverified pid is never ours."""
    if pid <= 0 or started in (None, ""):
        return False
    try:
        expected = float(started)
    except ValueError:
        return False
    found = process_start(pid)
    return found is not None and abs(found - expected) < _START_TOLERANCE


def kill_if_ours(pid: int, started: str | float | None) -> bool:
    """SIGKILL the process group of ``pid`` if ``pid`` is still the process that started at
    ``started`` (``is_process``); never signal a pid that is not verified. Returns whether it
    was ours (and so was killed)."""
    if not is_process(pid, started):
        return False
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    return True


class HostLease:
    """The lease of one job worker process on its host name (see the module docstring).

    ``lease_ms`` is the key's TTL; ``acquire`` takes it (or raises ``HostHeld``) and starts
    the renewing thread; ``release`` stops renewing and gives the name back."""

    def __init__(self, store: Store, host: str, *, lease_ms: int) -> None:
        self.store = store
        self.host = host
        self.lease_ms = max(300, lease_ms)
        self.instance = new_instance(host)
        self.pid = os.getpid()
        #: Set when another instance was found holding the name at a renewal (this worker's
        #: lease lapsed meanwhile, e.g. it was frozen); logged as an error.
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _claim(self) -> scripts.Held | None:
        return scripts.job_host_claim(
            self.store,
            host=self.host,
            instance=self.instance,
            pid=self.pid,
            lease_ms=self.lease_ms,
        )

    def _take(self) -> None:
        held = self._claim()
        if held is not None:
            raise HostHeld(self.host, held.instance, held.pid, held.since)

    def acquire(self, wait_seconds: float | None = None) -> None:
        """Take the host name, waiting up to ``wait_seconds`` (default: one lease and a half)
        for a lapsing holder. Raises ``HostHeld`` naming the live holder,
        ``StoreUnavailable``."""
        wait = self.lease_ms * 1.5 / 1000 if wait_seconds is None else wait_seconds
        for attempt in Retrying(
            retry=retry_if_exception_type(HostHeld),
            stop=stop_after_delay(wait),
            wait=wait_fixed(self.lease_ms / 4000),
            reraise=True,
        ):
            with attempt:
                self._take()
        self._thread = threading.Thread(target=self._renew, name="job-host-lease", daemon=True)
        self._thread.start()
        log.info("job host %s held by instance %s", self.host, self.instance)

    def _renew(self) -> None:
        while not self._stop.wait(self.lease_ms / 3000):
            try:
                reply = self._claim()
            except StoreUnavailable as exc:
                log.warning("job host lease of %s not renewed: %s", self.host, exc)
                continue
            if reply is not None and not self.lost.is_set():
                self.lost.set()
                log.error(
                    "job host %s is now held by %s (pid %s since %s): this worker's lease "
                    "lapsed; its stops may reach that worker",
                    self.host,
                    reply.instance,
                    reply.pid,
                    reply.since,
                )

    def release(self) -> None:
        """Stop renewing and give the host name back (best effort)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        with contextlib.suppress(StoreUnavailable):
            scripts.job_host_release(self.store, host=self.host, instance=self.instance)
