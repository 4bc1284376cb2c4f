"""Request bodies of the HTTP API (pydantic; unknown fields answer 422).

Booleans are JSON booleans in bodies only (``StrictBool``: ``"false"``, ``0`` or ``"yes"``
answer 422, never coerced). No route takes a boolean in its query string, where ``true`` and
``"true"`` cannot be told apart; query parameters are strings or enums parsed strictly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from fastapi import Depends, Header, Request
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictStr,
)

from orchestrator.archiving import archive, bulk
from orchestrator.errors import InvalidIdempotencyKey
from orchestrator.families import names as family_names
from orchestrator.storage import idempotency
from orchestrator.turn import turns

#: The most turns a cancel may name.
MAX_TURN_IDS = 1000


def _decimal_digits(value: object) -> object:
    """A query integer must be written in ASCII decimal digits alone: ``+1``, `` 1``, ``1_0``,
    ``1.0`` or ``١`` would be read as numbers by ``int`` and by pydantic's lax mode."""
    if isinstance(value, str) and not (value.isascii() and value.isdigit()):
        raise ValueError("must be a whole number written in decimal digits (0-9) alone")
    return value


#: A query parameter's integer, parsed strictly (with ``Query`` for its bounds):
#: ``Annotated[int, QUERY_INT, Query(ge=1, le=...)]``.
QUERY_INT = BeforeValidator(_decimal_digits)


#: The ``Idempotency-Key`` request header of the writes a client may need to retry without
#: knowing whether the first try was applied (``orchestrator/storage/idempotency.py``); checked by
#: the domain (400 ``invalid_idempotency_key``), so no constraint is declared here.
IDEMPOTENCY_KEY = Header(
    alias="Idempotency-Key",
    description=(
        "A key of the client's choosing (1 to "
        f"{idempotency.MAX_KEY} printable ASCII characters, no spaces; a UUID will do), sent "
        "again unchanged when the request is retried: within FLEET_IDEMPOTENCY_TTL_SECONDS "
        "(24 h) a retry answers what the first request did (same id, same status) and runs "
        "nothing twice; the key with another body answers 422 idempotency_key_reused. A 503 "
        "write_outcome_unknown means the request may have been applied: retry with the key."
    ),
)


def _one_idempotency_key(
    request: Request, key: Annotated[str | None, IDEMPOTENCY_KEY] = None
) -> str | None:
    """The request's ``Idempotency-Key`` (``None`` without one). Given more than once it is
    refused (``InvalidIdempotencyKey``, 400 ``invalid_idempotency_key``): FastAPI would take
    the first, and a retry whose proxy or client kept another would not be recognised."""
    if len(request.headers.getlist("idempotency-key")) > 1:
        raise InvalidIdempotencyKey(
            "The Idempotency-Key header was given more than once: send one key.",
            {"param": "idempotencyKey"},
        )
    return key


#: A route's ``Idempotency-Key`` parameter: ``IDEMPOTENCY_KEY``, given at most once.
IdempotencyKeyDep = Annotated[str | None, Depends(_one_idempotency_key)]


#: The answers of a route taking ``IDEMPOTENCY_KEY`` that concern the key (OpenAPI).
IDEMPOTENT_RESPONSES: dict[int | str, dict[str, str]] = {
    400: {"description": "invalid_idempotency_key: empty, over 255 characters or not printable."},
    422: {"description": "idempotency_key_reused: the key came with another request first."},
    503: {
        "description": "store_unavailable (nothing was sent to Redis: try again), or "
        "write_outcome_unknown (the connection dropped after the write was sent: it may have "
        "been applied; retry with the same Idempotency-Key)."
    },
}


def _length_checked(check: Callable[[int], None]) -> BeforeValidator:
    """Checks a JSON array's length before its items are validated (``check`` raises the
    domain's own error, answered as such), so an oversized list costs one error and no item
    validation, however many of its items are also wrong."""

    def validate(value: object) -> object:
        if isinstance(value, list):
            check(len(value))
        return value

    return BeforeValidator(validate)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CreateSession(_Strict):
    """Body of ``POST /sessions``."""

    cwd: StrictStr = Field(description="Absolute working directory.")
    parentId: StrictStr | None = Field(default=None, description="Parent session (subagent).")
    model: StrictStr | None = Field(
        default=None, description="Model name for FLEET_MODEL's backend (default: its own)."
    )
    agent: StrictStr | None = Field(
        default=None,
        description=(
            "The external agent that runs the session's turns, by its name in "
            "FLEET_AGENTS_FILE (default: FLEET_AGENT; empty: the built-in model)."
        ),
    )


