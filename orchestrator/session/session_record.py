"""The session record: its stored hash as a ``Session`` (ACP ``SessionInfo`` on the wire), and
the checks every session id, cwd and text the clients send goes through.

A session is stored as one Redis hash (``Keys.session``) plus its listing indexes; see
``orchestrator/storage/keys.py`` for the schema.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import re
import unicodedata
from dataclasses import dataclass, field
from typing import Any

from orchestrator.errors import InvalidParams, SessionNotFound, quoted_id
from orchestrator.models.usage import usage_of

#: Session ids (ours are ``sess_<hex>``; clients may only pass ids in this alphabet, so an id
#: can never reach a Redis key name with a separator or a glob in it).
SESSION_ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_CWD_LENGTH = 4096


def _hazard(h: dict[str, str]) -> dict[str, Any] | None:
    """The archive hazard of a stored hash, for its current archive transition only."""
    raw = h.get("archiveHazard")
    if not raw or h.get("archived") != "1" or h.get("reconcileTxn") != h.get("archiveTxn"):
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


@dataclass(frozen=True)
class Session:
    """A stored session. Times are ISO 8601 strings; ``title_source`` is ``client``,
    ``generated`` or ``""``."""

    session_id: str
    cwd: str
    title: str
    title_source: str
    parent_id: str | None
    created_at: str
    updated_at: str
    archived: bool
    archived_at: str | None
    deleted: bool
    #: When a census first found the archived session quiet (no live work in its subtree)
    #: after its current archive; ``None`` until then and for sessions not archived.
    quiet_at: str | None = None
    #: The reconciler's archive hazard (``{since, attempts, families}``): live work it could
    #: not stop after ``reconcile.MAX_ATTEMPTS`` re-dispatches; ``None`` otherwise.
    archive_hazard: dict[str, Any] | None = None
    #: The model name the session asked for (``""``: the backend's default).
    model: str = ""
    #: The external agent that runs its turns (``FLEET_AGENTS_FILE``; ``""``: the built-in
    #: model).
    agent: str = ""
    #: Model tokens of all its turns: ``{"inputTokens", "outputTokens"}``.
    usage: dict[str, int] = field(default_factory=lambda: {"inputTokens": 0, "outputTokens": 0})

    @classmethod
    def from_hash(cls, session_id: str, h: dict[str, str]) -> Session:
        """Build from the id (the key's suffix) and the stored hash fields.

        The hash does not store the id."""
        return cls(
            session_id=session_id,
            cwd=h["cwd"],
            title=h.get("title", ""),
            title_source=h.get("titleSource", ""),
            parent_id=h.get("parentId") or None,
            created_at=h["createdAt"],
            updated_at=h["updatedAt"],
            archived=h.get("archived") == "1",
            archived_at=h.get("archivedAt") or None,
            deleted=h.get("deleted") == "1",
            # quietTxn names the archive transition the quiet was observed for; an older one
            # (the session was unarchived and archived again since) says nothing.
            quiet_at=(
                h.get("quietAt") or None
                if h.get("archived") == "1" and h.get("quietTxn") == h.get("archiveTxn")
                else None
            ),
            archive_hazard=_hazard(h),
            model=h.get("model", ""),
            agent=h.get("agent", ""),
            usage=usage_of(h),
        )

    def to_info(self) -> dict[str, Any]:
        """ACP ``SessionInfo``: sessionId, cwd, title?, updatedAt, archived, _meta."""
        info: dict[str, Any] = {
            "sessionId": self.session_id,
            "cwd": self.cwd,
            "updatedAt": self.updated_at,
            "archived": self.archived,
        }
        if self.title:
            info["title"] = self.title
        meta: dict[str, Any] = {"createdAt": self.created_at}
        if self.parent_id:
            meta["parentId"] = self.parent_id
        if self.archived_at:
            meta["archivedAt"] = self.archived_at
        if self.quiet_at:
            meta["quietAt"] = self.quiet_at
        if self.title_source:
            meta["titleSource"] = self.title_source
        if self.archive_hazard is not None:
            meta["archiveHazard"] = self.archive_hazard
        if self.model:
            meta["model"] = self.model
        if self.agent:
            meta["agent"] = self.agent
        meta["usage"] = dict(self.usage)
        info["_meta"] = {"agentFleet": meta}
        return info


def check_session_id(session_id: object) -> str:
    """Return ``session_id`` if it is a well-formed id; otherwise raise ``SessionNotFound``
    (a malformed id names no session; quoted by ``quoted_id``) or ``InvalidParams`` when it
    is not a string."""
    if not isinstance(session_id, str):
        raise InvalidParams("sessionId must be a string.", {"param": "sessionId"})
    if not SESSION_ID_RE.fullmatch(session_id):
        raise SessionNotFound(quoted_id(session_id))
    return session_id


def cwd_hash(cwd: str) -> str:
    """Stable short hash of a cwd, used in index key names (never the raw path)."""
    return hashlib.sha1(cwd.encode("utf-8")).hexdigest()[:20]


def check_cwd(cwd: object) -> str:
    """Return ``cwd``, an absolute path string, in its normal form: repeated and trailing
    slashes and ``.`` / ``..`` components resolved as text (``/srv//app/`` and
    ``/srv/x/../app`` are ``/srv/app``; nothing on disk is read), so a session created with
    one spelling is found by a filter given another. Raises ``InvalidParams`` otherwise."""
    if not isinstance(cwd, str) or not cwd.startswith("/"):
        raise InvalidParams("cwd must be an absolute path (starting with '/').", {"param": "cwd"})
    if len(cwd) > MAX_CWD_LENGTH or "\x00" in cwd:
        raise InvalidParams(
            f"cwd must be at most {MAX_CWD_LENGTH} characters with no NUL byte.", {"param": "cwd"}
        )
    check_utf8(cwd, "cwd")
    if any(unicodedata.category(ch) == "Cc" for ch in cwd):
        # Control characters would reach terminals and logs that print the path.
        raise InvalidParams("cwd must not contain control characters.", {"param": "cwd"})
    # posixpath keeps a leading '//' (POSIX leaves its meaning to the system): one slash here.
    return "/" + posixpath.normpath(cwd).lstrip("/")


def check_utf8(text: str, param: str) -> str:
    """Return ``text`` if it encodes as UTF-8; raise ``InvalidParams`` for lone surrogates
    (what a JSON ``\\ud800`` escape or an undecodable file name turns into)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidParams(
            f"{param} is not valid Unicode text (it contains a lone surrogate).", {"param": param}
        ) from None
    return text
