"""The reminder poller: claims due reminders when they fall due, asleep in between.

It does not poll on a clock tick. Each pass (``reminders.poll``) claims what is due and
answers when the next reminder falls due or the next claimed one's deadline passes (both on
the Redis server's clock); the poller then waits that long on its subscription to
``Keys.reminders_wake``, where ``reminder_create.lua`` publishes each new reminder's due time,
so a reminder armed meanwhile for sooner wakes it. An idle fleet sends nothing while it waits.

Nothing is lost when a worker dies: a claimed reminder stays in ``reminders:firing`` with a
deadline, and every poller's wait ends by the earliest deadline too, so another poller (or the
restarted one) claims it again. The subscription is made before the pass that decides the
wait, so a reminder armed after that pass read the schedule is always heard. A publish is not
stored: if the subscription's connection drops (or stops answering: it is PINGed after
``PING_AFTER`` s of silence, ``SilenceProbe``), the poller subscribes again and passes at once;
``max_wait`` bounds any wait all the same.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from orchestrator.families import Dispatcher
from orchestrator.reminder import reminders
from orchestrator.storage.redisconn import SilenceProbe
from orchestrator.storage.store import Store

log = logging.getLogger(__name__)

#: Longest wait between two passes (seconds), even with nothing scheduled.
MAX_WAIT = 30.0
#: Seconds before a pass that failed (Redis or the broker away) is tried again.
RETRY_SECONDS = 0.2
#: Seconds of silence on the subscription before it is PINGed (a connection that died
#: without a reset hears nothing, which reads as no reminder armed).
PING_AFTER = 10.0
#: Longest single wait on the subscription (seconds): how soon ``stopping`` is noticed.
_TICK = 1.0


def run(
    store: Store,
    dispatcher: Dispatcher,
    stopping: threading.Event,
    *,
    max_wait: float = MAX_WAIT,
) -> None:
    """Claim and fire reminders as they fall due until ``stopping`` is set (a worker's
    background thread). A failing pass is logged and tried again after ``RETRY_SECONDS``;
    never raises."""
    while not stopping.is_set():
        pubsub = store.redis.pubsub(ignore_subscribe_messages=True)
        try:
            pubsub.subscribe(store.keys.reminders_wake)
            probe = SilenceProbe(after=PING_AFTER)
            while not stopping.is_set():
                _, wait = reminders.poll(store, dispatcher)
                seconds = max_wait if wait is None else min(wait, max_wait)
                _wait(pubsub, probe, stopping, seconds)
        except Exception as exc:  # Redis or the broker away: subscribe and pass again
            log.warning("reminder poller failed: %s: %s", type(exc).__name__, exc)
            stopping.wait(RETRY_SECONDS)
        finally:
            try:
                pubsub.close()
            except Exception as exc:  # a connection already gone
                log.debug("reminder poller's subscription not closed: %s", exc)


def _wait(pubsub: Any, probe: SilenceProbe, stopping: threading.Event, seconds: float) -> None:
    """Wait up to ``seconds``, less when a reminder is armed (a message on the wake channel)
    or ``stopping`` is set. Raises ``redis.TimeoutError`` when the subscription does not
    answer a PING (``probe``)."""
    deadline = time.monotonic() + seconds
    while not stopping.is_set():
        left = deadline - time.monotonic()
        if left <= 0:
            return
        message = pubsub.get_message(timeout=min(left, _TICK))
        if probe.step(message is not None):
            pubsub.ping()
        if message is not None and message["type"] == "message":
            return
