"""The step gate: asked before every model step; refuses steps of archived lineages.

Like a dramatiq middleware veto, ``admit`` raises a typed ``StepRefused`` and the step runner
ends the turn ``blocked`` without a model request.

It costs one Redis round trip whatever the lineage depth, and reads only the session's own
entries: the archive state is materialized down the tree when it is written, so the gate never
walks the lineage. The invariant the scripts keep, atomically, is: *a session with an archived
ancestor is itself in the archived set.* Archiving marks the whole subtree
(``archive.lua``); a child created under an archived lineage is born archived
(``create_session.lua``); unarchiving a session whose ancestor is archived is refused
(``unarchive.lua``). Writes are rare and reads are per step, so the cost sits on the write side.

The rule itself is written once, in Lua (``gate_refusal`` in ``storage/_lib.lua``): the step
runner applies it inside the script that begins the step (``turn_begin_step.lua``), so no step
is admitted once an archive commits, and ``admit`` asks the same rule through a one-line
script.

If Redis cannot be read the gate fails closed: ``StoreUnavailable`` propagates and the caller
retries the step later instead of running it.

The gate is also announced when it closes. The scripts that archive (``emit_archive_events``
in ``_lib.lua``, for one archive or one bulk batch) publish the ids of the sessions they
archived, one message per script, on ``Keys.gate_closed``. A process that runs work (a job
host, a turn worker with steps in flight) listens there (``listen``) instead of waiting for a
stop request or its next poll; it still asks the gate before it stops anything, since a
message may be read after an unarchive. A subscription that stays silent is PINGed, and one
that does not answer is made again (its connection may have died without a reset).
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Callable

import redis

from orchestrator.session import scripts
from orchestrator.session.sessions import SESSION_ID_RE
from orchestrator.storage.redisconn import SilenceProbe
from orchestrator.storage.sharing import PerStore, Shared
from orchestrator.storage.store import Store

log = logging.getLogger(__name__)


class StepRefused(Exception):
    """Raised when a step may not run: ``reason`` is ``archived``, ``deleted`` or ``missing``;
    ``holder`` is the archived session (the session itself: see the module docstring)."""

    def __init__(self, session_id: str, reason: str, holder: str | None = None) -> None:
        detail = f" ({holder})" if holder else ""
        super().__init__(f"step for {session_id} refused: {reason}{detail}")
        self.session_id = session_id
        self.reason = reason
        self.holder = holder


def admit(store: Store, session_id: str) -> None:
    """Return if a model step of ``session_id`` may run now.

    Raises ``StepRefused`` when the session (hence also when any ancestor) is archived, or the
    session is deleted or unknown; ``StoreUnavailable`` when Redis cannot answer (fail closed).
    """
    if not isinstance(session_id, str) or not SESSION_ID_RE.fullmatch(session_id):
        raise StepRefused(str(session_id), "missing")
    verdict = scripts.gate_admit(store, session_id=session_id)
    if verdict is not scripts.Verdict.OK:
        raise refusal(session_id, verdict.value)


def refusal(session_id: str, reason: str) -> StepRefused:
    """The typed veto for a refusal ``reason`` the gate's rule gave (``archived``, ``deleted``,
    ``missing``); an archived session holds its own refusal (see the module docstring)."""
    return StepRefused(session_id, reason, session_id if reason == "archived" else None)


def verdicts(store: Store, session_ids: list[str]) -> dict[str, str]:
    """The gate's verdict on each of ``session_ids`` in one round trip (``gate_many.lua``):
    ``{sessionId: "ok" | "archived" | "deleted" | "missing"}``; a malformed id is
    ``missing``. Raises ``StoreUnavailable``."""
    wanted = [s for s in dict.fromkeys(session_ids) if isinstance(s, str)]
    valid = [s for s in wanted if SESSION_ID_RE.fullmatch(s)]
    replies = scripts.gate_many(store, session_ids=valid)
    found = dict(zip(valid, (v.value for v in replies), strict=True))
    return {s: found.get(s, "missing") for s in wanted}


#: A listener of gate closures: called with the ids of the sessions an archive just closed
#: the gate on, or with ``None`` when some may have been missed (the subscription was made
#: or made again): the listener then looks at all its work.
Listener = Callable[[frozenset[str] | None], None]

#: Longest wait for one message (s): how soon the feed notices it has no listener left.
_FEED_WAIT = 1.0


class _Feed(Shared[Listener]):
    """The process's subscription to ``Keys.gate_closed`` for one store: a thread that runs
    while listeners are registered and tells each of them every closure."""

    def __init__(self, store: Store) -> None:
        super().__init__("gate-feed")
        self.store = store
        #: Set while the subscription stands (closures published now are heard).
        self.subscribed = threading.Event()

    def _tell(self, closed: frozenset[str] | None) -> None:
        for listener in self.members():
            try:
                listener(closed)
            except Exception as exc:  # one listener's failure must not silence the others
                log.warning("gate closure listener failed: %s", exc)

    def serve(self) -> None:
        pubsub: redis.client.PubSub | None = None
        failing = False
        probe = SilenceProbe()
        while not self.finished():
            try:
                if pubsub is None:
                    pubsub = self.store.redis.pubsub()
                    pubsub.subscribe(self.store.keys.gate_closed)
                    probe = SilenceProbe()
                message = pubsub.get_message(timeout=_FEED_WAIT)
                # A connection that died without a reset reads as "no closure" forever: a
                # subscription that does not answer a PING is made again (below), and the
                # listeners then look at all their work.
                if probe.step(message is not None):
                    pubsub.ping()
            except (redis.RedisError, OSError) as exc:
                self.subscribed.clear()
                _close(pubsub)
                pubsub = None
                if self.finished():  # nobody listens any more (a store closed after use)
                    return
                if not failing:
                    log.warning(
                        "gate closures not heard: %s; listening again once Redis answers", exc
                    )
                failing = True
                threading.Event().wait(0.5)
                continue
            if message is None:
                continue
            if message["type"] == "subscribe":  # from here on nothing is missed
                self.subscribed.set()
                if failing:
                    log.info("gate closures heard again")
                    failing = False
                self._tell(None)
            elif message["type"] == "message":
                self._tell(_closed_ids(message["data"]))
        self.subscribed.clear()
        _close(pubsub)


def _close(pubsub: redis.client.PubSub | None) -> None:
    if pubsub is not None:
        with contextlib.suppress(redis.RedisError, OSError):
            pubsub.close()


def _closed_ids(data: object) -> frozenset[str] | None:
    """The session ids of one closure message (a JSON list); ``None`` (look at everything)
    for a message that is not one."""
    try:
        ids = json.loads(data) if isinstance(data, (str, bytes)) else None
    except ValueError:
        ids = None
    if not isinstance(ids, list):
        return None
    return frozenset(i for i in ids if isinstance(i, str))


_feeds: PerStore[_Feed] = PerStore()


def listen(store: Store, listener: Listener) -> None:
    """Call ``listener`` with every gate closure announced on ``store`` from now on (on the
    process's one subscription thread per store, ``gate-feed``), and with ``None`` once the
    subscription is made and each time it is made again after a Redis failure (logged once
    per outage). ``listener`` must be quick or hand its work on: it runs on that thread.
    Until ``unlisten``."""
    _feeds.get(store, _Feed).add(listener)


def unlisten(store: Store, listener: Listener) -> None:
    """Stop calling ``listener`` (idempotent)."""
    feed = _feeds.find(store)
    if feed is not None:
        feed.remove(listener)


def listening(store: Store) -> threading.Event | None:
    """The event set while this process's subscription to ``store``'s closures stands, or
    ``None`` when nothing ever listened (for tests)."""
    feed = _feeds.find(store)
    return feed.subscribed if feed is not None else None
