"""``fleet acp``: the ACP agent over stdio, one JSON-RPC message per line (UTF-8, ``\\n``).

Logs go to stderr; stdout carries protocol messages only. A line longer than
``MAX_MESSAGE`` is answered with an error and skipped whole, a line that is not UTF-8 with
-32700; the connection goes on.
"""

from __future__ import annotations

import asyncio
import os
import selectors
import stat
import sys
import threading
from collections.abc import AsyncIterator
from typing import Any

from api.acp import MAX_MESSAGE, AcpConnection, encode_message, shared_hub
from api.context import dispatcher, redis_url, store
from orchestrator.storage import audit

_CHUNK = 1 << 16
#: Seconds the requests pending at stdin EOF get to be answered before they are answered
#: -32800 (cancelled); above the store's retry bound, so Redis being down answers -32010.
EOF_GRACE = 5.0


def _watchable(fd: int) -> bool:
    """Whether the event loop can watch ``fd`` for reading: a pipe, a socket or a character
    device its selector accepts (a terminal). ``/dev/null`` is a character device that epoll
    refuses (EPERM), and so is a regular file."""
    mode = os.fstat(fd).st_mode
    if not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or stat.S_ISCHR(mode)):
        return False
    with selectors.DefaultSelector() as selector:
        try:
            selector.register(fd, selectors.EVENT_READ)
        except (OSError, ValueError):
            return False
    return True


async def _stdin_reader() -> asyncio.StreamReader:
    """A stream reader on stdin: a pipe, socket or terminal is read by the event loop; any
    other file (``fleet acp < requests.jsonl``, ``< /dev/null``) by a thread."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=2 * _CHUNK)
    fd = sys.stdin.fileno()
    if _watchable(fd):
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        return reader

    def feed() -> None:
        try:
            while chunk := os.read(fd, _CHUNK):
                loop.call_soon_threadsafe(reader.feed_data, chunk)
        finally:
            loop.call_soon_threadsafe(reader.feed_eof)

    threading.Thread(target=feed, name="acp-stdin", daemon=True).start()
    return reader


async def _lines(reader: asyncio.StreamReader, too_long: Any) -> AsyncIterator[bytes]:
    """Complete lines from ``reader`` (without the ``\\n``). A line over ``MAX_MESSAGE``
    bytes is dropped up to its end and reported once through ``too_long()``."""
    buffer = bytearray()
    skipping = False
    while True:
        chunk = await reader.read(_CHUNK)
        if not chunk:
            if buffer and not skipping:
                yield bytes(buffer)
            return
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            if end < 0:
                break
            if skipping:
                skipping = False
            else:
                buffer += chunk[start:end]
                if len(buffer) > MAX_MESSAGE:
                    await too_long()
                else:
                    yield bytes(buffer)
            buffer.clear()
            start = end + 1
        if not skipping:
            buffer += chunk[start:]
            if len(buffer) > MAX_MESSAGE:
                buffer.clear()
                skipping = True
                await too_long()


async def serve_stdio() -> None:
    """Serve one client on stdin/stdout until stdin closes. Without a fleet it raises
    ``FleetNotFound`` before it reads anything."""
    st = store()
    out = sys.stdout.buffer

    async def send(message: dict[str, Any]) -> None:
        out.write(encode_message(message).encode("utf-8") + b"\n")
        out.flush()

    conn = AcpConnection(
        send, st, dispatcher(), shared_hub(redis_url(), st.keys.events, st.sentinel)
    )

    try:
        reader = await _stdin_reader()
        async for line in _lines(reader, conn.refuse_oversized):
            if line.strip():
                await conn.handle_bytes(line)
        # stdin closed: every request already read is answered before the process exits.
        await conn.drain(timeout=EOF_GRACE)
    finally:
        await conn.close()


def main() -> None:
    """Run the stdio agent; what its client changes is audited as done by ``acp:stdio``."""
    audit.set_default_actor("acp:stdio")
    asyncio.run(serve_stdio())
