"""Log formats (``orchestrator/logs.py``): JSON lines that always carry ``session_id``, a
readable text form for terminals, and the choice between them."""

from __future__ import annotations

import io
import json
import logging
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.logs import (
    _SECRETS,
    JsonFormatter,
    TextFormatter,
    configure,
    redact,
    resolve_format,
)
from orchestrator.settings import get_settings


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def _record(msg: str = "hello %s", *args: Any, **extra: Any) -> logging.LogRecord:
    record = logging.LogRecord("orchestrator.test", logging.WARNING, __file__, 1, msg, args, None)
    for key, value in extra.items():
        setattr(record, key, value)
    return record


@pytest.fixture
def root_handlers() -> Iterator[None]:
    """Restores the root logger's handlers and level after a test that calls ``configure``."""
    root = logging.getLogger()
    saved, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        if handler not in saved:
            root.removeHandler(handler)
    root.setLevel(level)


def test_a_json_line_always_has_session_id_even_when_unknown() -> None:
    entry = json.loads(JsonFormatter().format(_record("hello %s", "world")))
    assert entry["message"] == "hello world"
    assert entry["level"] == "WARNING"
    assert entry["logger"] == "orchestrator.test"
    assert entry["session_id"] is None
    assert entry["time"].endswith("Z")
    assert not {"turn_id", "family", "task_id", "exc"} & set(entry)


def test_a_json_line_carries_the_context_it_was_given() -> None:
    record = _record(session_id="sess_1", turn_id="turn_2", family="turn", task_id="t-3")
    entry = json.loads(JsonFormatter().format(record))
    assert {k: entry[k] for k in ("session_id", "turn_id", "family", "task_id")} == {
        "session_id": "sess_1",
        "turn_id": "turn_2",
        "family": "turn",
        "task_id": "t-3",
    }


def test_an_exception_is_one_field_of_one_line() -> None:
    record = _record("stop failed")
    try:
        raise RuntimeError("broker down")
    except RuntimeError:
        record.exc_info = sys.exc_info()
    line = JsonFormatter().format(record)
    assert "\n" not in line
    entry = json.loads(line)
    assert entry["exc"].startswith("Traceback")
    assert "RuntimeError: broker down" in entry["exc"]


def test_the_text_form_is_one_readable_line_with_its_context() -> None:
    line = TextFormatter().format(_record("archived", session_id="sess_1", family="turn"))
    assert line.endswith("WARNING orchestrator.test: archived [session_id=sess_1 family=turn]")
    assert "\n" not in line


@pytest.mark.parametrize(
    ("value", "tty", "expected"),
    [
        ("json", True, "json"),
        ("text", False, "text"),
        (None, True, "text"),
        (None, False, "json"),
        ("", False, "json"),
    ],
)
def test_the_format_is_the_configured_one_else_text_on_a_terminal(
    value: str | None, tty: bool, expected: str
) -> None:
    stream = _Tty() if tty else io.StringIO()
    assert resolve_format(value, stream) == expected


def test_configure_takes_the_format_given_and_replaces_its_own_handler(
    root_handlers: None,
) -> None:
    # Given the json format (as FLEET_LOG_FORMAT=json passes it) and a terminal stream
    first, second = _Tty(), _Tty()
    configure("json", stream=first)
    # When it is configured a second time
    handler = configure("json", stream=second)
    # Then only the second handler is installed, and it writes JSON despite the terminal
    assert sum(1 for h in logging.getLogger().handlers if getattr(h, "_fleet_handler", 0)) == 1
    logging.getLogger("orchestrator.test").info("hi", extra={"session_id": "sess_9"})
    assert first.getvalue() == ""
    entry = json.loads(second.getvalue().splitlines()[-1])
    assert (entry["message"], entry["session_id"]) == ("hi", "sess_9")
    assert isinstance(handler.formatter, JsonFormatter)


def test_a_bad_fleet_log_format_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_LOG_FORMAT", "xml")
    get_settings.cache_clear()
    try:
        with pytest.raises(ValueError, match="log_format"):
            get_settings()
    finally:
        monkeypatch.undo()
        get_settings.cache_clear()


_FRAGMENTS = [
    "token=",
    "&access_token=",
    "?api_key=",
    ";password=",
    "Bearer ",
    "Bearer abc",
    "Basic QWxhZGRpbjpvcGVu",
    "Authorization: xyz",
    "?token=abc",
    "bearer\t",
    "Basic ",
    "QWxhZGRpbjpvcGVu",
    "Authorization: ",
    "authorization=",
    'AUTHORIZATION"',
    "redis://",
    "redis://:pw@host",
    "amqp://u:p@h",
    ":pw@",
    "user:",
    "@host",
    "/path",
    "x",
    " ",
    "'",
    '"',
    "#",
    "é",
]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(_FRAGMENTS), st.text(max_size=6)), max_size=12))
def test_redact_skips_the_patterns_only_where_none_of_them_can_match(parts: list[str]) -> None:
    # Given any text built of credential-like fragments and arbitrary characters
    text = "".join(parts)
    # When it is redacted with the quick check in front of the patterns
    # Then it reads exactly as running every pattern on it would make it
    full = text
    for pattern, replacement in _SECRETS:
        full = pattern.sub(replacement, full)
    assert redact(text) == full


def test_the_default_handler_follows_stderr_and_never_writes_to_a_closed_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Given logging configured while stderr was a buffer that is closed afterwards (a command
    # run in-process by a test's CLI runner)
    buffer = io.StringIO()
    real = sys.stderr
    sys.stderr = buffer
    try:
        handler = configure("text")
    finally:
        sys.stderr = real
    buffer.close()
    try:
        # When a record is logged later
        logging.getLogger("fleet-test").warning("after the buffer closed")
        # Then it reaches the stderr of now, with no "Logging error"
        err = capsys.readouterr().err
        assert "after the buffer closed" in err
        assert "Logging error" not in err
    finally:
        logging.getLogger().removeHandler(handler)
