"""session/list: the archived filter, cwd, order, pagination and cursors (acp.md)."""

from __future__ import annotations

import base64
import json
import threading
import time

import pytest

from orchestrator.archiving import archive
from orchestrator.errors import InputRejected, InvalidParams
from orchestrator.session import sessions
from orchestrator.session.sessions import Session
from orchestrator.storage.store import Store
from orchestrator.turn import turns
from tests.helpers import RecordingDispatcher
from tests.orchestrator.support import unique_cwd


def ids(page: sessions.Page) -> list[str]:
    return [s.session_id for s in page.sessions]


def walk(store: Store, limit: int, **filters: object) -> list[list[str]]:
    """Every page of a listing, following nextCursor; asserts the last page has none."""
    pages: list[list[str]] = []
    cursor = None
    for _ in range(100):
        page = sessions.list_sessions(store, cursor=cursor, limit=limit, **filters)
        pages.append(ids(page))
        cursor = page.next_cursor
        if cursor is None:
            return pages
    raise AssertionError("pagination never ended")


def raw_cursor(data: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")


@pytest.fixture
def mixed(store: Store, recorder: RecordingDispatcher, cwd: str) -> tuple[Session, Session]:
    """An unarchived and an archived session in ``cwd``."""
    plain = sessions.create_session(store, cwd)
    hidden = sessions.create_session(store, cwd)
    archive.archive(store, recorder, hidden.session_id)
    return plain, hidden


@pytest.mark.parametrize("value", [None, "exclude"])
def test_the_default_filter_lists_only_unarchived_sessions(
    store: Store, cwd: str, mixed: tuple[Session, Session], value: object
) -> None:
    plain, _ = mixed
    assert ids(sessions.list_sessions(store, cwd=cwd, archived=value)) == [plain.session_id]


def test_omitting_the_filter_is_the_same_as_exclude(
    store: Store, cwd: str, mixed: tuple[Session, Session]
) -> None:
    plain, _ = mixed
    assert ids(sessions.list_sessions(store, cwd=cwd)) == [plain.session_id]


def test_include_lists_archived_and_unarchived_sessions(
    store: Store, cwd: str, mixed: tuple[Session, Session]
) -> None:
    plain, hidden = mixed
    listed = sessions.list_sessions(store, cwd=cwd, archived="include")
    assert sorted(ids(listed)) == sorted([plain.session_id, hidden.session_id])


def test_only_lists_just_the_archived_sessions(
    store: Store, cwd: str, mixed: tuple[Session, Session]
) -> None:
    _, hidden = mixed
    assert ids(sessions.list_sessions(store, cwd=cwd, archived="only")) == [hidden.session_id]


@pytest.mark.parametrize(
    "value", [True, False, "yes", "no", 1, 0, 1.5, "", "EXCLUDE", "Only", " only", "_x", ["only"]]
)
def test_any_other_archived_value_is_invalid_params_never_a_silent_exclude(
    store: Store, value: object
) -> None:
    with pytest.raises(InvalidParams) as raised:
        sessions.list_sessions(store, archived=value)
    assert raised.value.data["param"] == "archived"


def test_the_cwd_filter_matches_the_directory_however_it_is_spelled(store: Store) -> None:
    # Given sessions in a directory under three spellings, a sibling and a subdirectory
    base = unique_cwd()
    same = [sessions.create_session(store, c) for c in (base, base + "/", base + "/sub/..")]
    for other in (base + "x", base + "/sub"):
        sessions.create_session(store, other)
    # Then each is stored under the directory's normal form
    assert {s.cwd for s in same} == {base}
    # When listing by any spelling of the directory, Then exactly its three sessions appear
    for spelled in (base, base + "/", base.replace("/", "//")):
        for flt in ("exclude", "include"):
            listed = ids(sessions.list_sessions(store, cwd=spelled, archived=flt))
            assert sorted(listed) == sorted(s.session_id for s in same)


@pytest.mark.parametrize("bad_cwd", ["relative", "", 7])
def test_a_cwd_filter_that_is_not_absolute_is_invalid_params(store: Store, bad_cwd: object) -> None:
    with pytest.raises(InvalidParams):
        sessions.list_sessions(store, cwd=bad_cwd)


@pytest.mark.parametrize("flt", [None, "exclude", "include", "only"])
def test_deleted_sessions_are_never_listed_under_any_filter(
    store: Store, recorder: RecordingDispatcher, cwd: str, flt: str | None
) -> None:
    # Given a deleted plain session and a deleted archived one, beside a kept archived one
    gone = sessions.create_session(store, cwd)
    gone_archived = sessions.create_session(store, cwd)
    kept = sessions.create_session(store, cwd)
    archive.archive(store, recorder, gone_archived.session_id)
    archive.archive(store, recorder, kept.session_id)
    sessions.delete_session(store, gone.session_id)
    sessions.delete_session(store, gone_archived.session_id)
    deleted = {gone.session_id, gone_archived.session_id}

    # When listing with the filter, by cwd and over the whole store
    by_cwd = ids(sessions.list_sessions(store, cwd=cwd, archived=flt))
    everywhere = [sid for page in walk(store, 200, archived=flt) for sid in page]

    # Then neither deleted session appears
    assert deleted.isdisjoint(by_cwd)
    assert deleted.isdisjoint(everywhere)
    if flt in ("include", "only"):
        assert by_cwd == [kept.session_id]


def test_sessions_are_listed_newest_activity_first(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    # Given three sessions created one after another
    created = []
    for _ in range(3):
        created.append(sessions.create_session(store, cwd))
        time.sleep(0.005)
    assert ids(sessions.list_sessions(store, cwd=cwd)) == [s.session_id for s in created[::-1]]

    # When the oldest one gets new activity (a prompt)
    time.sleep(0.005)
    turns.start_turn(store, recorder, created[0].session_id, "say hi")

    # Then it moves to the top, and updatedAt never increases down the list
    listed = sessions.list_sessions(store, cwd=cwd).sessions
    assert [s.session_id for s in listed] == [
        created[0].session_id,
        created[2].session_id,
        created[1].session_id,
    ]
    stamps = [s.updated_at for s in listed]
    assert stamps == sorted(stamps, reverse=True)


def test_paging_by_two_over_five_sessions_visits_each_exactly_once(store: Store, cwd: str) -> None:
    # Given five sessions in one cwd
    made = {sessions.create_session(store, cwd).session_id for _ in range(5)}
    # When every page of two is read
    pages = walk(store, 2, cwd=cwd)
    # Then pages hold 2, 2 and 1 sessions, every session once, and the last page has no cursor
    assert [len(p) for p in pages] == [2, 2, 1]
    flat = [sid for page in pages for sid in page]
    assert len(flat) == len(set(flat)) == 5
    assert set(flat) == made


def test_there_is_no_next_cursor_when_the_last_page_is_exactly_full(store: Store, cwd: str) -> None:
    for _ in range(4):
        sessions.create_session(store, cwd)

    first = sessions.list_sessions(store, cwd=cwd, limit=2)
    second = sessions.list_sessions(store, cwd=cwd, limit=2, cursor=first.next_cursor)

    assert first.next_cursor is not None
    assert len(second.sessions) == 2
    assert second.next_cursor is None


def test_paging_is_exact_when_many_sessions_share_one_updated_time(
    store: Store, cwd: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given seven sessions with the very same updatedAt (ties are broken by id)
    monkeypatch.setattr(store, "now_ms", lambda: 1_700_000_000_000)
    made = {sessions.create_session(store, cwd).session_id for _ in range(7)}
    # When read two at a time
    pages = walk(store, 2, cwd=cwd)
    # Then each session is still seen exactly once
    flat = [sid for page in pages for sid in page]
    assert sorted(flat) == sorted(made)
    assert [len(p) for p in pages] == [2, 2, 2, 1]


def test_archived_filter_applies_before_pagination(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    # Given six sessions of which three are archived
    made = [sessions.create_session(store, cwd) for _ in range(6)]
    for s in made[::2]:
        archive.archive(store, recorder, s.session_id)
    archived_ids = {s.session_id for s in made[::2]}
    # When paging each filter by two
    only = walk(store, 2, cwd=cwd, archived="only")
    exclude = walk(store, 2, cwd=cwd, archived="exclude")
    # Then full pages hold only matching sessions
    assert [len(p) for p in only] == [2, 1]
    assert {sid for p in only for sid in p} == archived_ids
    assert {sid for p in exclude for sid in p} == {s.session_id for s in made} - archived_ids


def test_a_cursor_is_bound_to_its_archived_filter(store: Store, cwd: str) -> None:
    for _ in range(3):
        sessions.create_session(store, cwd)
    cursor = sessions.list_sessions(store, cwd=cwd, archived="include", limit=1).next_cursor
    assert cursor is not None
    for other in (None, "exclude", "only"):
        with pytest.raises(InvalidParams):
            sessions.list_sessions(store, cwd=cwd, archived=other, cursor=cursor, limit=1)


def test_a_cursor_is_bound_to_its_cwd(store: Store, cwd: str) -> None:
    for _ in range(3):
        sessions.create_session(store, cwd)
    by_cwd = sessions.list_sessions(store, cwd=cwd, limit=1).next_cursor
    unfiltered = sessions.list_sessions(store, limit=1).next_cursor
    assert by_cwd is not None and unfiltered is not None

    with pytest.raises(InvalidParams):
        sessions.list_sessions(store, cursor=by_cwd, limit=1)
    with pytest.raises(InvalidParams):
        sessions.list_sessions(store, cwd=unique_cwd(), cursor=by_cwd, limit=1)
    with pytest.raises(InvalidParams):
        sessions.list_sessions(store, cwd=cwd, cursor=unfiltered, limit=1)


@pytest.mark.parametrize(
    "cursor",
    [
        "",
        "garbage!!",
        "%%%",
        "é",
        "A" * 9000,
        7,
        True,
        raw_cursor([1, 2]),
        raw_cursor("text"),
        raw_cursor({"a": "exclude"}),
        raw_cursor({"a": "exclude", "c": None, "s": "1", "i": "sess_x"}),
        raw_cursor({"a": "exclude", "c": None, "s": True, "i": "sess_x"}),
        raw_cursor({"a": "exclude", "c": None, "s": 1.0, "i": 5}),
        base64.urlsafe_b64encode(b"\xff\xfe{").decode(),
    ],
)
def test_a_garbled_cursor_is_invalid_params(store: Store, cursor: object) -> None:
    with pytest.raises(InvalidParams) as raised:
        sessions.list_sessions(store, cursor=cursor)
    assert raised.value.data["param"] == "cursor"


def test_a_cursor_with_a_nan_score_is_refused_as_a_number_that_is_not_finite(
    store: Store,
) -> None:
    # json.dumps writes NaN, which is not JSON: refused as 1e999 would be, naming where.
    cursor = raw_cursor({"a": "exclude", "c": None, "s": float("nan"), "i": "sess_x"})
    with pytest.raises(InputRejected) as raised:
        sessions.list_sessions(store, cursor=cursor)
    assert raised.value.data == {"limit": "number", "param": "cursor", "max": 100, "path": "$.s"}


def test_a_cursor_with_a_huge_integer_score_is_invalid_params(store: Store) -> None:
    cursor = raw_cursor({"a": "exclude", "c": None, "s": 10**400, "i": "sess_x"})
    with pytest.raises(InvalidParams):
        sessions.list_sessions(store, cursor=cursor)


@pytest.mark.parametrize("limit", [0, -1, sessions.MAX_PAGE + 1])
def test_a_limit_out_of_range_is_invalid_params(store: Store, limit: int) -> None:
    with pytest.raises(InvalidParams):
        sessions.list_sessions(store, limit=limit)


def test_every_listed_session_info_carries_a_boolean_archived(
    store: Store, cwd: str, mixed: tuple[Session, Session]
) -> None:
    plain, hidden = mixed
    infos = {
        s.session_id: s.to_info()
        for s in sessions.list_sessions(store, cwd=cwd, archived="include").sessions
    }
    assert infos[plain.session_id]["archived"] is False
    assert infos[hidden.session_id]["archived"] is True
    assert all(isinstance(info["archived"], bool) for info in infos.values())


def test_an_empty_listing_is_an_empty_page_without_cursor(store: Store) -> None:
    page = sessions.list_sessions(store, cwd=unique_cwd(), archived="include")
    assert page.sessions == []
    assert page.next_cursor is None


def test_listing_modifies_nothing(store: Store, cwd: str, mixed: tuple[Session, Session]) -> None:
    # Given the stored hashes of two sessions
    keys = [store.keys.session(s.session_id) for s in mixed]
    before = [store.redis.hgetall(k) for k in keys]
    # When they are listed under every filter
    for flt in ("exclude", "include", "only"):
        sessions.list_sessions(store, cwd=cwd, archived=flt)
    # Then nothing about them changed
    assert [store.redis.hgetall(k) for k in keys] == before


def test_no_listed_row_contradicts_its_filter_while_another_thread_toggles_archive(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    """The listing reads an index, then the session hashes: a session archived or unarchived
    in between must be left out rather than listed against its filter."""
    toggled = sessions.create_session(store, cwd)
    for _ in range(3):
        sessions.create_session(store, cwd)
    done = threading.Event()

    def toggle() -> None:
        for _ in range(2_000):
            if done.is_set():
                return
            archive.archive(store, recorder, toggled.session_id)
            archive.unarchive(store, toggled.session_id)

    toggler = threading.Thread(target=toggle, daemon=True)
    toggler.start()
    wrong: list[tuple[str, bool]] = []
    filters = (("only", {True}), ("exclude", {False}), ("include", {True, False}))
    try:
        for _ in range(600):
            for flt, allowed in filters:
                for s in sessions.list_sessions(store, cwd=cwd, archived=flt).sessions:
                    if s.archived not in allowed:
                        wrong.append((flt, s.archived))
    finally:
        done.set()
        toggler.join()
    assert wrong == []


@pytest.mark.parametrize(
    ("title", "q"),
    [
        ("İstanbul office", "istanbul"),  # the dotted capital I folds to i and a dot
        ("İstanbul office", "ISTANBUL"),
        ("istanbul office", "İstanbul"),
        ("Straße", "STRASSE"),  # full case folding
        ("Cafe\u0301 notes", "café"),  # decomposed and composed é alike (NFC)
    ],
)
def test_a_title_search_folds_case_the_same_way_on_both_sides(title: str, q: str) -> None:
    needle = sessions.normalize_query(q)
    assert needle is not None and sessions.title_matches(title, needle)


def test_a_title_search_still_tells_dotless_i_apart() -> None:
    # ı (dotless i) is a letter of its own: it folds to itself, not to i
    needle = sessions.normalize_query("ılık")
    assert needle is not None and not sessions.title_matches("ilik", needle)
