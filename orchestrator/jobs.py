"""Jobs: background processes a session owns on one host.

A job is stored when a turn asks for it (state ``starting``, with a start lease), taken by one
job worker (``job_claim.lua``: refused if the lineage is archived by then), and supervised there
by ``JobSupervisor``: the process runs in its own process group, dies with the worker (Linux
``PR_SET_PDEATHSIG``), and its lease is refreshed while it runs (``job_renew.lua``: only while
the job is still running and claimed by this worker). Liveness is the lease: a job whose worker
died stops counting once the lease lapses (``activity`` marks it ``lost``). A lost job is dead:
a killed worker's jobs die with it; a frozen worker's are killed by its watchdog
(``orchestrator/jobwatch.py``) before their leases lapse; a worker that resumes and finds a
job's renewal refused kills its process group and stops tracking it.

Stopping is cooperative first: SIGTERM to the process group, SIGKILL after the grace period.
A stop signals only a process that is verifiably the job's (``orchestrator/ownership.py``):
one this supervisor forked, or an orphan of an earlier worker of this host whose pid still
names a process that started when the job's did; any other pid is left alone and the job is
recorded ``lost``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from orchestrator import jobwatch, limits
from orchestrator.errors import TurnStopped
from orchestrator.families import Dispatcher, Family, Task, control_queue, work_queue
from orchestrator.fencing import StepGuard
from orchestrator.ownership import kill_if_ours, new_instance, process_start
from orchestrator.processes import die_with_parent
from orchestrator.store import Store, iso, new_id, retried

log = logging.getLogger(__name__)

#: A starting job not taken by any worker within this time stops counting as live (ms).
START_TIMEOUT_MS = 30_000


class JobState(StrEnum):
    """Where a job is in its lifecycle."""

    STARTING = "starting"  #: stored, waiting for a job worker to take it
    RUNNING = "running"  #: its process runs on ``host``
    EXITED = "exited"  #: the process ended by itself (``exitCode``)
    STOPPED = "stopped"  #: stopped on request (archive or cancel)
    REFUSED = "refused"  #: never started: its lineage was archived, or its host was full
    #: (``FLEET_MAX_JOBS_PER_HOST``), when a worker took it; ``reason`` says which
    LOST = "lost"  #: its worker vanished; the lease lapsed
    FAILED = "failed"  #: the process could not be started


# The job records' plain reads and idempotent writes (same value, same TTL) go through the
# store's translation and bounded retry, so a Redis failure is StoreUnavailable, never a raw
# redis-py error; a task that meets it is retried (workers/retry.py).
@retried
def _job_fields(store: Store, job_id: str, *fields: str) -> list[str | None]:
    found: list[str | None] = store.redis.hmget(store.keys.job(job_id), *fields)
    return found


@retried
def _record_pid(store: Store, job_id: str, pid: int, started: float | None) -> None:
    fields = {"pid": pid, "pidStart": "" if started is None else repr(started)}
    store.redis.hset(store.keys.job(job_id), mapping=fields)


def create_job(
    store: Store,
    dispatcher: Dispatcher,
    session_id: str,
    seconds: float,
    label: str,
    *,
    command: str = "",
    guard: StepGuard | None = None,
) -> str:
    """Store a starting job and send it to the job queue. Returns the job id. With
    ``command`` the job runs it with ``/bin/sh`` and is stopped after ``seconds``; without,
    it runs the supervisor's own command for ``seconds`` (``sleep``).

    With ``guard`` (the copy of the step that asks for the job) nothing is stored once its turn
    no longer runs or that copy no longer owns the step (``orchestrator/fencing.py``): raises
    ``TurnStopped``. Raises ``LimitReached`` when the session already has
    ``FLEET_MAX_JOBS_PER_SESSION`` live jobs (counted in the script that stores the job),
    ``StoreUnavailable``."""
    jid = new_id("job")
    maximum = limits.JOBS_PER_SESSION.maximum()
    args = [jid, session_id, label, seconds, iso(store.now_ms()), START_TIMEOUT_MS]
    stored = store.run("job_create", [*args, *StepGuard.argv(guard), maximum, command])
    if stored == "stopped":
        raise TurnStopped(guard.turn_id if guard else "")
    limits.check_reply(limits.JOBS_PER_SESSION, maximum, stored)
    dispatcher.send(Task.JOB_RUN, [session_id, jid], work_queue(Family.JOB))
    return jid


@dataclass
class _Running:
    job_id: str
    session_id: str
    process: subprocess.Popen[bytes]
    #: Set (under the supervisor's lock) before a stop signals the process, so the reaper,
    #: which may see it end first, leaves recording its end to the stop (``stopped``).
    stopping: bool = False


class JobSupervisor:
    """Owns the job processes of one worker: starts, watches, stops them.

    All processes are forked from the supervisor's own long-lived thread, so the
    die-with-parent signal is tied to that thread, not to a short-lived pool thread. The
    first is the watchdog of this worker instance's jobs (``orchestrator/jobwatch.py``).
    """

    def __init__(
        self,
        store: Store,
        host: str,
        *,
        lease_ms: int,
        grace_seconds: float,
        command: Callable[[float], list[str]] | None = None,
        instance: str | None = None,
    ) -> None:
        self.store = store
        self.host = host
        #: This worker process's instance id (``ownership.HostLease.instance`` in a job
        #: worker), stored on every job it claims.
        self.instance = instance or new_instance(host)
        self.lease_ms = lease_ms
        self.grace = grace_seconds
        self.command = command or (lambda seconds: ["sleep", f"{seconds:g}"])
        self._running: dict[str, _Running] = {}
        self._pending: set[str] = set()  # claimed here, process not forked yet
        self._lock = threading.Lock()
        self._requests: list[tuple[str, str, float, str, threading.Event, list[object]]] = []
        self._wake = threading.Condition()
        self._stop = threading.Event()
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._thread = threading.Thread(target=self._loop, name="job-supervisor", daemon=True)
        self._thread.start()

    # -- public ------------------------------------------------------------------------------
    def start(self, session_id: str, job_id: str) -> str:
        """Take a starting job and run its process here. Returns ``running``,
        ``refused:<archived session>``, ``refused:<limit message>`` (this host already runs
        ``FLEET_MAX_JOBS_PER_HOST`` live jobs), or the job's state when it was not
        starting."""
        # Counted as ours before the claim is visible, so a stop that sees the claim also
        # sees the job here and waits for its fork instead of treating it as an orphan.
        with self._lock:
            self._pending.add(job_id)
        try:
            claimed = self.store.run("job_claim", [job_id, self.host, *self._claim_args()])
            raw, command = _job_fields(self.store, job_id, "seconds", "command")
            seconds = float(raw or 0)
        except BaseException:
            with self._lock:
                self._pending.discard(job_id)
            raise
        if claimed != "ok":
            with self._lock:
                self._pending.discard(job_id)
            log.info(
                "job %s not started: %s",
                job_id,
                claimed,
                extra={"session_id": session_id, "family": "job"},
            )
            return str(claimed)
        done = threading.Event()
        box: list[object] = []
        with self._wake:
            self._requests.append((session_id, job_id, seconds, command or "", done, box))
            self._wake.notify()
        done.wait(10)
        if box and isinstance(box[0], Exception):
            self.store.run(
                "job_end", [job_id, JobState.FAILED.value, "", iso(self.store.now_ms()), "running"]
            )
            log.warning(
                "job %s failed to start: %s",
                job_id,
                box[0],
                extra={"session_id": session_id, "family": "job"},
            )
            return "failed"
        return "running"

    def _claim_args(self) -> list[object]:
        """``job_claim.lua``'s lease, time, this worker's instance and the per-host limit
        (``FLEET_MAX_JOBS_PER_HOST``)."""
        maximum = limits.JOBS_PER_HOST.maximum()
        return [
            self.lease_ms,
            iso(self.store.now_ms()),
            self.instance,
            maximum,
            limits.JOBS_PER_HOST.template(maximum),
        ]

    def stop(self, session_id: str, job_ids: list[str]) -> dict[str, str]:
        """Stop the named jobs of a session that run here (SIGTERM, then SIGKILL after the
        grace period). Jobs that ended already are reported with their state. Returns
        ``{jobId: outcome}``; never raises for one job's failure."""
        outcomes: dict[str, str] = {}
        victims: list[_Running] = []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with self._lock:
                if not self._pending.intersection(job_ids):
                    break
            time.sleep(0.01)  # a stop racing the fork: let the process exist, then stop it
        with self._lock:
            for jid in job_ids:
                run = self._running.get(jid)
                if run is not None and run.session_id == session_id:
                    victims.append(run)
                else:
                    [state] = _job_fields(self.store, jid, "state")
                    outcomes[jid] = f"not here ({state})"
        for run in victims:
            try:
                outcomes[run.job_id] = self._terminate(run)
            except Exception as exc:  # contained: the next job is still stopped
                outcomes[run.job_id] = f"error: {exc}"
                log.warning(
                    "job %s stop failed: %s",
                    run.job_id,
                    exc,
                    extra={"session_id": session_id, "family": "job"},
                )
        return outcomes

    def owned(self) -> set[str]:
        """Ids of the jobs this supervisor runs or is about to fork."""
        with self._lock:
            return set(self._running) | self._pending

    def pids(self) -> dict[str, int]:
        """``{jobId: pid}`` of the processes running here."""
        with self._lock:
            return {jid: r.process.pid for jid, r in self._running.items()}

    def shutdown(self) -> None:
        """Stop every process (the worker is leaving) and the supervisor thread."""
        with self._lock:
            runs = list(self._running.values())
        for run in runs:
            try:
                self._terminate(run)
            except Exception as exc:
                log.warning("job %s stop at shutdown failed: %s", run.job_id, exc)
        self._stop.set()
        with self._wake:
            self._wake.notify()
        self._thread.join(timeout=5)
        if self._watchdog is not None:
            self._watchdog.kill()
            self._watchdog.wait(5)

    # -- internals ---------------------------------------------------------------------------
    def _terminate(self, run: _Running) -> str:
        proc = run.process
        extra = {"session_id": run.session_id, "family": "job"}
        with self._lock:
            run.stopping = True
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(self.grace)
            except subprocess.TimeoutExpired:
                log.warning(
                    "job %s ignored SIGTERM for %.1fs; killing", run.job_id, self.grace, extra=extra
                )
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
        with self._lock:
            self._running.pop(run.job_id, None)
        self.store.run(
            "job_end",
            [
                run.job_id,
                JobState.STOPPED.value,
                str(proc.returncode),
                iso(self.store.now_ms()),
                "running",
            ],
        )
        log.info("job %s stopped (pid %d)", run.job_id, proc.pid, extra=extra)
        return "stopped"

    def _spawn_pending(self) -> None:
        with self._wake:
            pending, self._requests = self._requests, []
        for session_id, job_id, seconds, command, done, box in pending:
            # A stored command runs under coreutils' timeout, which stops it after seconds.
            argv = ["timeout", f"{seconds:g}", "/bin/sh", "-c", command] if command else None
            try:
                proc = subprocess.Popen(
                    argv or self.command(seconds),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    preexec_fn=die_with_parent(),
                )
            except OSError as exc:
                with self._lock:
                    self._pending.discard(job_id)
                box.append(exc)
                done.set()
                continue
            with self._lock:
                self._running[job_id] = _Running(job_id, session_id, proc)
                self._pending.discard(job_id)
            _record_pid(self.store, job_id, proc.pid, process_start(proc.pid))
            log.info(
                "job %s running as pid %d for %gs",
                job_id,
                proc.pid,
                seconds,
                extra={"session_id": session_id, "family": "job"},
            )
            done.set()

    def _renew(self, run: _Running) -> None:
        """Renew the lease of a running job (``job_renew.lua``). When refused (the lease
        lapsed while this worker was frozen, the census may have recorded it ``lost``, or the
        job is no longer this instance's), the job must not run on: its process group is
        killed, it is recorded ``lost`` if still ``running``, and no longer tracked."""
        renewed = self.store.run("job_renew", [run.job_id, self.instance, self.lease_ms])
        with self._lock:
            if renewed == "ok" or run.stopping or self._running.pop(run.job_id, None) is None:
                return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.process.pid, signal.SIGKILL)
        run.process.wait(5)
        reason = f"its lease was not renewable ({renewed}): killed by its worker on resuming"
        ms = self.store.now_ms()
        self.store.run("job_end", [run.job_id, JobState.LOST.value, "", iso(ms), "running", reason])
        log.warning(
            "job %s: %s",
            run.job_id,
            reason,
            extra={"session_id": run.session_id, "family": "job"},
        )

    def _reap(self) -> None:
        with self._lock:
            runs = list(self._running.values())
        for run in runs:
            code = run.process.poll()
            if code is None:
                self._renew(run)
                continue
            with self._lock:
                if run.stopping or self._running.pop(run.job_id, None) is None:
                    continue  # being stopped right now; _terminate records it
            self.store.run(
                "job_end",
                [run.job_id, JobState.EXITED.value, str(code), iso(self.store.now_ms()), "running"],
            )
            log.info(
                "job %s exited with %d",
                run.job_id,
                code,
                extra={"session_id": run.session_id, "family": "job"},
            )

    def _loop(self) -> None:
        interval = max(0.05, min(0.5, self.lease_ms / 1000 / 4))
        last_reap = 0.0
        try:
            self._watchdog = jobwatch.start(self.store, self.host, self.instance, self.lease_ms)
        except OSError as exc:
            log.error("job watchdog not started: %s", exc)
        while not self._stop.is_set():
            with self._wake:
                if not self._requests:
                    self._wake.wait(interval)
            try:
                self._spawn_pending()
                if time.monotonic() - last_reap >= interval:
                    self._reap()
                    last_reap = time.monotonic()
            except Exception as exc:  # a Redis blip must not kill the supervisor
                log.warning("job supervisor: %s", exc)


