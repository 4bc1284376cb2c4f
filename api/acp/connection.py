"""``AcpConnection``: one client's connection, whatever its transport.

It is the JSON-RPC endpoint (``rpc.RpcEndpoint``) with the method tables of ``handlers``, the
sessions the client has open (``stream.Streams``) and its pending prompts
(``prompts.Prompts``).
"""

from __future__ import annotations

from typing import Any

from api.acp.asks import Asks
from api.acp.handlers import METHODS, NOTIFICATIONS
from api.acp.hub import EventHub
from api.acp.prompts import Prompts
from api.acp.rpc import RpcEndpoint, Send, id_key
from api.acp.stream import Streams, call_store
from orchestrator.families import Dispatcher
from orchestrator.storage.store import Store
from orchestrator.turn import turns


class AcpConnection(RpcEndpoint):
    """One client connection: its open sessions, pending prompts and event forwarding."""

    methods = METHODS
    notifications = NOTIFICATIONS
    handshake = "initialize"

    def __init__(self, send: Send, store: Store, dispatcher: Dispatcher, hub: EventHub) -> None:
        super().__init__(send)
        self.store, self.dispatcher, self.hub = store, dispatcher, hub
        self.prompts = Prompts()
        self.asks = Asks(store, self.request)
        self.streams = Streams(store, hub, self.send, self.prompts, self.asks.seen, self.asks.ended)

    @property
    def open(self) -> set[str]:
        """The sessions this client has open."""
        return self.streams.open

    async def started(self) -> None:
        await self.streams.start()

    async def close(self) -> None:
        """The transport closed: stop watching, cancel pending work of this connection."""
        self.streams.stop()
        self.asks.close()
        self.cancel_tasks()

    async def cancel_request(self, request_id: Any) -> None:
        """``$/cancel_request``: a pending session/prompt is cancelled like session/cancel and
        answers ``stopReason: cancelled``; any other pending request answers -32800."""
        entry = self.requests.get(id_key(request_id))
        if entry is not None and entry[1] == "session/prompt":
            params = entry[2].get("params")
            sid = params.get("sessionId") if isinstance(params, dict) else None
            if isinstance(sid, str) and sid:
                await self.cancel_turns(sid, self.prompts.cancel(sid))
                return
        await super().cancel_request(request_id)

    async def cancel_turns(self, sid: str, turn_ids: list[str] | None = None) -> int:
        """Cancel the named turns of the session (without ``turn_ids``, its live turns);
        return how many were asked to stop. A turn that ends ``cancelled`` at once (queued,
        or between steps) publishes no ``turn`` event, so its prompt is settled from here
        (through the forwarder, after the turn's updates); one with a step in flight is
        settled by the event its step publishes."""
        if turn_ids == []:
            return 0
        outcomes = await call_store(
            turns.cancel_session_turns, self.store, self.dispatcher, sid, turn_ids
        )
        for tid, outcome in outcomes.items():
            if outcome == "cancelled":
                self.streams.inject(
                    {
                        "type": "turn",
                        "sessionId": sid,
                        "turnId": tid,
                        "state": "cancelled",
                        "stopReason": "cancelled",
                    }
                )
        return sum(1 for outcome in outcomes.values() if outcome in ("cancelled", "cancelling"))
