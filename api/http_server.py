"""The HTTP protocol ``fleet api`` serves with: uvicorn's (httptools), with a deadline on the
request head.

uvicorn closes an idle keep-alive connection after ``timeout_keep_alive`` seconds, but any byte
received cancels that timer, and a new connection has no timer at all: a client that connects
and sends a request line and headers slowly, or never finishes them (slowloris), holds its
socket and file descriptor for as long as it likes, and enough such clients exhaust the
process's descriptors. ``head_timeout_protocol`` gives each request head a deadline, counted
from the connection (or from the end of the previous answer on a kept-alive one) to the end of
its headers, however slowly the bytes trickle in; past it the connection is closed. A request
whose head is complete is never cut: answers, ``GET /events`` streams and WebSockets run as
long as they do.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger(__name__)


class HeadTimeoutProtocol(HttpToolsProtocol):
    """``HttpToolsProtocol`` closing a connection whose request head (request line and headers)
    is not complete ``head_timeout`` seconds after the connection was made or its previous
    answer sent."""

    #: Seconds a request head may take; set by ``head_timeout_protocol``.
    head_timeout = 10.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None

    def _arm_head_timer(self) -> None:
        self._disarm_head_timer()
        self._head_timer = self.loop.call_later(self.head_timeout, self._head_timed_out)

    def _disarm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            client = f"{self.client[0]}:{self.client[1]}" if self.client else "a client"
            log.info(
                "closed the connection of %s: no whole request head within %g s",
                client,
                self.head_timeout,
            )
            self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_timer()

    def on_headers_complete(self) -> None:
        # Before the request (or WebSocket upgrade) runs: it is never cut by this deadline.
        self._disarm_head_timer()
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        # A request already waiting in the pipeline has its head: only an idle connection
        # waits for a new one.
        waiting = bool(self.pipeline)
        super().on_response_complete()
        if not waiting and not self.transport.is_closing():
            self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_timer()
        super().connection_lost(exc)


def head_timeout_protocol(seconds: float) -> type[HeadTimeoutProtocol]:
    """The protocol class to give uvicorn (``http=``) for a request-head deadline of
    ``seconds`` (> 0)."""
    return type("HeadTimeoutProtocol", (HeadTimeoutProtocol,), {"head_timeout": seconds})
