"""One settings object for every process of agent-fleet, read from ``FLEET_*`` variables.

Every variable is documented in the README's configuration table; the names below are the
field names upper-cased with the ``FLEET_`` prefix (``redis_url`` -> ``FLEET_REDIS_URL``).
"""

from __future__ import annotations

import socket
from functools import lru_cache
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class FleetSettings(BaseSettings):
    """Process configuration (pydantic-settings, environment prefix ``FLEET_``)."""

    model_config = SettingsConfigDict(env_prefix="FLEET_", extra="ignore")

    #: Redis URL used for state and as the Celery broker. ``None`` means "start an embedded
    #: server" for the local runners (``fleet up``, ``fleet demo``); long-running services
    #: started on their own require it.
    redis_url: str | None = None
    #: Prefix of every key agent-fleet writes (state and broker), so several fleets or test
    #: runs can share one Redis database without touching each other's data.
    key_prefix: str = "fleet:"
    #: Where the embedded Redis keeps its append-only file and the local runners their logs.
    state_dir: Path = Field(default_factory=lambda: Path.cwd() / ".fleet")
    #: Name of this host as job workers report it; stops for a job are routed to it.
    hostname: str = Field(default_factory=socket.gethostname)
    #: Seconds a job process gets between SIGTERM and SIGKILL when it is stopped.
    job_kill_grace_seconds: float = 2.0
    #: Seconds a job's liveness lease lasts; a job worker refreshes it while the process runs,
    #: so a job whose worker died stops counting as live once the lease runs out.
    job_lease_seconds: float = 5.0
    #: Seconds between two polls of the reminder poller.
    reminder_poll_seconds: float = 0.2
    #: Threads per family worker.
    worker_concurrency: int = 8
    #: Seconds a step refused because the store was unreachable waits before it is retried.
    gate_retry_seconds: float = 1.0
    #: Host and port the HTTP API binds to.
    api_host: str = "127.0.0.1"
    api_port: int = 8765
    #: Bearer token the API requires (issue: authentication); empty disables it on loopback.
    api_token: str = ""
    #: ``user:password`` Flower asks for (``fleet flower``); required beyond loopback.
    flower_basic_auth: str = ""


@lru_cache(maxsize=1)
def get_settings() -> FleetSettings:
    """Return the process-wide settings, read once from the environment."""
    return FleetSettings()
