"""A blank prompt (empty or only whitespace) is refused with invalid_params everywhere a
person prompts (the domain, REST, the CLI), and nothing is stored."""

from __future__ import annotations

from typing import Any

import pytest
from typer.testing import CliRunner

from api.cli import app
from orchestrator.errors import InvalidParams
from orchestrator.session import sessions
from orchestrator.turn import turns
from tests.helpers import error_shape, rest_client

BLANKS = ["", "   ", "\n\t \n"]


@pytest.mark.parametrize("text", BLANKS)
def test_the_domain_refuses_a_blank_prompt(store: Any, recorder: Any, text: str) -> None:
    sid = sessions.create_session(store, "/tmp").session_id
    with pytest.raises(InvalidParams) as raised:
        turns.start_turn(store, recorder, sid, text)
    assert raised.value.data == {"param": "prompt"} and "empty" in raised.value.message
    assert recorder.sent == []


@pytest.mark.parametrize("text", BLANKS)
def test_rest_refuses_a_blank_prompt(text: str) -> None:
    with rest_client() as client:
        sid = client.post("/sessions", json={"cwd": "/tmp"}).json()["sessionId"]
        resp = client.post(f"/sessions/{sid}/prompt", json={"prompt": text})
        error = error_shape(resp, 422, "invalid_params")
        assert "empty" in error["message"], error


def test_the_cli_refuses_a_blank_prompt(store: Any) -> None:
    sid = sessions.create_session(store, "/tmp").session_id
    result = CliRunner().invoke(app, ["prompt", sid, "  ", "--detach"])
    assert result.exit_code == 2, result.output
    assert "empty" in result.output and "Traceback" not in result.output, result.output
