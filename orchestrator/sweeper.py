"""The turn sweeper: every turn reaches a final state, whatever was lost on the way.

A turn's step can be lost: its worker is killed mid-step (the message comes back only after
the broker's visibility timeout, if at all), Redis crashes between storing a turn and queueing
its step, a redelivered step of a ``cancelling`` turn is refused by the gate (which cannot
move ``cancelling`` to ``blocked``). Each leaves a turn ``running`` or ``cancelling`` that no
worker will ever move again, and a session that queues its prompts behind it forever.

The sweeper finds them through the running-turn index (``Keys.turns_inflight``: every turn
``running`` or ``cancelling``, scored by its last progress on Redis's clock). A member with
no progress for ``FLEET_TURN_STUCK_SECONDS`` whose step holds no lease is lost, and one
script (``scripts/turn_sweep.lua``) decides and writes, per turn:

- ``running``: its current step is dispatched again (``resumed``); a duplicate is harmless,
  ``turn_begin_step`` drops a stale or in-flight copy. After ``FLEET_TURN_MAX_RESUMES``
  resumes of the same step it ends ``failed`` ("step N lost K times").
- ``cancelling``: it ends ``cancelled`` (``settled``), and its turn event resolves any pending
  ACP ``session/prompt``.
- ended, queued or missing: the member is dropped from the index (``removed``).

It covers every session, archived or not: a resumed step of an archived lineage meets the
gate and ends ``blocked``. Every turn worker runs a pass every
``FLEET_TURN_SWEEP_INTERVAL_SECONDS`` (``workers/sweeper.py``), and ``fleet sweep`` runs one;
passes that overlap are harmless, because a resume re-scores the member in the same script.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from orchestrator import activity, events, metrics
from orchestrator.families import Dispatcher, send_step
from orchestrator.store import Store, retried
from orchestrator.turns import STOP_REASON, TurnState

log = logging.getLogger(__name__)

#: Index members examined per pass at most (the oldest first); the rest wait for the next.
PASS_LIMIT = 1_000

#: Outcomes worth reporting (the others, ``fresh``/``leased``/``gone``, are no change).
ACTIONS = ("resumed", "failed", "settled", "removed")


@dataclass
class SweepReport:
    """What one pass did: ``examined`` index members old enough to look at, and the turn ids
    per action (``resumed``, ``failed``, ``settled``, ``removed``)."""

    examined: int = 0
    turns: dict[str, list[str]] = field(default_factory=dict)
    dispatch_failures: int = 0

    def add(self, action: str, turn_id: str) -> None:
        self.turns.setdefault(action, []).append(turn_id)

    @property
    def totals(self) -> dict[str, int]:
        """Turns per action, every action listed (0 when none)."""
        return {action: len(self.turns.get(action, [])) for action in ACTIONS}

    def to_wire(self) -> dict[str, Any]:
        """``{"examined", "totals": {action: n}, "turns": {action: [turnId]},
        "dispatchFailures"}`` (``fleet sweep --json``)."""
        return {
            "examined": self.examined,
            "totals": self.totals,
            "turns": {a: self.turns[a] for a in ACTIONS if a in self.turns},
            "dispatchFailures": self.dispatch_failures,
        }


@retried
def _stale(store: Store, stuck_ms: int, limit: int) -> list[str]:
    """Index members whose last progress is older than ``stuck_ms``, on Redis's clock."""
    cutoff = store.now_ms() - stuck_ms
    ids: list[str] = store.redis.zrangebyscore(
        store.keys.turns_inflight, "-inf", cutoff, start=0, num=limit
    )
    return ids


def _send(report: SweepReport, dispatcher: Dispatcher, sid: str, tid: str, step: int) -> None:
    try:
        send_step(dispatcher, sid, tid, step)
    except Exception as exc:  # broker down: the member was re-scored, the next pass retries
        report.dispatch_failures += 1
        log.warning(
            "step %d of turn %s not dispatched: %s",
            step,
            tid,
            exc,
            extra={"session_id": sid, "turn_id": tid},
        )


