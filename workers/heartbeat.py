"""Worker heartbeats in Redis: a family worker keeps a key with a short TTL alive while its
consumer consumes, so the local runners (``LocalFleet.wait_ready``) and ``/ready`` can tell
which families have a worker that will take their messages.

Readiness means consuming, not alive. The heartbeat is a bootstep of Celery's *consumer*,
beating on the consumer's own timer:

* the consumer (re)connects to the broker: ``start`` beats and schedules the next beats;
* the connection is lost: the consumer restarts its steps, ``stop`` cancels the beats and
  deletes the key (best effort: with Redis away it lapses within ``HEARTBEAT_TTL``), and the
  timer does not run while the consumer reconnects;
* warm shutdown (``worker_shutting_down``, the moment SIGTERM arrives, while in-flight tasks
  may still run for minutes): ``Runtime.stopping`` is set, which ends the beats, tells the
  step runner to hand in-flight steps back and stops the reminder poller, and the key is
  deleted at once.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any

from celery import bootsteps
from celery.signals import worker_shutting_down

from orchestrator import families
from workers.runtime import current_runtime, get_runtime, role

log = logging.getLogger(__name__)

#: Seconds a heartbeat lives; refreshed every third of it.
HEARTBEAT_TTL = 10


def _delete(key: str) -> None:
    with contextlib.suppress(Exception):  # Redis away: the key lapses within the TTL
        get_runtime().store.redis.delete(key)


def _delete_all(keys: list[str]) -> None:
    for key in keys:
        _delete(key)


class Heartbeat(bootsteps.StartStopStep):  # type: ignore[misc]  # Celery is untyped
    """Keeps ``Keys.worker_heartbeat(family, node)`` alive while the consumer consumes
    (family workers only: ``runtime.role().family``; ``<family>.ctl`` for a control-only
    worker, which ``/ready`` does not count; ``workers.app.create_app`` adds it to every
    consumer)."""

    # After the remote-control step too: its queue is bound when it starts, so a worker counts
    # as ready only once everything it consumes is bound (a bind refused by a full Redis then
    # happens before readiness, not after it).
    requires = ("celery.worker.consumer.tasks:Tasks", "celery.worker.consumer.control:Control")

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self.key: str | None = None
        self.tref: Any = None

    def start(self, c: Any) -> None:
        rt = get_runtime()
        served = role()
        if not served.family:
            return
        # A control-only worker beats as ``<family>.ctl``: it takes no work of the family.
        name = families.get(served.family).worker_name(control_only=served.control_only)
        self.key = rt.store.keys.worker_heartbeat(name, c.hostname)
        _steps.add(self)
        self.beat()
        self.tref = c.timer.call_repeatedly(HEARTBEAT_TTL / 3, self.beat)

    def beat(self) -> None:
        """Refresh the key, unless the worker is shutting down."""
        rt = get_runtime()
        key = self.key
        if key is None or rt.stopping.is_set():
            return
        try:
            rt.store.redis.set(key, rt.host, ex=HEARTBEAT_TTL)
        except Exception as exc:  # Redis away: the consumer notices it too and restarts
            log.debug("heartbeat failed: %s", exc)
        if rt.stopping.is_set():  # shutdown began while we wrote: take it back
            _delete(key)

    def stop(self, c: Any) -> None:
        if self.tref is not None:
            self.tref.cancel()
            self.tref = None
        if self.key is not None:
            _delete(self.key)
        _steps.discard(self)

    shutdown = stop


#: Heartbeat steps running in this process (one per consumer).
_steps: set[Heartbeat] = set()


@worker_shutting_down.connect
def _shutting_down(**_: Any) -> None:
    # Runs inside the signal handler on the main thread, which may be holding a connection
    # of the store's pool: the key is deleted from another thread.
    rt = current_runtime()
    if rt is not None:
        rt.stopping.set()
    keys = [step.key for step in list(_steps) if step.key]
    if keys:
        threading.Thread(
            target=_delete_all, args=(keys,), name="heartbeat-clear", daemon=True
        ).start()
