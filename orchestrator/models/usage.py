"""Model usage: each step's tokens, stored on its turn and session and counted in the
fleet's metrics (``fleet_model_tokens_total{direction}``, ``fleet_model_requests_total
{outcome}``, ``fleet_model_request_seconds``).

Shown as ``usage: {"inputTokens", "outputTokens"}`` on a session (``Session.to_info``'s
``_meta.agentFleet``, the REST session JSON). Best effort like every metric: a Redis failure
here is logged and never fails the step.
"""

from __future__ import annotations

import logging

from orchestrator.models import scripts
from orchestrator.models.model import Usage
from orchestrator.storage import metrics
from orchestrator.storage.store import Store

log = logging.getLogger(__name__)

#: Most tokens one step may count in one direction (more is not a count: Redis's counters are
#: 64-bit and a metric must stay meaningful).
MAX_TOKENS = 10**12


def _count(value: object, direction: str, turn_id: str) -> int:
    """``value`` when it is a token count (an ``int``, not a ``bool``, from 0 to
    ``MAX_TOKENS``), else 0 with a warning."""
    if type(value) is int and 0 <= value <= MAX_TOKENS:
        return value
    log.warning(
        "usage of turn %s: %s tokens %.40r is not a count (an integer from 0); dropped",
        turn_id,
        direction,
        value,
    )
    return 0


def record(
    store: Store, session_id: str, turn_id: str, usage: Usage, outcome: str, seconds: float
) -> None:
    """Count one model step: ``outcome`` (``ok``, ``cancelled``, ``failed``), how long it took
    (seconds) and its ``usage``, added to the turn's and the session's totals; one round
    trip. A token count that is not an integer from 0 to ``MAX_TOKENS`` (a model server's
    answer is untrusted) is dropped with a warning; the request is still counted."""
    usage = Usage(
        _count(usage.input_tokens, "input", turn_id), _count(usage.output_tokens, "output", turn_id)
    )
    try:
        pipe = store.redis.pipeline(transaction=False)
        metrics.queue_incr(pipe, store, metrics.MODEL_REQUESTS, (outcome,), 1)
        metrics.queue_observe(pipe, store, metrics.MODEL_REQUEST_SECONDS, seconds)
        if usage.input_tokens or usage.output_tokens:
            tokens = (("input", usage.input_tokens), ("output", usage.output_tokens))
            for direction, count in tokens:
                metrics.queue_incr(pipe, store, metrics.MODEL_TOKENS, (direction,), count)
            scripts.queue_usage_add(
                store,
                pipe,
                session_id=session_id,
                turn_id=turn_id,
                input_tokens=usage.input_tokens,
                output_tokens=usage.output_tokens,
            )
        store.execute(pipe, raise_on_error=True)
    except Exception as exc:  # best effort: usage never fails the step it counts
        log.warning("usage of turn %s not counted: %s", turn_id, exc)


def usage_of(h: dict[str, str]) -> dict[str, int]:
    """``{"inputTokens", "outputTokens"}`` of a stored session or turn hash."""
    return {
        "inputTokens": int(h.get("inputTokens") or 0),
        "outputTokens": int(h.get("outputTokens") or 0),
    }