class PermissionAnswer(_Strict):
    """Body of ``POST /sessions/{id}/permissions/{requestId}``."""

    outcome: StrictStr = Field(
        max_length=200,
        description="allow, reject, cancelled, or one of the request's option ids.",
    )


class PromptBody(_Strict):
    """Body of ``POST /sessions/{id}/prompt``."""

    prompt: StrictStr = Field(max_length=turns.MAX_PROMPT, description="The prompt text.")


class TitleBody(_Strict):
    """Body of ``PUT /sessions/{id}/title``."""

    title: StrictStr | None = Field(
        default=None,
        description="The new title; normalized like ACP session/set_title. Empty after "
        'normalization (or missing): 422 "Title must not be empty."',
    )


class BulkFilterBody(_Strict):
    """Which sessions (not archived) a bulk archive selects; at least one criterion."""

    cwd: StrictStr | None = Field(default=None, description="Exact absolute cwd.")
    idleSince: StrictStr | None = Field(
        default=None,
        description="ISO 8601 date-time with an offset or Z: last activity (updatedAt) older "
        "than this.",
        json_schema_extra={"format": "date-time"},
    )
    q: StrictStr | None = Field(
        default=None, description="Case-insensitive substring of the title."
    )


class BulkArchiveBody(_Strict):
    """Body of ``POST /sessions/archive``: exactly one of ``sessionIds`` and ``filter``."""

    sessionIds: Annotated[list[StrictStr] | None, _length_checked(bulk.check_id_count)] = Field(
        default=None,
        description=f"Sessions to archive, in order (at most {bulk.MAX_IDS}).",
        json_schema_extra={"maxItems": bulk.MAX_IDS},
    )
    filter: BulkFilterBody | None = Field(
        default=None,
        description="Select sessions instead (at most FLEET_BULK_FILTER_MAX, default 50000).",
    )
    stopActivity: StrictBool = Field(
        default=False,
        description="Stop live work of the selected sessions; otherwise they are refused.",
    )
    dryRun: StrictBool = Field(default=False, description="Compute the outcomes and write nothing.")


def _registered_family(name: str) -> str:
    if name not in family_names():
        raise ValueError(f"family must be one of {', '.join(family_names())}")
    return name


class ConfirmedItem(BaseModel):
    """One item the user confirmed stopping: a refusal's ``activity`` item, sent back as it
    came (its other fields are ignored)."""

    model_config = ConfigDict(extra="ignore")

    family: Annotated[StrictStr, AfterValidator(_registered_family)]
    id: Annotated[StrictStr, Field(max_length=200)]


class StopBody(_Strict):
    """Body of ``POST /sessions/{id}/archive`` and ``DELETE /sessions/{id}`` (optional)."""

    stopActivity: StrictBool = Field(
        default=False, description="Stop live work first; otherwise live work refuses (409)."
    )
    confirmedActivity: Annotated[
        list[ConfirmedItem] | None, _length_checked(archive.check_confirmed_count)
    ] = Field(
        default=None,
        description="With stopActivity: the items the user confirmed (the refusal's "
        "error.data.activity). If anything live now is not among them: 409 "
        "activity_changed with the current items, and nothing is written or stopped. "
        f"At most {archive.MAX_CONFIRMED} items.",
        json_schema_extra={"maxItems": archive.MAX_CONFIRMED},
    )

    def confirmed(self) -> archive.Confirmed | None:
        """The confirmation as (family, id) pairs, or None when not bound."""
        if self.confirmedActivity is None:
            return None
        return [(item.family, item.id) for item in self.confirmedActivity]


class UnarchiveBody(_Strict):
    """Body of ``POST /sessions/{id}/unarchive`` (optional): an empty object. Unarchive takes
    no options (it restores the archive's subtree and restarts nothing); any member answers
    422 naming it, so a client that thinks it passed an option learns otherwise."""


class CancelBody(_Strict):
    """Body of ``POST /sessions/{id}/cancel`` and ``/close`` (optional)."""

    turnIds: list[Annotated[StrictStr, Field(max_length=200)]] | None = Field(
        default=None,
        description="The turns to cancel (one of another session answers missing); "
        "without it, the turns live when the request arrives. A named turn that has ended "
        f"is left alone and answered with its end state. At most {MAX_TURN_IDS}.",
        json_schema_extra={"maxItems": MAX_TURN_IDS},
    )
