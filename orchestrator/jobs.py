"""Jobs: background processes a session owns on one host.

A job is stored when a turn asks for it (state ``starting``, with a start lease), taken by one
job worker (``job_claim.lua``: refused if the lineage is archived by then), and supervised there
by ``JobSupervisor``: the process runs contained (``orchestrator/containment.py``: a cgroup of
its own, or a PID namespace, which no descendant can leave), its leader dies with the worker
(Linux ``PR_SET_PDEATHSIG``) and the rest of its tree with it, and its lease is refreshed
while it runs (``job_renew.lua``: only while the job is still running and claimed by this
worker). Liveness is the lease: a job whose worker
died stops counting once the lease lapses (``activity`` marks it ``lost``). A lost job is dead:
a killed worker's jobs die with it; a frozen worker's are killed by its watchdog
(``orchestrator/jobwatch.py``) before their leases lapse; a worker that resumes and finds a
job's renewal refused kills its process group and stops tracking it. When Redis itself stalls,
the watchdog freezes the jobs instead and resumes or kills them when it answers again (a
frozen tree's lapsed lease is the watchdog's to settle, while it lives).

A job host does not wait for a stop request to stop a job whose session an archive took: it
listens for the gate's closures (``gate.listen``: the archive scripts announce the sessions
they archived) and, for the sessions of jobs it runs, asks the gate (``gate.verdicts``); a job
whose session the gate now refuses is stopped at once. The ``job.stop`` request that follows
finds it stopped. When the subscription is made, or made again after a Redis failure, it asks
the gate about every job it runs, so a closure announced while nobody listened is not missed.

A job runs while any process of its tree does: a command that ends leaving a background
process behind (``setsid CMD &``) keeps its job ``running`` (its lease renewed) until that
process ends too, or until the job's ``seconds`` are over, when the rest of the tree is killed.

Stopping is cooperative first: SIGTERM to every process of the tree, SIGKILL to the whole tree
after the grace period; the job is recorded ``stopped`` once no process of it is left.
A stop signals only a process that is verifiably the job's (``orchestrator/ownership.py``):
one this supervisor forked, or an orphan of an earlier worker of this host whose pid still
names a process that started when the job's did; any other pid is left alone and the job is
recorded ``lost``.
"""

from __future__ import annotations

import logging
import subprocess
import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass

from orchestrator import activity, containment, gate, jobwatch, limits
from orchestrator.errors import FleetError, TurnStopped
from orchestrator.families import Dispatcher, Family, Task, work_queue
from orchestrator.fencing import StepGuard
from orchestrator.ownership import new_instance, process_start
from orchestrator.processes import KILL_GRACE_SECONDS, die_with_parent, under_timeout
from orchestrator.states import JobState as JobState
from orchestrator.store import Store, iso, new_id, retried

log = logging.getLogger(__name__)

#: A starting job not taken by any worker within this time stops counting as live (ms).
START_TIMEOUT_MS = 30_000
#: How long a closure is remembered (s): a job forked after its session's closure was heard
#: (claimed just before the archive) is checked against it.
_RECENT_CLOSURE_SECONDS = 60.0


# The job records' plain reads and idempotent writes (same value, same TTL) go through the
# store's translation and bounded retry, so a Redis failure is StoreUnavailable, never a raw
# redis-py error; a task that meets it is retried (workers/retry.py).
@retried
def job_fields(store: Store, job_id: str, *fields: str) -> list[str | None]:
    found: list[str | None] = store.redis.hmget(store.keys.job(job_id), *fields)
    return found


@retried
def _record_pid(store: Store, job_id: str, pid: int, started: float | None, tree: str) -> None:
    fields = {"pid": pid, "pidStart": "" if started is None else repr(started), "tree": tree}
    store.redis.hset(store.keys.job(job_id), mapping=fields)


