"""Permission requests relayed to ACP clients: an agent of a session this client has open
asked before a tool call and waits for a person (``orchestrator/agents/permissions.py``).

The request reaches the client as its own ``session/request_permission``, sent when the
waiting update (``tool_call_update`` whose ``_meta.agentFleet.permission.state`` is
``pending``) is sent to it. Its answer is the person's: it is passed on
(``permissions.answer``; the first answer from any client, REST or the CLI wins); an answer
naming none of the request's options, an error or a malformed answer is ``cancelled``. When
the request is answered elsewhere (its ``answered`` update arrives), its turn ends, its
session is archived or deleted, or the client closes, the request sent to this client is
withdrawn with ``$/cancel_request``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from api.acp.stream import call_store
from orchestrator.agents import permissions
from orchestrator.errors import FleetError, InvalidParams
from orchestrator.storage.store import Store

log = logging.getLogger(__name__)

#: Sends a request to the client and answers ``(result, error)`` (``RpcEndpoint.request``).
Request = Callable[[str, dict[str, Any]], Awaitable[tuple[Any, Any]]]


def permission_of(update: dict[str, Any]) -> dict[str, Any] | None:
    """The fleet's permission record carried by a conversation update, if any."""
    if update.get("sessionUpdate") != "tool_call_update":
        return None
    meta = (update.get("_meta") or {}).get("agentFleet") or {}
    found = meta.get("permission")
    return found if isinstance(found, dict) else None


class Asks:
    """The permission requests relayed to one client, by the fleet's request id."""

    def __init__(self, store: Store, request: Request) -> None:
        self.store, self._request = store, request
        self._asking: dict[str, asyncio.Task[None]] = {}
        self._session: dict[str, str] = {}  # request id -> its session

    def seen(self, sid: str, update: dict[str, Any]) -> None:
        """Look at an update being sent to the client: ask it about a pending request,
        withdraw one answered elsewhere."""
        found = permission_of(update)
        if found is None:
            return
        rid = str(found.get("requestId", ""))
        if found.get("state") == "pending" and rid and rid not in self._asking:
            task = asyncio.create_task(self._ask(sid, rid, update, found))
            self._asking[rid], self._session[rid] = task, sid
            task.add_done_callback(lambda _t: self._forget(rid))
        elif found.get("state") == "answered":
            asking = self._asking.pop(rid, None)
            if asking is not None:
                asking.cancel()

    def ended(self, sid: str) -> None:
        """The session's turn ended, or the session was archived or deleted: withdraw what
        this client was asked in it (the requests went with the turn)."""
        for rid, of in list(self._session.items()):
            if of == sid:
                asking = self._asking.pop(rid, None)
                if asking is not None:
                    asking.cancel()

    def _forget(self, rid: str) -> None:
        self._asking.pop(rid, None)
        self._session.pop(rid, None)

    def close(self) -> None:
        """The client went: withdraw what it was asked."""
        for task in list(self._asking.values()):
            task.cancel()

    async def _ask(self, sid: str, rid: str, update: dict[str, Any], found: dict[str, Any]) -> None:
        waiting = await call_store(permissions.pending, self.store, sid)
        if rid not in {p.request_id for p in waiting}:
            return  # answered or gone before the client saw it (a replay)
        params = {
            "sessionId": sid,
            "toolCall": {"toolCallId": update.get("toolCallId", "")},
            "options": found.get("options") or [],
        }
        for p in waiting:
            if p.request_id == rid:
                params["toolCall"] = {**p.tool_call, "toolCallId": update.get("toolCallId", "")}
        result, error = await self._request("session/request_permission", params)
        chosen = "cancelled"
        if error is None and isinstance(result, dict):
            outcome = result.get("outcome") or {}
            if isinstance(outcome, dict) and outcome.get("outcome") == "selected":
                chosen = str(outcome.get("optionId", "cancelled"))
        try:
            await call_store(permissions.answer, self.store, sid, rid, chosen)
        except InvalidParams as exc:  # an option the request does not have: no permission
            log.info("permission %s: the client answered %s: %s", rid, chosen, exc.message)
            with contextlib.suppress(FleetError):
                await call_store(permissions.answer, self.store, sid, rid, "cancelled")
        except FleetError as exc:  # answered by someone else first, or gone with its turn
            log.info("permission %s: this client's answer not taken: %s", rid, exc.message)
