"""The typed params of every ACP method, and ``parse``, which validates them.

The stable methods use the models the ``agent-client-protocol`` package generates from the
published ACP v1 schema (``acp.schema``). The methods of the unstable schema it does not ship
yet (``session/archive``, ``session/unarchive``, ``session/set_title``, the ``archived`` filter
of ``session/list``) are declared here, on the same base and with the same names as in
``schema/v1/schema.unstable.json`` of ``@agentclientprotocol/sdk`` 2.4.0; so is the fleet's
own ``_agentFleet/activity``. Values the domain checks itself with its own messages (the
``archived`` filter, a title) are typed ``Any``/optional here, so the domain's error wins.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, TypeVar

from acp import schema
from pydantic import (
    BaseModel,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
)

from api.errors import MAX_LISTED_ERRORS, in_words
from orchestrator.errors import InvalidParams
from orchestrator.storage.idempotency import check_key

#: A protocol version as early clients sent it: the date of the revision they speak.
_LEGACY_VERSION = re.compile(r"\d{4}-\d{2}-\d{2}")

__all__ = [
    "ActivityRequest",
    "ArchiveSessionRequest",
    "CancelRequestNotification",
    "InitializeRequest",
    "ListSessionsRequest",
    "SetSessionTitleRequest",
    "UnarchiveSessionRequest",
    "idempotency_key",
    "parse",
    "schema",
]

M = TypeVar("M", bound=BaseModel)

_META = Annotated[dict[str, Any] | None, Field(alias="_meta")]


class _SessionRequest(schema.BaseModel):
    session_id: Annotated[str, Field(alias="sessionId")]
    field_meta: _META = None


class ArchiveSessionRequest(_SessionRequest):
    """``session/archive`` params (unstable schema): ``{"sessionId"}``, and agent-fleet's
    ``stopActivity`` (``false``: refuse a busy session, as REST does, instead of stopping its
    work; absent, ``null`` or ``true``: the protocol's rule, stop it). Any other value is
    -32602: a client that says not to stop must never have its work stopped."""

    stop_activity: Annotated[StrictBool | None, Field(alias="stopActivity")] = None


class UnarchiveSessionRequest(_SessionRequest):
    """``session/unarchive`` params (unstable schema): ``{"sessionId"}``."""


class SetSessionTitleRequest(_SessionRequest):
    """``session/set_title`` params (unstable schema): ``{"sessionId", "title"}``. A missing
    or null title reaches the domain, which answers "Title must not be empty."."""

    title: str | None = None


class InitializeRequest(schema.InitializeRequest):
    """``initialize`` params with ``protocolVersion`` an integer, as acp.md and the schema say
    (``uint16``), or a legacy date string (``"2024-11-05"``, which some editors still send),
    read as version 1 as the package reads it. The package's model reads any other string
    (and ``true``, ``1.5``) as a version too, so a client's mistake would pass unnoticed: those
    are refused (-32602 naming the field)."""

    protocol_version: Annotated[StrictInt, Field(alias="protocolVersion", ge=0, le=65535)]

    @field_validator("protocol_version", mode="before")
    @classmethod
    def _coerce_protocol_version(cls, value: Any) -> Any:
        # Replaces the package's validator of the same name, which turns "x" into 1.
        if isinstance(value, str) and _LEGACY_VERSION.fullmatch(value):
            return 1
        return value


class ListSessionsRequest(schema.ListSessionsRequest):
    """``session/list`` params with the unstable ``archived`` filter (``SessionArchiveFilter``:
    unknown values are kept, and refused by ``orchestrator.session.sessions`` with -32602)."""

    archived: Any = None


class CancelRequestNotification(schema.CancelRequestNotification):
    """``$/cancel_request`` params: ``{"requestId"}``, an id exactly as JSON-RPC spells one
    (``true`` or ``1.0`` name no request, so they are not read as ``1``)."""

    request_id: Annotated[StrictInt | StrictStr | None, Field(alias="requestId")]


class ActivityRequest(_SessionRequest):
    """``_agentFleet/activity`` params: ``{"sessionId"}``."""


#: What ``fleet_meta`` answers for a member that is absent (``None`` is a value sent).
ABSENT: Any = object()


def fleet_meta(meta: dict[str, Any] | None, name: str) -> Any:
    """``_meta.agentFleet.<name>`` of a request, ``ABSENT`` when not there. Raises
    ``InvalidParams`` when ``agentFleet`` is not an object."""
    ours = (meta or {}).get("agentFleet")
    if ours is None:
        return ABSENT
    if not isinstance(ours, dict):
        raise InvalidParams("_meta.agentFleet must be an object.", {"param": "_meta.agentFleet"})
    return ours.get(name, ABSENT)


def idempotency_key(meta: dict[str, Any] | None) -> str | None:
    """The client's idempotency key of a ``session/new`` or ``session/prompt``:
    ``_meta.agentFleet.idempotencyKey`` (``orchestrator/storage/idempotency.py``), ``None`` when
    absent. Raises ``InvalidParams`` when ``agentFleet`` is not an object,
    ``InvalidIdempotencyKey`` for a malformed key."""
    key = fleet_meta(meta, "idempotencyKey")
    return None if key is ABSENT else check_key(key)


def agent_name(meta: dict[str, Any] | None) -> str | None:
    """The agent a ``session/new`` asks for: ``_meta.agentFleet.agent`` (``None`` when
    absent). Raises ``InvalidParams`` when it is not a string."""
    name = fleet_meta(meta, "agent")
    if name is ABSENT or name is None:  # null: the default, as REST reads it
        return None
    if not isinstance(name, str):
        raise InvalidParams("_meta.agentFleet.agent must be a string.", {"param": "agent"})
    return name


def parse(model: type[M], params: Any) -> M:
    """``params`` (a JSON-RPC ``params`` member; absent or null is ``{}``) as ``model``.
    Raises ``InvalidParams`` naming each bad member, and for an empty ``sessionId``."""
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise InvalidParams("params must be an object.", {"param": "params"})
    try:
        parsed = model.model_validate(params)
    except ValidationError as exc:
        found = exc.errors(include_url=False)
        problems = [_problem(error) for error in found[:MAX_LISTED_ERRORS]]
        texts = [p for p, _ in problems]
        raise InvalidParams(
            "Invalid params: " + in_words(texts, len(found), "; ") + ".",
            {"param": problems[0][1], "errors": texts, "errorCount": len(found)},
        ) from None
    if getattr(parsed, "session_id", None) == "":
        raise InvalidParams("sessionId must not be empty.", {"param": "sessionId"})
    return parsed


def _problem(error: Any) -> tuple[str, str]:
    """(what is wrong, in words; the member's path) for one pydantic error."""
    path = ""
    for part in error["loc"]:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    path = path or "params"
    if error["type"] == "missing":
        return f"{path} is required", path
    return f"{path}: {error['msg']}", path
