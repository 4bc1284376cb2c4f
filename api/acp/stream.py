"""The sessions one ACP connection has open, and what it is sent of them.

Per open session the connection holds a cursor into the session's history (``Keys.history``):
how many recorded updates it has been sent. Events (``EventHub``) are handled in publish order
by one task, the forwarder; an ``update`` event only says that there is more, and what is sent
is read from the history after the cursor, so a late or lost event never drops or repeats an
update, and a ``session/load`` replay joins the live stream exactly. A ``turn`` event that
ends a turn settles the prompt waiting on it (``Prompts``), after the turn's updates.

An archive frees the session on every connection that has it open, as ``session/close`` would:
the connection is sent the updates recorded up to the archive, then
``session_info_update`` with ``archived: true``, then nothing more of the session, except the
``archived: false`` of its unarchive. After that, nothing flows until a client loads or
resumes it again. A delete (ACP has no notification for it) closes the session on every
connection, silently, as ``session/close`` does: nothing more of it can come, not even an
unarchive.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from api.acp.hub import EventHub, RelayUnavailable
from api.acp.prompts import Prompts
from api.acp.rpc import Send
from orchestrator import untrusted
from orchestrator.storage.store import Store
from orchestrator.storage.store import translated as translated_store
from orchestrator.turn import turns

log = logging.getLogger(__name__)

#: Turn states a ``turn`` event settles a pending ``session/prompt`` with.
_TERMINAL_TURN_STATES = frozenset(s.value for s in turns.STOP_REASON)
#: ``ToolCallStatus`` values of ACP v1. The orchestrator also records ``cancelled``, which
#: ACP v1 lacks; on the wire it becomes ``failed`` with the original kept in ``_meta``.
_TOOL_CALL_STATUSES = frozenset({"pending", "in_progress", "completed", "failed"})


async def call_store(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` on a thread; a Redis failure raises ``StoreUnavailable``."""

    def run() -> Any:
        with translated_store():
            return fn(*args, **kwargs)

    return await asyncio.to_thread(run)


def wire_update(update: dict[str, Any]) -> dict[str, Any]:
    """A recorded ``session/update`` payload in ACP v1 shape: the fleet's own fields
    (``turnId``, a ``cancelled`` tool-call status) move to ``_meta.agentFleet``."""
    out = dict(update)
    ours: dict[str, Any] = {}
    if "turnId" in out:
        ours["turnId"] = out.pop("turnId")
    status = out.get("status")
    if (
        out.get("sessionUpdate") in ("tool_call", "tool_call_update")
        and status is not None
        and status not in _TOOL_CALL_STATUSES
    ):
        ours["status"] = status
        out["status"] = "failed"
    if ours:
        meta = dict(out.get("_meta") or {})
        meta["agentFleet"] = {**(meta.get("agentFleet") or {}), **ours}
        out["_meta"] = meta
    return out


def _info(**fields: Any) -> dict[str, Any]:
    return {"sessionUpdate": "session_info_update", **fields}


