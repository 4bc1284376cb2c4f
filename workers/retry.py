"""The base class of every fleet task: a task that fails on the store or the broker is retried
by Celery with bounded, jittered exponential back-off instead of being acknowledged and lost.

Every task is idempotent, so running it again after a failure part-way through is harmless:
state changes are single Lua scripts that check the state they change (a turn step runs only
from the state its message names, a stop names exactly what it stops, a reminder fire is keyed
by the reminder), and a re-sent stop or step for something already settled is a no-op.

What ``Task.retry`` cannot do: when the retry's own publish fails (the broker is still away
after ``task_publish_retry_policy``), Celery raises ``Reject(requeue=False)`` and the message is
gone. Then the store still says what was meant to happen, and the repairers act on it: the
turn sweeper resumes or fails a turn whose step message is lost, due reminders are claimed
again by the reminder poller, and the archive reconciler re-sends the stops of archived
sessions that still have live work.
"""

from __future__ import annotations

from celery import Task
from celery.worker.request import Request
from kombu.exceptions import OperationalError
from redis import exceptions as redis_errors

from orchestrator.errors import StoreUnavailable
from orchestrator.storage.redisconn import TRANSIENT_REPLIES

#: Failures that pass by themselves: the store or the broker is away, loading, full,
#: read-only or short of replicas for a while.
TRANSIENT: tuple[type[Exception], ...] = (
    StoreUnavailable,
    OperationalError,
    redis_errors.ConnectionError,
    redis_errors.TimeoutError,
    *TRANSIENT_REPLIES,
)

#: Longest wait between two attempts (seconds); the first waits up to 1 s.
RETRY_BACKOFF_MAX = 30
#: Attempts after the first: with the waits above, about 8 minutes in all.
MAX_RETRIES = 20


class NamedRequest(Request):  # type: ignore[misc]
    """A task request whose every event (``task-started``, ``task-succeeded``, ...) carries
    the task's name, not only ``task-received``: a monitor that missed the received event
    (Flower started while the task ran) still shows the task by name."""

    def send_event(self, type: str, **fields: object) -> None:
        fields.setdefault("name", self.task.name)
        super().send_event(type, **fields)


class FleetTask(Task):  # type: ignore[misc]
    """Retries on ``TRANSIENT`` (``autoretry_for``) after a random wait of up to
    ``min(2**retries, RETRY_BACKOFF_MAX)`` seconds (``retry_backoff``, full jitter), at most
    ``MAX_RETRIES`` times; then the task fails with the last error."""

    Request = "workers.retry:NamedRequest"
    autoretry_for = TRANSIENT
    retry_backoff = True
    retry_backoff_max = RETRY_BACKOFF_MAX
    retry_jitter = True
    max_retries = MAX_RETRIES
