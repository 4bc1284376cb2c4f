"""The models package's door to Redis: one typed function per Lua script beside it
(``usage_add.lua``).

Only this module builds those scripts' ARGV and reads their replies.
"""

from __future__ import annotations

from typing import Any

from orchestrator.storage.store import Store


def queue_usage_add(
    store: Store,
    pipe: Any,
    *,
    session_id: str,
    turn_id: str,
    input_tokens: int,
    output_tokens: int,
) -> None:
    """Queue ``usage_add`` on ``pipe`` (sent by the caller with ``Store.execute``): add a
    model step's token counts to its turn's and its session's totals, only to those that
    exist (nothing is recreated). Its reply is ``1``."""
    store.queue_script(pipe, "usage_add", [session_id, turn_id, input_tokens, output_tokens])
