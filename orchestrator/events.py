"""Lifecycle events published on Redis so every API process can tell its clients.

An event is a JSON object ``{"type": ..., "sessionId": ..., ...}`` published on the
``events`` channel (``Keys.events``). Publishing is best effort: a failure is logged and never
undoes the change it reports (listing stays the source of truth).
"""

from __future__ import annotations

import json
import logging
from typing import Any

import redis

from orchestrator.store import Store

log = logging.getLogger(__name__)


def publish(store: Store, kind: str, session_id: str, **fields: Any) -> None:
    """Publish one event of ``kind`` (``archived``, ``unarchived``, ``title``, ``turn``)."""
    payload = json.dumps({"type": kind, "sessionId": session_id, **fields})
    try:
        store.redis.publish(store.keys.events, payload)
    except redis.RedisError as exc:
        log.warning(
            "event %s for %s not published: %s",
            kind,
            session_id,
            exc,
            extra={"session_id": session_id},
        )
