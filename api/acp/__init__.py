"""An ACP agent for the session lifecycle, independent of its transport.

``AcpConnection`` takes JSON-RPC 2.0 messages (one JSON text each) and sends responses and
``session/update`` notifications through a ``send`` coroutine; ``api/acp_stdio.py`` (one message
per line) and the ``/acp`` WebSocket of ``api/rest.py`` (one message per frame) are thin
adapters over it. The rules followed are those of ``shared/acp.md`` (ACP v1, seeds 000/001).

Where things are:

- ``rpc.py``: JSON-RPC framing, ids, dispatch through a method table, ``$/cancel_request``,
  and the one path every error answer takes (``error_of``, through ``api/errors.py``).
- ``params.py``: the params of every method, validated with the ACP schema's models.
- ``handlers.py``: one handler per method and the tables ``METHODS``/``NOTIFICATIONS``; a new
  method is a handler and a table entry.
- ``stream.py``: the sessions a connection has open: history cursor, replay, live updates,
  close (an archive closes them too), and the settling of prompts after their updates.
- ``prompts.py``: the pending prompts of a connection.
- ``hub.py``: the relay of Redis events to the connections of a process.
"""

from api.acp.connection import AcpConnection
from api.acp.handlers import LIST_PAGE, METHODS, NOTIFICATIONS, PROTOCOL_VERSION
from api.acp.hub import EventHub, shared_hub
from api.acp.rpc import INVALID_REQUEST, MAX_MESSAGE, encode_message
from api.acp.stream import wire_update

__all__ = [
    "INVALID_REQUEST",
    "LIST_PAGE",
    "MAX_MESSAGE",
    "METHODS",
    "NOTIFICATIONS",
    "PROTOCOL_VERSION",
    "AcpConnection",
    "EventHub",
    "encode_message",
    "shared_hub",
    "wire_update",
]
