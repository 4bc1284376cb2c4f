"""Stops on gate closures: a job host stops a job whose session an archive took without
waiting for a stop request.

It listens for the gate's closures (``gate.listen``: the archive scripts announce the sessions
they archived) and, for the sessions of jobs it runs, asks the gate (``gate.verdicts``); a job
whose session the gate now refuses is stopped at once. The ``job.stop`` request that follows
finds it stopped. When the subscription is made, or made again after a Redis failure, it asks
the gate about every job it runs, so a closure announced while nobody listened is not missed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from orchestrator.census import activity
from orchestrator.errors import FleetError
from orchestrator.job.jobspawn import RunningJob
from orchestrator.session import gate
from orchestrator.storage.store import Store

log = logging.getLogger(__name__)

#: How long a closure is remembered (s): a job forked after its session's closure was heard
#: (claimed just before the archive) is checked against it.
_RECENT_CLOSURE_SECONDS = 60.0


class GateWatch:
    """The gate closures one supervisor has heard, and the stops they call for.

    Closures are heard on the gate feed's thread and handed to the supervisor's thread through
    ``wake`` (the condition that thread waits on); ``check``, on that thread, asks the gate
    about the jobs ``candidates(session ids or None for all)`` returns and stops, each in a
    thread of its own with ``terminate``, those whose session it refuses."""

    def __init__(
        self,
        store: Store,
        wake: threading.Condition,
        *,
        candidates: Callable[[set[str] | None], list[RunningJob]],
        terminate: Callable[[RunningJob], str],
    ) -> None:
        self.store = store
        self._wake = wake
        self._candidates = candidates
        self._terminate = terminate
        #: Closures heard and not yet looked at: session ids, or ``None`` for all jobs.
        self._closures: set[str] | None = set()
        #: Sessions whose closure was heard lately (id -> monotonic time heard).
        self._recently_closed: dict[str, float] = {}
        self._lock = threading.Lock()
        self._listener: gate.Listener = self._on_closed  # one object: unlisten finds it

    def listen(self) -> None:
        """Subscribe to the gate's closures."""
        gate.listen(self.store, self._listener)

    def unlisten(self) -> None:
        """End the subscription."""
        gate.unlisten(self.store, self._listener)

    def quiet(self) -> bool:
        """No closure waits to be looked at. Called holding ``wake``."""
        return self._closures == set()

    def closed_lately(self, session_id: str) -> bool:
        """Whether the session's closure was heard within the last minute."""
        with self._lock:
            return session_id in self._recently_closed

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
        self.heard(None if closed is None else set(closed))

    def heard(self, closed: set[str] | None) -> None:
        """Have the supervisor's thread look at the jobs of ``closed`` (``None``: all)."""
        with self._wake:
            if closed is None or self._closures is None:
                self._closures = None
            else:
                self._closures |= closed
            self._wake.notify()

    def check(self, pause: threading.Event) -> None:
        """On the supervisor's thread: the closures heard since the last look. When the gate
        cannot be asked, all jobs are looked at again after waiting up to 0.5 s on ``pause``."""
        with self._wake:
            closures, self._closures = self._closures, set()
        if closures is None or closures:
            try:
                self._stop_refused(closures)
            except FleetError as exc:  # looked at again, all of them, in a moment
                log.warning("gate closure not acted on yet: %s", exc)
                self.heard(None)
                pause.wait(0.5)

    def _stop_refused(self, session_ids: set[str] | None) -> None:
        """Stop, each in a thread of its own, the jobs running here (of ``session_ids``, or
        all) whose session the gate refuses now. One round trip; none when no job here
        belongs to those sessions."""
        runs = self._candidates(session_ids)
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

    def _stop_gated(self, run: RunningJob, reason: str) -> None:
        extra = {"session_id": run.session_id, "family": "job"}
        log.info("job %s: its session is %s; stopping it", run.job_id, reason, extra=extra)
        try:
            self._terminate(run)
        except Exception as exc:  # the job.stop request and the reconciler still follow
            log.warning("job %s stop failed: %s", run.job_id, exc, extra=extra)
            return
        activity.note_quiet(self.store, run.session_id)
