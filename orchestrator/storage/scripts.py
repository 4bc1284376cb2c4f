"""The storage package's door to Redis: one typed function per Lua script beside it
(``audit_trail.lua``, ``audit_record.lua``).

Only this module builds those scripts' ARGV and reads their replies. Raises
``StoreUnavailable`` when Redis cannot be reached.
"""

from __future__ import annotations

import json
from typing import Any

from orchestrator.storage.store import Store


def audit_trail(store: Store, *, session_id: str) -> list[dict[str, Any]]:
    """The audit entries of ``session_id`` kept in its list and the batches waiting to move
    there (each an entry's fields with its ``id``), oldest first."""
    return [json.loads(raw) for raw in store.run("audit_trail", [session_id])]


def queue_audit_record(
    store: Store, pipe: Any, *, recorder: str, entries: list[tuple[str, str, str, str]]
) -> None:
    """Queue ``audit_record`` on ``pipe`` (sent by the caller with ``Store.execute``): one
    entry per ``(session_id, action, outcome, detail_json)``, all by ``recorder`` (a JSON
    object naming the actor). Its reply is the entry ids."""
    args: list[Any] = [recorder]
    for entry in entries:
        args.extend(entry)
    store.queue_script(pipe, "audit_record", args)