def stop_unclaimed(
    store: Store,
    dispatcher: Dispatcher,
    session_id: str,
    job_ids: list[str],
    *,
    local_host: str,
    local_instance: str,
) -> dict[str, str]:
    """Stop jobs not supervised by the caller (worker instance ``local_instance`` on
    ``local_host``): still ``starting`` -> ``stopped`` (the worker that takes one later finds
    it stopped); running on another host -> the stop is forwarded to that host's queue;
    claimed by this instance -> left to it (it is ending here); claimed by an earlier worker of
    this host (an orphan) -> ``_stop_orphan``. Returns ``{jobId: outcome}``."""
    outcomes: dict[str, str] = {}
    for jid in job_ids:
        result = store.run(
            "job_end",
            [jid, JobState.STOPPED.value, "", iso(store.now_ms()), JobState.STARTING.value],
        )
        if result == "ok":
            outcomes[jid] = "stopped before it started"
            continue
        if result != JobState.RUNNING.value:
            outcomes[jid] = str(result)
            continue
        host, instance, pid, started = _job_fields(
            store, jid, "host", "instance", "pid", "pidStart"
        )
        if host and host != local_host:
            dispatcher.send(Task.JOB_STOP, [session_id, [jid]], control_queue(Family.JOB, host))
            outcomes[jid] = f"forwarded to {host}"
        elif instance == local_instance:
            outcomes[jid] = "not here (running: ending on this worker)"
        else:
            outcomes[jid] = _stop_orphan(store, session_id, jid, pid, started)
    return outcomes


