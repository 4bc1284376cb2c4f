"""``/acp``: the Agent Client Protocol over a WebSocket, one JSON-RPC message per text frame.
The bearer token comes in the ``Authorization`` header or as ``?token=`` (a browser's
WebSocket cannot send headers); without it the socket is closed with 4401."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, WebSocket, WebSocketDisconnect

from api.acp import AcpConnection, encode_message, shared_hub
from api.deps import DispatcherDep, SettingsDep, StoreDep, bearer_ok

router = APIRouter()


@router.websocket("/acp")
async def acp_socket(
    ws: WebSocket,
    store: StoreDep,
    dispatcher: DispatcherDep,
    settings: SettingsDep,
    token: Annotated[
        str | None, Query(description="The bearer token, for clients that cannot send headers.")
    ] = None,
) -> None:
    """ACP over WebSocket: one JSON-RPC message per text frame (a binary frame is read as
    UTF-8 text; other bytes answer -32700). Malformed messages are answered with errors; the
    socket stays open."""
    expected = settings.api_token
    if expected:
        header = ws.headers.get("authorization") or f"Bearer {token or ''}"
        if not bearer_ok(header, expected):
            await ws.close(code=4401, reason="A valid bearer token is required.")
            return
    await ws.accept()

    async def send(message: dict[str, Any]) -> None:
        await ws.send_text(encode_message(message))

    conn = AcpConnection(
        send, store, dispatcher, shared_hub(store.url, store.keys.events, store.sentinel)
    )
    try:
        while True:
            frame = await ws.receive()
            if frame["type"] == "websocket.disconnect":
                break
            text = frame.get("text")
            if text is None:
                await conn.handle_bytes(frame.get("bytes") or b"")
            else:
                await conn.handle_text(text)
    except WebSocketDisconnect:
        pass
    finally:
        await conn.close()
