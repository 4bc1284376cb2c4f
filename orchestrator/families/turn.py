"""The ``turn`` family: a running or queued turn (a chain of model steps)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.families.base import Dispatcher, Family, Task, send_step
from orchestrator.families.registry import FamilySpec, register
from orchestrator.items import ActivityItem, shorten

if TYPE_CHECKING:
    from orchestrator.storage.store import Store

log = logging.getLogger(__name__)


def _item(sid: str, tid: str, fields: list[str | None]) -> ActivityItem:
    state, prompt = fields
    return ActivityItem(Family.TURN, tid, f'turn "{shorten(prompt or "")}" ({state})', sid)


def _settle(store: Store, dispatcher: Dispatcher | None, sid: str, tids: list[str]) -> None:
    """A turn left ``cancelling`` by a dead worker ends ``cancelled``; settled only with a
    dispatcher, since the session's next queued turn may then start (its first step is sent)."""
    if dispatcher is None:
        return
    from orchestrator.states import TurnState
    from orchestrator.storage.store import iso
    from orchestrator.turn.scripts import Finished, turn_finish

    ms = store.now_ms()
    for tid in tids:
        result = turn_finish(
            store,
            turn_id=tid,
            state=TurnState.CANCELLED,
            stop_reason="cancelled",
            error="",
            allowed_from=TurnState.CANCELLING.value,
            now_ms=ms,
            now_iso=iso(ms),
        )
        log.info(
            "turn %s: settled as cancelled (its worker is gone)",
            tid,
            extra={"session_id": sid, "turn_id": tid},
        )
        if isinstance(result, Finished) and result.promoted:
            send_step(dispatcher, sid, result.promoted, 0)


def _stop_here(store: Store, dispatcher: Dispatcher, sid: str, entries: list[Any]) -> str:
    from orchestrator.turn.turns import cancel_turns

    done = cancel_turns(store, dispatcher, sid, [t for t in entries if isinstance(t, str)])
    return f"{len(done)} turn(s) cancelled"


def _from_plan(sid: str, entry: Any) -> ActivityItem | None:
    return ActivityItem(Family.TURN, entry, "", sid) if isinstance(entry, str) else None


SPEC = register(
    FamilySpec(
        name=Family.TURN,
        display="turn",
        plural="turns",
        task_module="workers.tasks.turn",
        stop_task=Task.TURN_STOP,
        stop_many_task=Task.TURN_STOP_MANY,
        work_queue="turn",
        lua=Path(__file__).with_name("turn.lua"),
        item=_item,
        settle=_settle,
        from_plan=_from_plan,
        stop_here=_stop_here,
        status="turn running",
    )
)
