"""Per-process runtime for tasks: the store, the dispatcher, the model and, in job workers,
the job supervisor. Built once per worker process, on first use."""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field

from tenacity import Retrying, before_sleep_log, retry_if_exception_type, wait_exponential

from orchestrator.errors import StoreUnavailable
from orchestrator.jobs import JobSupervisor
from orchestrator.model import Model, ScriptedModel
from orchestrator.openai_model import OpenAIModel
from orchestrator.ownership import HostLease
from orchestrator.settings import FleetSettings, get_settings
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
    #: Job workers: this process's lease on ``host`` (its instance id goes on every job it
    #: claims), taken at start-up by ``hold_job_host``.
    host_lease: HostLease | None = None
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
                model=build_model(settings),
                host=os.environ.get("FLEET_HOSTNAME") or settings.hostname,
            )
        return _runtime


def build_model(settings: FleetSettings) -> Model:
    """The model backend ``FLEET_MODEL`` names: ``scripted`` or ``openai`` (configured by
    ``FLEET_OPENAI_*``)."""
    if settings.model == "openai":
        return OpenAIModel(
            base_url=settings.openai_base_url,
            api_key=settings.openai_api_key,
            model=settings.openai_model,
            max_retries=settings.openai_max_retries,
            timeout=settings.openai_timeout_seconds,
        )
    return ScriptedModel()


def current_runtime() -> Runtime | None:
    """The process's runtime if it was created, read without the lock (safe in a signal
    handler that may have interrupted ``get_runtime``)."""
    return _runtime


def hold_job_host() -> HostLease:
    """Take this job worker's host name before it consumes anything (``ownership.HostLease``,
    one lease per ``FLEET_JOB_LEASE_SECONDS``). Raises ``HostHeld`` naming the live worker
    that holds it; waits as long as Redis cannot be reached."""
    rt = get_runtime()
    lease = HostLease(rt.store, rt.host, lease_ms=int(get_settings().job_lease_seconds * 1000))
    # A worker (re)started while Redis is down or loading waits for it, as Celery waits for
    # its broker at start-up (broker_connection_retry_on_startup), instead of exiting.
    for attempt in Retrying(
        retry=retry_if_exception_type(StoreUnavailable),
        wait=wait_exponential(multiplier=0.2, max=5),
        before_sleep=before_sleep_log(log, logging.WARNING),
        reraise=True,
    ):
        with attempt:
            lease.acquire()
    rt.host_lease = lease
    return lease


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
                instance=rt.host_lease.instance if rt.host_lease else None,
            )
        return rt.supervisor
