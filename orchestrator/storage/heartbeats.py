"""Which family workers are alive: each worker keeps a heartbeat key with a short TTL
(``Keys.worker_heartbeat``, written by ``workers/heartbeat.py``); a key that exists is a worker
seen within the TTL."""

from __future__ import annotations

from orchestrator import families
from orchestrator.storage.store import Store, retried


@retried
def live_workers(store: Store) -> dict[str, list[str]]:
    """``{family: [node, ...]}`` for every family (an empty list when none is seen), nodes
    sorted (``turn@host``). Raises ``StoreUnavailable``."""
    out: dict[str, list[str]] = {family: [] for family in families.names()}
    # One SCAN for all families: the heartbeat keys differ only after "worker:<family>:".
    probe = store.keys.worker_heartbeat("*", "*")
    base = probe[: probe.index("*")]
    for key in store.redis.scan_iter(match=probe, count=1000):
        family, _, node = key[len(base) :].partition(":")
        if family in out and node:
            out[family].append(node)
    return {family: sorted(nodes) for family, nodes in out.items()}
