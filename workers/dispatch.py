"""``Dispatcher`` for Celery: sends a task by name to a named queue and returns.

Transient broker errors are retried with tenacity for a short, bounded time; the last error
is raised to the caller (the archive fan-out logs it and carries on).
"""

from __future__ import annotations

from typing import Any

from celery import Celery
from kombu.exceptions import OperationalError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_exponential


class CeleryDispatcher:
    """Publishes through ``app`` with ``send_task`` (no task code imported)."""

    def __init__(self, app: Celery) -> None:
        self.app = app

    @retry(
        retry=retry_if_exception_type((OperationalError, RedisConnectionError, RedisTimeoutError)),
        stop=stop_after_attempt(3),
        wait=wait_exponential(multiplier=0.05, max=0.3),
        reraise=True,
    )
    def send(self, task: str, args: list[Any], queue: str) -> None:
        """Send ``task`` with positional ``args`` to ``queue``. Raises the broker's error after
        three attempts."""
        self.app.send_task(task, args=args, queue=queue, routing_key=queue, retry=False)
