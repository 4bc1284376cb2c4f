"""``Dispatcher`` for Celery: sends a task by name to a named queue and returns.

``send_many`` publishes the messages of one operation (an archive's stops, a batch of
reminder fires) through kombu's producer batch: every message and its ``task-sent`` event is
built by Celery's own ``send_task`` and buffered, then written in one pipelined round trip to
Redis. The messages are ordinary Celery messages: workers consume them unchanged and Flower
sees them.

Transient broker errors are retried with tenacity for a short, bounded time; the last error
is raised to the caller (``send``) or reported per message (``send_many``). A retried batch may
publish some of its messages twice; every message this is used for is idempotent (a stop names
the exact items it stops, a reminder fire spends the reminder once).
"""

from __future__ import annotations

from typing import Any

from celery import Celery
from kombu.exceptions import OperationalError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_exponential

from orchestrator.families import Message

_transient = retry(
    retry=retry_if_exception_type((OperationalError, RedisConnectionError, RedisTimeoutError)),
    stop=stop_after_attempt(3),
    wait=wait_exponential(multiplier=0.05, max=0.3),
    reraise=True,
)


class CeleryDispatcher:
    """Publishes through ``app`` with ``send_task`` (no task code imported)."""

    def __init__(self, app: Celery) -> None:
        self.app = app

    @_transient
    def send(self, task: str, args: list[Any], queue: str) -> None:
        """Send ``task`` with positional ``args`` to ``queue``. Raises the broker's error after
        three attempts."""
        self.app.send_task(task, args=args, queue=queue, routing_key=queue, retry=False)

    def send_many(self, messages: list[Message]) -> list[Exception | None]:
        """Publish ``(task, args, queue)`` messages in one pipelined write; return, per
        message, the error that kept it from being published (the batch's last error, after
        three attempts) or ``None``. Never raises."""
        if not messages:
            return []
        try:
            self._publish_batch(messages)
        except Exception as exc:  # contained: reported per message, as the protocol says
            return [exc] * len(messages)
        return [None] * len(messages)

    @_transient
    def _publish_batch(self, messages: list[Message]) -> None:
        with self.app.producer_or_acquire() as producer, producer.batch():
            for task, args, queue in messages:
                self.app.send_task(
                    task,
                    args=args,
                    queue=queue,
                    routing_key=queue,
                    retry=False,
                    producer=producer,
                )
