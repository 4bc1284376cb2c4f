"""Worker heartbeats in Redis: each family worker keeps a key with a short TTL alive, so the
local runners (and ``/ready``) can tell which families have a live worker."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from typing import Any

from celery.signals import worker_ready

from workers.runtime import get_runtime

log = logging.getLogger(__name__)

#: Seconds a heartbeat lives; refreshed every third of it.
HEARTBEAT_TTL = 10


def _beat(family: str, node: str) -> None:
    rt = get_runtime()
    key = rt.store.keys.worker_heartbeat(family, node)
    while True:
        try:
            rt.store.redis.set(key, rt.host, ex=HEARTBEAT_TTL)
        except Exception as exc:  # Redis away: beat again later
            log.debug("heartbeat failed: %s", exc)
        if rt.stopping.wait(HEARTBEAT_TTL / 3):
            with contextlib.suppress(Exception):
                rt.store.redis.delete(key)
            return


@worker_ready.connect
def _start(sender: Any = None, **_: Any) -> None:
    family = os.environ.get("FLEET_WORKER_FAMILY")
    if family:
        node = getattr(sender, "hostname", None) or f"{family}@{get_runtime().host}"
        threading.Thread(target=_beat, args=(family, node), name="heartbeat", daemon=True).start()
