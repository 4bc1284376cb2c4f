"""Idempotency keys for the writes whose reply a client may lose: a session's creation and a
prompt.

A client sends a key of its choosing with the request (REST ``Idempotency-Key``, ACP
``_meta.agentFleet.idempotencyKey``; ``fleet`` and the console make one) and sends the same
key again when it retries. The script that creates the session (``create_session.lua``) or the
turn (``turn_create.lua``) records the key in the same atomic step, with a fingerprint of the
request and the id it made (``Keys.idempotency``, kept ``FLEET_IDEMPOTENCY_TTL_SECONDS``). A
retry with the key finds it in that script and answers the same id, creating nothing; the key
with another request is refused (``IdempotencyKeyReused``). Keys are scoped: session creation
has one scope, each session's prompts another. A refused request (unknown session, archived,
over a limit) records nothing, so its retry is judged afresh.

When the connection to Redis drops after such a write was sent and before its reply came, the
store cannot know whether the script ran: ``outcome_unknown`` turns that failure into
``WriteOutcomeUnknown`` (a 503 that says so and how to check), and leaves a failure before
anything was sent (the connection could not be opened) the plain ``StoreUnavailable``.
A failure after the script answered (reading back what it made) is ``WriteOutcomeUnknown``
too (``written``).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import redis
from redis.sentinel import MasterNotFoundError

from orchestrator.errors import InvalidIdempotencyKey, StoreUnavailable, WriteOutcomeUnknown
from orchestrator.storage.store import Store

#: Longest key accepted, in characters (a UUID takes 36).
MAX_KEY = 255
#: Printable ASCII, space excluded: what an HTTP header value carries unchanged.
_KEY_RE = re.compile(r"[\x21-\x7e]+")
#: The scope of session creation's keys (a prompt's is its session id).
SESSIONS_SCOPE = "sessions"


def check_key(key: object) -> str:
    """``key`` if it is a valid idempotency key: a string of 1..``MAX_KEY`` printable ASCII
    characters without spaces. Raises ``InvalidIdempotencyKey``."""
    data = {"param": "idempotencyKey", "max": MAX_KEY}
    if not isinstance(key, str) or not key:
        raise InvalidIdempotencyKey("The idempotency key must be a non-empty string.", data)
    if len(key) > MAX_KEY:
        raise InvalidIdempotencyKey(
            f"The idempotency key is longer than {MAX_KEY} characters.", data
        )
    if not _KEY_RE.fullmatch(key):
        raise InvalidIdempotencyKey(
            "The idempotency key must be printable ASCII without spaces (a UUID will do).", data
        )
    return key


@dataclass(frozen=True)
class Idempotency:
    """What a creating script needs of a request's key: ``digest`` (SHA-256 of the key, hex;
    the key's name in ``Keys.idempotency``), ``fingerprint`` (SHA-256 of the request, hex)
    and ``ttl_ms`` (how long the key is kept, milliseconds)."""

    digest: str
    fingerprint: str
    ttl_ms: int

    @staticmethod
    def argv(found: Idempotency | None) -> list[str | int]:
        """The script's arguments for ``found``: ``[digest, fingerprint, ttlMs]``, all
        empty for a request without a key."""
        if found is None:
            return ["", "", 0]
        return [found.digest, found.fingerprint, found.ttl_ms]


def for_request(store: Store, key: str | None, *request: str) -> Idempotency | None:
    """The ``Idempotency`` of a request carrying ``key`` (``None``: no key) whose content is
    ``request`` (the values a retry must repeat, in a fixed order). Raises
    ``InvalidIdempotencyKey``."""
    if key is None:
        return None
    check_key(key)
    fingerprint = hashlib.sha256(json.dumps(list(request)).encode()).hexdigest()
    return Idempotency(
        hashlib.sha256(key.encode()).hexdigest(),
        fingerprint,
        max(1, int(store.settings.idempotency_ttl_seconds * 1000)),
    )


def _request_sent(exc: BaseException | None) -> bool:
    """Whether the redis-py failure ``exc`` may have come after the request reached the
    server. redis-py raises the same classes for a connection it could not open (nothing was
    sent) as for a reply it lost; only the messages of the first tell it apart, so anything
    else counts as sent."""
    if not isinstance(exc, (redis.ConnectionError, redis.TimeoutError)):
        return False  # the server answered (an error reply): the script ran or did nothing
    if isinstance(exc, MasterNotFoundError):
        return False
    text = str(exc)
    return "connecting to" not in text and not text.startswith("Timeout connecting")


@contextmanager
def outcome_unknown(what: str, check: str, *, keyed: bool) -> Iterator[None]:
    """Inside the block, a ``StoreUnavailable`` raised by a write whose request may have
    reached Redis (its reply was lost) becomes ``WriteOutcomeUnknown`` naming ``what`` was
    written (``session creation``, ``prompt``) and ``check`` (how to see whether it was),
    with ``keyed`` (the request carries an idempotency key: retrying with it is safe)."""
    try:
        yield
    except WriteOutcomeUnknown:
        raise
    except StoreUnavailable as exc:
        if _request_sent(exc.__cause__):
            raise WriteOutcomeUnknown(what, check, keyed=keyed) from exc
        raise


@contextmanager
def written(what: str, check: str, *, keyed: bool) -> Iterator[None]:
    """Inside the block (what a write does after its script answered, such as reading back
    what it made), any ``StoreUnavailable`` becomes ``WriteOutcomeUnknown`` (arguments as for
    ``outcome_unknown``): the write may have been applied, so the client must not be told
    that nothing was. A redis-py connection failure there counts as one too."""
    try:
        yield
    except WriteOutcomeUnknown:
        raise
    except (StoreUnavailable, redis.ConnectionError, redis.TimeoutError) as exc:
        raise WriteOutcomeUnknown(what, check, keyed=keyed) from exc
