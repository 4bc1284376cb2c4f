"""Logging of a worker process: agent-fleet's formats (``orchestrator/logs.py``) instead of
Celery's, with the running task's context on every record.

Connecting to ``setup_logging`` tells Celery not to configure logging itself. Every record
logged while a task runs gets ``task_id`` and, when the code did not pass it, ``session_id``
(a task's first argument is always the session id) and the worker's ``family``.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import current_task
from celery.signals import setup_logging

from orchestrator.logs import configure
from orchestrator.storage import audit
from workers.runtime import installed_settings, role


class TaskContext(logging.Filter):
    """Fills ``task_id``, ``session_id`` and ``family`` from the running task and worker."""

    def __init__(self, family: str | None) -> None:
        super().__init__()
        self.family = family

    def filter(self, record: logging.LogRecord) -> bool:
        if self.family and getattr(record, "family", None) is None:
            record.family = self.family
        task = current_task
        request = getattr(task, "request", None) if task else None
        task_id = getattr(request, "id", None)
        if task_id:
            if getattr(record, "task_id", None) is None:
                record.task_id = task_id
            args = getattr(request, "args", None) or ()
            if getattr(record, "session_id", None) is None and args and isinstance(args[0], str):
                record.session_id = args[0]
        return True


@setup_logging.connect
def _setup(loglevel: Any = None, **_: Any) -> None:
    settings = installed_settings()
    if settings is None:  # a worker started without an entry point: nothing to go by
        configure(level=loglevel or logging.INFO)
    else:
        configure(
            settings.log_format or None,
            level=loglevel or logging.INFO,
            filters=[TaskContext(role().family or None)],
        )
    audit.set_default_actor("worker")
