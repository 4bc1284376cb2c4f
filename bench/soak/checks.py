"""The checks run after recovery. Each returns a ``Check``: how many violations, a one-line
detail and a few examples. Only the client's own log (``traffic.ClientLog``) and the store's
evidence (``evidence.Evidence``) are compared; both use the machine's wall clock."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

from bench.soak.evidence import Evidence, epoch_ms
from bench.soak.procs import Exit
from bench.soak.traffic import Call

FINAL = {"completed", "cancelled", "blocked", "failed"}
ARCHIVE_OPS = {"archive", "archive_stop", "bulk", "bulk_stop"}
ARCHIVED = {"archived", "already_archived"}


@dataclass
class Check:
    """One check's result."""

    name: str
    violations: int
    detail: str
    examples: list[str] = field(default_factory=list)


def acknowledged_archives(calls: list[Call]) -> list[tuple[str, float, float, str]]:
    """``(session, sent, acknowledged, outcome)`` of every archive answered 200 with
    ``archived`` or ``already_archived`` for that session (single and bulk)."""
    out = []
    for c in calls:
        if c.op not in ARCHIVE_OPS or c.status != 200 or not isinstance(c.body, dict):
            continue
        if "results" in c.body:
            for item in c.body["results"]:
                if item.get("outcome") in ARCHIVED:
                    out.append((item["sessionId"], c.sent, c.done, item["outcome"]))
        elif c.body.get("outcome") in ARCHIVED:
            out.append((c.sids[0], c.sent, c.done, c.body["outcome"]))
    return out


def late_model_requests(calls: list[Call], ev: Evidence) -> Check:
    """(1) A model request that began after the client got the 200 of an archive of the
    session or of an ancestor, with no unarchive of that lineage that may have committed
    between the archive and the request."""
    acks: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for sid, sent, done, _ in acknowledged_archives(calls):
        acks[sid].append((sent * 1000, done * 1000))
    # (sent, answered) of every unarchive; one never answered may have committed any time.
    unarchives: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for c in calls:
        if c.op == "unarchive":
            done = c.done * 1000 if c.answered else float("inf")
            unarchives[c.sids[0]].append((c.sent * 1000, done))
    found, total = 0, 0
    examples: list[str] = []
    for sid, rows in ev.requests.items():
        line = [sid, *ev.lineages.get(sid, [])]
        held = [(h, sent, ack) for h in line for sent, ack in acks.get(h, [])]
        lifts = [u for h in line for u in unarchives.get(h, [])]
        for tid, step, at in rows:
            total += 1
            for holder, sent, ack in held:
                # An unarchive lifts this archive if it may have committed after it (answered
                # after the archive was sent) and before the request (sent before it).
                if at > ack and not any(u_done > sent and u_sent < at for u_sent, u_done in lifts):
                    found += 1
                    if len(examples) < 5:
                        examples.append(
                            f"{sid} turn {tid} step {step}: request {at - ack:.0f} ms after the "
                            f"archive of {holder} was acknowledged"
                        )
                    break
    committed = _after_commit(ev, unarchives)
    return Check(
        "model requests after an acknowledged archive",
        found,
        f"{total} model requests, {sum(len(v) for v in acks.values())} acknowledged archives; "
        f"not counted: {committed} began after the archive's audit entry was written",
        examples,
    )


def _after_commit(ev: Evidence, unarchives: dict[str, list[tuple[float, float]]]) -> int:
    """Model requests that began after an archive of their lineage had committed (its audit
    entry's time: written after the commit, before the 200), with no unarchive that may have
    come between. Shown, not counted: a step admitted just before the commit may record its
    request just after it."""
    commits: dict[str, list[float]] = defaultdict(list)
    for e in ev.audit:
        if e.get("action") in ("archive", "bulk_archive") and e.get("outcome") == "archived":
            at = epoch_ms(e.get("at"))
            if at is not None:
                commits[e.get("sessionId", "")].append(at)
    late = 0
    for sid, rows in ev.requests.items():
        line = [sid, *ev.lineages.get(sid, [])]
        marks = [t for h in line for t in commits.get(h, [])]
        lifts = [u for h in line for u in unarchives.get(h, [])]
        for _, _, at in rows:
            if any(
                at > mark and not any(done > mark and sent < at for sent, done in lifts)
                for mark in marks
            ):
                late += 1
    return late


def reminders(ev: Evidence, now_ms: float) -> Check:
    """(2) Every stored reminder either was deleted by a stop, was refused by its session
    (logged ``not fired``), or became exactly one turn with source ``reminder`` (matched by
    the turn's ``reminderId`` when the store keeps one, else by session and unique prompt)."""
    by_key: Counter[tuple[str, str]] = Counter()
    by_rid: Counter[str] = Counter()
    for t in ev.turns.values():
        if t.get("source") == "reminder":
            by_key[(t.get("sessionId", ""), t.get("prompt", ""))] += 1
            if t.get("reminderId"):
                by_rid[t["reminderId"]] += 1
    fate: Counter[str] = Counter()
    examples: list[str] = []
    for rid in sorted(set(ev.reminders) | ev.stored_reminders):
        h = ev.reminders.get(rid)
        if h is None:
            turns = by_rid.get(rid, 0)
            state = "gone"
        else:
            turns = by_rid[rid] if by_rid else by_key.get((h["sessionId"], h["prompt"]), 0)
            state = h.get("state", "")
        if turns > 1:
            what = "duplicated"
        elif turns == 1:
            what = "became a turn"
        elif state == "deleted":
            what = "deleted by a stop"
        elif rid in ev.refused_reminders:
            what = "refused"
        elif state == "armed":
            due = epoch_ms(h.get("dueAt")) if h else None
            what = "never fired" if due is not None and due < now_ms - 5000 else "pending"
        elif state == "gone":
            what = "vanished"
        else:
            what = "lost"
        fate[what] += max(1, turns - 1) if what == "duplicated" else 1
        if what in ("duplicated", "never fired", "vanished", "lost") and len(examples) < 5:
            examples.append(f"{rid} ({state}, session {h['sessionId'] if h else '?'}): {what}")
    bad = sum(fate[w] for w in ("duplicated", "never fired", "vanished", "lost"))
    detail = ", ".join(f"{n} {w}" for w, n in sorted(fate.items())) or "no reminders"
    return Check("reminders lost or duplicated", bad, detail, examples)


