"""Supervision: the job processes of one worker, their leases, their ends and their stops.

``JobSupervisor`` takes a starting job (``job_claim.lua``), forks its process tree
(``orchestrator/job/jobspawn.py``), renews its lease while any process of the tree runs
(``job_renew.lua``) and records its end. A command that ends leaving a background process
behind (``setsid CMD &``) keeps its job ``running`` (its lease renewed) until that process ends
too, or until the job's ``seconds`` are over, when the rest of the tree is killed.

Stopping is cooperative first: SIGTERM to every process of the tree, SIGKILL to the whole tree
after the grace period; the job is recorded ``stopped`` once no process of it is left.
A stop signals only a process that is verifiably the job's (``orchestrator/process/ownership.py``):
one this supervisor forked, or an orphan of a former worker of this host whose pid still names
a process that started when the job's did (``orchestrator/job/jobstops.py``); any other pid is left
alone and the job is recorded ``lost``. A job whose session an archive took is stopped without
waiting for its stop request (``orchestrator/job/jobgatewatch.py``).
"""

from __future__ import annotations

import logging
import subprocess
import threading
import time
from collections.abc import Callable
from concurrent import futures

from orchestrator.job import jobspawn, jobwatch, scripts
from orchestrator.job.jobgatewatch import GateWatch
from orchestrator.job.jobs import JobState, end_job, job_fields, record_pid
from orchestrator.job.jobspawn import RunningJob
from orchestrator.process.ownership import new_instance, process_start
from orchestrator.session import limits
from orchestrator.storage.store import Store, iso

log = logging.getLogger(__name__)


