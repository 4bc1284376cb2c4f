"""The console's view of a session run by an external agent (the project's tiny ACP agent on
a private fleet of turn workers): it names the agent, and a permission request waiting for a
person is shown with the agent's options and answered there."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.agents import permissions
from orchestrator.turn.turns import get_turn
from tests.agents.fleet_support import agent_fleet, agents_toml
from tests.console.test_console import SHOTS, TOKEN, Server, browser, page
from tests.helpers import wait_for

__all__ = ["browser", "page"]

pytestmark = [pytest.mark.redis, pytest.mark.integration]


@pytest.fixture(scope="module")
def agents(
    redis_url: str, key_prefix: str, tmp_path_factory: Any
) -> Iterator[tuple[Any, Any, Server]]:
    with agent_fleet(redis_url, key_prefix, tmp_path_factory, "consoleagents", agents_toml()) as (
        private,
        store,
    ):
        saved = os.environ.get("FLEET_AGENTS_FILE")
        os.environ["FLEET_AGENTS_FILE"] = str(store.settings.agents_file)
        try:
            server = Server(
                store.keys.prefix, TOKEN, tmp_path_factory.mktemp("console-agents") / "api.log"
            )
        finally:
            if saved is None:
                os.environ.pop("FLEET_AGENTS_FILE", None)
            else:
                os.environ["FLEET_AGENTS_FILE"] = saved
        try:
            yield private, store, server
        finally:
            server.stop()


def test_the_session_view_names_the_agent_and_answers_its_permission_request(
    agents: tuple[Any, Any, Server], page: Any, tmp_path: Path
) -> None:
    private, store, server = agents
    marker = tmp_path / "allowed-in-the-console"
    sid = server.ok("POST", "/sessions", {"cwd": str(tmp_path), "agent": "tiny-ask"})["sessionId"]
    page.goto(f"{server.base}/console#/session/{sid}")
    card = page.locator(f'#detail .card[data-session-id="{sid}"]')
    card.wait_for()
    assert card.locator("#detail-agent").inner_text() == "tiny-ask"

    # When the agent asks before a command
    turn = server.ok("POST", f"/sessions/{sid}/prompt", {"prompt": f"run: touch {marker}"})
    asked = card.locator("#permissions .asks li")
    asked.wait_for()
    assert "The agent asks to run" in asked.inner_text()
    page.screenshot(path=str(SHOTS / "agent-permission.png"))

    # And the person allows it in the console
    asked.get_by_role("button", name="Allow").click()

    # Then the command ran, the turn ended and the request is gone from the view
    wait_for(lambda: marker.exists(), 20, message="the allowed command to run")
    wait_for(
        lambda: (t := get_turn(store, turn["turnId"])) is not None and t.state == "completed",
        20,
        message="the turn to end",
    )
    card.locator("#permissions .asks").wait_for(state="detached")
    assert permissions.pending(store, sid) == []
