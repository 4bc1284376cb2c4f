"""A spawn whose subagent is archived between its creation and its first turn: the subagent
has no work yet, so an archive without ``stopActivity`` (one naming it, or a bulk archive
selecting its cwd) may take it. The spawning turn sees a failed tool call and goes on; it is
stopped only when its own lineage was archived."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from orchestrator.archiving import archive, bulk
from orchestrator.models.model import ScriptedModel
from orchestrator.session import sessions
from orchestrator.session.sessions import Session
from orchestrator.storage.store import Store
from orchestrator.turn import steps, tools, turns
from orchestrator.turn.turns import TurnState
from tests.helpers import RecordingDispatcher


def step(store: Store, recorder: RecordingDispatcher, sid: str, tid: str, index: int) -> str:
    return steps.run_step(store, recorder, ScriptedModel(), tools.run_tool, sid, tid, index)


def tool_results(store: Store, sid: str) -> list[dict[str, Any]]:
    """The session's ``tool_call_update`` updates, oldest first."""
    updates = sessions.conversation(store, sid)
    return [u for u in updates if u.get("sessionUpdate") == "tool_call_update"]


def archive_after_creation(
    monkeypatch: pytest.MonkeyPatch, then: Callable[[Session], None]
) -> list[Session]:
    """Make the spawn tool's ``create_session`` run ``then(child)`` right after it stores the
    child: the gap before its first turn, where another request's archive can land."""
    made: list[Session] = []
    real = sessions.create_session

    def creating(*args: Any, **kwargs: Any) -> Session:
        child = real(*args, **kwargs)
        made.append(child)
        then(child)
        return child

    monkeypatch.setattr(tools, "create_session", creating)
    return made


def test_a_subagent_archived_alone_before_its_first_turn_fails_the_spawn_and_the_turn_goes_on(
    store: Store, recorder: RecordingDispatcher, cwd: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a parent turn whose first step spawns a subagent, and a bulk archive by the cwd
    # (no stopActivity) landing between the subagent's creation and its first turn
    parent = sessions.create_session(store, cwd).session_id
    tid = turns.start_turn(store, recorder, parent, "spawn say c\nsay done")
    selected: list[Any] = []
    made = archive_after_creation(
        monkeypatch,
        lambda child: selected.append(
            bulk.bulk_archive(store, recorder, flt=bulk.BulkFilter(cwd=cwd)).to_wire()
        ),
    )
    # When the step runs
    step(store, recorder, parent, tid, 0)
    # Then the bulk archived the idle subagent only (the parent was busy: refused)
    [child] = made
    outcomes = {r["sessionId"]: r["outcome"] for r in selected[0]["results"]}
    assert outcomes == {parent: "refused", child.session_id: "archived"}
    assert sessions.get_session(store, child.session_id).archived
    assert not sessions.get_session(store, parent).archived
    # And nothing ran in it: it holds no turn
    assert store.redis.zcard(store.keys.live_turns(child.session_id)) == 0
    # And the spawn's tool call settled failed, saying why, while the parent turn runs on
    settled = tool_results(store, parent)
    assert [u["status"] for u in settled] == ["failed"]
    text = settled[0]["content"][0]["content"]["text"]
    assert child.session_id in text and "archived before its first turn began" in text
    assert turns.get_turn(store, tid).state is TurnState.RUNNING  # type: ignore[union-attr]
    # And its next step completes it
    step(store, recorder, parent, tid, 1)
    done = turns.get_turn(store, tid)
    assert done is not None and done.state is TurnState.COMPLETED and not done.cancelled_by


def test_a_spawn_whose_own_lineage_is_archived_meanwhile_stops_with_the_turn(
    store: Store, recorder: RecordingDispatcher, cwd: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given the same spawn, and an archive with stopActivity of the parent in the same gap
    parent = sessions.create_session(store, cwd).session_id
    tid = turns.start_turn(store, recorder, parent, "spawn say c\nsay done")
    made = archive_after_creation(
        monkeypatch, lambda child: archive.archive(store, recorder, parent, stop_activity=True)
    )
    # When the step runs
    step(store, recorder, parent, tid, 0)
    # Then the subagent went with its parent's archive, ran nothing, and the parent turn
    # ends as the archive ended it; no failed tool result lands after the archive
    [child] = made
    assert sessions.get_session(store, child.session_id).archived
    assert store.redis.zcard(store.keys.live_turns(child.session_id)) == 0
    ended = turns.get_turn(store, tid)
    assert ended is not None and ended.state is TurnState.CANCELLED
    assert ended.cancelled_by == "archive"
    assert "failed" not in [u["status"] for u in tool_results(store, parent)]
