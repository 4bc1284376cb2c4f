"""The family registry: each activity family declared once, by a ``FamilySpec``.

The census (``orchestrator/census/activity.py``), the stop fan-out
(``orchestrator/archiving/stops.py``), the
worker queue lists and task modules (``workers/app.py``), the CLI's ``--family`` choices, the
console's labels and the Lua scripts' liveness rule (``FamilySpec.lua``, put before every
script by ``orchestrator.storage.store``) all read it. A name that is not registered raises
``UnknownFamily``; nothing falls through to another family.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.errors import InvalidParams
from orchestrator.items import ActivityItem

#: Builds a census item from a live row of the family's Lua rule: (session id, item id,
#: the values of the rule's ``fields``).
ItemBuilder = Callable[[str, str, list[str | None]], ActivityItem]
#: Settles items whose owner vanished: (store, dispatcher or None, session id, item ids).
Settler = Callable[..., None]
#: Stops a descendant's items in the subagent worker itself: (store, dispatcher, session id,
#: plan entries) -> an outcome phrase such as ``2 turn(s) cancelled``.
LocalStop = Callable[..., str]


class UnknownFamily(InvalidParams):
    """A family name no registry entry declares."""

    code = "unknown_family"


def _ids(items: list[ActivityItem]) -> list[str]:
    return [item.id for item in items]


def _plan_id(item: ActivityItem) -> Any:
    return item.id


@dataclass(frozen=True)
class FamilySpec:
    """One activity family.

    - ``name`` (wire name), ``display``/``plural``: what people read (console, CLI);
      ``status``: what the console shows for a session busy with it, when not ``<n> <name>``.
    - ``task_module``: the worker module defining its tasks; ``stop_task``/``stop_many_task``:
      its single and bulk stop task names.
    - Queues: ``work_queue`` (``None`` when it has no work of its own), the control queue
      ``<name>.ctl`` (``control_queue``), per host when ``host_stops`` (a stop must reach the
      host owning the item), and ``extra_queues`` its workers also consume.
    - Census: ``lua``, the Lua file registering its liveness rule (``family(name, ...)``,
      ``orchestrator/storage/_lib.lua``; naming the one key that holds a session's item ids,
      when there is one, lets the live-work checks pass an idle session with one EXISTS
      across families), ``item`` turning a live row into an
      ``ActivityItem``, ``settle`` for items whose owner vanished. A family without ``lua`` is
      not a session's own records (``subagent``: derived from the descendants).
    - Stops: ``payload`` is what a stop carries for one session's items (ids by default; the
      single stop's arguments are ``[sessionId, payload]``, the bulk stop's ``[{sessionId:
      payload}]``); ``plan_entry``/``from_plan`` write and read an item in a subagent plan;
      ``stop_here`` stops plan entries inside the subagent worker (otherwise they are sent).
    """

    name: str
    display: str
    plural: str
    task_module: str
    stop_task: str
    stop_many_task: str
    work_queue: str | None = None
    extra_queues: tuple[str, ...] = ()
    host_stops: bool = False
    lua: Path | None = None
    item: ItemBuilder | None = None
    settle: Settler | None = None
    payload: Callable[[list[ActivityItem]], Any] = _ids
    plan_entry: Callable[[ActivityItem], Any] = _plan_id
    from_plan: Callable[[str, Any], ActivityItem | None] | None = None
    stop_here: LocalStop | None = None
    status: str | None = None

    def control_queue(self, host: str | None = None) -> str:
        """The queue its stops go to: ``<name>.ctl``, or ``<name>.ctl.<host>`` for a family
        whose stops must reach the owning host, when the host is known."""
        if self.host_stops and host:
            return f"{self.name}.ctl.{host}"
        return f"{self.name}.ctl"

    def stop_queue(self, item: ActivityItem) -> str:
        """Where the stop of ``item`` goes."""
        return self.control_queue(item.host)

    def static_queues(self) -> list[str]:
        """Its queues whose names do not depend on a host."""
        work = [self.work_queue] if self.work_queue else []
        return [self.control_queue(), *work, *self.extra_queues]

    def worker_queues(self, host: str, *, control_only: bool = False) -> list[str]:
        """The queues its worker on ``host`` consumes, control queues first; with
        ``control_only``, the control queue alone (a worker that takes only stops). Raises
        ``InvalidParams`` for a control-only worker of a family whose stops must reach the
        host owning the item: those run in the worker that owns it."""
        if control_only:
            if self.host_stops:
                able = [spec.name for spec in _REGISTRY.values() if not spec.host_stops]
                raise InvalidParams(
                    f"{self.display} stops run in the {self.name} worker that owns the item "
                    f"on its host; a control-only worker serves these families: "
                    f"{', '.join(able)}.",
                    {"param": "family", "allowed": able},
                )
            return [self.control_queue()]
        own = [self.control_queue(host)] if self.host_stops else []
        return [*own, *self.static_queues()]

    def worker_name(self, *, control_only: bool = False) -> str:
        """What a worker of the family calls itself before ``@host`` (its node name) and in
        its heartbeat: the family, or its control queue for a control-only worker."""
        return self.control_queue() if control_only else self.name

    def node_name(self, host: str, *, control_only: bool = False) -> str:
        """The Celery node name of its worker on ``host``: ``turn@host``, ``turn.ctl@host``."""
        return f"{self.worker_name(control_only=control_only)}@{host}"


_REGISTRY: dict[str, FamilySpec] = {}
_version = 0


def register(spec: FamilySpec) -> FamilySpec:
    """Add a family; registry order is the order families are listed, read and stopped in.
    Raises ``ValueError`` when the name is taken."""
    global _version
    if spec.name in _REGISTRY:
        raise ValueError(f"family {spec.name!r} is already registered")
    _REGISTRY[spec.name] = spec
    _version += 1
    return spec


def unregister(name: str) -> None:
    """Remove a family (tests that register one of their own)."""
    global _version
    get(name)
    del _REGISTRY[name]
    _version += 1


def get(name: object) -> FamilySpec:
    """The registered family ``name``. Raises ``UnknownFamily`` naming the known ones."""
    found = _REGISTRY.get(name) if isinstance(name, str) else None
    if found is None:
        known = ", ".join(_REGISTRY)
        raise UnknownFamily(
            f"Unknown activity family {str(name)[:40]!r} (known: {known}).",
            {"param": "family", "allowed": list(_REGISTRY)},
        )
    return found


def families() -> list[FamilySpec]:
    """Every registered family, in registry order."""
    return list(_REGISTRY.values())


def names() -> list[str]:
    """The registered families' names, in registry order."""
    return list(_REGISTRY)


def version() -> int:
    """Changes whenever the registry does (scripts built from it are rebuilt)."""
    return _version


def lua_rules() -> str:
    """The Lua of every family's liveness rule, in registry order."""
    return "\n".join(
        spec.lua.read_text(encoding="utf-8") for spec in _REGISTRY.values() if spec.lua
    )
