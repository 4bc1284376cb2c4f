"""The turn sweeper: every turn reaches a final state, whatever was lost on the way.

A turn's step can be lost: its worker is killed mid-step (the message comes back only after
the broker's visibility timeout, if at all), Redis crashes between storing a turn and queueing
its step, a redelivered step of a ``cancelling`` turn is refused by the gate (which cannot
move ``cancelling`` to ``blocked``). Each leaves a turn ``running`` or ``cancelling`` that no
worker will ever move again, and a session that queues its prompts behind it forever.

The sweeper finds them through the running-turn index (``Keys.turns_inflight``: every turn
``running`` or ``cancelling``, scored by its last progress on Redis's clock). A member with
no progress for ``FLEET_TURN_STUCK_SECONDS`` whose step holds no lease is a suspect, but not
yet lost: a step also makes no progress and holds no lease while its message waits in the
broker for a free worker thread, and a turn worker with every thread on a long step (an
``openai`` request may take ``openai_model.TIMEOUT_SECONDS``) leaves the steps queued behind it
waiting for minutes. Resending such a step only adds another copy to the queue it waits in,
and failing it after ``MAX_RESUMES`` resends fails a healthy turn. So the sweeper
asks the broker (``turn/turn_broker_scan.lua``, once per pass for all suspects):

- every message of step N of turn T has the task id ``T.step.N`` (``step_message_id``; the
  dispatcher in ``workers/dispatch.py`` sets it, and a retried or redelivered copy keeps it);
- kombu's Redis transport keeps a queue as a Redis list of JSON messages, and a message a
  worker took and has not acknowledged (steps are acknowledged when they end) in its
  ``unacked`` hash, under the broker prefix ``Keys.broker_prefix`` (the same builders
  configure the transport in ``workers/app.py``, so this module needs neither Celery nor
  kombu); the scan reads the turn queue, the oldest ``SCAN_LIMIT`` messages, and the hash
  for the id of each suspect's current step.

A step whose message is in the queue is ``waiting``, however long (the fleet is only busy).
One in the unacked hash was taken by a worker: a live worker takes a message only with a
thread free (a prefetch multiplier of 1 with late acknowledgement, ``workers/app.py``) and
begins it at once (it takes its lease), so a delivery still held without its step beginning
``FLEET_TURN_STUCK_SECONDS`` after the sweeper first saw it (noted on the turn: ``heldTag``,
``heldMs``) is held by a dead worker (kombu would hand it back only after the visibility
timeout) and the step is lost; before that it is ``waiting``. A held step that began (the
turn's ``stepToken``) and lost its lease is lost at once, without waiting out the grace: the
worker that began it died with it (kombu keeps a killed worker's step in the hash until the
visibility timeout), or froze past its lease (fencing drops what it writes late). (A step
retried after a store failure waits out its back-off, at most
``workers.retry.RETRY_BACKOFF_MAX``, in the unacked hash of a live worker: past the grace the
sweeper resends it, and the later copy is dropped.)

A step found in neither is lost. A suspect the bounded scan could not rule on (the queue or
the hash is longer than ``SCAN_LIMIT``) waits for a later pass rather than being resent on a
guess. Suspects only are looked for, and one scan serves them all, so a pass costs no scan
while every running turn holds its lease.

Two things do not depend on the broker. A ``cancelling`` turn whose step
holds no lease is settled wherever its message is: no copy of its step would settle it
(``turn_begin_step`` drops one). And the scan is not atomic with the message's moves: kombu
takes a message from its list and records it in the unacked hash in two commands, so a scan
between them finds it nowhere and resends the step; the copy is dropped by
``turn_begin_step`` and the loss counts once against ``MAX_RESUMES``, as any loss
does.

A lost step is repaired by one script (``turn/turn_sweep.lua``) per turn:

- ``running``: its current step is dispatched again (``resumed``); a duplicate is harmless,
  ``turn_begin_step`` drops a stale or in-flight copy. After ``MAX_RESUMES``
  resumes of the same step it ends ``failed`` ("step N lost K times").
- ``cancelling``: it ends ``cancelled`` (``settled``), and its turn event resolves any pending
  ACP ``session/prompt``.
- ended, queued or missing: the member is dropped from the index (``removed``).
- ``running`` with its step's message in the broker: left alone (``waiting``).

It covers every session, archived or not: a resumed step of an archived lineage meets the
gate and ends ``blocked``. Every turn worker runs a pass six times per
``FLEET_TURN_STUCK_SECONDS`` (``workers/sweeper.py``), and ``fleet sweep`` runs one;
passes that overlap are harmless, because a resume re-scores the member in the same script.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from orchestrator.census import activity
from orchestrator.families import Dispatcher, Family, send_step, work_queue
from orchestrator.storage import events, metrics
from orchestrator.storage.store import Store, retried
from orchestrator.turn import scripts
from orchestrator.turn.turns import STOP_REASON, TurnState

log = logging.getLogger(__name__)

#: Times the sweeper dispatches the same lost step again before it ends the turn ``failed``
#: ("step N lost K times").
MAX_RESUMES = 3

#: Index members examined per pass at most (the oldest first); the rest wait for the next.
PASS_LIMIT = 1_000

#: Messages of the turn queue, and entries of the broker's unacked hash, read per pass at
#: most (the queue's oldest first). A scan runs only when a pass has suspects, reads in
#: chunks of 500 and blocks Redis for about a millisecond per 1,000 messages.
SCAN_LIMIT = 5_000

#: Outcomes worth reporting (the others, ``fresh``/``leased``/``gone``/``waiting``, are no
#: change).
ACTIONS = ("resumed", "failed", "settled", "removed")

#: What the broker scan found of a suspect's step: (``queued``|``held``|``unseen``|
#: ``absent``|``skip``, the step looked for, the delivery tag of a ``held`` message).
Seen = tuple[str, str, str]


@dataclass
class SweepReport:
    """What one pass did: ``examined`` index members old enough to look at, the turn ids
    per action (``resumed``, ``failed``, ``settled``, ``removed``), and those ``waiting``
    (their step's message is still in the broker)."""

    examined: int = 0
    turns: dict[str, list[str]] = field(default_factory=dict)
    dispatch_failures: int = 0
    waiting: list[str] = field(default_factory=list)

    def add(self, action: str, turn_id: str) -> None:
        self.turns.setdefault(action, []).append(turn_id)

    @property
    def totals(self) -> dict[str, int]:
        """Turns per action, every action listed (0 when none)."""
        return {action: len(self.turns.get(action, [])) for action in ACTIONS}

    def to_wire(self) -> dict[str, Any]:
        """``{"examined", "totals": {action: n}, "turns": {action: [turnId]},
        "dispatchFailures", "waiting"}`` (``fleet sweep --json``; ``waiting`` counts the
        turns whose step's message is still in the broker)."""
        return {
            "examined": self.examined,
            "totals": self.totals,
            "turns": {a: self.turns[a] for a in ACTIONS if a in self.turns},
            "dispatchFailures": self.dispatch_failures,
            "waiting": len(self.waiting),
        }


@retried
def _stale(store: Store, stuck_ms: int, limit: int) -> list[str]:
    """Index members whose last progress is older than ``stuck_ms``, on Redis's clock."""
    cutoff = store.now_ms() - stuck_ms
    ids: list[str] = store.redis.zrangebyscore(
        store.keys.turns_inflight, "-inf", cutoff, start=0, num=limit
    )
    return ids


@retried
def _scan(store: Store, ids: list[str], limit: int) -> dict[str, Seen]:
    """What the broker holds of the current step of each of ``ids``
    (``turn/turn_broker_scan.lua``), by turn id."""
    if not ids:
        return {}
    return scripts.turn_broker_scan(
        store, queue=work_queue(Family.TURN), scan_limit=limit, turn_ids=ids
    )


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
    seen: Seen = ("", "", ""),
) -> str:
    """Look at one index member and repair it if its step is lost (one script), given what
    the broker scan found of its step (``seen``; none: its step is judged by its lease
    alone). Returns the script's outcome (``resume``, ``failed``, ``cancelled``,
    ``removed``, ``waiting``, ``fresh``, ``leased``, ``gone``). Raises
    ``StoreUnavailable``."""
    swept = scripts.turn_sweep(
        store,
        turn_id=turn_id,
        stuck_ms=stuck_ms,
        max_resumes=max_resumes,
        failed_stop_reason=STOP_REASON[TurnState.FAILED],
        cancelled_stop_reason=STOP_REASON[TurnState.CANCELLED],
        seen=seen,
    )
    outcome = swept.outcome
    if isinstance(swept, scripts.Swept):
        if outcome == "removed":
            report.add("removed", turn_id)
        elif outcome == "waiting":
            report.waiting.append(turn_id)
        return outcome
    sid = swept.session_id
    extra = {"session_id": sid, "turn_id": turn_id}
    if isinstance(swept, scripts.Resume):
        step, losses = swept.step, swept.losses
        log.warning(
            "turn %s: step %d lost (%d), dispatched again", turn_id, step, losses, extra=extra
        )
        report.add("resumed", turn_id)
        _send(report, dispatcher, sid, turn_id, step)
        return outcome
    promoted = swept.promoted
    if swept.settlement:  # the lost step's open tool call, settled
        events.publish(store, "update", sid, update=json.loads(swept.settlement))
    if isinstance(swept, scripts.SweptFailed):
        error = swept.error
        log.warning("turn %s ended failed: %s", turn_id, error, extra=extra)
        report.add("failed", turn_id)
        if swept.wrote_history:
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
    scan_limit: int = SCAN_LIMIT,
) -> SweepReport:
    """One pass over the running-turn index: every member with no progress for
    ``stuck_seconds`` (default ``FLEET_TURN_STUCK_SECONDS``) is examined, the oldest first
    (at most ``limit``); the broker is asked once for the steps of all of them (reading at
    most ``scan_limit`` messages of the queue and of the unacked hash each), and each is
    left waiting, resumed, ended or dropped (``sweep_turn``). Counts what it did in
    ``fleet_turn_sweeps{action}``. Raises ``StoreUnavailable`` (turns examined before the
    failure keep what was done to them)."""
    settings = store.settings
    stuck_ms = int(1000 * (settings.turn_stuck_seconds if stuck_seconds is None else stuck_seconds))
    most = MAX_RESUMES if max_resumes is None else max_resumes
    report = SweepReport()
    stale = _stale(store, stuck_ms, limit)
    seen = _scan(store, stale, scan_limit)
    for tid in stale:
        report.examined += 1
        sweep_turn(
            store,
            dispatcher,
            tid,
            stuck_ms=stuck_ms,
            max_resumes=most,
            report=report,
            seen=seen[tid],
        )
    done = Counter({action: n for action, n in report.totals.items() if n})
    metrics.incr_many(
        store, [(metrics.TURN_SWEEPS, (action,), n) for action, n in sorted(done.items())]
    )
    return report