class JobSupervisor:
    """Owns the job processes of one worker: starts, watches, stops them.

    All processes are forked from the supervisor's own long-lived thread, so the
    die-with-parent signal is tied to that thread, not to a short-lived pool thread. The
    first is the watchdog of this worker instance's jobs (``orchestrator/job/jobwatch.py``).
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
        freeze_max_seconds: float | None = None,
    ) -> None:
        self.store = store
        self.host = host
        #: This worker process's instance id (``ownership.HostLease.instance`` in a job
        #: worker), stored on every job it claims.
        self.instance = instance or new_instance(host)
        self.lease_ms = lease_ms
        self.grace = grace_seconds
        #: Seconds its watchdog may keep a job frozen while Redis does not answer.
        self.freeze_max = (
            store.settings.job_freeze_max_seconds
            if freeze_max_seconds is None
            else freeze_max_seconds
        )
        self.command = command or (lambda seconds: ["sleep", f"{seconds:g}"])
        self._running: dict[str, RunningJob] = {}
        #: Claimed here, process not forked yet: each job's fork, resolved with its pid (or
        #: the fork's error) by the supervisor thread, cancelled when the claim failed.
        self._pending: dict[str, futures.Future[int]] = {}
        self._lock = threading.Lock()
        #: (session id, job id, seconds, command or ''), waiting for the supervisor thread.
        self._requests: list[tuple[str, str, float, str]] = []
        self._wake = threading.Condition()
        self._stop = threading.Event()
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._gate = GateWatch(
            store, self._wake, candidates=self._unstopped, terminate=self._terminate
        )
        # Every attribute the thread reads is set before it starts.
        self._thread = threading.Thread(target=self._loop, name="job-supervisor", daemon=True)
        self._thread.start()
        self._gate.listen()

    # -- public ------------------------------------------------------------------------------
    def start(self, session_id: str, job_id: str) -> str:
        """Take a starting job and run its process here. Returns ``running``,
        ``refused:<archived session>``, ``refused:<limit message>`` (this host already runs
        ``FLEET_MAX_JOBS_PER_HOST`` live jobs), or the job's state when it was not
        starting."""
        # Counted as ours before the claim is visible, so a stop that sees the claim also
        # sees the job here and waits for its fork instead of treating it as an orphan.
        fork: futures.Future[int] = futures.Future()
        with self._lock:
            self._pending[job_id] = fork
        try:
            claimed = self._claim(job_id)
            raw, command = job_fields(self.store, job_id, "seconds", "command")
            seconds = float(raw or 0)
        except BaseException:
            self._settle(job_id)
            raise
        if claimed != "ok":
            self._settle(job_id)
            log.info(
                "job %s not started: %s",
                job_id,
                claimed,
                extra={"session_id": session_id, "family": "job"},
            )
            return str(claimed)
        with self._wake:
            self._requests.append((session_id, job_id, seconds, command or ""))
            self._wake.notify()
        try:
            fork.result(timeout=10)
        except futures.TimeoutError:  # the supervisor thread is slow: it forks it later
            return "running"
        except OSError as exc:
            end_job(self.store, job_id, JobState.FAILED)
            log.warning(
                "job %s failed to start: %s",
                job_id,
                exc,
                extra={"session_id": session_id, "family": "job"},
            )
            return "failed"
        return "running"

    def _settle(self, job_id: str, pid: int | None = None, error: OSError | None = None) -> None:
        """The job is no longer pending: its fork gave ``pid`` or failed with ``error``, or
        (neither) its claim failed."""
        with self._lock:
            fork = self._pending.pop(job_id, None)
        if fork is None:
            return
        if error is not None:
            fork.set_exception(error)
        elif pid is not None:
            fork.set_result(pid)
        else:
            fork.cancel()

    def _claim(self, job_id: str) -> str:
        """Claim ``job_id`` for this worker under the per-host limit
        (``FLEET_MAX_JOBS_PER_HOST``); the reply of ``scripts.job_claim``."""
        maximum = limits.JOBS_PER_HOST.maximum(self.store.settings)
        return scripts.job_claim(
            self.store,
            job_id=job_id,
            host=self.host,
            lease_ms=self.lease_ms,
            now_iso=iso(self.store.now_ms()),
            instance=self.instance,
            max_per_host=maximum,
            limit_template=limits.JOBS_PER_HOST.template(maximum),
        )

    def stop(self, session_id: str, job_ids: list[str]) -> dict[str, str]:
        """Stop the named jobs of a session that run here (SIGTERM, then SIGKILL after the
        grace period). Jobs that ended already are reported with their state. Returns
        ``{jobId: outcome}``; never raises for one job's failure."""
        outcomes: dict[str, str] = {}
        victims: list[RunningJob] = []
        with self._lock:
            forks = [self._pending[jid] for jid in job_ids if jid in self._pending]
        # A stop racing the fork: let the process exist, then stop it.
        futures.wait(forks, timeout=10)
        with self._lock:
            for jid in job_ids:
                run = self._running.get(jid)
                if run is not None and run.session_id == session_id:
                    victims.append(run)
                else:
                    [state] = job_fields(self.store, jid, "state")
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
            return set(self._running) | set(self._pending)

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
        self._gate.unlisten()
        self._stop.set()
        with self._wake:
            self._wake.notify()
        self._thread.join(timeout=5)
        if self._watchdog is not None:
            self._watchdog.kill()
            self._watchdog.wait(5)

    # -- internals ---------------------------------------------------------------------------
    def _terminate(self, run: RunningJob) -> str:
        """Stop one process tree (SIGTERM, SIGKILL after the grace period) and record the job
        ``stopped`` once none of its processes is left. A second caller while a stop is under
        way (the ``job.stop`` task and the gate watch may meet here) waits for the tree to end
        instead of signalling it again."""
        proc = run.process
        extra = {"session_id": run.session_id, "family": "job"}
        with self._lock:
            first, run.stopping = not run.stopping, True
        if not first:
            run.tree.wait_gone(self.grace + 5)
            return "stopped"
        if run.tree.alive() and not run.tree.stop(self.grace):
            log.warning(
                "job %s ignored SIGTERM for %.1fs; killed", run.job_id, self.grace, extra=extra
            )
        run.tree.close()
        with self._lock:
            self._running.pop(run.job_id, None)
        end_job(self.store, run.job_id, JobState.STOPPED, str(proc.returncode))
        log.info("job %s stopped (pid %d)", run.job_id, proc.pid, extra=extra)
        return "stopped"

    def _spawn_pending(self) -> None:
        with self._wake:
            pending, self._requests = self._requests, []
        for session_id, job_id, seconds, command in pending:
            try:
                run = jobspawn.spawn(
                    session_id, job_id, seconds, command, default=self.command, grace=self.grace
                )
            except OSError as exc:
                self._settle(job_id, error=exc)
                continue
            with self._lock:
                self._running[job_id] = run
            if self._gate.closed_lately(session_id):  # claimed just before an archive heard
                self._gate.heard({session_id})
            pid = run.process.pid
            record_pid(self.store, job_id, pid, process_start(pid), run.tree.handle)
            log.info(
                "job %s running as pid %d for %gs",
                job_id,
                pid,
                seconds,
                extra={"session_id": session_id, "family": "job"},
            )
            self._settle(job_id, pid=pid)

    def _renew(self, run: RunningJob) -> None:
        """Renew the lease of a running job (``job_renew.lua``). When refused (the lease
        lapsed while this worker was frozen, the census may have recorded it ``lost``, or the
        job is no longer this instance's), the job must not run on: its process tree is
        killed, it is recorded ``lost`` if still ``running``, and no longer tracked. A lapsed
        lease of a tree its watchdog froze while Redis did not answer is the watchdog's to
        settle (``orchestrator/job/jobwatch.py``: resumed or killed) while the watchdog lives, up
        to ``freeze_max`` seconds."""
        renewed = scripts.job_renew(
            self.store, job_id=run.job_id, instance=self.instance, lease_ms=self.lease_ms
        )
        if renewed == "lapsed" and run.tree.frozen():
            now = time.monotonic()
            since = run.frozen_lapsed_at = run.frozen_lapsed_at or now
            watchdog = self._watchdog
            if watchdog is not None and watchdog.poll() is None and now - since < self.freeze_max:
                return
        with self._lock:
            if renewed == "ok" or run.stopping or self._running.pop(run.job_id, None) is None:
                return
        run.tree.close()
        reason = f"its lease was not renewable ({renewed}): killed by its worker on resuming"
        end_job(self.store, run.job_id, JobState.LOST, reason=reason)
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
            if code is not None and time.monotonic() >= run.deadline and run.tree.alive():
                run.tree.close()  # its command ended, what it left behind is out of time
            if code is None or run.tree.alive():  # live while any process of its tree is
                self._renew(run)
                continue
            with self._lock:
                if run.stopping or self._running.pop(run.job_id, None) is None:
                    continue  # being stopped right now; _terminate records it
            run.tree.close()  # its (empty) cgroup
            end_job(self.store, run.job_id, JobState.EXITED, str(code))
            log.info(
                "job %s exited with %d",
                run.job_id,
                code,
                extra={"session_id": run.session_id, "family": "job"},
            )

    def _unstopped(self, session_ids: set[str] | None) -> list[RunningJob]:
        """The jobs running here, of ``session_ids`` (``None``: all), no stop is under way for."""
        with self._lock:
            return [
                r
                for r in self._running.values()
                if not r.stopping and (session_ids is None or r.session_id in session_ids)
            ]

    def _loop(self) -> None:
        interval = max(0.05, min(0.5, self.lease_ms / 1000 / 4))
        last_reap = 0.0
        try:
            self._watchdog = jobwatch.start(
                self.store, self.host, self.instance, self.lease_ms, self.freeze_max
            )
        except OSError as exc:
            log.error("job watchdog not started: %s", exc)
        while not self._stop.is_set():
            try:  # nothing may end this thread: every job of this worker is forked here
                with self._wake:
                    if not self._requests and self._gate.quiet():
                        self._wake.wait(interval)
                self._spawn_pending()
                self._gate.check(self._stop)
                if time.monotonic() - last_reap >= interval:
                    self._reap()
                    last_reap = time.monotonic()
            except Exception as exc:  # a Redis blip must not kill the supervisor
                log.warning("job supervisor: %s", exc)
                self._stop.wait(interval)
