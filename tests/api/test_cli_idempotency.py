"""``--idempotency-key`` of ``fleet sessions new`` and ``fleet prompt`` (in process against the
real test Redis); the retry of a lost reply is in ``tests/faults/test_lost_write_reply.py``."""

from __future__ import annotations

import json
import uuid

from click.testing import Result
from typer.testing import CliRunner

from api.cli import app
from orchestrator import sessions
from orchestrator.store import Store

runner = CliRunner()


def _run(*args: str) -> Result:
    result = runner.invoke(app, list(args), env={"COLUMNS": "300"})
    assert "Traceback" not in result.output, result.output
    return result


def test_sessions_new_with_a_key_given_twice_creates_one_session(store: Store) -> None:
    cwd, key = f"/tmp/fleet-cli-idem/{uuid.uuid4().hex}", str(uuid.uuid4())
    first = _run("sessions", "new", cwd, "--idempotency-key", key)
    again = _run("sessions", "new", cwd, "--idempotency-key", key)
    assert first.exit_code == again.exit_code == 0, first.output + again.output
    assert first.stdout == again.stdout
    [made] = sessions.list_sessions(store, cwd=cwd).sessions
    assert first.stdout.strip() == made.session_id


def test_prompt_with_a_key_given_twice_starts_one_turn(store: Store) -> None:
    sid = sessions.create_session(store, f"/tmp/fleet-cli-idem/{uuid.uuid4().hex}").session_id
    key = str(uuid.uuid4())
    first = _run("prompt", sid, "say hi", "--detach", "--idempotency-key", key)
    again = _run("prompt", sid, "say hi", "--detach", "--idempotency-key", key)
    assert first.exit_code == again.exit_code == 0, first.output + again.output
    assert first.stdout == again.stdout
    other = _run("prompt", sid, "say ho", "--detach", "--idempotency-key", key, "--json")
    assert other.exit_code == 2
    assert json.loads(other.stdout)["error"]["code"] == "idempotency_key_reused"


def test_a_malformed_key_is_refused_before_anything_is_written(store: Store) -> None:
    cwd = f"/tmp/fleet-cli-idem/{uuid.uuid4().hex}"
    result = _run("sessions", "new", cwd, "--idempotency-key", "has space", "--json")
    assert result.exit_code == 2
    assert json.loads(result.stdout)["error"]["code"] == "invalid_idempotency_key"
    assert sessions.list_sessions(store, cwd=cwd).sessions == []
