"""The turn package's door to Redis: one typed function per Lua script beside it
(``turn_create.lua``, ``turn_begin_step.lua``, ``turn_advance.lua``, ``turn_finish.lua``,
``turn_record.lua``, ``turn_cancel.lua``, ``turn_sweep.lua``, ``turn_broker_scan.lua``,
``turn_watch.lua``, ``turn_watch_many.lua``).

Only this module builds those scripts' ARGV and reads their replies. A reply that is a turn's
state or a verdict callers hand on as it is (``ok``, ``superseded``, ``missing``) stays a
string, its values listed on each function. Every function raises ``StoreUnavailable`` when
Redis cannot be reached.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Any, ClassVar

from orchestrator.session.fencing import StepGuard
from orchestrator.states import TurnState
from orchestrator.storage.idempotency import Idempotency
from orchestrator.storage.store import Store

#: What the broker scan found of a turn's step: what was seen (``queued``, ``held``,
#: ``unseen``, ``absent``, ``skip``; ``""`` when not looked), the step looked for, the
#: delivery tag of a held message.
Seen = tuple[str, str, str]


@dataclass(frozen=True)
class Stored:
    """``turn_create``: the turn is stored; ``outcome`` is ``run`` (it runs now) or ``queued``
    (behind the session's running turn)."""

    outcome: str


@dataclass(frozen=True)
class Replay:
    """``turn_create``: the idempotency key was seen before; ``turn_id`` is the turn it
    created. Nothing stored."""

    turn_id: str


@dataclass(frozen=True)
class KeyReused:
    """``turn_create``: the idempotency key came before with another prompt. Nothing stored."""


@dataclass(frozen=True)
class SessionMissing:
    """``turn_create``: no such session. Nothing stored."""


@dataclass(frozen=True)
class Archived:
    """``turn_create``: the session's lineage is archived, by ``holder``. Nothing stored."""

    holder: str


@dataclass(frozen=True)
class Stopped:
    """``turn_create``: the guarding step's turn no longer runs or that copy no longer owns
    the step, or (a reminder's fire) a stop deleted the reminder. Nothing stored."""


@dataclass(frozen=True)
class Duplicate:
    """``turn_create``: the reminder fired before; ``turn_id`` is the turn it created."""

    turn_id: str


Created = Stored | Replay | KeyReused | SessionMissing | Archived | Stopped | Duplicate


def turn_create(
    store: Store,
    *,
    session_id: str,
    turn_id: str,
    prompt: str,
    label: str,
    source: str,
    now_ms: int | None = None,
    now_iso: str = "",
    guard: StepGuard | None = None,
    reminder_id: str = "",
    idempotency: Idempotency | None = None,
) -> Created:
    """Store turn ``turn_id`` of ``session_id`` for ``prompt`` (``label``: its short form;
    ``source``: ``prompt``, ``reminder``, ``subagent``, ``subagent_result``), running at once
    when the session has no running turn, else queued; ``now_ms`` (ms since the epoch) and
    ``now_iso`` ``None``/``""``: the server's clock. With ``guard`` nothing is stored once
    that copy of the step no longer owns its turn; with ``reminder_id`` at most one turn per
    reminder; with ``idempotency`` at most one turn per key."""
    guard_tid, guard_token = StepGuard.argv(guard)
    args: list[object] = [session_id, turn_id, prompt, label, source]
    args += ["" if now_ms is None else now_ms, now_iso, guard_tid, reminder_id, guard_token]
    reply = store.run("turn_create", [*args, *Idempotency.argv(idempotency)])
    verdict = str(reply[0])
    if verdict in ("run", "queued"):
        return Stored(verdict)
    if verdict == "replay":
        return Replay(str(reply[1]))
    if verdict == "key_reused":
        return KeyReused()
    if verdict == "not_found":
        return SessionMissing()
    if verdict == "archived":
        return Archived(str(reply[1]))
    if verdict == "duplicate":
        return Duplicate(str(reply[1]))
    return Stopped()


@dataclass(frozen=True)
class Begun:
    """``turn_begin_step``: this copy of the step began (its lease holds its token); what the
    step needs: the turn's session, prompt and source, the session's ``title``, ``model`` and
    ``agent`` (``""`` when unset)."""

    session_id: str
    prompt: str
    source: str
    title: str
    model: str
    agent: str = ""


@dataclass(frozen=True)
class GateRefused:
    """``turn_begin_step``: the gate refused the step (``reason``); the turn ended in
    ``ended`` and ``promoted`` (``""``: none) is the session's next turn, now running."""

    reason: str
    ended: TurnState
    promoted: str


@dataclass(frozen=True)
class Dropped:
    """``turn_begin_step``: nothing begun; ``why`` is ``stale`` (a duplicate of a step already
    run), ``inflight`` (a duplicate of a step running now), ``missing``, or the turn's state
    when it no longer runs."""

    why: str


def turn_begin_step(
    store: Store, *, turn_id: str, index: int, lease_ms: int, token: str
) -> Begun | GateRefused | Dropped:
    """Ask the gate and begin step ``index`` of ``turn_id`` as the copy holding ``token``,
    with a lease of ``lease_ms``, in one script."""
    reply = store.run("turn_begin_step", [turn_id, index, lease_ms, token])
    verdict = str(reply[0])
    if verdict == "ok":
        sid, prompt, source, title, model, agent = (str(x) for x in reply[1:7])
        return Begun(sid, prompt, source, title, model, agent)
    if verdict == "refused":
        _, reason, ended, promoted = reply
        return GateRefused(str(reason), TurnState(ended), str(promoted))
    return Dropped(verdict)


def turn_advance(
    store: Store, *, turn_id: str, index: int, token: str, said: str | None = None
) -> str:
    """Move the running ``turn_id`` to step ``index`` and drop the lease of the copy holding
    ``token`` (the same index re-offers the step), with ``said`` (an update's JSON, ``""``:
    none) landed first. Returns ``ok``, ``superseded`` (another copy owns the step) or the
    turn's state when it no longer runs."""
    args: list[object] = [turn_id, index, token]
    if said is not None:
        args.append(said)
    return str(store.run("turn_advance", args))


@dataclass(frozen=True)
class Finished:
    """``turn_finish``: the turn ended; ``promoted`` (``""``: none) is the session's next
    turn, now running; ``session_id`` is the turn's session (``""`` unless announced)."""

    promoted: str
    session_id: str


@dataclass(frozen=True)
class NotMoved:
    """``turn_finish``: the turn was not in a state allowed to end (``state``, or
    ``missing``)."""

    state: str


@dataclass(frozen=True)
class Superseded:
    """``turn_finish``: another copy of the step owns the turn; nothing ended."""


def turn_finish(
    store: Store,
    *,
    turn_id: str,
    state: TurnState,
    stop_reason: str,
    error: str,
    allowed_from: str,
    now_ms: int | None = None,
    now_iso: str = "",
    token: str | None = None,
    stream_max: int | None = None,
    said: str | None = None,
) -> Finished | NotMoved | Superseded:
    """End ``turn_id`` in ``state`` (ACP ``stop_reason``, ``error`` text) if its state is in
    ``allowed_from`` (a comma list); ``now_ms`` ``None``: the server's clock. With ``token``
    only the copy of the step holding it may; with ``stream_max`` the end is published on
    the event stream (capped near that many entries); ``said`` (an update's JSON) lands in
    the conversation first."""
    args: list[object] = [turn_id, state.value, stop_reason, error]
    args += ["" if now_ms is None else now_ms, now_iso, allowed_from]
    tail: list[object | None] = [token, stream_max, said]
    while tail and tail[-1] is None:
        tail.pop()
    reply = store.run("turn_finish", [*args, *("" if v is None else v for v in tail)])
    verdict = str(reply[0])
    if verdict == "finished":
        return Finished(str(reply[1]), str(reply[2]) if len(reply) > 2 else "")
    if verdict == "superseded":
        return Superseded()
    return NotMoved(str(reply[1]) if len(reply) > 1 else "")


class Recorded(IntEnum):
    """``turn_record``: what became of an update."""

    APPENDED = 1
    #: The turn no longer runs (or may not write): nothing appended.
    STOPPED = 0
    #: Another copy of the step owns the turn: nothing appended.
    SUPERSEDED = -1


def turn_record(
    store: Store, *, turn_id: str, update_json: str, settle: bool, token: str | None = None
) -> Recorded:
    """Append ``update_json`` (a ``session/update`` of ``turn_id``) to its session's
    conversation and publish it, while the turn runs (with ``settle``, also while it is
    ``cancelling``) and the copy of the step holding ``token`` owns it (``""``: the turn's
    state alone; ``None`` sends no token)."""
    args: list[object] = [turn_id, update_json, "1" if settle else "0"]
    if token is not None:
        args.append(token)
    return Recorded(int(store.run("turn_record", args)))


@dataclass(frozen=True)
class CancelOutcome:
    """``turn_cancel``: per named turn (in order) its outcome (``cancelled``,
    ``cancelling``, ``missing``, a state it had ended in), and ``promoted`` turns that
    started running; ``ended`` are the turns this call ended."""

    outcomes: list[tuple[str, str]]
    ended: set[str]


def turn_cancel(
    store: Store, *, now_ms: int, now_iso: str, session_id: str, turn_ids: list[str]
) -> CancelOutcome:
    """Cancel exactly ``turn_ids`` of ``session_id`` (queued ones first), at ``now_ms`` (ms
    since the epoch) / ``now_iso``."""
    flat, ended = store.run("turn_cancel", [now_ms, now_iso, session_id, *turn_ids])
    pairs = [(str(t), str(o)) for t, o in zip(flat[::2], flat[1::2], strict=True)]
    return CancelOutcome(pairs, {str(t) for t in ended})


@dataclass(frozen=True)
class Swept:
    """``turn_sweep``: left alone or dropped; ``outcome`` is ``gone``, ``removed`` (the
    member's turn no longer runs: ``state``), ``fresh``, ``leased`` or ``waiting`` (the
    broker holds its step: ``state`` is what was seen)."""

    outcome: str
    state: str = ""


@dataclass(frozen=True)
class Resume:
    """``turn_sweep``: step ``step`` of the turn of ``session_id`` is lost (``losses`` times
    so far); the caller dispatches it again."""

    outcome: ClassVar[str] = "resume"
    session_id: str
    step: int
    losses: int


@dataclass(frozen=True)
class SweptFailed:
    """``turn_sweep``: the turn ended ``failed`` after ``losses`` losses (``error``);
    ``wrote_history`` when the error was said in the conversation; ``promoted`` (``""``:
    none) is the session's next turn; ``settlement`` the open tool call settled (JSON, or
    ``""``)."""

    outcome: ClassVar[str] = "failed"
    session_id: str
    promoted: str
    losses: int
    error: str
    wrote_history: bool
    settlement: str


@dataclass(frozen=True)
class SweptCancelled:
    """``turn_sweep``: a ``cancelling`` turn whose step is gone ended ``cancelled``;
    ``promoted`` and ``settlement`` as for ``SweptFailed``."""

    outcome: ClassVar[str] = "cancelled"
    session_id: str
    promoted: str
    settlement: str


def turn_sweep(
    store: Store,
    *,
    turn_id: str,
    stuck_ms: int,
    max_resumes: int,
    failed_stop_reason: str,
    cancelled_stop_reason: str,
    seen: Seen = ("", "", ""),
) -> Swept | Resume | SweptFailed | SweptCancelled:
    """The sweeper's decision for ``turn_id``, a member of the running-turn index, with no
    progress for ``stuck_ms``, given what the broker scan ``seen`` of its step; past
    ``max_resumes`` losses of a step the turn fails."""
    args = [turn_id, stuck_ms, max_resumes, failed_stop_reason, cancelled_stop_reason, *seen]
    row: list[Any] = store.run("turn_sweep", args)
    outcome = str(row[0])
    if outcome == "resume":
        return Resume(str(row[1]), int(row[2]), int(row[3]))
    if outcome == "failed":
        sid, promoted, losses, error, wrote, settled = row[1:7]
        return SweptFailed(
            str(sid), str(promoted), int(losses), str(error), wrote == "1", str(settled)
        )
    if outcome == "cancelled":
        return SweptCancelled(str(row[1]), str(row[2]), str(row[-1]))
    return Swept(outcome, str(row[1]) if len(row) > 1 else "")


def turn_broker_scan(
    store: Store, *, queue: str, scan_limit: int, turn_ids: list[str]
) -> dict[str, Seen]:
    """What the broker holds of the current step of each of ``turn_ids`` (reading at most
    ``scan_limit`` messages of ``queue`` and of the unacked hash), by turn id; read-only."""
    row = store.run("turn_broker_scan", [queue, scan_limit, *turn_ids])
    return {
        tid: (str(row[3 * i]), str(row[3 * i + 1]), str(row[3 * i + 2]))
        for i, tid in enumerate(turn_ids)
    }


def turn_watch(store: Store, *, turn_id: str, lease_ms: int | None, token: str) -> str:
    """What a step in flight polls: the turn's state, ``superseded`` (the copy holding
    ``token`` no longer owns it) or ``missing``; with ``lease_ms`` its lease is refreshed."""
    return str(store.run("turn_watch", [turn_id, "" if lease_ms is None else lease_ms, token]))


def turn_watch_many(store: Store, *, watches: list[tuple[str, int | None, str]]) -> list[str]:
    """``turn_watch`` for each ``(turn_id, lease_ms, token)`` of ``watches`` in one call, in
    their order."""
    args: list[object] = []
    for turn_id, lease_ms, token in watches:
        args += [turn_id, "" if lease_ms is None else lease_ms, token]
    return [str(state) for state in store.run("turn_watch_many", args)]
