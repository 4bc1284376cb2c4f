"""A session's conversation as chat messages, the form a model step sees it in.

The conversation is stored as ACP ``session/update`` payloads (``Keys.history``): prompts
(``user_message_chunk``), said text (``agent_message_chunk``, several chunks per answer),
tool calls (``tool_call``, carrying the tool's name in ``_meta.agentFleet.tool`` and its
arguments in ``rawInput``) and their results (``tool_call_update``). ``messages`` folds them
into ``Message`` s: consecutive chunks make one message, an assistant's tool calls join its
text, and a tool call that never got a result (its turn was stopped) answers
``(no result: the turn was stopped)``, so every call has its result, as chat APIs require.
"""

from __future__ import annotations

import json
from typing import Any

from orchestrator import untrusted
from orchestrator.models.model import Message, Role, ToolCall
from orchestrator.storage.store import Store, retried

#: Most stored updates a step reads (the latest ones).
MAX_UPDATES = 2000
_NO_RESULT = "(no result: the turn was stopped)"


@retried
def _tail(store: Store, session_id: str) -> list[str]:
    found: list[str] = store.redis.lrange(store.keys.history(session_id), -MAX_UPDATES, -1)
    return found


def conversation(store: Store, session_id: str) -> list[Message]:
    """The session's conversation (its last ``MAX_UPDATES`` updates) as messages, oldest
    first. Raises ``StoreUnavailable``."""
    return messages(untrusted.stored_updates(_tail(store, session_id)))


def _text(content: Any) -> str:
    if isinstance(content, dict):
        return str(content.get("text", ""))
    if isinstance(content, list):  # tool-call content: [{"type": "content", "content": {...}}]
        return "".join(_text(c.get("content")) for c in content if isinstance(c, dict))
    return ""


def _call(update: dict[str, Any]) -> ToolCall:
    meta = (update.get("_meta") or {}).get("agentFleet") or {}
    raw = update.get("rawInput", {})
    arguments = raw if isinstance(raw, str) else json.dumps(raw)
    return ToolCall(str(meta.get("tool", "")), arguments, str(update.get("toolCallId", "")))


class _Folder:
    def __init__(self) -> None:
        self.out: list[Message] = []
        self.pending: list[str] = []  # calls of the last assistant message with no result yet

    def settle_pending(self) -> None:
        for call_id in self.pending:
            self.out.append(Message(Role.TOOL, _NO_RESULT, call_id=call_id))
        self.pending = []

    def add(self, update: dict[str, Any]) -> None:
        kind = update.get("sessionUpdate")
        last = self.out[-1] if self.out else None
        if kind == "user_message_chunk":
            self.settle_pending()
            self.out.append(Message(Role.USER, _text(update.get("content"))))
        elif kind == "agent_message_chunk":
            text = _text(update.get("content"))
            if last is not None and last.role is Role.ASSISTANT and not last.tool_calls:
                self.out[-1] = Message(Role.ASSISTANT, last.text + text)
            else:
                self.settle_pending()
                self.out.append(Message(Role.ASSISTANT, text))
        elif kind == "tool_call":
            call = _call(update)
            if last is not None and last.role is Role.ASSISTANT:
                self.out[-1] = Message(Role.ASSISTANT, last.text, (*last.tool_calls, call))
            else:
                self.settle_pending()
                self.out.append(Message(Role.ASSISTANT, "", (call,)))
            self.pending.append(call.call_id)
        elif kind == "tool_call_update" and update.get("toolCallId") in self.pending:
            call_id = str(update["toolCallId"])
            self.pending.remove(call_id)
            result = _text(update.get("content")) or str(update.get("status", ""))
            self.out.append(Message(Role.TOOL, result, call_id=call_id))


def messages(updates: list[dict[str, Any]]) -> list[Message]:
    """Fold stored ``session/update`` payloads (oldest first) into chat messages (see the
    module docstring); updates of other kinds are skipped."""
    folder = _Folder()
    for update in updates:
        if isinstance(update, dict):
            folder.add(update)
    folder.settle_pending()
    return folder.out
