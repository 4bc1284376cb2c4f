"""The activity census: what is still live for a session, per family.

Admission reads stored state only (turn records, job records with their leases, stored
reminders, the lineage), never a worker's memory, so a session with no running agent but an
armed reminder still counts, and a job whose worker died stops counting once its lease lapses.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from orchestrator.families import Dispatcher, Family, send_step
from orchestrator.sessions import check_session_id, descendants, get_session
from orchestrator.store import Store, iso, now_ms, retried

log = logging.getLogger(__name__)

_LABEL_TEXT = 60


@dataclass(frozen=True)
class ActivityItem:
    """One live item: ``family``, ``id`` (turn/job/reminder id, or the descendant session id
    for ``subagent``), a human ``label``, the ``session_id`` that owns it, and for jobs the
    ``host`` running the process."""

    family: Family
    id: str
    label: str
    session_id: str
    host: str | None = None

    def to_wire(self) -> dict[str, Any]:
        """``{"family", "id", "label", "sessionId", "host"?}``."""
        out: dict[str, Any] = {
            "family": self.family.value,
            "id": self.id,
            "label": self.label,
            "sessionId": self.session_id,
        }
        if self.host:
            out["host"] = self.host
        return out


def shorten(text: str, limit: int = _LABEL_TEXT) -> str:
    """The first line of ``text``, cut to ``limit`` characters with an ellipsis."""
    first = text.strip().splitlines()[0] if text.strip() else ""
    return first if len(first) <= limit else first[: limit - 1] + "…"


@retried
def _read_own(store: Store, sid: str) -> tuple[list[ActivityItem], list[str], list[str]]:
    """The session's own live items, plus the ids of turns and jobs whose owner vanished."""
    k = store.keys
    pipe = store.redis.pipeline(transaction=False)
    pipe.zrange(k.live_turns(sid), 0, -1)
    pipe.smembers(k.live_jobs(sid))
    pipe.smembers(k.live_reminders(sid))
    turn_ids, job_ids, reminder_ids = pipe.execute()
    job_ids, reminder_ids = sorted(job_ids), sorted(reminder_ids)

    pipe = store.redis.pipeline(transaction=False)
    for tid in turn_ids:
        pipe.hmget(k.turn(tid), "state", "prompt")
        pipe.exists(k.step_lease(tid))
    for jid in job_ids:
        pipe.hmget(k.job(jid), "state", "label", "host", "pid")
        pipe.exists(k.job_lease(jid))
    for rid in reminder_ids:
        pipe.hmget(k.reminder(rid), "prompt", "dueAt")
    rows = pipe.execute()

    items: list[ActivityItem] = []
    stale_turns: list[str] = []
    stale_jobs: list[str] = []
    pos = 0
    for tid in turn_ids:
        (state, prompt), leased = rows[pos], rows[pos + 1]
        pos += 2
        if state in ("queued", "running") or (state == "cancelling" and leased):
            label = f'turn "{shorten(prompt or "")}" ({state})'
            items.append(ActivityItem(Family.TURN, tid, label, sid))
        elif state == "cancelling":
            stale_turns.append(tid)
    for jid in job_ids:
        (state, label, host, pid), leased = rows[pos], rows[pos + 1]
        pos += 2
        if state in ("starting", "running") and leased:
            where = f" on {host} (pid {pid})" if host and pid else " (starting)"
            items.append(ActivityItem(Family.JOB, jid, f"job {label}{where}", sid, host or None))
        elif state in ("starting", "running"):
            stale_jobs.append(jid)
    for rid in reminder_ids:
        prompt, due = rows[pos]
        pos += 1
        label = f'reminder "{shorten(prompt or "")}" due {due}'
        items.append(ActivityItem(Family.REMINDER, rid, label, sid))
    return items, stale_turns, stale_jobs


def _own(store: Store, sid: str, dispatcher: Dispatcher | None) -> list[ActivityItem]:
    items, stale_turns, stale_jobs = _read_own(store, sid)
    _settle_stale(store, dispatcher, sid, stale_turns if dispatcher else [], stale_jobs)
    return items


def _settle_stale(
    store: Store, dispatcher: Dispatcher | None, sid: str, turns: list[str], jobs: list[str]
) -> None:
    """Records whose owner vanished (lease lapsed) are settled so they never block archive.
    A turn settled here may let the next queued turn run: its first step is sent."""
    ms = now_ms()
    for tid in turns:
        result = store.run(
            "turn_finish", [tid, "cancelled", "cancelled", "", ms, iso(ms), "cancelling"]
        )
        log.info(
            "turn %s: settled as cancelled (its worker is gone)",
            tid,
            extra={"session_id": sid, "turn_id": tid},
        )
        if dispatcher is not None and result[0] == "finished" and result[1]:
            send_step(dispatcher, sid, result[1], 0)
    for jid in jobs:
        store.run("job_end", [jid, "lost", "", iso(ms), "starting,running"])
        log.warning("job %s: marked lost (its lease lapsed; the owning worker is gone)", jid)


def census(
    store: Store, session_id: str, dispatcher: Dispatcher | None = None
) -> list[ActivityItem]:
    """Every live item of a session: its own turns, jobs and reminders, then one ``subagent``
    item per descendant session (any depth) that has live work of its own.

    Records whose owner vanished are settled on the way (a job whose lease lapsed is marked
    ``lost``); a turn left ``cancelling`` by a dead worker is settled only when a
    ``dispatcher`` is given, since that can start the session's next queued turn.
    Raises ``SessionNotFound``, ``StoreUnavailable``.
    """
    sid = check_session_id(session_id)
    get_session(store, sid)
    items = _own(store, sid, dispatcher)
    for child in descendants(store, sid):
        own = _own(store, child, dispatcher)
        if not own:
            continue
        counts: dict[str, int] = {}
        for item in own:
            counts[item.family.value] = counts.get(item.family.value, 0) + 1
        summary = ", ".join(f"{n} {fam}{'s' if n > 1 else ''}" for fam, n in counts.items())
        items.append(ActivityItem(Family.SUBAGENT, child, f"subagent {child} ({summary})", child))
    return items


def own_items(
    store: Store, session_id: str, dispatcher: Dispatcher | None = None
) -> list[ActivityItem]:
    """The session's own live turns, jobs and reminders (no descendants)."""
    return _own(store, session_id, dispatcher)
