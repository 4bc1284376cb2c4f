"""The process package's door to Redis: one function per Lua script beside it
(``job_host_claim.lua``, ``job_host_release.lua``: which worker instance holds a host name).

Only this module builds those scripts' ARGV and reads their replies. Every function raises
``StoreUnavailable`` when Redis cannot be reached.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.storage.store import Store


@dataclass(frozen=True)
class Held:
    """``job_host_claim``: another instance holds the host name (its instance, pid and the
    time it took the name, as stored)."""

    instance: str
    pid: str
    since: str


def job_host_claim(
    store: Store, *, host: str, instance: str, pid: int, lease_ms: int
) -> Held | None:
    """Take or renew the host name for ``instance`` (process ``pid``) for ``lease_ms``.
    Returns ``None`` when this instance holds it, else who does."""
    reply = store.run("job_host_claim", [host, instance, pid, lease_ms])
    if reply[0] == "ok":
        return None
    return Held(str(reply[1]), str(reply[2]), str(reply[3]))


def job_host_release(store: Store, *, host: str, instance: str) -> bool:
    """Give the host name back if ``instance`` holds it. Returns whether it was released."""
    return bool(store.run("job_host_release", [host, instance]))
