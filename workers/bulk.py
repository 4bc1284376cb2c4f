"""The per-session loop of the bulk stop tasks (``*.stop_many``): each session of a batch is
stopped by the family's single-session task body, on its own, so one failure never keeps the
other sessions of the batch running.

Job stops wait for each process to end (SIGTERM, then SIGKILL after the grace period), so the
job and subagent loops run sessions on a few threads at once: a batch of hundreds of sessions
then takes about one grace period, not one per session.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

log = logging.getLogger(__name__)

#: Sessions a job or subagent bulk stop handles at once.
STOP_THREADS = 16


def _one(stop_one: Callable[..., dict[str, Any]], family: str, sid: str, ids: Any) -> Any:
    try:
        # ``ids`` goes as sent: a list of ids, or a subagent stop's plans by descendant.
        result = stop_one(sid) if ids is None else stop_one(sid, ids)
        return {k: v for k, v in result.items() if k != "sessionId"}
    except Exception as exc:  # contained: the batch's other sessions are still stopped
        log.warning(
            "%s stop failed: %s: %s",
            family,
            type(exc).__name__,
            exc,
            extra={"session_id": sid, "family": family},
        )
        return f"error: {type(exc).__name__}: {exc}"


def each_session(
    stops: dict[str, Any],
    stop_one: Callable[..., dict[str, Any]],
    family: str,
    *,
    threads: int = 1,
) -> dict[str, Any]:
    """Call ``stop_one(sessionId, ids)`` for each entry of ``stops`` (``stop_one(sessionId)``
    when the entry's value is ``None``), on up to ``threads`` threads; return ``{sessionId:
    result or "error: ..."}``. Never raises for one session's failure (logged as a warning)."""
    if not isinstance(stops, dict):
        log.warning("%s bulk stop ignored: arguments are not a mapping", family)
        return {}
    if threads <= 1 or len(stops) <= 1:
        return {sid: _one(stop_one, family, sid, ids) for sid, ids in stops.items()}
    with ThreadPoolExecutor(min(threads, len(stops)), thread_name_prefix=f"{family}-stop") as ex:
        futures = {sid: ex.submit(_one, stop_one, family, sid, ids) for sid, ids in stops.items()}
        return {sid: future.result() for sid, future in futures.items()}
