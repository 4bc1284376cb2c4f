"""``fleet bulk-archive`` by ids, any number of them: the ids go out in requests of at most
``orchestrator.archiving.bulk.MAX_IDS`` (the cap one request has, over HTTP as here) and the answers
are merged into the one a single request would give: results in the order the ids were
given, totals over all of them, the batches and stops of every request.

- Duplicates are dropped before the list is split (the first kept), as one request merges
  them, so each session is counted once whichever requests its copies would have fallen in.
- Over several requests the ids are put in write order (``orchestrator.archiving.bulk.write_order``:
  ancestors first) before they are split, so an ancestor goes out in a request no later than
  its named descendants: it archives them in its own transition, and they answer
  ``already_archived``, as in one request. A dry run writes nothing, so a request cannot
  know what an earlier one would have archived: a descendant whose named ancestor went in an
  earlier request is reported ``archived`` (would archive), not ``already_archived``; the
  sessions selected, and a real run, are the same.
- A request that fails (a ``FleetError`` such as ``store_unavailable``) or is interrupted
  (Ctrl-C: ``Interrupted``) ends the run: the
  answers of the requests before it are kept, and its ids (it may have archived some of
  them: its batches before the failing one stay written) and those of the requests not sent
  are returned, in the order given, for the caller to report.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import redis

from orchestrator.archiving import bulk
from orchestrator.archiving.bulk import BulkResult
from orchestrator.archiving.stops import StopReport
from orchestrator.errors import FleetError
from orchestrator.families import Dispatcher
from orchestrator.storage.redisconn import store_unavailable
from orchestrator.storage.store import Store


class Interrupted(FleetError):
    """What ends a run over several requests that the user interrupted (SIGINT, Ctrl-C):
    reported as a failed request is, so the ids not confirmed are still named."""

    code = "interrupted"


@dataclass(frozen=True)
class Unfinished:
    """Why a run over several requests stopped early: ``error``, raised by request
    ``failed`` (counted from 1) of ``requests``; ``unconfirmed``: that request's ids, some
    of which it may have archived; ``not_sent``: the ids of the requests after it."""

    error: FleetError
    failed: int
    requests: int
    unconfirmed: list[str]
    not_sent: list[str]


@dataclass(frozen=True)
class Split:
    """``result``: the merged answers of the requests that completed (all of them unless
    ``unfinished``); ``requests``: how many the ids needed; ``given``: the ids, duplicates
    once, in the order given."""

    result: BulkResult
    requests: int
    given: int
    unfinished: Unfinished | None = None


def archive_ids(
    store: Store,
    dispatcher: Dispatcher,
    session_ids: list[str],
    *,
    stop_activity: bool,
    dry_run: bool,
    progress: Callable[[int, int], None] | None = None,
) -> Split:
    """Archive ``session_ids`` (any number; duplicates once) in requests of at most
    ``orchestrator.archiving.bulk.MAX_IDS``, with one ``progress(done, total)`` over all of them.

    A single request raises what ``bulk_archive`` raises; with several, a failing
    request is returned as ``Split.unfinished`` with what the earlier ones did."""
    given = list(dict.fromkeys(session_ids))
    cap = bulk.MAX_IDS  # read now: the cap the server checks
    if len(given) <= cap:
        parts = [given]  # as one request: the server orders them itself
    else:
        ordered = bulk.write_order(store, given)
        parts = [ordered[start : start + cap] for start in range(0, len(ordered), cap)]
    bar = _Overall(progress, len(given))
    answers: list[BulkResult] = []
    unfinished = None
    before = 0  # sessions of the requests already answered
    for number, part in enumerate(parts, 1):
        try:
            answers.append(
                bulk.bulk_archive(
                    store,
                    dispatcher,
                    session_ids=part,
                    stop_activity=stop_activity,
                    dry_run=dry_run,
                    progress=bar.after(before),
                )
            )
        except (FleetError, redis.RedisError, KeyboardInterrupt) as exc:
            if len(parts) == 1:
                raise  # one request fails as it always did
            if isinstance(exc, KeyboardInterrupt):
                error: FleetError = Interrupted(
                    "Stopped by an interrupt (Ctrl-C) during a request."
                )
            else:
                error = exc if isinstance(exc, FleetError) else store_unavailable(exc)
            later = {sid for rest in parts[number:] for sid in rest}
            unfinished = Unfinished(
                error,
                number,
                len(parts),
                _in_order(given, set(part)),
                _in_order(given, later),
            )
            break
        before += len(part)
    result = _merged(answers, given, stop_activity=stop_activity, dry_run=dry_run)
    return Split(result, len(parts), len(given), unfinished)


class _Overall:
    """One ``progress(done, total)`` over every request: each request's own count is offset
    by the sessions of the requests before it, and a call that does not move the bar (a
    request's opening ``0``) is left out."""

    def __init__(self, progress: Callable[[int, int], None] | None, total: int) -> None:
        self.progress, self.total, self.last = progress, total, -1

    def after(self, before: int) -> Callable[[int, int], None] | None:
        """The ``progress`` of a request that follows ``before`` sessions."""
        if self.progress is None:
            return None
        return lambda done, _of: self.show(before + done)

    def show(self, done: int) -> None:
        if done != self.last and self.progress is not None:
            self.last = done
            self.progress(done, self.total)


def _in_order(given: list[str], wanted: set[str]) -> list[str]:
    return [sid for sid in given if sid in wanted]


def _merged(
    answers: list[BulkResult], given: list[str], *, stop_activity: bool, dry_run: bool
) -> BulkResult:
    """The answers of several requests as one: results in the order of ``given`` (each
    request answers in its own write order), batches summed, stops sent and failed of all."""
    place = {sid: i for i, sid in enumerate(given)}
    results = sorted(
        (item for answer in answers for item in answer.results),
        key=lambda item: place[item.session_id],
    )
    report = StopReport()
    for answer in answers:
        for family, n in answer.stop_report.sent.items():
            report.sent[family] = report.sent.get(family, 0) + n
        report.failed.extend(answer.stop_report.failed)
        report.counts.extend(answer.stop_report.counts)
    batches = sum(answer.batches for answer in answers)
    return BulkResult(results, dry_run, stop_activity, batches, report)
