"""The activity census: what is still live for a session, per family.

Admission reads stored state only (turn records, job records with their leases, stored
reminders, the lineage), never a worker's memory, so a session with no running agent but an
armed reminder still counts, and a job whose worker died stops counting once its lease lapses.
"""

from __future__ import annotations

import dataclasses
import logging
from datetime import datetime

from orchestrator import metrics
from orchestrator.errors import FleetError, StoreUnavailable
from orchestrator.families import Dispatcher, Family, send_step
from orchestrator.items import ActivityItem as ActivityItem  # the census returns them
from orchestrator.sessions import check_session_id, get_session
from orchestrator.store import Store, iso, retried

log = logging.getLogger(__name__)

_LABEL_TEXT = 60


def shorten(text: str, limit: int = _LABEL_TEXT) -> str:
    """The first line of ``text``, cut to ``limit`` characters with an ellipsis."""
    first = text.strip().splitlines()[0] if text.strip() else ""
    return first if len(first) <= limit else first[: limit - 1] + "…"


#: A session's own live items, and the ids of its turns and jobs whose owner vanished.
Own = tuple[list[ActivityItem], list[str], list[str]]


@retried
def _read_own_many(store: Store, sids: list[str]) -> dict[str, Own]:
    """For each session: its own live items, plus the ids of turns and jobs whose owner
    vanished. Two pipelined round trips whatever the number of sessions (one when none of
    them has any live-work entry)."""
    k = store.keys
    pipe = store.redis.pipeline(transaction=False)
    for sid in sids:
        pipe.zrange(k.live_turns(sid), 0, -1)
        pipe.smembers(k.live_jobs(sid))
        pipe.smembers(k.live_reminders(sid))
    listed = pipe.execute()
    entries: list[tuple[str, list[str], list[str], list[str]]] = []
    pipe = store.redis.pipeline(transaction=False)
    for i, sid in enumerate(sids):
        turn_ids, job_ids, reminder_ids = listed[3 * i : 3 * i + 3]
        job_ids, reminder_ids = sorted(job_ids), sorted(reminder_ids)
        entries.append((sid, turn_ids, job_ids, reminder_ids))
        for tid in turn_ids:
            pipe.hmget(k.turn(tid), "state", "prompt")
            pipe.exists(k.step_lease(tid))
        for jid in job_ids:
            pipe.hmget(k.job(jid), "state", "label", "host", "pid")
            pipe.exists(k.job_lease(jid))
        for rid in reminder_ids:
            pipe.hmget(k.reminder(rid), "prompt", "dueAt")
    rows = pipe.execute() if len(pipe) else []

    out: dict[str, Own] = {}
    pos = 0
    for sid, turn_ids, job_ids, reminder_ids in entries:
        items: list[ActivityItem] = []
        stale_turns: list[str] = []
        stale_jobs: list[str] = []
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
                items.append(
                    ActivityItem(Family.JOB, jid, f"job {label}{where}", sid, host or None)
                )
            elif state in ("starting", "running"):
                stale_jobs.append(jid)
        for rid in reminder_ids:
            prompt, due = rows[pos]
            pos += 1
            label = f'reminder "{shorten(prompt or "")}" due {due}'
            items.append(ActivityItem(Family.REMINDER, rid, label, sid))
        out[sid] = (items, stale_turns, stale_jobs)
    return out


def _read_own(store: Store, sid: str) -> Own:
    """The session's own live items, plus the ids of turns and jobs whose owner vanished."""
    return _read_own_many(store, [sid])[sid]


def _own(store: Store, sid: str, dispatcher: Dispatcher | None) -> list[ActivityItem]:
    items, stale_turns, stale_jobs = _read_own(store, sid)
    _settle_stale(store, dispatcher, sid, stale_turns if dispatcher else [], stale_jobs)
    return items