def stuck_turns(ev: Evidence, settle: float) -> Check:
    """(3) Turns not in a final state when the settle window ended."""
    live = [t for t in ev.turns.values() if t.get("state") not in FINAL]
    by_state = Counter(t.get("state", "?") for t in live)
    examples = [
        f"{t['turnId']} {t.get('state')} at step {t.get('step')} (source {t.get('source')})"
        for t in live[:5]
    ]
    detail = f"{len(ev.turns)} turns; not final {settle:g} s after the faults stopped: " + (
        ", ".join(f"{n} {s}" for s, n in sorted(by_state.items())) or "none"
    )
    return Check("turns not final after the settle window", len(live), detail, examples)


def exits(found: list[Exit]) -> Check:
    """(4) Processes that exited without a SIGKILL from the soak."""
    by_name = Counter(e.name for e in found)
    unrecoverable = sum(1 for e in found if e.unrecoverable)
    examples = [
        f"{e.name} exit {e.code}: "
        + (e.unrecoverable[-1] if e.unrecoverable else "(no 'Unrecoverable error' line)")
        for e in found[:5]
    ]
    detail = (
        ", ".join(f"{n} {name}" for name, n in sorted(by_name.items())) or "none"
    ) + f"; {unrecoverable} with 'Unrecoverable error' in the log"
    return Check("process exits not caused by the soak", len(found), detail, examples)


#: The 503 codes of a Redis the API could not reach or lost mid-write (docs/reliability.md):
#: the answers a store fault is owed, not failures.
STORE_FAULT_CODES = frozenset({"store_unavailable", "write_outcome_unknown"})


def server_errors(calls: list[Call]) -> Check:
    """(5) HTTP 5xx answers other than a 503 of ``STORE_FAULT_CODES`` (every 500 counts)."""
    fives = [c for c in calls if c.status is not None and c.status >= 500]
    bad = [c for c in fives if not (c.status == 503 and c.code in STORE_FAULT_CODES)]
    unanswered = sum(1 for c in calls if c.status is None)
    statuses = Counter(f"{c.status} {c.code or '-'}" for c in fives)
    examples = [f"{c.op} {c.sids[:1]}: {c.status} {str(c.body)[:160]}" for c in bad[:5]]
    detail = f"{len(calls)} requests, {unanswered} unanswered (API down), 5xx: " + (
        ", ".join(f"{n} x {s}" for s, n in sorted(statuses.items())) or "none"
    )
    return Check("HTTP 5xx other than a store fault's 503", len(bad), detail, examples)


def metrics_and_audit(calls: list[Call], ev: Evidence) -> Check:
    """(6) ``fleet_archives_total{outcome="archived"}`` and the audit's archive entries with
    outcome ``archived`` against the archives the client saw: per session at least the
    acknowledged ``archived`` outcomes, at most those plus the attempts that got no answer
    or a 5xx (they may have committed; their retry then answered ``already_archived``)."""
    acked: Counter[str] = Counter()
    maybe: Counter[str] = Counter()
    for sid, _, _, outcome in acknowledged_archives(calls):
        if outcome == "archived":
            acked[sid] += 1
    for c in calls:
        if c.op in ARCHIVE_OPS and (c.status is None or c.status >= 500):
            for sid in c.sids:
                maybe[sid] += 1
    audited: Counter[str] = Counter(
        e.get("sessionId", "")
        for e in ev.audit
        if e.get("action") in ("archive", "bulk_archive") and e.get("outcome") == "archived"
    )
    missing = extra = 0
    examples: list[str] = []
    for sid in set(acked) | set(audited):
        low, high = acked[sid], acked[sid] + maybe[sid]
        if audited[sid] < low:
            missing += low - audited[sid]
            if len(examples) < 5:
                examples.append(f"{sid}: {low} archives acknowledged, {audited[sid]} audited")
        elif audited[sid] > high:
            extra += audited[sid] - high
            if len(examples) < 5:
                examples.append(f"{sid}: {audited[sid]} audited, at most {high} happened")
    low, high = sum(acked.values()), sum(acked.values()) + sum(maybe.values())
    metric = ev.archived_metric
    off = 0 if metric is None else max(0, low - metric, metric - high)
    if metric is None:
        off = 1
    if off:
        examples.append(f"fleet_archives_total{{archived}} = {metric}, expected {low}..{high}")
    detail = (
        f"archived acknowledged {low} (+{high - low} unanswered attempts); "
        f"metric {metric} ({ev.metric_source}); audit {sum(audited.values())}; "
        f"{missing} unaudited, {extra} audited beyond what happened"
    )
    return Check(
        "metrics and audit vs acknowledged archives", missing + extra + off, detail, examples
    )
