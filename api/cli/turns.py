"""``fleet prompt``: start a turn and follow it to its end.

Following reads the session's conversation (the history list ACP ``session/load`` replays)
from where the turn began, woken by the fleet's event channel, and prints the turn's updates
as they are recorded; it returns when the turn is in a final state. Exit status: 0 when the
turn completed, 1 when it failed, was cancelled or blocked by the gate (the reason on
stderr: ``session archived`` for a turn an archive stopped, ``session deleted`` for one a
delete stopped), 2 when it was refused before it
started, 130 when following was interrupted (Ctrl-C; the turn goes on).
"""

from __future__ import annotations

import json
from typing import Any

import typer
from rich.text import Text

from api.cli.common import app, console, err, printable
from api.cli.keyed import KEY_OPTION, keyed_write
from orchestrator import untrusted
from orchestrator.storage.store import Store
from orchestrator.turn.turns import (
    CANCELLED_BY_ARCHIVE,
    CANCELLED_BY_DELETE,
    LIVE_STATES,
    Turn,
    TurnState,
    get_turn,
)

#: Longest wait between two reads of the conversation when no event arrives (seconds).
_WAKE_SECONDS = 0.5


def _tool_text(update: dict[str, Any]) -> str:
    parts = []
    for block in update.get("content") or []:
        inner = block.get("content", block) if isinstance(block, dict) else {}
        if isinstance(inner, dict) and inner.get("type") == "text":
            parts.append(str(inner.get("text", "")))
    return " ".join(parts)


def _shown(text: object) -> str:
    """Text a model or an agent wrote, as printed: its lines kept, every other character
    that is not printable escaped (``printable``), so it cannot drive the terminal."""
    return "\n".join(printable(line) for line in str(text).split("\n"))


def _permission_line(permission: dict[str, Any]) -> str:
    rid = printable(str(permission.get("requestId", "")))
    if permission.get("state") == "pending":
        options = ", ".join(
            printable(f"{o.get('optionId')} ({o.get('kind')})")
            for o in permission.get("options") or []
            if isinstance(o, dict)
        )
        return f"   ? permission asked ({rid}): {options}"
    return f"   permission {rid}: {printable(str(permission.get('outcome', '')))}"


def render_update(update: dict[str, Any], *, prompts: bool = False) -> str:
    """One line for an ACP ``session/update`` payload ('' for a kind not shown): the agent's
    text, a tool call as ``-> title``, its outcome as ``   status: text``, a permission
    request and its answer; with ``prompts`` the user's prompt as ``> text``. What a model
    or an agent wrote is printed with its control characters escaped."""
    kind = update.get("sessionUpdate")
    content = update.get("content")
    text = content.get("text", "") if isinstance(content, dict) else ""
    if kind == "agent_message_chunk":
        return _shown(text)
    if kind == "user_message_chunk":
        return "> " + _shown(text).replace("\n", "\n> ") if prompts else ""
    if kind == "tool_call":
        return f"-> {_shown(update.get('title', 'tool'))}"
    if kind == "tool_call_update":
        permission = ((update.get("_meta") or {}).get("agentFleet") or {}).get("permission")
        if isinstance(permission, dict):
            return _permission_line(permission)
        if not update.get("status"):
            return ""
        detail = _shown(_tool_text(update))
        return f"   {update.get('status', '')}" + (f": {detail}" if detail else "")
    return ""


class Transcript:
    """Prints a conversation's updates as a person reads them: an agent's message as one
    text however many chunks it streamed in (each printed as it comes, no line break between
    them), every other update on a line of its own (``render_update``)."""

    def __init__(self, *, prompts: bool = False) -> None:
        self.prompts = prompts
        self._in_message = False

    def add(self, update: dict[str, Any]) -> None:
        """Print one update."""
        line = render_update(update, prompts=self.prompts)
        if update.get("sessionUpdate") == "agent_message_chunk":
            if line:
                console.print(line, end="", highlight=False, soft_wrap=True)
                self._in_message = True
            return
        if not line:
            return
        self.end()
        console.print(line, highlight=False)

    def end(self) -> None:
        """End the message being printed, if one is (its last line)."""
        if self._in_message:
            console.print("")
            self._in_message = False


