"""Log formats for every agent-fleet process: JSON lines in production, readable text in a
terminal.

Every record carries ``session_id`` (``null`` when unknown) and, when the code logging it knows
them, ``turn_id``, ``family`` and ``task_id``, passed through ``extra={...}``. A JSON line is
``{"time", "level", "logger", "message", "session_id", "turn_id"?, "family"?, "task_id"?,
"exc"?}``; an exception and its traceback are one field, never extra lines.

``configure`` installs one handler on the root logger; the interfaces call it (``fleet api``,
``fleet up``, ``fleet acp``, and the Celery workers through ``workers/logs.py``). The format
comes from ``FLEET_LOG_FORMAT`` (``json`` | ``text``); unset, it is ``text`` when the stream is
a terminal and ``json`` otherwise.

Credentials never reach a log line: ``RedactSecrets`` (one filter, on every handler of the
process: ``configure`` and ``redact_every_handler``) replaces query parameters such as
``token=`` and ``access_token=``, ``Bearer``/``Basic`` credentials, ``Authorization`` values
and the password of URLs (``redis://:pw@host``) with ``[REDACTED]``, in the message, its
arguments (uvicorn's access log keeps its argument tuple) and tracebacks.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from collections.abc import Iterable
from typing import Any, TextIO

from orchestrator.storage.store import iso

#: Context fields a record may carry through ``extra``; ``session_id`` is always written.
CONTEXT_FIELDS = ("session_id", "turn_id", "family", "task_id")
#: Attribute marking the handler ``configure`` installed, so a second call replaces it.
_MARK = "_fleet_handler"


REDACTED = "[REDACTED]"
#: (pattern, replacement) pairs applied in order by ``redact``.
_SECRETS: list[tuple[re.Pattern[str], str]] = [
    # ?token=... &access_token=... in URLs and access-log request lines.
    (
        re.compile(
            r"(?i)([?&;](?:token|access_token|api_key|apikey|password|secret|auth)=)[^&;\s\"'#]*"
        ),
        rf"\1{REDACTED}",
    ),
    # Authorization: Bearer <token> / Basic <base64>, wherever the header is echoed.
    (re.compile(r"(?i)(\bbearer\s+)[^\s\"',;]+"), rf"\1{REDACTED}"),
    (re.compile(r"(\bBasic\s+)[A-Za-z0-9+/]{8,}=*"), rf"\1{REDACTED}"),
    (
        re.compile(r"(?i)(\bauthorization[\"']?\s*[:=]\s*[\"']?)(?!bearer\b|basic\b)[^\s\"',;]+"),
        rf"\1{REDACTED}",
    ),
    # scheme://user:password@host (redis://:pw@host): the password goes.
    (re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://[^/\s:@]*:)[^/\s@]+@"), rf"\1{REDACTED}@"),
]


def redact(text: str) -> str:
    """``text`` with every credential ``_SECRETS`` knows replaced by ``[REDACTED]``.

    Text that holds none of what every pattern needs (``=``, ``@``, ``bearer``, ``basic``,
    ``authorization``, any case) is returned as it is without running them: most log lines
    (a worker logs two per task) hold none."""
    if not _may_hold_secret(text):
        return text
    for pattern, replacement in _SECRETS:
        text = pattern.sub(replacement, text)
    return text


def _may_hold_secret(text: str) -> bool:
    """Whether ``text`` holds something one of ``_SECRETS`` needs to match: a query parameter
    and ``authorization=`` need ``=``, a URL's password ``@``, the others their word."""
    if "=" in text or "@" in text:
        return True
    lower = text.lower()
    return "bearer" in lower or "basic" in lower or "authorization" in lower


