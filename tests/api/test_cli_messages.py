"""Bad command-line values get a usage error naming the option (exit 2, no traceback), and
messages say what is wrong, not something else."""

from __future__ import annotations

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


@pytest.mark.parametrize("command", [("auto-archive",), ("archive", "--auto")])
def test_a_negative_idle_age_is_refused_naming_the_flag(command: tuple[str, ...]) -> None:
    code, said = _said(*command, "--idle-seconds", "-5", "--dry-run")
    assert code == 2, said
    assert "Invalid value for '--idle-seconds'" in said, said
    assert "FLEET_AUTO_ARCHIVE_IDLE_SECONDS" not in said, said