def _ended(store: Store, sid: str, tid: str, state: TurnState, error: str = "") -> None:
    # A failed turn has no ACP stop reason (as ``turns`` publishes it).
    reason = None if state is TurnState.FAILED else STOP_REASON[state]
    fields: dict[str, Any] = {"turnId": tid, "state": state.value, "stopReason": reason}
    if error:
        fields["error"] = error
    events.publish(store, "turn", sid, **fields)
    # The turn may have been its archive's last live work.
    activity.note_quiet(store, sid)


def sweep_turn(
    store: Store,
    dispatcher: Dispatcher,
    turn_id: str,
    *,
    stuck_ms: int,
    max_resumes: int,
    report: SweepReport,
) -> str:
    """Look at one index member and repair it if its step is lost (one script). Returns the
    script's outcome (``resume``, ``failed``, ``cancelled``, ``removed``, ``fresh``,
    ``leased``, ``gone``). Raises ``StoreUnavailable``."""
    row = store.run(
        "turn_sweep",
        [
            turn_id,
            stuck_ms,
            max_resumes,
            STOP_REASON[TurnState.FAILED],
            STOP_REASON[TurnState.CANCELLED],
        ],
    )
    outcome = str(row[0])
    if outcome == "removed":
        report.add("removed", turn_id)
        return outcome
    if outcome not in ("resume", "failed", "cancelled"):
        return outcome
    sid = str(row[1])
    extra = {"session_id": sid, "turn_id": turn_id}
    if outcome == "resume":
        step, losses = int(row[2]), int(row[3])
        log.warning(
            "turn %s: step %d lost (%d), dispatched again", turn_id, step, losses, extra=extra
        )
        report.add("resumed", turn_id)
        _send(report, dispatcher, sid, turn_id, step)
        return outcome
    promoted = str(row[2])
    settled = str(row[-1])  # the lost step's open tool call, settled: JSON or ''
    if settled:
        events.publish(store, "update", sid, update=json.loads(settled))
    if outcome == "failed":
        error = str(row[4])
        log.warning("turn %s ended failed: %s", turn_id, error, extra=extra)
        report.add("failed", turn_id)
        if row[5] == "1":
            events.publish(
                store,
                "update",
                sid,
                update={
                    "sessionUpdate": "agent_message_chunk",
                    "turnId": turn_id,
                    "content": {"type": "text", "text": f"error: {error}"},
                },
            )
        _ended(store, sid, turn_id, TurnState.FAILED, error)
    else:
        log.info("turn %s settled cancelled (its step is gone)", turn_id, extra=extra)
        report.add("settled", turn_id)
        _ended(store, sid, turn_id, TurnState.CANCELLED)
    if promoted:
        _send(report, dispatcher, sid, promoted, 0)
    return outcome


def sweep(
    store: Store,
    dispatcher: Dispatcher,
    *,
    stuck_seconds: float | None = None,
    max_resumes: int | None = None,
    limit: int = PASS_LIMIT,
) -> SweepReport:
    """One pass over the running-turn index: every member with no progress for
    ``stuck_seconds`` (default ``FLEET_TURN_STUCK_SECONDS``) is examined, the oldest first
    (at most ``limit``), and resumed, ended or dropped (``sweep_turn``). Counts what it did in
    ``fleet_turn_sweeps{action}``. Raises ``StoreUnavailable`` (turns examined before the
    failure keep what was done to them)."""
    settings = store.settings
    stuck_ms = int(1000 * (settings.turn_stuck_seconds if stuck_seconds is None else stuck_seconds))
    most = settings.turn_max_resumes if max_resumes is None else max_resumes
    report = SweepReport()
    for tid in _stale(store, stuck_ms, limit):
        report.examined += 1
        sweep_turn(store, dispatcher, tid, stuck_ms=stuck_ms, max_resumes=most, report=report)
    done = Counter({action: n for action, n in report.totals.items() if n})
    metrics.incr_many(
        store, [(metrics.TURN_SWEEPS, (action,), n) for action, n in sorted(done.items())]
    )
    return report
