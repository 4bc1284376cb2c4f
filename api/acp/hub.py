"""The relay of the fleet's Redis events to the ACP connections of one process.

Domain changes are published on Redis (``orchestrator/events.py``); ``EventHub`` holds one
subscription per event loop and puts each event into the queues of the connections that
watch its session.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import weakref
from typing import Any

from orchestrator.redisconn import async_client

log = logging.getLogger(__name__)


class EventHub:
    """Relays the fleet's Redis events to the connections of this process that watch a
    session. One subscription per process, started on first use."""

    def __init__(self, url: str, channel: str) -> None:
        self.url, self.channel = url, channel
        self._watchers: dict[str, set[asyncio.Queue[dict[str, Any]]]] = {}
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()

    async def start(self) -> None:
        """Subscribe (once per event loop); returns when the subscription is active."""
        loop = asyncio.get_running_loop()
        if self._task is None or self._task.done() or self._task.get_loop() is not loop:
            self._ready = asyncio.Event()
            self._task = loop.create_task(self._run())
        await asyncio.wait_for(self._ready.wait(), 10)

    async def _run(self) -> None:
        while True:
            client = async_client(self.url, decode_responses=True)
            try:
                pubsub = client.pubsub()
                await pubsub.subscribe(self.channel)
                self._ready.set()
                async for message in pubsub.listen():
                    if message.get("type") != "message":
                        continue
                    try:
                        event = json.loads(message["data"])
                    except (TypeError, ValueError):
                        continue
                    for queue in list(self._watchers.get(event.get("sessionId", ""), ())):
                        queue.put_nowait(event)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Redis went away: resubscribe after a pause
                log.warning("event relay lost its subscription: %s", exc)
                await asyncio.sleep(0.5)
            finally:
                with contextlib.suppress(Exception):
                    await client.aclose()

    def watch(self, session_id: str, queue: asyncio.Queue[dict[str, Any]]) -> None:
        """Deliver events of ``session_id`` into ``queue``."""
        self._watchers.setdefault(session_id, set()).add(queue)

    def unwatch(self, session_id: str, queue: asyncio.Queue[dict[str, Any]]) -> None:
        """Stop delivering events of ``session_id`` into ``queue``."""
        watchers = self._watchers.get(session_id)
        if watchers is not None:
            watchers.discard(queue)
            if not watchers:
                del self._watchers[session_id]


_HUBS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, EventHub] = weakref.WeakKeyDictionary()


def shared_hub(url: str, channel: str) -> EventHub:
    """The event hub of the running event loop (one subscription per loop and channel).

    A hub's queues belong to its loop, so connections served by different loops (a test
    client's portal beside a server) never share one: each loop relays to its own."""
    loop = asyncio.get_running_loop()
    hub = _HUBS.get(loop)
    if hub is None or (hub.url, hub.channel) != (url, channel):
        hub = _HUBS[loop] = EventHub(url, channel)
    return hub
