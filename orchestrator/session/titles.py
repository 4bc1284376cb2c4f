"""Session titles: one normalizer for every path, and an atomic write (ACP
session/set_title).

- ``normalize_title`` is the only place a title is cleaned. ACP ``session/set_title``, the REST
  API and generated titles all go through it, so a title reads the same whichever way it came.
- ``set_title`` stores a normalized title with its source (``client`` or ``generated``). A
  client-set title is never replaced by a generated one; the check is made by the same Lua
  script that writes, so a title being generated while the client renames is discarded.
- ``generated_title`` derives a title from a prompt (its first non-blank line).

Setting a title does not change ``updatedAt``: it is not activity in the session.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Literal

import grapheme

from orchestrator.errors import InvalidParams, InvalidTitle, SessionNotFound
from orchestrator.session import scripts
from orchestrator.session.sessions import check_session_id
from orchestrator.storage import audit, events
from orchestrator.storage.store import Store

#: Longest stored title, in grapheme clusters (what a reader sees as one character), not code
#: points: a family emoji is 7 code points but one symbol. 120 fits a list row or a window
#: title with room to spare and keeps SessionInfo payloads small on long listings.
MAX_TITLE_GRAPHEMES = 120
#: Longest raw title accepted, in code points, before normalization. Normalization and
#: grapheme segmentation are linear but done in pure Python; the bound keeps one request from
#: making the server chew on megabytes to keep 120 graphemes of it.
MAX_TITLE_INPUT = 10_000
#: Longest generated title, in grapheme clusters: a prompt's first line is often a sentence,
#: and a generated title is a label, not a summary.
GENERATED_TITLE_GRAPHEMES = 60

#: Where a title came from, as stored in the session hash field ``titleSource``.
TitleSource = Literal["client", "generated"]

EMPTY_TITLE_MESSAGE = "Title must not be empty."

#: Invisible separators shown as nothing; they become spaces so the words they separated stay
#: apart. U+200D ZERO WIDTH JOINER and U+200C ZERO WIDTH NON-JOINER are deliberately absent:
#: they are part of emoji ZWJ sequences and of the spelling of Indic and Arabic-script words.
_ZERO_WIDTH = frozenset("\u200b\u2060\ufeff\u180e")
#: Bidi embedding/override (U+202A-U+202E) and isolate (U+2066-U+2069) controls: they can make
#: a title display reversed or spill its direction into the text around it in a client's UI.
_BIDI_CONTROLS = frozenset(
    "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
    # The direction marks (LRM, RLM, ALM) draw nothing: a title made only of them would be
    # stored and shown as blank.
    "\u200e\u200f\u061c"
)
#: Most code points a stored title may have: the grapheme cap alone would let one letter carry
#: thousands of combining marks. Each cluster is first cut to ``_CLUSTER_CODEPOINTS`` (a base
#: and 30 marks: the Stream-Safe Text Format of UAX #15), then whole clusters are dropped from
#: the end until the title fits.
MAX_TITLE_CODEPOINTS = 1000
_CLUSTER_CODEPOINTS = 31
_SPACE_RUNS = re.compile(" {2,}")


def _clean_char(ch: str) -> str:
    """One code point of a title: ``" "``, itself, or ``""`` (dropped)."""
    # str.isspace covers the line breaks (\r \n \v \f U+0085 U+2028 U+2029), tabs and the
    # Unicode space separators; it is tested before Cc because \t \n \r ... are Cc too, and
    # must separate words rather than vanish.
    if ch in _ZERO_WIDTH or ch.isspace():
        return " "
    if ch in _BIDI_CONTROLS:
        return ""
    # Cc: control characters. Cs: lone surrogates, which a JSON "\ud800" escape can produce
    # and which cannot be encoded as UTF-8 for Redis.
    if unicodedata.category(ch) in ("Cc", "Cs"):
        return ""
    return ch


def _cap(text: str, graphemes: int) -> str:
    """The first ``graphemes`` grapheme clusters of ``text``, with no trailing space."""
    # Cutting at a cluster boundary keeps every cluster whole; the cut may leave a space last.
    cut: str = grapheme.slice(text, 0, graphemes)
    return cut.rstrip(" ")


def normalize_title(raw: object) -> str:
    """Return the title to store for ``raw``: at most ``MAX_TITLE_GRAPHEMES`` grapheme
    clusters of NFC text with single spaces, no leading or trailing space, and no control,
    bidi-control or zero-width-space characters.

    Steps: invisible separators and every kind of whitespace and line break become spaces;
    control characters (Cc), lone surrogates and bidi embedding/override/isolate controls are
    dropped; NFC; runs of spaces collapse to one; trim; cut to ``MAX_TITLE_GRAPHEMES`` whole
    grapheme clusters (an emoji ZWJ sequence, a flag or a letter with its combining marks is
    never split); trim again. Idempotent: ``normalize_title(normalize_title(x)) ==
    normalize_title(x)``.

    Raises ``InvalidTitle`` ("Title must not be empty.") for ``None`` or a title empty after
    normalization; ``InvalidParams`` when ``raw`` is not a string or is longer than
    ``MAX_TITLE_INPUT`` code points. ACP session/set_title: -32602 for both.
    """
    if raw is None:
        raise InvalidTitle(EMPTY_TITLE_MESSAGE, {"param": "title"})
    if not isinstance(raw, str):
        raise InvalidParams("title must be a string.", {"param": "title"})
    if len(raw) > MAX_TITLE_INPUT:
        raise InvalidParams(
            f"title is longer than {MAX_TITLE_INPUT} characters.",
            {"param": "title", "maxLength": MAX_TITLE_INPUT},
        )

    text = "".join(_clean_char(ch) for ch in raw)
    # NFC so that canonically equal titles are stored alike (é typed precomposed or as e +
    # U+0301) and graphemes are counted on one form. It runs after the removals rather than
    # first: removing a control between a letter and its combining mark ("e\x00\u0301") leaves
    # a pair that only a later NFC composes, and the result would not be idempotent otherwise.
    # NFC turns no kept character into whitespace or a control, so the cleaning holds.
    text = unicodedata.normalize("NFC", text)
    text = _SPACE_RUNS.sub(" ", text).strip(" ")
    text = _cap(text, MAX_TITLE_GRAPHEMES)
    if len(text) > MAX_TITLE_CODEPOINTS:
        text = "".join(g[:_CLUSTER_CODEPOINTS] for g in grapheme.graphemes(text))
    while len(text) > MAX_TITLE_CODEPOINTS:
        # Drop whole clusters from the end until the code points fit too.
        text = _cap(text, grapheme.length(text) - 1)
    if not text and any(unicodedata.category(ch) == "Cs" for ch in raw):
        raise InvalidParams(
            "title is not valid Unicode text (it holds only lone surrogates).", {"param": "title"}
        )
    if not text:
        raise InvalidTitle(EMPTY_TITLE_MESSAGE, {"param": "title"})
    return text


def set_title(
    store: Store, session_id: str, raw: object, *, source: TitleSource = "client"
) -> str | None:
    """Normalize ``raw`` and store it as the title of the session; return the stored title,
    or ``None`` when a generated title was discarded because the client has set one.

    ``source`` is ``"client"`` (a person or ACP client; written durably, since ACP answers
    only once the title is persisted) or ``"generated"``. Whether a generated title may be
    written is decided atomically with the write, so a generation that was in flight when the
    client renamed the session never overwrites the client's title. Archived sessions can be
    retitled (they are listed); ``updatedAt`` does not change. A successful write publishes a
    ``title`` event carrying the stored title; a client's is also recorded in the audit trail.

    Raises ``InvalidTitle``/``InvalidParams`` (see ``normalize_title``; also a non-string
    ``session_id``), ``SessionNotFound`` (unknown, malformed or deleted session),
    ``StoreUnavailable``. ACP session/set_title.
    """
    if source not in ("client", "generated"):
        raise ValueError(f"unknown title source {source!r}")
    sid = check_session_id(session_id)
    title = normalize_title(raw)
    outcome = scripts.set_title(store, session_id=sid, title=title, source=source)
    if outcome is scripts.TitleOutcome.NOT_FOUND:
        raise SessionNotFound(sid)
    if outcome is scripts.TitleOutcome.DISCARDED:
        return None
    events.publish(store, "title", sid, title=title)
    if source == "client":  # a generated title is the fleet's own doing, not a change asked for
        audit.record(store, sid, "set_title", "set", title=title)
    return title


def generated_title(prompt: str) -> str | None:
    """A title for a session from its first prompt: the first line that is not blank after
    normalization, cut to ``GENERATED_TITLE_GRAPHEMES`` grapheme clusters. ``None`` when no
    line yields a title. Never raises for any string, however long.
    """
    for line in prompt.splitlines():
        # A generated title never needs more than the start of a long line; cutting by code
        # points keeps normalize_title's input bound from refusing it (a cluster of more than
        # 10,000 code points could be cut, and would still come out as valid text).
        try:
            title = normalize_title(line[:MAX_TITLE_INPUT])
        except InvalidTitle:
            continue
        return _cap(title, GENERATED_TITLE_GRAPHEMES)
    return None
