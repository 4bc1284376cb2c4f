"""The activity families, each declared once in the registry (``registry.py``), and the names
of their tasks and queues.

A family is one module here (``turn.py``, ``job.py``, ``subagent.py``, ``reminder.py``; for
families whose items a session owns, a Lua file with its liveness rule beside it) holding its
one ``register(FamilySpec(...))``; the built-in ones are imported below in ``Family`` order.
Everything that lists, reads, stops or serves families reads the registry: an unknown name
raises ``UnknownFamily``.

The orchestrator speaks to workers by task name and queue name only (``Dispatcher``), so the
API process never imports task code. Queue layout, per family (``FamilySpec``):

- ``<family>``: its work (``turn`` steps, ``job`` starts, ``reminder`` firings; ``subagent``
  has none); ``<family>.ctl``: its stops.
- ``job.ctl.<host>``: stops for jobs running on ``<host>``, consumed only by that host's job
  worker, so a stop reaches exactly the host that owns the process (``host_stops``).
- ``maintenance``: scheduled fleet-wide tasks (``archive.auto``), consumed by reminder workers.

Bulk operations send one stop per family per batch (``*.stop_many``, jobs: per host queue)
carrying many sessions, instead of one message per session.

Control queues are separate from work queues and listed first by every worker, so a stop never
waits behind queued work.
"""

from __future__ import annotations

import importlib

from orchestrator.families.base import (
    MAINTENANCE_QUEUE,
    BatchDispatcher,
    Dispatcher,
    Family,
    Message,
    Task,
    message_id,
    send_all,
    send_step,
    step_message_id,
)
from orchestrator.families.registry import (
    FamilySpec,
    UnknownFamily,
    families,
    get,
    names,
    register,
    unregister,
)

# The built-in families register themselves, each from its own module, in the order of
# ``Family`` (the order they are listed, read and stopped in).
for _name in Family:
    importlib.import_module(f"orchestrator.families.{_name}")


__all__ = [
    "MAINTENANCE_QUEUE",
    "BatchDispatcher",
    "Dispatcher",
    "Family",
    "FamilySpec",
    "Message",
    "Task",
    "UnknownFamily",
    "control_queue",
    "families",
    "get",
    "message_id",
    "names",
    "register",
    "send_all",
    "send_step",
    "step_message_id",
    "unregister",
    "work_queue",
]


def work_queue(family: str) -> str:
    """The queue a family's work goes to (``turn``, ``job``, ...). Raises ``UnknownFamily``,
    or ``ValueError`` for a family without work of its own."""
    queue = get(family).work_queue
    if queue is None:
        raise ValueError(f"family {family!r} has no work queue")
    return queue


def control_queue(family: str, host: str | None = None) -> str:
    """The queue a family's stops go to (per host for a family whose stops must reach the
    owning host). Raises ``UnknownFamily``."""
    return get(family).control_queue(host)