def end_job(
    store: Store,
    job_id: str,
    state: JobState,
    exit_code: str = "",
    *,
    was: JobState = JobState.RUNNING,
    reason: str = "",
) -> str:
    """Record a job ended in ``state`` if it is still ``was`` (``job_end.lua``, at Redis's
    time). Returns ``ok``, or the job's state when it was not ``was``."""
    args = [job_id, state.value, exit_code, iso(store.now_ms()), was.value, reason]
    return str(store.run("job_end", args))


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
    maximum = limits.JOBS_PER_SESSION.maximum(store.settings)
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
    tree: containment.Tree
    #: Monotonic seconds after which what is left of the tree is killed (its time limit).
    deadline: float = float("inf")
    #: Set (under the supervisor's lock) before a stop signals the process, so the reaper,
    #: which may see it end first, leaves recording its end to the stop (``stopped``).
    stopping: bool = False
    #: Monotonic seconds a renewal first found its lease lapsed and its tree frozen by the
    #: watchdog (``None``: not so).
    frozen_lapsed_at: float | None = None

    @property
    def process(self) -> subprocess.Popen[bytes]:
        """The tree's leader."""
        return self.tree.process


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
        self._running: dict[str, _Running] = {}
        #: Claimed here, process not forked yet: each job's fork, resolved with its pid (or
        #: the fork's error) by the supervisor thread, cancelled when the claim failed.
        self._pending: dict[str, futures.Future[int]] = {}
        self._lock = threading.Lock()
        #: (session id, job id, seconds, command or ''), waiting for the supervisor thread.
        self._requests: list[tuple[str, str, float, str]] = []
        self._wake = threading.Condition()
        self._stop = threading.Event()
        self._watchdog: subprocess.Popen[bytes] | None = None
        #: Gate closures heard and not yet looked at: session ids, or ``None`` for all jobs.
        self._closures: set[str] | None = set()
        #: Sessions whose closure was heard lately (id -> monotonic time heard).
        self._recently_closed: dict[str, float] = {}
        self._listener: gate.Listener = self._on_closed  # one object: unlisten finds it
        # Every attribute the thread reads is set before it starts.
        self._thread = threading.Thread(target=self._loop, name="job-supervisor", daemon=True)
        self._thread.start()
        gate.listen(store, self._listener)

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
            claimed = self.store.run("job_claim", [job_id, self.host, *self._claim_args()])
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

    def _claim_args(self) -> list[object]:
        """``job_claim.lua``'s lease, time, this worker's instance and the per-host limit
        (``FLEET_MAX_JOBS_PER_HOST``)."""
        maximum = limits.JOBS_PER_HOST.maximum(self.store.settings)
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
        gate.unlisten(self.store, self._listener)
        self._stop.set()
        with self._wake:
            self._wake.notify()
        self._thread.join(timeout=5)
        if self._watchdog is not None:
            self._watchdog.kill()
            self._watchdog.wait(5)

    # -- internals ---------------------------------------------------------------------------
    def _terminate(self, run: _Running) -> str:
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
            # A stored command runs under coreutils' timeout, which stops it after seconds and
            # takes its whole process tree down with this worker (under_timeout).
            if command:
                argv, preexec = under_timeout(["/bin/sh", "-c", command], seconds)
            else:
                argv, preexec = self.command(seconds), die_with_parent()
            try:
                tree = containment.start(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    preexec_fn=preexec,
                )
            except OSError as exc:
                self._settle(job_id, error=exc)
                continue
            proc = tree.process
            limit = seconds + self.grace + KILL_GRACE_SECONDS if seconds > 0 else float("inf")
            with self._lock:
                self._running[job_id] = _Running(
                    job_id, session_id, tree, deadline=time.monotonic() + limit
                )
                closed_lately = session_id in self._recently_closed
            if closed_lately:  # claimed just before an archive heard already: ask the gate
                self._heard({session_id})
            _record_pid(self.store, job_id, proc.pid, process_start(proc.pid), tree.handle)
            log.info(
                "job %s running as pid %d for %gs",
                job_id,
                proc.pid,
                seconds,
                extra={"session_id": session_id, "family": "job"},
            )
            self._settle(job_id, pid=proc.pid)

    def _renew(self, run: _Running) -> None:
        """Renew the lease of a running job (``job_renew.lua``). When refused (the lease
        lapsed while this worker was frozen, the census may have recorded it ``lost``, or the
        job is no longer this instance's), the job must not run on: its process tree is
        killed, it is recorded ``lost`` if still ``running``, and no longer tracked. A lapsed
        lease of a tree its watchdog froze while Redis did not answer is the watchdog's to
        settle (``orchestrator/jobwatch.py``: resumed or killed) while the watchdog lives, up
        to ``freeze_max`` seconds."""
        renewed = self.store.run("job_renew", [run.job_id, self.instance, self.lease_ms])
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

    def _on_closed(self, closed: frozenset[str] | None) -> None:
        """A gate closure heard (on the gate feed's thread): handed to the supervisor's
        thread, which asks the gate about the jobs here of those sessions."""
        now = time.monotonic()
        with self._lock:
            if closed is not None:
                for sid in closed:
                    self._recently_closed[sid] = now
            for sid, heard in list(self._recently_closed.items()):
                if now - heard > _RECENT_CLOSURE_SECONDS:
                    del self._recently_closed[sid]
        self._heard(None if closed is None else set(closed))

    def _heard(self, closed: set[str] | None) -> None:
        with self._wake:
            if closed is None or self._closures is None:
                self._closures = None
            else:
                self._closures |= closed
            self._wake.notify()

    def _check_closures(self) -> None:
        """On the supervisor's thread: the closures heard since the last look."""
        with self._wake:
            closures, self._closures = self._closures, set()
        if closures is None or closures:
            try:
                self._stop_refused(closures)
            except FleetError as exc:  # looked at again, all of them, in a moment
                log.warning("gate closure not acted on yet: %s", exc)
                self._heard(None)
                self._stop.wait(0.5)

    def _stop_refused(self, session_ids: set[str] | None) -> None:
        """Stop, each in a thread of its own, the jobs running here (of ``session_ids``, or
        all) whose session the gate refuses now. One round trip; none when no job here
        belongs to those sessions."""
        with self._lock:
            runs = [
                r
                for r in self._running.values()
                if not r.stopping and (session_ids is None or r.session_id in session_ids)
            ]
        if not runs:
            return
        verdict = gate.verdicts(self.store, [r.session_id for r in runs])
        for run in runs:
            reason = verdict.get(run.session_id, "ok")
            if reason != "ok":
                threading.Thread(
                    target=self._stop_gated,
                    args=(run, reason),
                    name=f"job-stop-{run.job_id}",
                    daemon=True,
                ).start()

    def _stop_gated(self, run: _Running, reason: str) -> None:
        extra = {"session_id": run.session_id, "family": "job"}
        log.info("job %s: its session is %s; stopping it", run.job_id, reason, extra=extra)
        try:
            self._terminate(run)
        except Exception as exc:  # the job.stop request and the reconciler still follow
            log.warning("job %s stop failed: %s", run.job_id, exc, extra=extra)
            return
        activity.note_quiet(self.store, run.session_id)

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
                    if not self._requests and self._closures == set():
                        self._wake.wait(interval)
                self._spawn_pending()
                self._check_closures()
                if time.monotonic() - last_reap >= interval:
                    self._reap()
                    last_reap = time.monotonic()
            except Exception as exc:  # a Redis blip must not kill the supervisor
                log.warning("job supervisor: %s", exc)
                self._stop.wait(interval)