def _settle_stale(
    store: Store, dispatcher: Dispatcher | None, sid: str, turns: list[str], jobs: list[str]
) -> None:
    """Records whose owner vanished (lease lapsed) are settled so they never block archive.
    A turn settled here may let the next queued turn run: its first step is sent."""
    ms = store.now_ms()
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
    ``dispatcher`` is given, since that can start the session's next queued turn. The first
    empty census of an archived session records it quiet (``mark_quiet``).
    Raises ``SessionNotFound``, ``StoreUnavailable``.
    """
    sid = check_session_id(session_id)
    session = get_session(store, sid)
    items = census_many(store, [sid], dispatcher)[sid]
    if not items and session.archived and session.quiet_at is None:
        mark_quiet(store, sid)
    return items


def mark_quiet(store: Store, session_id: str, *, observe: bool = True) -> bool:
    """Record that an archived session has no live work left: ``quietAt`` is written on it and
    on every session of its subtree archived in the same transition, once per archive
    transition. With ``observe``, the seconds since the archive go to the
    ``fleet_archive_quiet_seconds`` histogram when the session is the one the archive was
    asked for (a descendant archived with it is not counted again). Returns whether it was
    newly marked. Best effort: never raises for a store failure (logged at debug)."""
    try:
        ms = store.now_ms()
        marked = store.run("mark_quiet", [session_id, iso(ms)])
    except StoreUnavailable as exc:
        log.debug("quiet of %s not recorded: %s", session_id, exc)
        return False
    if not marked:
        return False
    archived_at, root = marked
    since = datetime.fromisoformat(archived_at).timestamp() if archived_at else ms / 1000
    seconds = max(0.0, ms / 1000 - since)
    if observe and root == "1":
        metrics.observe(store, metrics.ARCHIVE_QUIET, seconds)
    log.info("quiet %.3fs after its archive", seconds, extra={"session_id": session_id})
    return True


def note_quiet(store: Store, session_id: str) -> None:
    """After a stop acted on ``session_id``: if it is archived, take its census (which records
    it quiet when nothing is left), then the same for each archived ancestor, nearest first,
    until one still has live work. So an archive is recorded quiet when its last work ends,
    even if nobody reads its activity. Best effort: never raises (logged at debug)."""
    try:
        chain = [session_id, *_lineage(store, session_id)]
        for sid in chain:
            session = get_session(store, sid)
            if not session.archived:
                return  # nor are its ancestors: an archive covers the whole subtree
            if session.quiet_at is None and census(store, sid):
                return
    except FleetError as exc:
        log.debug("quiet check of %s skipped: %s", session_id, exc)


@retried
def _lineage(store: Store, session_id: str) -> list[str]:
    """The session's ancestors, nearest first."""
    found: list[str] = store.redis.lrange(store.keys.lineage(session_id), 0, -1)
    return found


@retried
def _descendants_many(store: Store, roots: list[str]) -> dict[str, list[str]]:
    """Every descendant of each root, any depth, breadth first (children of one session in
    sorted order, deleted ones included): one pipelined round trip per tree level for all
    roots together."""
    out: dict[str, list[str]] = {root: [] for root in roots}
    level = [(root, root) for root in dict.fromkeys(roots)]
    while level:
        pipe = store.redis.pipeline(transaction=False)
        for _, sid in level:
            pipe.smembers(store.keys.children(sid))
        nxt: list[tuple[str, str]] = []
        for (root, _), members in zip(level, pipe.execute(), strict=True):
            for child in sorted(members):
                out[root].append(child)
                nxt.append((root, child))
        level = nxt
    return out


def census_many(
    store: Store,
    session_ids: list[str],
    dispatcher: Dispatcher | None = None,
    *,
    settle: bool = True,
) -> dict[str, list[ActivityItem]]:
    """``census`` of many sessions at once (bulk operations), in a few pipelined round trips
    per batch: one per tree level to find descendants, then two for every session's own
    records; a batch of idle sessions without subagents costs three. The ids are not checked
    (callers pass stored sessions). With ``settle=False`` nothing is written (a dry run):
    records whose owner vanished are left as they are (they do not count as live either way).
    """
    roots = list(dict.fromkeys(session_ids))
    if not roots:
        return {}
    tree = _descendants_many(store, roots)
    everyone = list(dict.fromkeys([*roots, *(d for r in roots for d in tree[r])]))
    own_rows = _read_own_many(store, everyone)
    own: dict[str, list[ActivityItem]] = {}
    for sid, (items, stale_turns, stale_jobs) in own_rows.items():
        if settle and (stale_turns or stale_jobs):
            _settle_stale(store, dispatcher, sid, stale_turns if dispatcher else [], stale_jobs)
        own[sid] = items
    out: dict[str, list[ActivityItem]] = {}
    for root in roots:
        items = list(own[root])
        for child in tree[root]:
            mine = own[child]
            if not mine:
                continue
            counts: dict[str, int] = {}
            for item in mine:
                counts[item.family.value] = counts.get(item.family.value, 0) + 1
            summary = ", ".join(f"{n} {fam}{'s' if n > 1 else ''}" for fam, n in counts.items())
            items.append(
                ActivityItem(
                    Family.SUBAGENT,
                    child,
                    f"subagent {child} ({summary})",
                    child,
                    parts=tuple(mine),
                )
            )
        out[root] = items
    return out


def merge_items(first: list[ActivityItem], then: list[ActivityItem]) -> list[ActivityItem]:
    """``first`` followed by the items of ``then`` it lacks, compared by (family, id). A
    ``subagent`` item in both keeps ``first``'s label and carries the parts of both, so
    nothing either list names goes unstopped."""
    out = list(first)
    where = {(item.family, item.id): i for i, item in enumerate(out)}
    for item in then:
        at = where.get((item.family, item.id))
        if at is None:
            where[(item.family, item.id)] = len(out)
            out.append(item)
            continue
        known = out[at]
        have = {(p.family, p.id) for p in known.parts}
        extra = tuple(p for p in item.parts if (p.family, p.id) not in have)
        if extra:
            out[at] = dataclasses.replace(known, parts=known.parts + extra)
    return out


def own_items(
    store: Store, session_id: str, dispatcher: Dispatcher | None = None
) -> list[ActivityItem]:
    """The session's own live turns, jobs and reminders (no descendants)."""
    return _own(store, session_id, dispatcher)