def follow(store: Store, session_id: str, turn_id: str, as_json: bool, start: int = 0) -> Turn:
    """Print the turn's updates as they are recorded (JSON lines with ``as_json``), reading
    the conversation from index ``start``, until it ends;
    return the ended turn. Raises ``StoreUnavailable`` or ``redis.RedisError``."""
    history = store.keys.history(session_id)
    pubsub = store.redis.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(store.keys.events)
    seen = start
    transcript = Transcript()
    try:
        while True:
            turn = get_turn(store, turn_id)
            found = store.redis.lrange(history, seen, -1)
            seen += len(found)
            for update in untrusted.stored_updates(found):
                if update.get("turnId") != turn_id:
                    continue
                if as_json:
                    print(json.dumps(update), flush=True)
                else:
                    transcript.add(update)
            if turn is not None and turn.state not in LIVE_STATES:
                transcript.end()
                return turn
            pubsub.get_message(timeout=_WAKE_SECONDS)
            while pubsub.get_message(timeout=0):
                pass
    finally:
        pubsub.close()


def _start_index(store: Store, session_id: str) -> int:
    return int(store.redis.llen(store.keys.history(session_id)))


@app.command()
def prompt(
    session_id: str = typer.Argument(..., help="The session."),
    text: str = typer.Argument(..., help="Prompt; '\\n' separates scripted instructions."),
    detach: bool = typer.Option(
        False, "--detach", "-d", help="Print the turn id and return at once (do not follow)."
    ),
    as_json: bool = typer.Option(
        False, "--json", help="Print the turn's updates as JSON lines, then the turn."
    ),
    idempotency_key: str | None = KEY_OPTION,
) -> None:
    """Start a turn in a session and follow it: its output is printed as it is recorded and
    the command ends with the turn (exit 0 when it completed, 1 when it failed, was cancelled
    or blocked, with the reason). --detach prints the turn id and returns at once. A lost
    reply is retried with the same idempotency key: the turn runs once."""
    from api.context import dispatcher, store
    from orchestrator.turn.turns import start_turn

    start = 0 if detach else _start_index(store(), session_id)
    said = text.replace("\\n", "\n")
    turn_id = keyed_write(
        lambda key: start_turn(store(), dispatcher(), session_id, said, idempotency_key=key),
        idempotency_key,
    )
    if detach:
        print(json.dumps({"turnId": turn_id}) if as_json else turn_id)
        return
    if not as_json:
        err.print(f"turn {turn_id}", highlight=False)
    try:
        turn = follow(store(), session_id, turn_id, as_json, start)
    except KeyboardInterrupt:
        err.print(
            f"stopped following turn {turn_id}; it goes on (fleet activity {session_id})",
            highlight=False,
        )
        raise typer.Exit(130) from None
    if as_json:
        print(json.dumps(turn.to_wire()))
    if turn.state is TurnState.COMPLETED:
        return
    if not as_json:
        err.print(Text.assemble((f"turn {turn.state.value}", "red"), _reason(turn)))
    raise typer.Exit(1)


#: What ``fleet prompt`` says of a turn an archive or a delete stopped (its ``cancelledBy``).
_STOPPED_BY = {CANCELLED_BY_ARCHIVE: ": session archived", CANCELLED_BY_DELETE: ": session deleted"}


def _reason(turn: Turn) -> str:
    """Why a turn did not complete, as ``fleet prompt`` prints it after the state: the
    archive or delete that stopped it, else its error, else nothing."""
    if turn.state is TurnState.CANCELLED and turn.cancelled_by in _STOPPED_BY:
        return _STOPPED_BY[turn.cancelled_by]
    return f": {turn.error}" if turn.error else ""
