"""The commands whose write may lose its reply (``fleet sessions new``, ``fleet prompt``): each
sends an idempotency key (``--idempotency-key``, a fresh UUID by default) and, while Redis is
unavailable or the reply was lost, retries for a few seconds with the same key, so a retry
never creates a second session or turn (``orchestrator/storage/idempotency.py``). When it gives up
it
names the key, so the command can be run again with it safely."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import TypeVar

import typer
from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_exponential

from api.cli.common import err
from orchestrator.errors import StoreUnavailable
from orchestrator.storage.idempotency import check_key

T = TypeVar("T")

#: How long a command retries its write with its key, in seconds.
RETRY_SECONDS = 5.0

#: The ``--idempotency-key`` option of the commands.
KEY_OPTION = typer.Option(
    None,
    "--idempotency-key",
    metavar="KEY",
    help=(
        "Idempotency key of the write (default: a new UUID). Run the command again with the "
        "key it printed after a lost reply: it answers what was done and does nothing twice."
    ),
)


def _transient(exc: BaseException) -> bool:
    return isinstance(exc, StoreUnavailable) and exc.transient


def keyed_write(write: Callable[[str], T], key: str | None) -> T:
    """``write(key)`` with ``key`` (a new UUID when ``None``), retried with the same key on a
    transient ``StoreUnavailable`` (``WriteOutcomeUnknown`` included) for up to
    ``RETRY_SECONDS``. Raises what ``write`` raises last, after a note on stderr naming the
    key to retry with; ``InvalidIdempotencyKey`` for a malformed ``key``."""
    key = check_key(key) if key is not None else str(uuid.uuid4())
    retrying = Retrying(
        retry=retry_if_exception(_transient),
        stop=stop_after_delay(RETRY_SECONDS),
        wait=wait_exponential(multiplier=0.1, max=1.0),
        reraise=True,
    )
    try:
        return retrying(write, key)
    except StoreUnavailable:
        err.print(
            f"note: to retry without doing it twice: --idempotency-key {key}", highlight=False
        )
        raise
