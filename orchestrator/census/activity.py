"""The activity census: what is still live for a session, per family.

Admission reads stored state only (turn records, job records with their leases, stored
reminders, the lineage), never a worker's memory, so a session with no running agent but an
armed reminder still counts, and a job whose worker died stops counting once its lease lapses.
"""

from __future__ import annotations

import dataclasses
import logging
from datetime import datetime
from typing import Any

from orchestrator import families
from orchestrator.census import scripts
from orchestrator.errors import FleetError, StoreUnavailable
from orchestrator.families import Dispatcher, Family
from orchestrator.items import ActivityItem, shorten
from orchestrator.session.sessions import check_session_id, descendants_many, get_session
from orchestrator.storage import metrics
from orchestrator.storage.store import Store, iso, retried

log = logging.getLogger(__name__)

__all__ = [
    "ActivityItem",
    "census",
    "census_many",
    "census_of_rows",
    "merge_items",
    "own_items",
    "shorten",
    "subagent_label",
]


#: A session's own live items, and per family the ids of items whose owner vanished.
Own = tuple[list[ActivityItem], dict[str, list[str]]]


@retried
def _read_own_many(store: Store, sids: list[str], archived_only: bool = False) -> dict[str, Own]:
    """For each session: its own live items, plus per family the ids of items whose owner
    vanished. One script call whatever the number of sessions: ``census.lua`` applies each
    family's liveness rule (its Lua, the one place it is written) and returns the live rows,
    which each family's registry entry turns into items. With ``archived_only`` a session
    not archived when the script runs reads as having nothing."""
    # ``retried`` sees redis-py's own transient errors: the script only reads, re-running it
    # is harmless.
    rows = scripts.census(store, session_ids=sids, archived_only=archived_only)
    return {sid: _decode_own(sid, per_family) for sid, per_family in zip(sids, rows, strict=True)}


def _decode_own(sid: str, per_family: list[scripts.FamilyRows]) -> Own:
    """One session's ``census_rows`` reply (``_lib.lua``) as items and stale ids by family."""
    items: list[ActivityItem] = []
    stale: dict[str, list[str]] = {}
    for rows in per_family:
        spec = families.get(rows.family)
        if spec.item is None:
            raise ValueError(f"family {rows.family!r} has a liveness rule but no item builder")
        items.extend(spec.item(sid, row[0], list(row[1:])) for row in rows.live)
        if rows.vanished:
            stale[spec.name] = rows.vanished
    return items, stale


def _own(store: Store, sid: str, dispatcher: Dispatcher | None) -> list[ActivityItem]:
    items, stale = _read_own_many(store, [sid])[sid]
    _settle_stale(store, dispatcher, sid, stale)
    return items


def _settle_stale(
    store: Store, dispatcher: Dispatcher | None, sid: str, stale: dict[str, list[str]]
) -> None:
    """Items whose owner vanished (a lease lapsed) are settled by their family so they never
    block archive (``FamilySpec.settle``; a family may need ``dispatcher`` to settle)."""
    for name, ids in stale.items():
        settle = families.get(name).settle
        if settle is not None:
            settle(store, dispatcher, sid, ids)


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
        marked = scripts.mark_quiet(store, session_id=session_id, now_iso=iso(ms))
    except StoreUnavailable as exc:
        log.debug("quiet of %s not recorded: %s", session_id, exc)
        return False
    if marked is None:
        return False
    _quiet_recorded(store, session_id, ms, marked.archived_at, observe and marked.root)
    return True


def _quiet_recorded(store: Store, sid: str, ms: int, archived_at: str, observe: bool) -> None:
    """Log (and with ``observe``, time in the histogram) a quiet recorded at ``ms`` (epoch
    ms) for an archive at ``archived_at`` (ISO 8601, or empty)."""
    since = datetime.fromisoformat(archived_at).timestamp() if archived_at else ms / 1000
    seconds = max(0.0, ms / 1000 - since)
    if observe:
        metrics.observe(store, metrics.ARCHIVE_QUIET, seconds)
    log.info("quiet %.3fs after its archive", seconds, extra={"session_id": sid})


def note_quiet(store: Store, session_id: str) -> None:
    """After a stop acted on ``session_id``: if it is archived and its subtree has no live work
    left, record it quiet, then the same for each archived ancestor, nearest first, until one
    still has live work. So an archive is recorded quiet when its last work ends, even if
    nobody reads its activity. One script (``note_quiet.lua``: each family's liveness rule,
    the server's clock), one round trip whatever the depth: it runs on a stop's or a step's
    worker right after the work ended, on the way from the last item's end to ``quietAt``.
    Items whose owner vanished count as not live and are left for a census to settle. Best
    effort: never raises (logged at debug)."""
    try:
        now, marked = scripts.note_quiet(store, session_id=session_id)
    except FleetError as exc:
        log.debug("quiet check of %s skipped: %s", session_id, exc)
        return
    ms = int(datetime.fromisoformat(now).timestamp() * 1000)
    for quiet in marked:
        _quiet_recorded(store, quiet.session_id, ms, quiet.archived_at, quiet.root)


