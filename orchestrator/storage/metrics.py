"""Fleet metrics, counted in Redis so every process adds to the same figures.

Archives happen in the API, gate refusals in turn workers, stop failures in either, so an
in-process registry would show each process its own slice. Each metric is one hash
(``Keys.metric``): a counter maps its label values to a count (``HINCRBY``), a histogram keeps
one count per bucket plus ``sum`` (its ``count`` is the sum of its buckets). The API reads
them at scrape time (``api/metrics.py``) and renders the Prometheus exposition.

Counting is best effort: a failure is logged at debug and never raised, so a metric can never
fail the operation it counts. Counts live as long as the Redis data (they are not reset when a
process restarts, which is what Prometheus expects of a counter).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.storage.store import Store, retried

log = logging.getLogger(__name__)

#: Separator of label values in a counter's hash field (label values are fixed words:
#: families, outcomes, reasons).
_SEP = "|"


@dataclass(frozen=True)
class Counter:
    """A monotonic count; ``labels`` names the label values ``incr`` takes, in order."""

    name: str
    help: str
    labels: tuple[str, ...]


@dataclass(frozen=True)
class Histogram:
    """Observations in seconds, counted into the fixed upper ``buckets`` (``+Inf`` implied)."""

    name: str
    help: str
    buckets: tuple[float, ...]


ARCHIVES = Counter(
    "fleet_archives",
    "Archive calls by outcome (archived, already_archived, refused).",
    ("outcome",),
)
ARCHIVE_REFUSALS = Counter(
    "fleet_archive_refusals",
    "Archives refused for live work, by family of the live items (a refusal naming a turn "
    "and a job counts once for each).",
    ("family",),
)
STOP_DISPATCHES = Counter(
    "fleet_stop_dispatches",
    "Stop requests sent to a family's control queue.",
    ("family",),
)
STOP_FAILURES = Counter(
    "fleet_stop_failures",
    "Stop requests that could not be sent, by family.",
    ("family",),
)
GATE_REFUSALS = Counter(
    "fleet_gate_refusals",
    "Model steps the gate refused, by reason (archived, deleted, missing).",
    ("reason",),
)
WAKEUPS_REFUSED = Counter(
    "fleet_wakeups_refused",
    "Wake-ups (a reminder firing, a subagent's first turn or its report to its parent) refused "
    "because their lineage was archived: nothing was stored, by source.",
    ("source",),
)
ARCHIVE_HAZARDS = Counter(
    "fleet_archive_hazards",
    "Archives flagged with an archive hazard by the reconciler (live work still there after "
    "5 stop re-dispatches), once per family of the live items.",
    ("family",),
)
TURN_SWEEPS = Counter(
    "fleet_turn_sweeps",
    "Turns the sweeper repaired, by action: resumed (a lost step dispatched again), failed "
    "(lost 4 times), settled (cancelling with its step gone, now "
    "cancelled), removed (an index entry of a turn no longer running).",
    ("action",),
)
ARCHIVE_QUIET = Histogram(
    "fleet_archive_quiet_seconds",
    "Seconds from an archive with stopActivity to the first census that found the session "
    "quiet (no live work left in its subtree).",
    (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0),
)

MODEL_TOKENS = Counter(
    "fleet_model_tokens",
    "Tokens model steps read (input) and wrote (output), as the model server reported them.",
    ("direction",),
)
MODEL_REQUESTS = Counter(
    "fleet_model_requests",
    "Model steps by outcome: ok, cancelled (stopped while it ran) or failed (the model "
    "server refused or could not be reached after its retries).",
    ("outcome",),
)
MODEL_REQUEST_SECONDS = Histogram(
    "fleet_model_request_seconds",
    "Seconds a model step's request took (with its retries, to the last streamed byte).",
    (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0),
)

COUNTERS = (
    ARCHIVES,
    ARCHIVE_REFUSALS,
    STOP_DISPATCHES,
    STOP_FAILURES,
    GATE_REFUSALS,
    WAKEUPS_REFUSED,
    ARCHIVE_HAZARDS,
    TURN_SWEEPS,
    MODEL_TOKENS,
    MODEL_REQUESTS,
)
HISTOGRAMS = (ARCHIVE_QUIET, MODEL_REQUEST_SECONDS)


def bucket_field(bound: float) -> str:
    """The hash field of a histogram bucket whose upper bound is ``bound`` (``le=<bound>``,
    ``le=+Inf``)."""
    return "le=+Inf" if math.isinf(bound) else f"le={bound:g}"


def incr(store: Store, counter: Counter, *labels: str, by: int = 1) -> None:
    """Add ``by`` to ``counter`` for the given label values (one per ``counter.labels``).
    Never raises for a Redis failure (logged at debug)."""
    if len(labels) != len(counter.labels):
        raise ValueError(f"{counter.name} takes labels {counter.labels}, got {labels}")
    try:
        store.redis.hincrby(store.keys.metric(counter.name), _SEP.join(labels), by)
    except Exception as exc:  # best effort: a metric never fails what it counts
        log.debug("metric %s not counted: %s", counter.name, exc)


def incr_many(store: Store, counts: Sequence[tuple[Counter, tuple[str, ...], int]]) -> None:
    """Add several ``(counter, labels, by)`` increments in one round trip. Never raises for a
    Redis failure (logged at debug)."""
    if not counts:
        return
    _check_labels(counts)
    try:
        pipe = store.redis.pipeline(transaction=False)
        incr_into(pipe, store, counts)
        pipe.execute()
    except Exception as exc:  # best effort: a metric never fails what it counts
        log.debug("metrics not counted: %s", exc)


def queue_incr(pipe: Any, store: Store, counter: Counter, labels: tuple[str, ...], by: int) -> None:
    """Add an increment of ``counter`` to a redis-py pipeline (executed by the caller)."""
    incr_into(pipe, store, [(counter, labels, by)])


def queue_observe(pipe: Any, store: Store, histogram: Histogram, seconds: float) -> None:
    """Add one observation of ``seconds`` (negative counts as 0) to a redis-py pipeline."""
    value = max(0.0, seconds)
    bound = next((b for b in histogram.buckets if value <= b), math.inf)
    key = store.keys.metric(histogram.name)
    pipe.hincrby(key, bucket_field(bound), 1)
    pipe.hincrbyfloat(key, "sum", value)


def incr_into(
    pipe: Any, store: Store, counts: Sequence[tuple[Counter, tuple[str, ...], int]]
) -> None:
    """Queue ``incr_many``'s increments on a redis-py ``pipe`` the caller executes (so they
    share a round trip with other best-effort writes). Raises ``ValueError`` for a wrong
    number of labels, before anything is queued."""
    _check_labels(counts)
    for counter, labels, by in counts:
        pipe.hincrby(store.keys.metric(counter.name), _SEP.join(labels), by)


def _check_labels(counts: Sequence[tuple[Counter, tuple[str, ...], int]]) -> None:
    for counter, labels, _ in counts:
        if len(labels) != len(counter.labels):
            raise ValueError(f"{counter.name} takes labels {counter.labels}, got {labels}")


def observe(store: Store, histogram: Histogram, seconds: float) -> None:
    """Record one observation of ``seconds`` (negative values count as 0). Never raises for a
    Redis failure (logged at debug)."""
    try:
        pipe = store.redis.pipeline(transaction=True)
        queue_observe(pipe, store, histogram, seconds)
        pipe.execute()
    except Exception as exc:  # best effort, as for counters
        log.debug("metric %s not observed: %s", histogram.name, exc)


@dataclass(frozen=True)
class HistogramValue:
    """A histogram as read: ``buckets`` are ``(upper bound, cumulative count)`` pairs ending
    with ``+Inf``; ``sum`` in seconds; ``count`` observations."""

    buckets: list[tuple[float, int]]
    sum: float
    count: int


@dataclass(frozen=True)
class Snapshot:
    """Every metric as read at one moment: ``counters[name]`` maps a tuple of label values to
    a count; ``sessions`` maps ``active``/``archived`` to how many sessions are in that
    listing index."""

    counters: dict[str, dict[tuple[str, ...], int]]
    histograms: dict[str, HistogramValue]
    sessions: dict[str, int]


def _histogram(histogram: Histogram, raw: dict[str, str]) -> HistogramValue:
    running = 0
    buckets: list[tuple[float, int]] = []
    for bound in (*histogram.buckets, math.inf):
        running += int(raw.get(bucket_field(bound), 0))
        buckets.append((bound, running))
    # Every observation lands in one bucket, so the count is the +Inf bucket's: it is not
    # stored apart (one command fewer per observation).
    return HistogramValue(buckets, float(raw.get("sum", 0.0)), running)


@retried
def snapshot(store: Store) -> Snapshot:
    """Read every metric in one round trip. Raises ``StoreUnavailable``."""
    k = store.keys
    pipe = store.redis.pipeline(transaction=False)
    for counter in COUNTERS:
        pipe.hgetall(k.metric(counter.name))
    for histogram in HISTOGRAMS:
        pipe.hgetall(k.metric(histogram.name))
    states = ("active", "archived")
    for state in states:
        pipe.zcard(k.index(state))
    rows = pipe.execute()
    counters = {
        c.name: {tuple(field.split(_SEP)): int(v) for field, v in raw.items()}
        for c, raw in zip(COUNTERS, rows[: len(COUNTERS)], strict=True)
    }
    rest = rows[len(COUNTERS) :]
    histograms = {
        h.name: _histogram(h, raw)
        for h, raw in zip(HISTOGRAMS, rest[: len(HISTOGRAMS)], strict=True)
    }
    sessions = {state: int(n) for state, n in zip(states, rest[len(HISTOGRAMS) :], strict=True)}
    return Snapshot(counters, histograms, sessions)
