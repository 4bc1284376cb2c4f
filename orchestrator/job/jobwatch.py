"""The job watchdog: a job that counts as lost is already dead, whatever befell its worker.

A job counts as live while its lease (``Keys.job_lease``) exists; the worker's supervisor
renews it every quarter lease, and the census marks a job ``lost`` once it lapses. A frozen
worker (SIGSTOP, a debugger, a stalled VM thread) stops renewing, but its job processes run
on: freezing a process does not freeze its children. So every job worker runs this watchdog
as a child process of its own (``JobSupervisor`` starts it; it dies with the worker by
``PR_SET_PDEATHSIG``, like the jobs), which the worker's freeze does not reach:

* every ``1/8`` lease it reads the jobs this worker instance runs (``Keys.host_jobs``, each
  job's ``state``/``instance``/``pid``/``pidStart`` and its lease's remaining TTL) and keeps,
  per job, the local (monotonic) time its lease lapses as last read;
* a job whose lease has less than a third of a lease left (the supervisor, renewing every
  quarter, keeps at least three quarters), or whose record is no longer ``running`` while its
  process still lives, has its process tree killed (SIGKILL to its leader's group, only after
  its pid is verified by its start time, and ``cgroup.kill`` of its recorded cgroup,
  ``containment.kill_tree_if_ours``) *before* the lease lapses, then is recorded
  ``lost`` with a ``reason`` (``job_end.lua``, one script; a no-op if it ended otherwise).

Consequence: when the census sees a lapsed lease, the job's process is already gone (or
frozen, below). A frozen worker's jobs are killed by this watchdog; a killed worker's jobs die
by PDEATHSIG (and the watchdog with them).

When Redis itself does not answer (a stalled server: SIGSTOP, a slow ``fsync`` under
``appendfsync always``), every worker's renewals fail at once, and killing by the lapse time
last read would lose every job of the fleet. So a job that reaches the margin while this
watchdog cannot read the store is *frozen* instead (``containment.freeze_recorded``:
``cgroup.freeze`` of its cgroup, else SIGSTOP of its tree): it does no work, so the census
not counting it once its lease lapses hides no running work. The watchdog keeps polling; at
its first read that answers, it asks ``job_renew.lua`` to resume the job (with its pid and
start time): the script takes the lease again, even a lapsed one, only while the job is still
``running``, this instance's, that process, and its lineage neither archived nor deleted;
then the tree is thawed. Refused (an archive committed during the stall, the census recorded
it ``lost``), the tree is killed frozen (SIGKILL and ``cgroup.kill`` end frozen tasks) and the
job recorded ``lost``: nothing of an archived session runs after its archive. A job frozen
longer than ``FLEET_JOB_FREEZE_MAX_SECONDS`` is killed and recorded ``lost`` like one past
the margin (``0``: never frozen).

Honest limits: a whole host frozen (a VM paused) freezes its jobs and this watchdog too; on
thaw the census may already count the job ``lost``, and the watchdog (or the resuming
supervisor, whose renewal is refused, ``job_renew.lua``) kills it within one poll, before it
runs on for more than that. A worker
frozen between forking a job and recording its pid leaves a process nobody can name; that
window is one Redis write long.

Run as ``python -m orchestrator.job.jobwatch HOST INSTANCE [LEASE_MS [FREEZE_MAX_SECONDS]]``;
the store is the settings' (``FLEET_REDIS_URL``, ``FLEET_KEY_PREFIX``: the URL never goes on
a command line), the lease defaults to ``FLEET_JOB_LEASE_SECONDS``, the freeze bound to
``FLEET_JOB_FREEZE_MAX_SECONDS``. Imports no Celery.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from dataclasses import dataclass, field

from orchestrator.errors import StoreUnavailable
from orchestrator.job import scripts
from orchestrator.process import containment, watchdogs
from orchestrator.process.containment import kill_tree_if_ours
from orchestrator.states import JobState
from orchestrator.storage.store import Store, iso, translated

#: Named, not ``__name__``: run with ``-m`` this module is ``__main__``.
log = logging.getLogger("orchestrator.job.jobwatch")

#: The ``reason`` recorded on a job the watchdog killed.
REASON = "its worker stopped renewing the lease (frozen?): killed before the lease lapsed"
#: The ``reason`` of a job killed because it stayed frozen too long while Redis did not answer.
FROZEN_TOO_LONG = (
    "Redis did not answer for {frozen:.1f} s (FLEET_JOB_FREEZE_MAX_SECONDS): killed frozen"
)
#: The ``reason`` of a job killed frozen because its resumption was refused.
REFUSED_REASON = "frozen while Redis did not answer, not resumable ({reply}): killed frozen"
#: ``job_renew.lua``'s replies by which a job may run on.
_RUNS = ("ok", "revived")
#: The ``reason`` (and log line) of one killed only after its lease lapsed: the watchdog was
#: held up as well (frozen with its worker, a whole host paused), so the census may already
#: count the job lost.
LATE_REASON = (
    "its worker stopped renewing the lease (frozen?): killed {late:.1f} s after the lease"
    " lapsed, this watchdog having been held up too"
)


@dataclass
class _Watched:
    pid: int
    started: str
    #: Its tree's recorded cgroup (``containment.Tree.handle``; ``""``: none).
    tree: str
    #: Monotonic seconds at which the lease lapses, as last read (``-inf``: kill now).
    lapses: float
    #: The last lapse time read while the lease still ran (``lapses`` may be ``-inf`` since).
    renewed_until: float = float("-inf")
    #: Monotonic seconds it was frozen at while Redis did not answer (``None``: not frozen).
    frozen_at: float | None = None
    #: The pids frozen by SIGSTOP (``containment.freeze_recorded``; none in a cgroup).
    stopped: list[int] = field(default_factory=list)


#: Per job id: state, instance, pid, pidStart, tree and the lease's remaining TTL in ms
#: (< 0: none).
Row = tuple[str | None, str | None, str | None, str | None, str | None, int]


def _read(store: Store, host: str, known: list[str]) -> dict[str, Row]:
    """The records of the host's claimed jobs and of ``known`` ones: two round trips, never
    retried (the next pass reads again). Raises ``StoreUnavailable``."""
    with translated():
        jids = sorted(set(store.redis.smembers(store.keys.host_jobs(host))) | set(known))
        pipe = store.redis.pipeline(transaction=False)
        for jid in jids:
            pipe.hmget(store.keys.job(jid), "state", "instance", "pid", "pidStart", "tree")
            pipe.pttl(store.keys.job_lease(jid))
        found = pipe.execute() if jids else []
    return {jid: (*found[2 * i], int(found[2 * i + 1])) for i, jid in enumerate(jids)}


class Watchdog:
    """Watches the jobs of worker instance ``instance`` on ``host`` (see the module
    docstring). ``lease_ms`` is the jobs' lease; ``freeze_max`` the seconds a job may stay
    frozen while Redis does not answer (default ``FLEET_JOB_FREEZE_MAX_SECONDS``; ``0``: never
    frozen); ``poll`` does one pass."""

    def __init__(
        self,
        store: Store,
        host: str,
        instance: str,
        lease_ms: int,
        freeze_max: float | None = None,
    ) -> None:
        self.store = store
        self.host = host
        self.instance = instance
        self.lease_ms = lease_ms
        self.freeze_max = (
            store.settings.job_freeze_max_seconds if freeze_max is None else freeze_max
        )
        self.margin = watchdogs.kill_margin(lease_ms)
        self.interval = watchdogs.poll_interval(lease_ms)
        self._watched: dict[str, _Watched] = {}
        #: Whether the last pass could not read the store.
        self._stalled = False

    def poll(self) -> list[str]:
        """One pass: learn lapse times, freeze or kill what must stop, resume what may run
        again. Returns the killed job ids."""
        asked = time.monotonic()  # the TTLs read count from then at the latest
        try:
            rows = _read(self.store, self.host, list(self._watched))
        except StoreUnavailable as exc:  # the TTL runs on in the server: judge by last read
            log.warning("job watchdog cannot read the store: %s", exc)
            answers = False
        else:
            self._learn(rows, asked)
            answers = True
        # Redis answers again after a stall: a lease its worker could not renew meanwhile is
        # renewed here (with the same checks as a resumption) rather than its job killed.
        stalled, self._stalled = self._stalled, not answers
        # Every kill first, by the time after the read; then their records, which may wait
        # on a store that does not answer.
        now = time.monotonic()
        killed: list[tuple[str, str, int]] = []
        for jid, job in list(self._watched.items()):
            if job.frozen_at is not None:
                reason = self._thaw_or_condemn(jid, job, now - job.frozen_at, answers)
                if reason is not None:
                    del self._watched[jid]
                    if containment.kill_frozen(job.pid, job.started, job.tree, job.stopped):
                        killed.append((jid, reason, job.pid))
            elif job.lapses - now < self.margin and not answers and self.freeze_max > 0:
                job.stopped = containment.freeze_recorded(job.pid, job.started, job.tree)
                job.frozen_at = now
                log.warning(
                    "job %s frozen: Redis does not answer and its lease has %.1f s left (pid %d)",
                    jid,
                    max(0.0, job.lapses - now),
                    job.pid,
                )
            elif job.lapses - now < self.margin and not (
                answers and stalled and job.lapses > now and self._renew(jid, job) in _RUNS
            ):
                del self._watched[jid]
                if kill_tree_if_ours(job.pid, job.started, job.tree):
                    late = time.monotonic() - job.renewed_until
                    late_ok = 0 < late < float("inf")
                    killed.append(
                        (jid, LATE_REASON.format(late=late) if late_ok else REASON, job.pid)
                    )
        for jid, reason, pid in killed:
            self._record(jid, reason, pid)
        return [jid for jid, _, _ in killed]

    def _renew(self, jid: str, job: _Watched) -> str | None:
        """Renew or take again the lease of job ``jid`` (``job_renew.lua`` with its pid and
        start time: refused once the job may no longer run). Returns the script's reply
        (``ok``/``revived``: ``job.lapses`` moved on), ``None`` when the store failed."""
        try:
            reply = scripts.job_renew(
                self.store,
                job_id=jid,
                instance=self.instance,
                lease_ms=self.lease_ms,
                pid=job.pid,
                pid_start=job.started,
            )
        except StoreUnavailable as exc:
            log.warning("job %s lease not renewed: %s", jid, exc)
            return None
        if reply in _RUNS:
            job.lapses = job.renewed_until = time.monotonic() + self.lease_ms / 1000
        return reply

    def _thaw_or_condemn(self, jid: str, job: _Watched, frozen: float, answers: bool) -> str | None:
        """For job ``jid``, frozen ``frozen`` seconds: the reason to kill it (frozen too long,
        or its resumption refused), else ``None`` (thawed, or still waiting for Redis)."""
        if frozen >= self.freeze_max:
            return FROZEN_TOO_LONG.format(frozen=frozen)
        refused = self._resume(jid, job) if answers else None
        return None if refused is None else REFUSED_REASON.format(reply=refused)

    def _resume(self, jid: str, job: _Watched) -> str | None:
        """Resume frozen job ``jid`` now that Redis answers: take its lease again
        (``_renew``) and thaw its tree. Returns ``None`` when resumed or when the store failed
        again (still frozen), else the script's refusal (the tree must be killed)."""
        reply = self._renew(jid, job)
        if reply is None:
            return None
        if reply not in _RUNS:
            return reply
        assert job.frozen_at is not None
        frozen = time.monotonic() - job.frozen_at
        containment.thaw_recorded(job.tree, job.stopped)
        job.frozen_at, job.stopped = None, []
        log.warning(
            "job %s thawed after %.1f s frozen: Redis answers and its lease is %s (pid %d)",
            jid,
            frozen,
            "taken again" if reply == "revived" else "held",
            job.pid,
        )
        return None

    def _learn(self, rows: dict[str, Row], now: float) -> None:
        for jid, (state, instance, pid, started, tree, ttl_ms) in rows.items():
            ours = state == "running" and instance == self.instance
            if ours and pid:
                lapses = now + ttl_ms / 1000 if ttl_ms > 0 else float("-inf")
                known = self._watched.get(jid)
                until = lapses if ttl_ms > 0 else known.renewed_until if known else lapses
                if known is not None and known.frozen_at is not None:
                    known.lapses, known.renewed_until = lapses, until  # resumed by the pass
                    continue
                self._watched[jid] = _Watched(int(pid), started or "", tree or "", lapses, until)
            elif jid in self._watched and not ours:
                # Ended (its process is gone, so nothing is signalled) or counted lost by the
                # census (a whole host frozen and thawed): its process must not run on.
                self._watched[jid].lapses = float("-inf")

    def _record(self, jid: str, reason: str, pid: int) -> None:
        """Record killed job ``jid`` lost with ``reason`` (a no-op if it ended otherwise)."""
        try:
            ms = self.store.now_ms()
            scripts.job_end(
                self.store,
                job_id=jid,
                state=JobState.LOST,
                exit_code="",
                now_iso=iso(ms),
                allowed_from=(JobState.RUNNING,),
                reason=reason,
            )
        except StoreUnavailable as exc:  # the lease lapses anyway; the census records it
            log.warning("job %s killed, not recorded: %s", jid, exc)
        log.warning("job %s: %s (pid %d)", jid, reason, pid)

    def run_forever(self) -> None:
        """Poll every ``interval`` seconds until killed (with the worker, by PDEATHSIG)."""
        while True:
            try:
                self.poll()
            except Exception as exc:  # contained: a bad record must not end the watch
                log.warning("job watchdog: %s", exc)
            time.sleep(self.interval)


def start(
    store: Store, host: str, instance: str, lease_ms: int, freeze_max: float
) -> subprocess.Popen[bytes]:
    """Start the watchdog of worker ``instance``'s jobs (their lease ``lease_ms``, frozen at
    most ``freeze_max`` seconds while Redis does not answer) as a child process of the
    caller's thread (``watchdogs.spawn``). Raises ``OSError``."""
    args = [host, instance, str(lease_ms), repr(freeze_max)]
    return watchdogs.spawn(store, "orchestrator.job.jobwatch", *args, stdin=subprocess.DEVNULL)


def main(argv: list[str]) -> None:
    """``HOST INSTANCE [LEASE_MS [FREEZE_MAX_SECONDS]]``: watch that worker instance's jobs
    until killed."""
    store = watchdogs.own_store("jobwatch", "job")
    host, instance = argv[:2]
    default = int(store.settings.job_lease_seconds * 1000)
    lease_ms = int(argv[2]) if len(argv) > 2 else default
    freeze_max = float(argv[3]) if len(argv) > 3 else None
    Watchdog(store, host, instance, lease_ms, freeze_max).run_forever()


if __name__ == "__main__":  # pragma: no cover - the supervisor's child process
    main(sys.argv[1:])