#: ``sessions.descendants_many``, retried as a read of the census.
_descendants_many = retried(descendants_many)


def census_many(
    store: Store,
    session_ids: list[str],
    dispatcher: Dispatcher | None = None,
    *,
    settle: bool = True,
    archived_only: bool = False,
) -> dict[str, list[ActivityItem]]:
    """``census`` of many sessions at once (bulk operations), in a few pipelined round trips
    per batch: one per tree level to find descendants, then one script call
    (``census.lua``) for every session's own records; a batch of idle sessions without
    subagents costs two. The ids are not checked
    (callers pass stored sessions). With ``settle=False`` nothing is written (a dry run):
    records whose owner vanished are left as they are (they do not count as live either way).
    With ``archived_only`` (a census whose items are to be stopped) a session or descendant
    that is no longer archived when its records are read counts as having nothing: it was
    unarchived since it was chosen, and its work now is not the archive's to stop.
    """
    roots = list(dict.fromkeys(session_ids))
    if not roots:
        return {}
    tree = _descendants_many(store, roots)
    everyone = list(dict.fromkeys([*roots, *(d for r in roots for d in tree[r])]))
    own_rows = _read_own_many(store, everyone, archived_only)
    return _assemble(store, dispatcher, roots, tree, own_rows, settle)


def census_of_rows(
    store: Store, session_id: str, flat: list[Any], dispatcher: Dispatcher | None = None
) -> list[ActivityItem]:
    """``census`` of ``session_id`` from rows a script read itself (``archive.lua``): ``flat``
    is sid, ``census_rows(sid)`` for the session, then for each descendant in the order
    ``descendants`` (``_lib.lua``) walks them. Records whose owner vanished are settled, as by
    ``census``; nothing else is read. Raises ``StoreUnavailable`` only when settling."""
    sids = [str(s) for s in flat[::2]]
    own = {
        sid: _decode_own(sid, scripts.census_rows(rows))
        for sid, rows in zip(sids, flat[1::2], strict=True)
    }
    tree = {session_id: [s for s in sids if s != session_id]}
    return _assemble(store, dispatcher, [session_id], tree, own, True)[session_id]


def _assemble(
    store: Store,
    dispatcher: Dispatcher | None,
    roots: list[str],
    tree: dict[str, list[str]],
    own_rows: dict[str, Own],
    settle: bool,
) -> dict[str, list[ActivityItem]]:
    """Each root's census: its own items, then one ``subagent`` item per descendant (in
    ``tree`` order) with live items of its own; stale records settled when ``settle``."""
    own: dict[str, list[ActivityItem]] = {}
    for sid, (items, stale) in own_rows.items():
        if settle and stale:
            _settle_stale(store, dispatcher, sid, stale)
        own[sid] = items
    out: dict[str, list[ActivityItem]] = {}
    for root in roots:
        items = list(own[root])
        for child in tree[root]:
            mine = own[child]
            if not mine:
                continue
            label = subagent_label(child, mine)
            items.append(ActivityItem(Family.SUBAGENT, child, label, child, parts=tuple(mine)))
        out[root] = items
    return out


def subagent_label(child: str, parts: list[ActivityItem] | tuple[ActivityItem, ...]) -> str:
    """The label of a ``subagent`` item: ``subagent <id> (2 turns, 1 job, 1 reminder)``, its
    ``parts`` counted by family in the order they first appear."""
    counts: dict[str, int] = {}
    for item in parts:
        counts[item.family] = counts.get(item.family, 0) + 1
    summary = ", ".join(
        f"{n} {spec.plural if n > 1 else spec.display}"
        for spec, n in ((families.get(fam), n) for fam, n in counts.items())
    )
    return f"subagent {child} ({summary})"


def merge_items(first: list[ActivityItem], then: list[ActivityItem]) -> list[ActivityItem]:
    """``first`` followed by the items of ``then`` it lacks, compared by (family, id). A
    ``subagent`` item in both carries the parts of both, so nothing either list names goes
    unstopped; when ``then`` adds parts its label counts them all (``subagent_label``), so
    it names everything stopped in that session, not only what ``first`` had."""
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
            parts = known.parts + extra
            label = subagent_label(known.id, parts)
            out[at] = dataclasses.replace(known, label=label, parts=parts)
    return out


def own_items(
    store: Store, session_id: str, dispatcher: Dispatcher | None = None
) -> list[ActivityItem]:
    """The session's own live turns, jobs and reminders (no descendants)."""
    return _own(store, session_id, dispatcher)
