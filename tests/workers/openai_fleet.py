"""What the ``openai`` model's worker tests share: a fleet of real turn, job and reminder
workers on the ``openai`` model, pointed at a fixture server of the tests' own
(``tests/openai_server.py`` replaying ``tests/fixtures/openai``), and helpers to start a turn
on a fixture and read what it did."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from orchestrator.families import Family
from orchestrator.session.sessions import create_session
from orchestrator.turn.turns import get_turn, start_turn
from tests.faults.fleets import PrivateFleet, private_fleet
from tests.helpers import wait_for
from tests.openai_server import Served
from tests.workers.support import history

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "openai"


@contextlib.contextmanager
def openai_fleet(
    redis_url: str,
    key_prefix: str,
    tmp_path_factory: Any,
    name: str,
    server: Served,
    max_steps: int,
    retries: int,
    **env: str,
) -> Iterator[PrivateFleet]:
    """Turn, job and reminder workers on the ``openai`` model of ``server`` (at most
    ``max_steps`` steps a turn, ``retries`` retries a request; ``env`` on top)."""
    env = {
        "FLEET_MODEL": "openai",
        "OPENAI_BASE_URL": server.base_url,
        "OPENAI_API_KEY": "test-key",
        "FLEET_OPENAI_MODEL": "plain",
        "FLEET_OPENAI_MAX_RETRIES": str(retries),
        "FLEET_MAX_TURN_REQUESTS": str(max_steps),
        **env,
    }
    families = [Family.TURN, Family.JOB, Family.REMINDER]
    with private_fleet(redis_url, key_prefix, tmp_path_factory, name, families, env) as fleet:
        yield fleet


def new_turn(private: PrivateFleet, tmp_path: Path, model: str) -> tuple[str, str, str]:
    """A new session on ``model`` and a turn with a prompt of its own: (sid, tid, prompt)."""
    sid = create_session(private.store, str(tmp_path), model=model).session_id
    prompt = f"{model} task {uuid.uuid4().hex[:8]}"
    return sid, start_turn(private.store, private.dispatcher, sid, prompt), prompt


def ended(private: PrivateFleet, tid: str, timeout: float = 30.0) -> Any:
    """The turn once it is final (fails the test after ``timeout`` s)."""
    final = ("completed", "failed", "cancelled", "blocked")
    return wait_for(
        lambda: (t := get_turn(private.store, tid)) is not None and t.state in final and t,
        timeout,
        message=f"turn {tid} to end",
    )


def updates_of(private: PrivateFleet, sid: str, tid: str, kind: str) -> list[dict[str, Any]]:
    """The turn's stored updates of one ``sessionUpdate`` kind."""
    return [
        u for u in history(private.store, sid) if u["turnId"] == tid and u["sessionUpdate"] == kind
    ]


def said(private: PrivateFleet, sid: str, tid: str) -> str:
    """The text the turn said (its ``agent_message_chunk`` s joined)."""
    return "".join(
        u["content"]["text"] for u in updates_of(private, sid, tid, "agent_message_chunk")
    )


def result_text(update: dict[str, Any]) -> str:
    """A ``tool_call_update``'s text."""
    return str(update["content"][0]["content"]["text"])