def _stop_orphan(
    store: Store, session_id: str, jid: str, pid: str | None, started: str | None
) -> str:
    """A job left running by an earlier worker of this host: with no pid recorded it just
    ends ``stopped``; its process group is killed only if its pid still names the process
    that started at ``pidStart``; otherwise the pid is not ours (reused, or another pid
    namespace), nothing is signalled and the job is recorded ``lost``."""
    extra = {"session_id": session_id, "family": "job"}
    if not pid:  # its worker died between the claim and the fork: there is nothing to signal
        store.run(
            "job_end",
            [jid, JobState.STOPPED.value, "", iso(store.now_ms()), JobState.RUNNING.value],
        )
        return "stopped (no process was recorded)"
    if kill_if_ours(int(pid), started):
        store.run(
            "job_end",
            [jid, JobState.STOPPED.value, "", iso(store.now_ms()), JobState.RUNNING.value],
        )
        log.warning("job %s: orphan of an earlier worker killed (pid %s)", jid, pid, extra=extra)
        return "orphan killed"
    store.run(
        "job_end", [jid, JobState.LOST.value, "", iso(store.now_ms()), JobState.RUNNING.value]
    )
    log.warning(
        "job %s: recorded lost, nothing signalled (pid %s is not its process here)",
        jid,
        pid,
        extra=extra,
    )
    return "lost (its process is not here)"
