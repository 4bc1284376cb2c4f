"""The relay of the fleet's Redis events to the ACP connections of one process.

Domain changes are published on Redis (``orchestrator/storage/events.py``); ``EventHub`` holds one
subscription per event loop and puts each event into the queues of the connections that
watch its session.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from typing import Any

from orchestrator import untrusted
from orchestrator.storage.redisconn import SentinelOptions, SilenceProbe, async_client

log = logging.getLogger(__name__)

#: Seconds ``EventHub.start`` waits for Redis to answer the first subscription attempt.
START_TIMEOUT = 10.0
#: Pause before resubscribing, in seconds: doubled after each failed attempt up to the max.
RETRY_MIN, RETRY_MAX = 0.5, 30.0
#: Longest wait for one message (s) before the subscription's silence is looked at.
READ_WAIT = 1.0


class RelayUnavailable(Exception):
    """The event relay is not subscribed; its message is the reason (never empty)."""


def describe(exc: BaseException) -> str:
    """A failure as log text that is never empty: its message, else its type's name."""
    return str(exc).strip() or type(exc).__name__


class EventHub:
    """Relays the fleet's Redis events to the connections of this process that watch a
    session. One subscription per process, started on first use."""

    def __init__(self, url: str, channel: str, sentinel: SentinelOptions | None = None) -> None:
        self.url, self.channel, self.sentinel = url, channel, sentinel
        self._watchers: dict[str, set[asyncio.Queue[dict[str, Any]]]] = {}
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()  # set while subscribed
        self._settled = asyncio.Event()  # set by the first attempt's outcome
        self._failed: str | None = None  # the reason of the current outage

    async def start(self) -> None:
        """Subscribe (once per event loop); returns when the subscription is active. Raises
        ``RelayUnavailable`` (its message names the reason) when the first attempt fails or
        Redis gives no answer within ``START_TIMEOUT`` seconds; the relay keeps retrying in
        the background either way."""
        loop = asyncio.get_running_loop()
        if self._task is None or self._task.done() or self._task.get_loop() is not loop:
            self._ready, self._settled, self._failed = asyncio.Event(), asyncio.Event(), None
            self._task = loop.create_task(self._run())
        try:
            await asyncio.wait_for(self._settled.wait(), START_TIMEOUT)
        except TimeoutError:
            raise RelayUnavailable(f"no answer from Redis within {START_TIMEOUT:g} s") from None
        if not self._ready.is_set():
            raise RelayUnavailable(self._failed or "the subscription failed")

    async def _run(self) -> None:
        """Subscribe and relay until cancelled. A lost subscription is logged once per outage
        (and its recovery once); reconnects back off from ``RETRY_MIN`` to ``RETRY_MAX``
        seconds."""
        delay = RETRY_MIN
        while True:
            client = async_client(self.url, self.sentinel, decode_responses=True)
            try:
                pubsub = client.pubsub()
                await pubsub.subscribe(self.channel)
                self._subscribed()
                delay = RETRY_MIN
                probe = SilenceProbe()
                while True:
                    message = await pubsub.get_message(timeout=READ_WAIT)
                    # A connection that died without a reset reads as "no event" forever:
                    # one that does not answer a PING is dropped and subscribed again.
                    if probe.step(message is not None):
                        await pubsub.ping()
                    if message is not None:
                        self._relay(message)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Redis went away: resubscribe after a pause
                self._lost(describe(exc))
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX)
            finally:
                with contextlib.suppress(Exception):
                    await client.aclose()

    def _subscribed(self) -> None:
        if self._failed is not None:
            log.warning("event relay subscribed again")
        self._failed = None
        self._ready.set()
        self._settled.set()

    def _lost(self, reason: str) -> None:
        if self._failed is None:
            log.warning(
                "event relay lost its subscription (%s); resubscribing with back-off up to %g s",
                reason,
                RETRY_MAX,
            )
        self._failed = reason
        self._ready.clear()
        self._settled.set()

    def _relay(self, message: dict[str, Any]) -> None:
        if message.get("type") != "message":
            return
        try:
            event = untrusted.stored(message["data"])
        except (TypeError, ValueError):
            return
        if not isinstance(event, dict):
            return
        for queue in list(self._watchers.get(event.get("sessionId", ""), ())):
            queue.put_nowait(event)

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


def shared_hub(url: str, channel: str, sentinel: SentinelOptions | None = None) -> EventHub:
    """The event hub of the running event loop (one subscription per loop and channel), on
    the Redis of ``url`` (with ``sentinel``, a ``Store.sentinel``, for a ``sentinel://`` one).

    A hub's queues belong to its loop, so connections served by different loops (a test
    client's portal beside a server) never share one: each loop relays to its own."""
    loop = asyncio.get_running_loop()
    hub = _HUBS.get(loop)
    if hub is None or (hub.url, hub.channel, hub.sentinel) != (url, channel, sentinel):
        hub = _HUBS[loop] = EventHub(url, channel, sentinel)
    return hub