class RedactSecrets(logging.Filter):
    """Removes credentials from a record before any handler writes it (see the module
    docstring). String arguments are redacted one by one, so formatters that read
    ``record.args`` themselves (uvicorn's access formatter) keep working; a credential that
    only shows once they are merged into the message makes the message the redacted text."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(redact(a) if isinstance(a, str) else a for a in record.args)
        elif isinstance(record.args, dict):
            record.args = {
                k: redact(v) if isinstance(v, str) else v for k, v in record.args.items()
            }
        try:
            message = record.getMessage()
        except (TypeError, ValueError):
            return True  # a broken format string: the handler reports it as usual
        clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
            record.exc_info = None  # formatters print exc_text instead
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


_REDACTOR = RedactSecrets()


def redact_every_handler() -> None:
    """Add ``RedactSecrets`` to every handler installed in this process so far (the root's
    and every logger's, e.g. uvicorn's own when it configured logging itself)."""
    loggers = [logging.getLogger()] + [
        lg for lg in logging.Logger.manager.loggerDict.values() if isinstance(lg, logging.Logger)
    ]
    for lg in loggers:
        for handler in lg.handlers:
            if not any(isinstance(f, RedactSecrets) for f in handler.filters):
                handler.addFilter(_REDACTOR)


def _context(record: logging.LogRecord) -> dict[str, Any]:
    out: dict[str, Any] = {"session_id": getattr(record, "session_id", None)}
    for name in CONTEXT_FIELDS[1:]:
        value = getattr(record, name, None)
        if value is not None:
            out[name] = value
    return out


class FixedContext(logging.Filter):
    """Fills context fields (``CONTEXT_FIELDS``) a record does not carry with fixed values:
    a helper process of one family (a watchdog) marks its lines with it, as its worker's
    lines are marked."""

    def __init__(self, **fields: str) -> None:
        super().__init__()
        self.fields = fields

    def filter(self, record: logging.LogRecord) -> bool:
        for name, value in self.fields.items():
            if getattr(record, name, None) is None:
                setattr(record, name, value)
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": iso(int(record.created * 1000)),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            **_context(record),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:  # set (and redacted) by RedactSecrets
            entry["exc"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


class TextFormatter(logging.Formatter):
    """``HH:MM:SS.mmm LEVEL logger: message [session_id=... turn_id=...]`` for terminals."""

    def __init__(self) -> None:
        super().__init__(
            "%(asctime)s.%(msecs)03d %(levelname)-7s %(name)s: %(message)s", "%H:%M:%S"
        )

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        context = " ".join(f"{k}={v}" for k, v in _context(record).items() if v is not None)
        if not context:
            return text
        # The context goes after the first line, so a traceback keeps its own lines below.
        first, sep, rest = text.partition("\n")
        return f"{first} [{context}]{sep}{rest}"


def resolve_format(value: str | None, stream: TextIO) -> str:
    """``json`` or ``text``: ``value`` when it is one of them, else ``text`` for a terminal
    ``stream`` and ``json`` otherwise."""
    if value in ("json", "text"):
        return value
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        tty = False
    return "text" if tty else "json"


def formatter(fmt: str) -> logging.Formatter:
    """The formatter for ``fmt`` (``json`` or ``text``)."""
    return JsonFormatter() if fmt == "json" else TextFormatter()


class _Stderr(logging.StreamHandler):  # type: ignore[type-arg]
    """A handler writing to whatever ``sys.stderr`` is when a record is emitted, not to the
    stream it was when the handler was made: a command run in-process (a test's CLI runner)
    swaps stderr for a buffer it closes afterwards, and later records must not go there."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass  # always the current sys.stderr


def configure(
    fmt: str | None = None,
    level: int | str = logging.INFO,
    *,
    stream: TextIO | None = None,
    filters: Iterable[logging.Filter] = (),
) -> logging.Handler:
    """Log every record of ``level`` and above to ``stream`` (stderr) in format ``fmt``
    (``json``, ``text``, or ``None``: by terminal; entry points pass ``FLEET_LOG_FORMAT``).

    Replaces the handler an earlier call installed and leaves other handlers alone (a test's
    log capture keeps working; it gets ``RedactSecrets`` too, as the new handler does).
    ``filters`` are added to the handler, e.g. one filling ``task_id`` from the running
    Celery task. Returns the handler.
    """
    out = stream if stream is not None else sys.stderr
    handler = logging.StreamHandler(out) if stream is not None else _Stderr()
    handler.setFormatter(formatter(resolve_format(fmt, out)))
    handler.addFilter(_REDACTOR)
    for item in filters:
        handler.addFilter(item)
    setattr(handler, _MARK, True)
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, _MARK, False)]:
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(level)
    redact_every_handler()
    return handler