class Streams:
    """The open sessions of one connection: their cursors, events and replay."""

    def __init__(
        self,
        store: Store,
        hub: EventHub,
        send: Send,
        prompts: Prompts,
        seen: Callable[[str, dict[str, Any]], None] | None = None,
        ended: Callable[[str], None] | None = None,
    ) -> None:
        self.store, self.hub, self._send, self.prompts = store, hub, send, prompts
        # Called with each update sent, and when a session's turn ends or the session is
        # archived or deleted (the permission requests relayed to the client).
        self._seen, self._ended = seen, ended
        self.open: set[str] = set()
        self._cursor: dict[str, int] = {}  # per open session: history items sent
        self.events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        # Sessions being loaded: their events wait here until the replay has been sent.
        self._loading: dict[str, list[dict[str, Any]]] = {}
        # Sessions closed by their archive: their unarchive is still told.
        self._archived: set[str] = set()
        self._forwarder: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Subscribe to the events and start the forwarder (once)."""
        if self._forwarder is not None:
            return
        try:
            await self.hub.start()
        except RelayUnavailable as exc:  # Redis unreachable: requests still get their answers
            # The hub logs the outage itself, once; this connection only notes it started
            # without the relay.
            log.info("event relay not subscribed yet: %s", exc)
        self._forwarder = asyncio.create_task(self._forward())

    def stop(self) -> None:
        """The transport closed: stop watching every session and stop the forwarder."""
        for sid in self.open | self._archived | self.prompts.sessions():
            self.hub.unwatch(sid, self.events)
        if self._forwarder is not None:
            self._forwarder.cancel()

    def watch(self, sid: str) -> None:
        """Receive ``sid``'s events (a prompt pending on it needs its turn's end)."""
        self.hub.watch(sid, self.events)

    def release(self, sid: str) -> None:
        """Stop receiving ``sid``'s events unless something of this connection needs them:
        it is open, closed by an archive that may be undone, or a prompt waits on it."""
        if sid not in self.open and sid not in self._archived and not self.prompts.pending(sid):
            self.hub.unwatch(sid, self.events)

    def inject(self, event: dict[str, Any]) -> None:
        """Handle ``event`` as if relayed (a turn whose end published no event)."""
        self.events.put_nowait(event)

    async def open_session(self, sid: str, cursor: int | None = None) -> None:
        """Watch ``sid``; updates recorded from ``cursor`` on (default: from now) are sent."""
        if sid in self.open:
            return
        self.open.add(sid)
        self._archived.discard(sid)
        self.watch(sid)
        if cursor is None:
            cursor = int(await call_store(self.store.redis.llen, self.store.keys.history(sid)))
            # An update recorded after the LLEN whose event came before the cursor was set
            # found no cursor: catch up through the forwarder.
            self.inject({"type": "update", "sessionId": sid})
        self._cursor.setdefault(sid, cursor)

    def close_session(self, sid: str, *, by_archive: bool = False) -> None:
        """No more updates of ``sid`` for this client (``by_archive``: but its unarchive)."""
        if sid in self.open:
            self.open.discard(sid)
            self._cursor.pop(sid, None)
            if by_archive:
                self._archived.add(sid)
        if not by_archive:
            self._archived.discard(sid)
        self.release(sid)

    def loading(self, sid: str) -> bool:
        """Whether a ``session/load`` of ``sid`` is replaying it."""
        return sid in self._loading

    async def replay(self, sid: str) -> None:
        """(Re)open ``sid`` and send its whole history; live updates continue from the end
        of the replay, none lost in between and none sent twice (events arriving during the
        replay are held, then handled against the cursor)."""
        held: list[dict[str, Any]] = []
        self._loading[sid] = held
        try:
            self.close_session(sid)  # loading an open session replays it from the start
            await self.open_session(sid, 0)
            raw = await call_store(self.store.redis.lrange, self.store.keys.history(sid), 0, -1)
            self._cursor[sid] = len(raw)
            await self._send_history(sid, raw)
            while held:  # the forwarder keeps holding this session's events meanwhile
                await self._handle(held.pop(0), loading=True)
        finally:
            del self._loading[sid]

    async def _forward(self) -> None:
        """Handle events in publish order (the only task that sends live updates)."""
        while True:
            event = await self.events.get()
            held = self._loading.get(str(event.get("sessionId")))
            if held is not None:
                held.append(event)
                continue
            try:
                await self._handle(event)
            except Exception:  # one bad event never stops the relay
                log.exception("ACP event %s not handled", event.get("type"))

    async def _handle(self, event: dict[str, Any], *, loading: bool = False) -> None:
        """Send what ``event`` means to this client; settle the prompt of an ended turn.
        ``loading``: called by ``replay`` for an event it held."""
        sid = str(event.get("sessionId"))
        kind = event.get("type")
        if self._ended is not None and (
            kind in ("archived", "deleted")
            or (kind == "turn" and event.get("state") in _TERMINAL_TURN_STATES)
        ):
            self._ended(sid)
        if kind == "update":
            await self._sync(sid, loading=loading)
        elif kind == "archived" and sid in self.open:
            upto = event.get("historyLength")
            await self._sync(sid, loading=loading, upto=upto if isinstance(upto, int) else None)
            await self.send_update(sid, _info(archived=True))
            self.close_session(sid, by_archive=True)
        elif kind == "unarchived" and (sid in self.open or sid in self._archived):
            await self.send_update(sid, _info(archived=False))
            self._archived.discard(sid)
            self.release(sid)
        elif kind == "deleted":
            self.close_session(sid)
        elif kind == "title" and sid in self.open:
            await self.send_update(sid, _info(title=event.get("title")))
        elif kind == "turn" and event.get("state") in _TERMINAL_TURN_STATES:
            await self._sync(sid, loading=loading)  # the turn's updates precede its answer
            reason = str(event.get("stopReason") or "end_turn")
            self.prompts.settle(str(event.get("turnId")), reason)

    async def _sync(self, sid: str, *, loading: bool = False, upto: int | None = None) -> None:
        """Send the updates recorded for ``sid`` since this client's cursor (up to the
        ``upto``-th). One caller at a time per session: the forwarder, or ``replay``."""
        start = self._cursor.get(sid)
        if start is None or (upto is not None and upto <= start):
            return
        end = -1 if upto is None else upto - 1
        key = self.store.keys.history(sid)
        raw = await call_store(self.store.redis.lrange, key, start, end)
        if self._cursor.get(sid) != start or (sid in self._loading and not loading):
            return  # closed, reopened or being loaded meanwhile: that path sends them
        self._cursor[sid] = start + len(raw)
        await self._send_history(sid, raw)

    async def _send_history(self, sid: str, raw: list[str]) -> None:
        for update in untrusted.stored_updates(raw):
            await self.send_update(sid, update)

    async def send_update(self, sid: str, update: dict[str, Any]) -> None:
        """Send one ``session/update`` notification (a transport closing is not an error:
        prompts still settle)."""
        message = {
            "jsonrpc": "2.0",
            "method": "session/update",
            "params": {"sessionId": sid, "update": wire_update(update)},
        }
        try:
            await self._send(message)
        except Exception as exc:
            log.debug("update for %s not sent: %s", sid, exc)
            return
        if self._seen is not None:
            self._seen(sid, update)
