"""Numeric options of the CLI, read strictly: a count is decimal digits alone and a duration
is decimal digits with at most one decimal point. What Python's ``int`` and ``float`` would
also take (``1_0``, ``+5``, `` 5``, ``1e3``, ``inf``, ``nan``) is a usage error (exit 2)
naming the option, never a traceback or a surprise later."""

from __future__ import annotations

import re
from typing import Any

import typer

from orchestrator.settings import MAX_SECONDS

#: Seconds between a worker's ``worker-heartbeat`` events (Flower's liveness of a worker).
EVENT_HEARTBEAT_SECONDS = 10
#: Threads of a family worker (``fleet worker --concurrency``).
WORKER_CONCURRENCY = 8
#: Seconds between two runs of ``archive.auto`` in ``fleet beat``'s schedule (``--interval``).
AUTO_ARCHIVE_INTERVAL_SECONDS = 300.0
#: Seconds a client of ``fleet api`` has to send a whole request head once it connects or its
#: previous answer was sent (``--head-timeout``); then the connection is closed (slowloris).
HEAD_TIMEOUT_SECONDS = 10.0

_DECIMAL = re.compile(r"[0-9]+(\.[0-9]*)?|\.[0-9]+")


class Count:
    """The ``parser`` of an integer option: a whole number in ``[low, high]`` (``high``
    ``None``: no upper bound), written in decimal digits only. Raises ``typer.BadParameter``."""

    def __init__(self, low: int, high: int | None = None) -> None:
        self.low, self.high = low, high

    def __call__(self, value: Any) -> int:
        if isinstance(value, int) and not isinstance(value, bool):  # a default
            return value
        text = str(value)
        if not (text.isascii() and text.isdigit()):
            raise typer.BadParameter(f"{text!r} is not a whole number written in digits.")
        number = int(text)
        if number < self.low or (self.high is not None and number > self.high):
            upper = f" and at most {self.high}" if self.high is not None else ""
            raise typer.BadParameter(f"{number} is out of range: at least {self.low}{upper}.")
        return number


class Duration:
    """The ``parser`` of an option in seconds: a decimal number (``30``, ``0.5``) from 0 up to
    ``orchestrator.settings.MAX_SECONDS``. Raises ``typer.BadParameter``."""

    def __call__(self, value: Any) -> float:
        if isinstance(value, int | float) and not isinstance(value, bool):  # a default
            return float(value)
        text = str(value)
        if not (text.isascii() and _DECIMAL.fullmatch(text)):
            raise typer.BadParameter(f"{text!r} is not a number of seconds such as 30 or 0.5.")
        seconds = float(text)
        if seconds > MAX_SECONDS:
            raise typer.BadParameter(
                f"{text} is out of range: at least 0 and at most {MAX_SECONDS}."
            )
        return seconds


def count_option(default: int, *names: str, low: int, high: int | None = None, help: str) -> Any:
    """A ``typer.Option`` read by ``Count(low, high)``, its range shown in ``--help``."""
    shown = f"{low}<=N<={high}" if high is not None else f"N>={low}"
    return typer.Option(default, *names, parser=Count(low, high), metavar=f"N [{shown}]", help=help)


def seconds_option(default: float, *names: str, help: str | None = None, **extra: Any) -> Any:
    """A ``typer.Option`` in seconds read by ``Duration()`` (0 allowed), ``extra`` passed on
    (``hidden=True``)."""
    return typer.Option(default, *names, parser=Duration(), metavar="SECONDS", help=help, **extra)
