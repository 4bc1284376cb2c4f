"""Session titles: normalization and the atomic write (ACP session/set_title)."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
import time
from typing import Any

import grapheme
import pytest

from orchestrator.archiving.archive import archive
from orchestrator.errors import InvalidParams, InvalidTitle, SessionNotFound
from orchestrator.session.sessions import create_session, delete_session, get_session
from orchestrator.session.titles import (
    GENERATED_TITLE_GRAPHEMES,
    MAX_TITLE_GRAPHEMES,
    MAX_TITLE_INPUT,
    generated_title,
    normalize_title,
    set_title,
)
from orchestrator.storage.store import now_ms
from tests.helpers import wait_for

FAMILY = "\U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466"  # 👨‍👩‍👧‍👦, 7 code points
FRANCE = "\U0001f1eb\U0001f1f7"  # 🇫🇷
GERMANY = "\U0001f1e9\U0001f1ea"  # 🇩🇪
FILL = "a" * (MAX_TITLE_GRAPHEMES - 1)  # leaves room for exactly one more cluster


# -- normalization ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("  Fix the build  ", "Fix the build"),
        ("Fix\nthe\r\nbuild", "Fix the build"),
        ("Fix\t\tthe   build", "Fix the build"),
        ("Fix\u2028the\u2029build\x85now\x0bor\x0clater", "Fix the build now or later"),
        ("Fix\u00a0\u3000the build", "Fix the build"),  # Unicode spaces
        ("Fix\u200bthe\u2060build\ufeffnow\u180eok", "Fix the build now ok"),  # zero-width
        ("\ufeffTitle", "Title"),  # a BOM in front is trimmed away
        ("Fix\x00the\x07 build\x1b[31m\x7f", "Fixthe build[31m"),  # controls dropped
        ("abc\u202edef\u202c", "abcdef"),  # right-to-left override
        ("a\u202ab\u202bc\u202dd\u2066e\u2067f\u2068g\u2069", "abcdefg"),
        ("e\u0301t\u00e9", "\u00e9t\u00e9"),  # NFC: decomposed and precomposed agree
        ("e\x00\u0301", "\u00e9"),  # a control between letter and mark: still NFC
    ],
)
def test_normalize_title_cleans_whitespace_controls_and_invisibles(raw: str, expected: str) -> None:
    assert normalize_title(raw) == expected


def test_normalize_title_keeps_zero_width_joiners_and_non_joiners() -> None:
    # ZWJ and ZWNJ are parts of emoji sequences and of the spelling of words.
    persian = "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645"  # می‌خواهم
    devanagari = "\u0915\u094d\u200d\u0937"  # क्‍ष
    assert normalize_title(persian) == persian
    assert normalize_title(devanagari) == devanagari
    assert normalize_title(f"Family {FAMILY} trip") == f"Family {FAMILY} trip"


def test_normalize_title_caps_at_max_graphemes_and_trims_after_the_cut() -> None:
    assert normalize_title("x" * 500) == "x" * MAX_TITLE_GRAPHEMES
    # The cut lands right after a space, which is then trimmed.
    assert normalize_title(FILL + " tail") == FILL


def test_the_cap_never_splits_an_emoji_zwj_sequence() -> None:
    # Given a title whose 120th cluster is a 7-code-point family, followed by more text
    # (a cut by code points at 120 would keep only the man)
    raw = FILL + FAMILY + "b"
    # When it is normalized, the family is kept whole
    assert normalize_title(raw) == FILL + FAMILY
    # And when the family is the 121st cluster, it is dropped whole
    assert normalize_title("a" + raw) == "a" * MAX_TITLE_GRAPHEMES


def test_the_cap_never_splits_a_letter_from_its_combining_marks() -> None:
    # e + U+0301 composes under NFC; q + marks has no precomposed form and stays a sequence.
    assert normalize_title(FILL + "e\u0301z") == FILL + "\u00e9"
    assert normalize_title(FILL + "q\u0301\u0302z") == FILL + "q\u0301\u0302"
    assert normalize_title("a" + FILL + "q\u0301\u0302") == "a" * MAX_TITLE_GRAPHEMES


def test_the_cap_never_splits_a_flag() -> None:
    assert normalize_title(FILL + FRANCE + GERMANY) == FILL + FRANCE
    assert normalize_title("a" * 118 + FRANCE * 3) == "a" * 118 + FRANCE * 2
    assert normalize_title("a" + FILL + FRANCE) == "a" * MAX_TITLE_GRAPHEMES


@pytest.mark.parametrize(
    "raw",
    ["", "   ", "\t\n\r\n \u2028", "\x00\x01\x7f\x1b", "\u200b\u2060\ufeff", "\u202e\u2066"],
)
def test_a_title_empty_after_normalization_is_refused(raw: str) -> None:
    with pytest.raises(InvalidTitle) as err:
        normalize_title(raw)
    assert err.value.message == "Title must not be empty."
    assert str(err.value) == "Title must not be empty."


def test_a_missing_title_is_refused_as_empty() -> None:
    with pytest.raises(InvalidTitle) as err:
        normalize_title(None)
    assert err.value.message == "Title must not be empty."


@pytest.mark.parametrize("raw", [123, 1.5, True, ["a"], {"title": "a"}, b"bytes"])
def test_a_title_that_is_not_a_string_is_refused(raw: object) -> None:
    with pytest.raises(InvalidParams) as err:
        normalize_title(raw)
    assert not isinstance(err.value, InvalidTitle)
    assert err.value.message == "title must be a string."


def test_a_raw_title_longer_than_the_input_bound_is_refused_before_normalization() -> None:
    assert normalize_title(" " * (MAX_TITLE_INPUT - 1) + "x") == "x"
    with pytest.raises(InvalidParams) as err:
        normalize_title(" " * MAX_TITLE_INPUT + "x")
    assert not isinstance(err.value, InvalidTitle)
    assert err.value.message == f"title is longer than {MAX_TITLE_INPUT} characters."


_POOL = (
    list("abcXYZ019 .-_/")
    + [" ", "\t", "\n", "\r", "\x0b", "\x0c", "\x85", "\u2028", "\u2029", "\u00a0", "\u3000"]
    + ["\x00", "\x07", "\x1b", "\x7f", "\x9f", "\ud800"]
    + ["\u200b", "\u2060", "\ufeff", "\u180e", "\u200c", "\u200d"]
    + ["\u202a", "\u202e", "\u2066", "\u2069", "\u200e", "\u061c"]
    + ["\u0301", "\u0302", "\u0323", "\u0e31", "\u1100", "\u1161", "\u11a8", "\uac00"]
    + ["\u00e9", "\u212b", "\u2126", "\u0915", "\u094d", "\u0645", "\u4e2d", "\ufb01"]
    + ["\U0001f468", "\U0001f469", "\U0001f467", "\ufe0f", "\U0001f3fd", "\u2764"]
    + ["\U0001f1eb", "\U0001f1f7", "\U0001f1e9", "\U0001f3f4", "\U000e0067", "\U000e007f"]
)


def _random_titles(count: int, seed: int = 1) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        length = rng.choice([1, 3, 10, 60, 130, 300, 800])
        out.append(
            "".join(
                rng.choice(_POOL) if rng.random() < 0.8 else chr(rng.randrange(0x20, 0x30000))
                for _ in range(length)
            )
        )
    return out


@pytest.mark.parametrize("raw", _random_titles(50))
def test_normalize_title_is_idempotent_and_within_the_cap(raw: str) -> None:
    try:
        once = normalize_title(raw)
    except InvalidTitle:
        return
    assert normalize_title(once) == once
    assert 1 <= grapheme.length(once) <= MAX_TITLE_GRAPHEMES
    assert once == once.strip(" ") and "  " not in once
    assert not any(ch.isspace() and ch != " " for ch in once)
    # Storable: valid UTF-8 once every lone surrogate is gone.
    once.encode("utf-8")


# -- generated titles ---------------------------------------------------------------------


def test_generated_title_is_the_first_non_blank_line() -> None:
    assert generated_title("\n  \n\t\u200b\nFix the  flaky test\nthen more") == "Fix the flaky test"


def test_generated_title_is_capped_at_its_own_length() -> None:
    title = generated_title("word " * 100)
    assert title is not None
    assert grapheme.length(title) <= GENERATED_TITLE_GRAPHEMES
    assert title == title.strip(" ") and title.startswith("word word")
    assert generated_title(FAMILY * 100) == FAMILY * GENERATED_TITLE_GRAPHEMES


def test_generated_title_is_none_when_nothing_is_usable() -> None:
    assert generated_title("") is None
    assert generated_title(" \n\t\n\x00\u202e\n") is None


def test_generated_title_accepts_a_line_longer_than_the_input_bound() -> None:
    assert generated_title("x" * (MAX_TITLE_INPUT * 3)) == "x" * GENERATED_TITLE_GRAPHEMES


# -- storing ------------------------------------------------------------------------------


def test_set_title_persists_the_normalized_title_as_a_client_title(store: Any) -> None:
    sid = create_session(store, "/tmp/x").session_id
    assert set_title(store, sid, "  Fix\nthe build ") == "Fix the build"
    stored = get_session(store, sid)
    assert stored.title == "Fix the build"
    assert stored.title_source == "client"


def test_each_client_set_replaces_the_previous_title(store: Any) -> None:
    sid = create_session(store, "/tmp/x").session_id
    set_title(store, sid, "First")
    assert set_title(store, sid, "Second") == "Second"
    assert get_session(store, sid).title == "Second"


def test_set_title_refuses_an_unknown_or_malformed_session(store: Any) -> None:
    with pytest.raises(SessionNotFound):
        set_title(store, "sess_doesnotexist000000000", "Title")
    with pytest.raises(SessionNotFound):
        set_title(store, "not a session id!", "Title")
    with pytest.raises(InvalidParams):
        set_title(store, 42, "Title")  # type: ignore[arg-type]


def test_set_title_refuses_a_deleted_session(store: Any) -> None:
    # Given a deleted session
    sid = create_session(store, "/tmp/x").session_id
    assert delete_session(store, sid)
    # When it is retitled, it is not found, and nothing is written
    with pytest.raises(SessionNotFound):
        set_title(store, sid, "Title")
    with pytest.raises(SessionNotFound):
        set_title(store, sid, "Title", source="generated")
    assert get_session(store, sid, include_deleted=True).title == ""


def test_set_title_refuses_an_empty_title_without_writing(store: Any) -> None:
    sid = create_session(store, "/tmp/x").session_id
    set_title(store, sid, "Kept")
    with pytest.raises(InvalidTitle):
        set_title(store, sid, " \n ")
    assert get_session(store, sid).title == "Kept"


def test_an_archived_session_can_be_retitled(store: Any, recorder: Any) -> None:
    # Any session session/list would return can be retitled, without loading it.
    sid = create_session(store, "/tmp/x").session_id
    archive(store, recorder, sid)
    assert set_title(store, sid, "Archived work") == "Archived work"
    assert get_session(store, sid).title == "Archived work"


def test_a_generated_title_is_stored_on_an_untitled_session(store: Any) -> None:
    sid = create_session(store, "/tmp/x").session_id
    assert set_title(store, sid, "Generated", source="generated") == "Generated"
    stored = get_session(store, sid)
    assert (stored.title, stored.title_source) == ("Generated", "generated")
    # A later generated title may replace an earlier generated one.
    assert set_title(store, sid, "Better", source="generated") == "Better"
    assert get_session(store, sid).title == "Better"


def test_a_generated_title_never_replaces_a_client_title(store: Any) -> None:
    # Given a session the client has titled
    sid = create_session(store, "/tmp/x").session_id
    set_title(store, sid, "Mine")
    # When a generated title arrives, it is discarded
    assert set_title(store, sid, "Generated", source="generated") is None
    # Then the client's title is kept
    stored = get_session(store, sid)
    assert (stored.title, stored.title_source) == ("Mine", "client")


def test_a_client_title_replaces_a_generated_one(store: Any) -> None:
    sid = create_session(store, "/tmp/x").session_id
    set_title(store, sid, "Generated", source="generated")
    assert set_title(store, sid, "Mine") == "Mine"
    stored = get_session(store, sid)
    assert (stored.title, stored.title_source) == ("Mine", "client")


def test_set_title_does_not_change_updated_at(store: Any) -> None:
    # Given a session, and a clock that has moved past its updatedAt
    created = get_session(store, create_session(store, "/tmp/x").session_id)
    sid = created.session_id
    key = store.keys.session(sid)
    updated_ms = int(store.redis.hget(key, "updatedMs"))
    wait_for(lambda: now_ms() > updated_ms + 1, timeout=2, message="the clock to move")
    # When it is titled by the client and by generation
    set_title(store, sid, "Generated", source="generated")
    set_title(store, sid, "Mine")
    # Then updatedAt and the listing order are unchanged
    assert get_session(store, sid).updated_at == created.updated_at
    assert int(store.redis.hget(key, "updatedMs")) == updated_ms
    assert store.redis.zscore(store.keys.index("all"), sid) == updated_ms


def test_set_title_publishes_the_stored_title(store: Any) -> None:
    sid = create_session(store, "/tmp/x").session_id
    pubsub = store.redis.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(store.keys.events)
    try:
        wait_for(lambda: pubsub.subscribed, timeout=5, message="the subscription")
        set_title(store, sid, " Fix\n\nit ")
        deadline = time.monotonic() + 5
        event = None
        while event is None and time.monotonic() < deadline:
            message = pubsub.get_message(timeout=0.2)
            if message is not None:
                data = json.loads(message["data"])
                if data.get("sessionId") == sid and data.get("type") == "title":
                    event = data
        assert event == {"type": "title", "sessionId": sid, "title": "Fix it"}
    finally:
        pubsub.close()


def test_a_generation_racing_a_client_rename_never_ends_with_the_generated_title(
    store: Any,
) -> None:
    # Given a generator writing generated titles in a loop
    sid = create_session(store, "/tmp/x").session_id
    stop = threading.Event()
    results: list[str | None] = []
    errors: list[BaseException] = []

    def generate() -> None:
        i = 0
        try:
            while not stop.is_set() and i < 20_000:
                results.append(set_title(store, sid, f"generated {i}", source="generated"))
                i += 1
        except BaseException as exc:  # surfaced to the test below
            errors.append(exc)

    thread = threading.Thread(target=generate, daemon=True)
    thread.start()
    try:
        wait_for(lambda: len(results) >= 20 or errors, timeout=10, message="generation")
        # When the client renames the session while the generator runs
        assert set_title(store, sid, "Client title") == "Client title"
        seen = len(results)
        wait_for(lambda: len(results) >= seen + 20 or errors, timeout=10, message="more tries")
    finally:
        stop.set()
        thread.join(timeout=10)
    assert not thread.is_alive()
    assert errors == []
    # Then every generation after the rename was discarded and the client's title stands
    assert results[-10:] == [None] * 10
    stored = get_session(store, sid)
    assert (stored.title, stored.title_source) == ("Client title", "client")


# -- layering -----------------------------------------------------------------------------


def test_titles_imports_neither_fastapi_nor_celery() -> None:
    code = (
        "import sys, orchestrator.session.titles; "
        "assert 'fastapi' not in sys.modules and 'celery' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
