"""Every Redis key agent-fleet writes, named in one place.

All keys start with the configured prefix (``FLEET_KEY_PREFIX``, default ``fleet:``). The type
and meaning of each key is given next to its builder. The Lua scripts never spell a key: each
runs after ``lua_prelude``, generated from these builders (``K.turn(tid)``, ``K.archived``),
with the prefix as its first argument, so the builders below are the one source of every key
name in Python and in Lua.

Single-instance Redis is assumed: scripts touch keys they derive at run time, which Redis
Cluster would not allow.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass

#: kombu's name of its hash of unacknowledged messages (under ``Keys.broker_prefix``), given
#: to the transport by ``workers/app.py`` so the two cannot disagree.
BROKER_UNACKED = "unacked"

#: Session states an index is kept for.
INDEX_STATES = ("all", "active", "archived")
#: Audit entries kept per session (``Keys.audit_log``); older ones are trimmed.
AUDIT_MAX_PER_SESSION = 1000
#: Audit entries kept in the fleet-wide trail (``Keys.audit_all``).
AUDIT_MAX_GLOBAL = 100_000


@dataclass(frozen=True)
class Keys:
    """Key builders bound to one prefix."""

    prefix: str

    # -- sessions ---------------------------------------------------------------------------
    def session(self, sid: str) -> str:
        """HASH: cwd, title, titleSource (client|generated|''), parentId,
        createdAt/updatedAt (ISO 8601; updatedAt: the last prompt or turn end, a turn end
        within 1 s of the last one leaving it there), updatedMs, archived ('0'|'1'),
        archivedAt, archiveTxn (id of the archive transition that archived it), deleted
        ('0'|'1'), quietAt and
        quietTxn (when a census first found it quiet after the archive transition quietTxn);
        reconciler bookkeeping (``orchestrator/archiving/reconcile.py``): reconcileTxn (the archive
        transition the attempts count for), reconcileAttempts, reconcileNextMs (epoch ms before
        which it is not retried) and archiveHazard (JSON {since, attempts, families}); model
        (the model name it asked for, '' for the backend's default); inputTokens and
        outputTokens (model usage of all its turns, ``orchestrator/models/usage.py``); trailBatch
        and trail2Batch (while the newest one or two entries of its audit trail wait in a
        bulk archive's batch hash, ``audit_batch``, the ids of those batches, the older
        first; the session's next entry moves them to ``audit_log``). The id is the key's
        suffix, not a field."""
        return f"{self.prefix}session:{sid}"

    def lineage(self, sid: str) -> str:
        """LIST: ancestor session ids, nearest first. Written once at creation, removed
        when the session is deleted."""
        return f"{self.prefix}lineage:{sid}"

    def children(self, sid: str) -> str:
        """SET: ids of the direct subagent sessions of ``sid``. A deleted session leaves its
        parent's set; a delete takes its subtree, this set with it."""
        return f"{self.prefix}children:{sid}"

    def busy_children(self, sid: str) -> str:
        """SET: ids of the direct subagents of ``sid`` that are not deleted and hold items of
        some activity family (``live_turns``, ``live_jobs`` or ``live_reminders`` exists), live
        or stale: a superset of its live subagents, so ``create_session.lua`` counts
        ``FLEET_MAX_SUBAGENTS_PER_SESSION`` among these, never walking the idle ones. Every
        script that adds or removes an item of a session updates it in the same script
        (``sync_busy`` in ``_lib.lua``); a delete removes the session from its parent's and
        drops its own. Kept from the session's creation on."""
        return f"{self.prefix}busychildren:{sid}"

    @property
    def archived(self) -> str:
        """SET: ids of every archived session. The step gate reads it."""
        return f"{self.prefix}archived"

    def index(self, state: str, cwd_hash: str | None = None) -> str:
        """ZSET: session ids scored by updatedAt (epoch ms), one per listing state
        (``all``/``active``/``archived``), optionally narrowed to one cwd (by its hash)."""
        if cwd_hash is None:
            return f"{self.prefix}idx:{state}"
        return f"{self.prefix}idx:cwd:{cwd_hash}:{state}"

    def history(self, sid: str) -> str:
        """LIST: JSON ``session/update`` payloads of the conversation, oldest first."""
        return f"{self.prefix}history:{sid}"

    def model_requests(self, sid: str) -> str:
        """LIST: JSON records of every model request started for the session (turnId, step,
        at): the evidence that nothing ran after an archive."""
        return f"{self.prefix}modelreq:{sid}"

    def permissions(self, sid: str) -> str:
        """HASH: the session's permission requests waiting for a person
        (``orchestrator/agents/permissions.py``): request id -> JSON ``{requestId, turnId,
        toolCall, options, askedAt, expiresAt}``."""
        return f"{self.prefix}perm:{sid}"

    def permission_answer(self, rid: str) -> str:
        """LIST with TTL: the answer to permission request ``rid`` (an option id, or
        ``cancelled``), pushed by a person's client, popped by the agent's waiting step."""
        return f"{self.prefix}permans:{rid}"

    def idempotency(self, scope: str, digest: str) -> str:
        """HASH with TTL (``FLEET_IDEMPOTENCY_TTL_SECONDS``): a client's idempotency key, seen
        by the script that created what it asked for (``orchestrator/storage/idempotency.py``):
        fp (the request's fingerprint) and id (the session or turn it created). ``scope`` is
        ``sessions`` for a session's creation, the session id for a prompt; ``digest`` is the
        SHA-256 of the client's key (hex), so any key fits the key schema."""
        return f"{self.prefix}idem:{scope}:{digest}"

    # -- turns ------------------------------------------------------------------------------
    def turn(self, tid: str) -> str:
        """HASH: turnId, sessionId, state (see ``TurnState``), prompt, label, source, step
        (index of the next step to run), stopReason, error, createdAt, endedAt, openCall (the
        id of the tool call its step has open, settled as cancelled by an archive), said ('1'
        once its prompt is in the conversation: recorded when its first step is admitted); the
        sweeper's bookkeeping (``orchestrator/turn/sweeper.py``): resumes (times step ``resumeStep``
        was found lost and dispatched again), resumeStep, and heldTag and heldMs (the
        delivery of its step it found taken by a worker and not begun, and since when, epoch
        ms on Redis's clock; removed when the turn ends); the fencing of its current step
        (``orchestrator/session/fencing.py``): stepToken (the token of the copy that began it last)
        and stepLeaseMs (that copy's lease length, to re-take a lapsed lease); inputTokens and
        outputTokens (its model usage); cancelledBy (``archive`` when an archive of its session
        or an ancestor stopped it, kept by whatever settles it later; absent otherwise)."""
        return f"{self.prefix}turn:{tid}"

    def live_turns(self, sid: str) -> str:
        """ZSET: ids of the session's live turns (queued, running, cancelling) scored by
        arrival order (``turn_seq``); the lowest queued one runs next."""
        return f"{self.prefix}turns:live:{sid}"

    def turn_seq(self, sid: str) -> str:
        """STRING (counter): arrival order of the session's turns; scores ``live_turns``."""
        return f"{self.prefix}turn:seq:{sid}"

    def active_turn(self, sid: str) -> str:
        """STRING: id of the turn currently running for the session (one at a time)."""
        return f"{self.prefix}turn:active:{sid}"

    @property
    def turns_inflight(self) -> str:
        """ZSET: ids of every turn ``running`` or ``cancelling``, scored by the epoch ms
        (Redis ``TIME``) of its last progress (a step began, the turn advanced); removed when
        the turn ends. The sweeper (``orchestrator/turn/sweeper.py``) reads it to find lost
        steps."""
        return f"{self.prefix}turns:inflight"

    def step_lease(self, tid: str) -> str:
        """STRING with TTL: present while a worker is executing a step of the turn; its value
        is the fencing token of the copy of the step that owns it
        (``orchestrator/session/fencing.py``).
        """
        return f"{self.prefix}turn:lease:{tid}"

    # -- jobs -------------------------------------------------------------------------------
    def job(self, jid: str) -> str:
        """HASH: jobId, sessionId, label, state (see ``JobState``), seconds, host, instance
        (the worker instance that claimed it, ``orchestrator/process/ownership.py``), pid, pidStart
        (the process's start time, epoch seconds as psutil reports it), createdAt, startedAt,
        endedAt, exitCode, command (the shell command a ``start_job`` call gave, '' for the
        supervisor's own) and, for a job a worker refused to start, reason (why:
        ``archived:<session>`` or the limit's message)."""
        return f"{self.prefix}job:{jid}"

    def host_jobs(self, host: str) -> str:
        """SET: ids of the jobs job workers of ``host`` took (``job_claim.lua``) and that have
        not ended; those whose lease lapsed are pruned at the next claim there. Counted for
        ``FLEET_MAX_JOBS_PER_HOST``."""
        return f"{self.prefix}jobs:host:{host}"

    def live_jobs(self, sid: str) -> str:
        """SET: ids of the session's jobs not yet known to have ended."""
        return f"{self.prefix}jobs:live:{sid}"

    def job_lease(self, jid: str) -> str:
        """STRING with TTL: the job counts as live only while this exists. Set at dispatch
        (start timeout), refreshed by the owning job worker while the process runs."""
        return f"{self.prefix}job:lease:{jid}"

    def job_host(self, host: str) -> str:
        """HASH with TTL: the lease of the live job worker on host name ``host``: instance,
        pid, since (ISO 8601). Renewed by its holder; a second worker with the same host name
        is refused while it exists (``orchestrator/process/ownership.py``)."""
        return f"{self.prefix}job:host:{host}"

    # -- reminders --------------------------------------------------------------------------
    def reminder(self, rid: str) -> str:
        """HASH: reminderId, sessionId, prompt, label, dueAt (ISO 8601), createdAt, state
        (``armed``; ``firing`` once claimed; then ``fired``, ``deleted``, ``refused`` or
        ``dropped``), claims (how many times the poller claimed it) and, once fired, turnId
        (the one turn it became)."""
        return f"{self.prefix}reminder:{rid}"

    @property
    def reminders_due(self) -> str:
        """ZSET: armed reminder ids scored by due time (epoch ms, the Redis server's clock);
        the poller claims from it."""
        return f"{self.prefix}reminders:due"

    @property
    def reminders_firing(self) -> str:
        """ZSET: claimed (``firing``) reminder ids scored by the epoch ms (server clock) after
        which the poller claims them again, because their turn was not created in time."""
        return f"{self.prefix}reminders:firing"

    @property
    def reminders_wake(self) -> str:
        """PUBSUB channel: a reminder's due time (epoch ms, server clock) as it is armed, so a
        poller sleeping until the next due reminder wakes for an earlier one
        (``orchestrator/reminder/reminders.py``)."""
        return f"{self.prefix}reminders:wake"

    def live_reminders(self, sid: str) -> str:
        """SET: ids of the session's live reminders: armed, or firing (claimed, their turn not
        created yet)."""
        return f"{self.prefix}reminders:live:{sid}"

    # -- workers ----------------------------------------------------------------------------
    def worker_heartbeat(self, family: str, node: str) -> str:
        """STRING with TTL: present while worker ``node`` of ``family`` is alive."""
        return f"{self.prefix}worker:{family}:{node}"

    def worker_heartbeats(self, family: str) -> str:
        """Glob matching the heartbeat keys of every worker of ``family``."""
        return f"{self.prefix}worker:{family}:*"

    def ops_counter(self, name: str) -> str:
        """STRING (counter): how many ``ops.ping`` tasks named ``name`` ran."""
        return f"{self.prefix}ops:{name}"

    # -- the broker (kombu's Redis transport, configured in ``workers/app.py``) -------------
    @property
    def broker_prefix(self) -> str:
        """Prefix of every key of the Celery broker (kombu's ``global_keyprefix``): its
        queues and its record of unacknowledged messages live beside the fleet's state."""
        return f"{self.prefix}celery:"

    def broker_queue(self, queue: str) -> str:
        """LIST: the messages waiting in broker queue ``queue`` (a family's queue name), as
        kombu's Redis transport keeps them: JSON, pushed on the left, taken from the right.
        Messages sent with a priority go to other lists (none of the fleet's are)."""
        return f"{self.broker_prefix}{queue}"

    @property
    def broker_unacked(self) -> str:
        """HASH: the messages a worker took and has not acknowledged yet (steps are
        acknowledged when they end), kombu's delivery tag -> JSON ``[message, exchange,
        routing key]``; kombu hands an entry back to its queue after the visibility
        timeout. ``BROKER_UNACKED`` names it in the transport's options."""
        return f"{self.broker_prefix}{BROKER_UNACKED}"

    # -- events -----------------------------------------------------------------------------
    @property
    def events(self) -> str:
        """PUBSUB channel: JSON lifecycle events (archived, unarchived, title, turn state)."""
        return f"{self.prefix}events"

    @property
    def gate_closed(self) -> str:
        """PUBSUB channel: a JSON list of the session ids one archive script (or one bulk
        batch) just archived, for the processes that stop their work
        (``orchestrator/session/gate.py``)."""
        return f"{self.prefix}gate:closed"

    @property
    def event_stream(self) -> str:
        """STREAM: the lifecycle events of ``events`` kept durably (field ``event``: the JSON
        payload), capped near ``events.STREAM_MAXLEN`` entries; ``GET /events`` (Server-Sent
        Events) reads it, so a client resumes after its ``Last-Event-ID``."""
        return f"{self.prefix}events:stream"

    # -- operations: metrics and audit -------------------------------------------------------
    def metric(self, name: str) -> str:
        """HASH: one metric (``orchestrator/storage/metrics.py``). A counter maps its label values
        (joined by ``|``) to a count; a histogram maps ``le=<bound>`` (non-cumulative) and
        ``sum`` to numbers (its count is the sum of its buckets)."""
        return f"{self.prefix}metrics:{name}"

    def audit_log(self, sid: str) -> str:
        """LIST: the session's lifecycle changes (``orchestrator/storage/audit.py``), oldest first,
        capped at ``Store.audit_max_per_session`` (``AUDIT_MAX_PER_SESSION``) entries; each a
        JSON object ``{id, at, action, outcome, actor, detail}`` whose ``id`` is the same
        entry's id in ``audit_all`` (an ancestor's entry, for an archive, unarchive or delete
        that reached the session through it: ``detail`` ``{ancestorId}``). A bulk archive's
        entry waits in its batch's hash (``audit_batch``) until the session's next entry, so
        the bulk adds no key per session.
        A list, not a stream: a stream's first node takes 4 KB on Redis >= 7.0 (it is
        preallocated), a list with one entry a few hundred bytes."""
        return f"{self.prefix}auditlog:{sid}"

    def audit_batch(self, batch: str) -> str:
        """HASH: the audit trail entries one bulk archive batch (``archiving/archive.lua``,
        ``batch`` its transition base id) left waiting: field ``<session id>:<slot>`` (slot
        1 or 2, the session hash's trailBatch or trail2Batch naming this batch), value the
        entry as ``audit_log`` holds it. The session's next entry moves its own out
        (``flush_trail`` in ``_lib.lua``); Redis drops the hash once the last one is gone.
        One key per batch of up to 1,000 sessions, where a list per session would add a key
        to Redis's key table for each."""
        return f"{self.prefix}auditbatch:{batch}"

    @property
    def audit_all(self) -> str:
        """STREAM: every session's lifecycle changes, capped at ``Store.audit_max_global``
        (``AUDIT_MAX_GLOBAL``)."""
        return f"{self.prefix}audit"


# -- the scripts' view of this schema --------------------------------------------------------
_PREFIX_MARK = "\x01"
_ARG_MARKS = ("\x02", "\x03", "\x04")


def _lua_template(text: str, args: tuple[str, ...]) -> str:
    """A key built from sentinels as a Lua expression over ``P`` and ``args``."""
    assert text.startswith(_PREFIX_MARK)
    parts, rest = ["P"], text[len(_PREFIX_MARK) :]
    while rest:
        at = [(rest.index(m), m) for m in _ARG_MARKS if m in rest]
        if not at:
            parts.append(repr(rest))
            break
        pos, mark = min(at)
        if pos:
            parts.append(repr(rest[:pos]))
        parts.append(args[_ARG_MARKS.index(mark)])
        rest = rest[pos + 1 :]
    return " .. ".join(parts)


@functools.cache
def lua_prelude() -> str:
    """Lua that defines ``K``, one builder per key of ``Keys`` over the prefix ``P``
    (``ARGV[1]``): ``K.turn(tid)``, ``K.archived``, ``K.index(state, cwd_hash)`` (``nil``
    for the unnarrowed index). ``orchestrator.storage.store`` puts it before every script, so the
    scripts take every key name from this module instead of rebuilding it."""
    probe = Keys(_PREFIX_MARK)
    lines = ["local P = ARGV[1]", "local K = {}"]
    for name, member in inspect.getmembers(Keys):
        if name.startswith("_") or name == "prefix":
            continue
        if isinstance(member, property):
            lines.append(f"K.{name} = {_lua_template(getattr(probe, name), ())}")
            continue
        params = list(inspect.signature(member).parameters.values())[1:]
        names = tuple(f"a{i}" for i in range(len(params)))
        full = _lua_template(getattr(probe, name)(*_ARG_MARKS[: len(params)]), names)
        required = [p for p in params if p.default is inspect.Parameter.empty]
        body = f"return {full}"
        if len(required) < len(params):
            short = _lua_template(
                getattr(probe, name)(*_ARG_MARKS[: len(required)]), names[: len(required)]
            )
            body = f"if {names[len(required)]} == nil then return {short} end {body}"
        lines.append(f"K.{name} = function({', '.join(names)}) {body} end")
    return "\n".join(lines) + "\n"
