"""Per-process runtime for tasks: the store, the dispatcher, the model and, in job workers,
the job supervisor. Built once per worker process, on first use."""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field

from orchestrator.jobs import JobSupervisor
from orchestrator.model import Model, ScriptedModel
from orchestrator.settings import get_settings
from orchestrator.store import Store
from workers.app import app
from workers.dispatch import CeleryDispatcher

log = logging.getLogger(__name__)


@dataclass
class Runtime:
    """What tasks need: ``store``, ``dispatcher``, ``model``, ``host`` and (job workers only)
    ``supervisor``."""

    store: Store
    dispatcher: CeleryDispatcher
    model: Model
    host: str
    supervisor: JobSupervisor | None = None
    #: Set when the worker begins to shut down (``workers.heartbeat``): in-flight steps hand
    #: their turn back, the reminder poller and the heartbeat stop.
    stopping: threading.Event = field(default_factory=threading.Event)


_runtime: Runtime | None = None
_lock = threading.Lock()


def get_runtime() -> Runtime:
    """The process's runtime, created on first call."""
    global _runtime
    with _lock:
        if _runtime is None:
            settings = get_settings()
            url = app.conf.broker_url
            _runtime = Runtime(
                store=Store(url, settings.key_prefix),
                dispatcher=CeleryDispatcher(app),
                model=ScriptedModel(),
                host=os.environ.get("FLEET_HOSTNAME") or settings.hostname,
            )
        return _runtime


def current_runtime() -> Runtime | None:
    """The process's runtime if it was created, read without the lock (safe in a signal
    handler that may have interrupted ``get_runtime``)."""
    return _runtime


def supervisor() -> JobSupervisor:
    """The job supervisor of this process (job workers), created on first call."""
    rt = get_runtime()
    with _lock:
        if rt.supervisor is None:
            settings = get_settings()
            rt.supervisor = JobSupervisor(
                rt.store,
                rt.host,
                lease_ms=int(settings.job_lease_seconds * 1000),
                grace_seconds=settings.job_kill_grace_seconds,
            )
        return rt.supervisor
