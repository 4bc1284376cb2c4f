"""Lifecycle events published on Redis so every API process can tell its clients.

An event is a JSON object ``{"type": ..., "sessionId": ..., ...}`` published on the
``events`` channel (``Keys.events``). Lifecycle events (``DURABLE_KINDS``: archived,
unarchived, title, turn, deleted) are also appended to a capped stream
(``Keys.event_stream``, about ``STREAM_MAXLEN`` entries), in the same pipeline, so
``GET /events`` can serve them as Server-Sent Events whose ids are the stream ids and a client
that reconnects with ``Last-Event-ID`` misses nothing still retained. Conversation
``update`` events are only published (the history list is their durable record). Archive and
delete emit theirs from their own scripts (``emit_event`` in ``_lib.lua``), in this same
form: a ``deleted`` event is ``{"type": "deleted", "sessionId"}``, one per session a delete
removed (its descendants too).

Publishing is best effort: a failure is logged and never undoes the change it reports (listing
stays the source of truth).
"""

from __future__ import annotations

import logging
from typing import Any

import redis

from orchestrator import entries, untrusted
from orchestrator.storage.store import Store, retried

log = logging.getLogger(__name__)


#: The largest stream id Redis can hold.
_LAST_ID = f"{2**64 - 1}-{2**64 - 1}"
#: Event kinds kept in the durable stream (and served by ``GET /events``).
DURABLE_KINDS = frozenset({"archived", "unarchived", "title", "turn", "deleted"})
#: Approximate cap of the event stream (``XADD MAXLEN ~``): Redis trims whole nodes, so it
#: may hold slightly more.
STREAM_MAXLEN = 10_000


def publish(store: Store, kind: str, session_id: str, **fields: Any) -> None:
    """Publish one event of ``kind`` (``archived``, ``unarchived``, ``title``, ``turn``,
    ``update``); lifecycle kinds are also appended to the event stream."""
    publish_many(store, [(kind, session_id, fields)])


def publish_many(store: Store, batch: list[tuple[str, str, dict[str, Any]]]) -> None:
    """Publish ``(kind, session_id, fields)`` events in order, in one round trip (bulk
    operations). Best effort, like ``publish``."""
    if not batch:
        return
    pipe = store.redis.pipeline(transaction=False)
    for kind, session_id, fields in batch:
        payload = entries.payload(kind, session_id, fields)
        if kind in DURABLE_KINDS:
            pipe.xadd(
                store.keys.event_stream,
                {"event": payload},
                maxlen=STREAM_MAXLEN,
                approximate=True,
            )
        pipe.publish(store.keys.events, payload)
    try:
        pipe.execute()
    except redis.RedisError as exc:
        first_kind, first_sid, _ = batch[0]
        log.warning(
            "%d event(s) (%s for %s, ...) not published: %s",
            len(batch),
            first_kind,
            first_sid,
            exc,
            extra={"session_id": first_sid},
        )


@retried
def deleted_after(store: Store, session_id: str, after: str) -> bool:
    """Whether the event stream still holds, after entry ``after`` (a stream id), the
    ``deleted`` event of ``session_id``: a client that lost its connection before that event
    can still resume and read it. Reads at most the stream's ``STREAM_MAXLEN`` entries, in
    pages. Raises ``StoreUnavailable``."""
    if after == _LAST_ID:  # nothing can follow it (and Redis refuses it as an open start)
        return False
    cursor = f"({after}"
    while True:
        page = store.redis.xrange(store.keys.event_stream, min=cursor, max="+", count=1000)
        for _, fields in page:
            raw = fields.get("event", "")
            if session_id in raw and '"deleted"' in raw:
                try:
                    event = untrusted.stored(raw)
                except ValueError:
                    continue
                if not isinstance(event, dict):
                    continue
                if event.get("type") == "deleted" and event.get("sessionId") == session_id:
                    return True
        if len(page) < 1000:
            return False
        cursor = f"({page[-1][0]}"
