"""``fleet acp``: the ACP agent over stdio, one JSON-RPC message per line (UTF-8, ``\\n``).

Logs go to stderr; stdout carries protocol messages only.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from api.acp import AcpConnection, EventHub
from api.context import dispatcher, redis_url, store


async def serve_stdio() -> None:
    """Serve one client on stdin/stdout until stdin closes."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=2**24)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    out = sys.stdout.buffer

    async def send(message: dict[str, Any]) -> None:
        out.write(json.dumps(message, ensure_ascii=False).encode() + b"\n")
        out.flush()

    st = store()
    hub = EventHub(redis_url(), st.keys.events)
    conn = AcpConnection(send, st, dispatcher(), hub)
    try:
        while True:
            line = await reader.readline()
            if not line:
                break
            text = line.decode("utf-8", errors="replace").strip()
            if text:
                await conn.handle_text(text)
        # stdin closed: let answers to requests already read go out.
        await conn.drain(timeout=2)
    finally:
        await conn.close()


def main() -> None:
    """Run the stdio agent."""
    asyncio.run(serve_stdio())
