"""Bad command-line values get a usage error naming the option (exit 2, no traceback), and
messages say what is wrong, not something else."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from api.cli import app

runner = CliRunner()


@pytest.fixture(autouse=True)
def _wide_console(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "300")


def _said(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args))
    output = " ".join(result.output.split())
    assert "Traceback" not in output, output
    return result.exit_code, output


@pytest.mark.parametrize(
    "args",
    [
        ("flower", "--port", "99999"),
        ("flower", "--port", "0"),
        ("flower", "--port", "-1"),
        ("api", "--port", "70000"),
        ("api", "--port", "-5"),
    ],
)
def test_a_port_out_of_range_is_a_usage_error(args: tuple[str, ...]) -> None:
    code, said = _said(*args)
    assert code == 2, said
    assert "Invalid value for '--port'" in said, said


def test_a_malformed_confirmed_item_is_named_not_blamed_on_a_missing_stop() -> None:
    sid = "sess_" + "0" * 24
    code, said = _said("archive", sid, "--stop", "--confirmed", "bogus")
    assert code == 2, said
    assert "needs --stop" not in said, said
    assert "FAMILY:ID" in said and "'bogus'" in said, said
    code, said = _said("archive", sid, "--confirmed", "turn:turn_1")
    assert code == 2 and "--confirmed needs --stop" in said, said


@pytest.mark.parametrize("command", ["archive", "delete"])
def test_a_confirmed_item_of_no_family_is_invalid_not_activity_changed(command: str) -> None:
    sid = "sess_" + "0" * 24
    code, said = _said(command, sid, "--stop", "--confirmed", "bogus:x")
    assert code == 2, said
    assert "invalid_params" in said and "'bogus:x' names no family" in said, said
    assert "turn, job, subagent, reminder" in said and "activity_changed" not in said, said


@pytest.mark.parametrize("command", [("auto-archive",), ("archive", "--auto")])
def test_a_negative_idle_age_is_refused_naming_the_flag(command: tuple[str, ...]) -> None:
    code, said = _said(*command, "--idle-seconds", "-5", "--dry-run")
    assert code == 2, said
    assert "Invalid value for '--idle-seconds'" in said, said
    assert "FLEET_" not in said, said


def _fleet_with_redis(url: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    env.update(FLEET_REDIS_URL=url, COLUMNS="300")
    proc = subprocess.run(
        [sys.executable, "-m", "api.cli", "sessions", "ls"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    said = " ".join(proc.stderr.split())
    assert proc.returncode == 2 and "Traceback" not in said, said
    return said


def test_a_bad_db_index_is_a_configuration_error_not_a_retry() -> None:
    said = _fleet_with_redis("redis://127.0.0.1:6379/99")
    assert "DB index is out of range" in said, said
    assert "Try again" not in said and "FLEET_REDIS_URL" in said, said


def test_a_refused_connection_says_so_once_without_a_double_period() -> None:
    said = _fleet_with_redis(f"redis://127.0.0.1:{_closed_port()}/0")
    assert "Connection refused" in said and "Try again shortly" in said, said
    assert ".." not in said, said


def test_a_sentinel_without_a_primary_is_one_short_line() -> None:
    said = _fleet_with_redis(f"sentinel://127.0.0.1:{_closed_port()}")
    assert "MasterNotFoundError" in said and "No master found for 'mymaster'" in said, said
    assert "ConnectionPool" not in said and len(said) < 300, said


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_store_error_ending_in_a_period_gets_no_second_one() -> None:
    import redis

    from orchestrator.errors import StoreUnavailable
    from orchestrator.storage.redisconn import store_unavailable

    refused = redis.ConnectionError("Error 111 connecting to 127.0.0.1:1. Connection refused.")
    for message in (store_unavailable(refused).message, StoreUnavailable(str(refused)).message):
        assert ".." not in message, message
        assert message.endswith(("refused). Try again shortly.", "refused. Try again shortly."))


def test_sweep_refuses_a_negative_stuck_age() -> None:
    code, said = _said("sweep", "--stuck-seconds", "-1")
    assert code == 2 and "Invalid value for '--stuck-seconds'" in said, said


def test_a_session_in_a_directory_missing_here_is_kept_with_a_note(tmp_path: Path) -> None:
    missing = str(tmp_path / "not" / "here")
    result = runner.invoke(app, ["sessions", "new", missing])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip().startswith("sess_"), result.stdout  # the id alone, for scripts
    note = " ".join(result.stderr.split())
    assert f"note: {missing} is not a directory on this machine" in note, note
    assert "worker's host" in note, note
    present = runner.invoke(app, ["sessions", "new", str(tmp_path)])
    assert present.exit_code == 0 and "note:" not in present.output, present.output


def test_a_setting_out_of_range_is_one_line_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FLEET_API_PORT", "99999")
    code, said = _said("api")
    assert code == 2, said
    assert "FLEET_API_PORT" in said and "65535" in said, said


#: Every numeric option, and what Python's int() or float() would have taken for it.
_NUMBER_OPTIONS = [
    (("audit", "--limit"), ["1_0", "+5", " 5", "5 ", "0", "1001", "x", "١٢"]),
    (("sessions", "show", "sess_" + "0" * 24, "--limit"), ["1_0", "0", "2.5"]),
    (("worker", "--family", "turn", "--concurrency"), ["-1", "1_0", "8.0"]),
    (("up", "--hosts"), ["0", "1e2"]),
    (("api", "--port"), ["80_80", "+80"]),
    (("flower", "--port"), ["5_555"]),
    (("sweep", "--stuck-seconds"), ["inf", "nan", "1e3", "-0.5", "1_0", "1e400", "2000000000"]),
    (("auto-archive", "--dry-run", "--idle-seconds"), ["nan", "inf", "1e400", "3_600"]),
    (("archive", "--auto", "--dry-run", "--idle-seconds"), ["nan", "Infinity"]),
    (("beat", "--idle-seconds"), ["nan", "-1"]),
    (("beat", "--interval"), ["inf", "1e9x"]),
]


@pytest.mark.parametrize(
    ("command", "value"),
    [(command, value) for command, values in _NUMBER_OPTIONS for value in values],
    ids=lambda v: " ".join(v) if isinstance(v, tuple) else repr(v),
)
def test_a_number_option_is_read_strictly_and_refused_naming_the_option(
    command: tuple[str, ...], value: str
) -> None:
    code, said = _said(*command, value)
    assert code == 2, said
    assert f"Invalid value for '{command[-1]}'" in said, said


@pytest.mark.parametrize(
    ("command", "value"),
    [
        (("auto-archive", "--dry-run", "--idle-seconds"), "2.5"),
        (("auto-archive", "--dry-run", "--idle-seconds"), "5."),
        (("auto-archive", "--dry-run", "--idle-seconds"), ".5"),
        (("audit", "--limit"), "7"),
    ],
)
def test_a_plain_number_is_still_taken(command: tuple[str, ...], value: str) -> None:
    code, said = _said(*command, value)
    assert code == 0, said


def test_a_bad_number_with_json_is_a_json_error() -> None:
    result = runner.invoke(app, ["audit", "--limit", "1_0", "--json"])
    assert result.exit_code == 2, result.output
    assert '"code": "invalid_params"' in result.output and "'--limit'" in result.output


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("FLEET_TURN_STUCK_SECONDS", "inf"),
        ("FLEET_TURN_STUCK_SECONDS", "nan"),
        ("FLEET_JOB_FREEZE_MAX_SECONDS", "1e300"),
        ("FLEET_JOB_LEASE_SECONDS", "0"),
        ("FLEET_MAX_JOBS_PER_HOST", "-3"),
    ],
)
def test_a_duration_or_count_setting_out_of_range_names_the_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    from api import context
    from orchestrator.settings import get_settings

    def read_afresh() -> None:
        for cached in (get_settings, context.settings, context.store):
            cached.cache_clear()

    monkeypatch.setenv(variable, value)
    read_afresh()
    try:
        code, said = _said("sweep", "--json")
    finally:
        monkeypatch.delenv(variable)
        read_afresh()
    assert code == 2, said
    assert variable in said, said


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_a_tool_setting_naming_an_unknown_tool_is_refused_naming_it_and_the_known_ones(
    monkeypatch: pytest.MonkeyPatch, as_json: bool
) -> None:
    from api import context
    from orchestrator.settings import get_settings

    def read_afresh() -> None:
        for cached in (get_settings, context.settings, context.store):
            cached.cache_clear()

    monkeypatch.setenv("FLEET_TOOLS", "shell, shel,set_reminder")
    read_afresh()
    try:
        code, said = _said("sweep", *(["--json"] if as_json else []))
    finally:
        monkeypatch.delenv("FLEET_TOOLS")
        read_afresh()
    assert code == 2, said
    assert "invalid_params" in said, said
    assert "FLEET_TOOLS: unknown tool 'shel' (the tools are shell, start_job, " in said, said
    if as_json:
        assert '"code": "invalid_params"' in said, said
    else:
        assert said.startswith("error (invalid_params): FLEET_TOOLS: "), said


@pytest.mark.parametrize("value", ["", "shell", " shell , start_job ", "set_reminder,shell"])
def test_a_tool_setting_naming_known_tools_or_none_is_taken(value: str) -> None:
    from orchestrator.settings import FleetSettings

    assert FleetSettings(tools=value).tools == value


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["nonexistent", "--json"], "No such command 'nonexistent'."),
        (
            ["sessons", "ls", "--json"],
            "No such command 'sessons'. Did you mean 'sessions', 'permissions'?",
        ),
        (["sessions", "nope", "--json"], "No such command 'nope'."),
        (["--json"], "No such option: --json"),
        (["sessions", "--json"], "No such option: --json"),
        (["--bogus", "sessions", "ls", "--json"], "No such option: --bogus"),
        (["unarchive", "--json"], "Missing argument 'session_id'."),
        (["sessions", "ls", "--bogus", "--json"], "No such option: --bogus"),
        (["sessions", "ls", "--json=1"], "Option '--json' does not take a value."),
        (["sessions", "ls", "--json="], "Option '--json' does not take a value."),
        (["archive", "--json=true"], "Option '--json' does not take a value."),
    ],
)
def test_a_usage_error_with_json_is_a_json_error_on_stdout(args: list[str], message: str) -> None:
    import json

    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert json.loads(result.stdout) == {
        "error": {"code": "invalid_params", "message": message, "data": {}}
    }, result.stdout


def test_a_usage_error_without_json_keeps_the_usage_text() -> None:
    result = runner.invoke(app, ["nonexistent"])
    assert result.exit_code == 2, result.output
    said = " ".join(result.output.split())
    assert "Usage: " in said and "No such command 'nonexistent'." in said, said
    assert '"error"' not in said, said
    # --json after "--" is an argument, not the option: the usage text too.
    assert '"error"' not in runner.invoke(app, ["nonexistent", "--", "--json"]).output
    assert '"error"' not in runner.invoke(app, ["nonexistent", "--", "--json=1"]).output


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_the_api_on_a_port_in_use_is_refused_naming_the_port(host: str) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        code, said = _said("api", "--host", host, "--port", str(port))
    assert code == 2, said  # uvicorn's own failure: a log line and exit 3
    assert f"error (invalid_params): port {port} on {host} is in use" in said, said
    assert "--port or FLEET_API_PORT" in said, said


def test_fleet_up_refuses_an_api_port_in_use_before_starting_anything(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        env.update(FLEET_API_PORT=str(port), FLEET_STATE_DIR=str(tmp_path), COLUMNS="300")
        proc = subprocess.run(
            [sys.executable, "-m", "api.cli", "up"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
    said = " ".join(proc.stderr.split())
    assert proc.returncode == 2, said
    assert f"port {port} on 127.0.0.1 is in use" in said and "FLEET_API_PORT" in said, said
    assert proc.stdout == "" and "Traceback" not in said, proc.stdout
    assert not (tmp_path / "fleet.json").exists()


def test_a_control_only_job_worker_is_refused_naming_the_families_that_can_have_one() -> None:
    # A job's stop must run in the worker holding the job's process on its host.
    code, said = _said("worker", "--family", "job", "--control")
    assert code == 2, said
    assert "--control" in said and "host" in said, said
    assert "turn, subagent, reminder" in said, said
