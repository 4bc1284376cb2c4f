"""The complete REST surface: titles, close and cancel, the title search with pagination,
strict query values, the bulk archive endpoint (errors and caps) and the Server-Sent Events
stream with ``Last-Event-ID`` resume. In process (TestClient) against the real test Redis;
one test serves the app with uvicorn on a socket, as ``fleet api`` does."""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi.testclient import TestClient

import api.rest
from orchestrator.archiving import archive
from orchestrator.reminder import reminders
from orchestrator.session import listing, titles
from orchestrator.settings import FleetSettings, get_settings
from orchestrator.storage.store import Store
from orchestrator.turn import turns
from tests.helpers import RecordingDispatcher, rest_client, wait_for
from tests.helpers import error_shape as _error

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with rest_client(sse_heartbeat_seconds=0.3) as c:
        yield c


def _cwd() -> str:
    return f"/tmp/fleet-api-complete/{uuid.uuid4().hex}"


def _new(client: TestClient, cwd: str | None = None, **extra: Any) -> str:
    resp = client.post("/sessions", json={"cwd": cwd or _cwd(), **extra})
    assert resp.status_code == 201, resp.text
    sid: str = resp.json()["sessionId"]
    return sid


def _title(client: TestClient, sid: str, body: Any) -> httpx.Response:
    return client.put(f"/sessions/{sid}/title", json=body)


# --------------------------------------------------------------------------- OpenAPI


def test_openapi_documents_every_new_route(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    paths = spec["paths"]
    assert "post" in paths["/sessions/archive"]
    assert "put" in paths["/sessions/{session_id}/title"]
    assert "post" in paths["/sessions/{session_id}/close"]
    assert "post" in paths["/sessions/{session_id}/cancel"]
    assert "text/event-stream" in paths["/events"]["get"]["responses"]["200"]["content"]
    assert "q" in {p["name"] for p in paths["/sessions"]["get"]["parameters"]}
    body = spec["components"]["schemas"]["BulkArchiveBody"]["properties"]
    assert {"sessionIds", "filter", "stopActivity", "dryRun"} <= set(body)
    assert body["sessionIds"]["maxItems"] == 10_000
    # A route with a body documents the answers to a body too large or not sent as JSON
    answers = paths["/sessions/archive"]["post"]["responses"]
    assert {"413", "415", "422"} <= set(answers), sorted(answers)
    assert answers["415"]["content"]["application/json"]["schema"]["$ref"].endswith("/Error")
    assert "415" not in paths["/sessions"]["get"]["responses"]


# --------------------------------------------------------------------------- titles


def test_set_title_uses_the_acp_normalizer(client: TestClient) -> None:
    sid = _new(client)
    raw = "  Fix\tthe \u200blogin\n bug  "
    resp = _title(client, sid, {"title": raw})
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"sessionId": sid, "title": titles.normalize_title(raw)}
    assert client.get(f"/sessions/{sid}").json()["title"] == "Fix the login bug"


@pytest.mark.parametrize("body", [{}, {"title": None}, {"title": ""}, {"title": " \u200b\n\t "}])
def test_an_empty_title_is_422_title_must_not_be_empty(client: TestClient, body: Any) -> None:
    error = _error(_title(client, _new(client), body), 422, "invalid_title")
    assert error["message"] == "Title must not be empty."


@pytest.mark.parametrize("body", [{"title": 5}, {"title": ["x"]}, {"title": "x", "other": 1}])
def test_an_ill_typed_title_body_is_422(client: TestClient, body: Any) -> None:
    _error(_title(client, _new(client), body), 422, "invalid_params")


def test_titles_of_unknown_and_archived_sessions(client: TestClient) -> None:
    _error(_title(client, "sess_" + "0" * 24, {"title": "x"}), 404, "session_not_found")
    sid = _new(client)
    client.post(f"/sessions/{sid}/archive")
    assert _title(client, sid, {"title": "kept"}).json()["title"] == "kept"


# --------------------------------------------------------------------------- close and cancel


@pytest.mark.parametrize("action", ["close", "cancel"])
def test_close_and_cancel_stop_the_live_turns_only(
    client: TestClient, store: Store, action: str
) -> None:
    # Given a session with a running turn, a queued one and an armed reminder (turns started
    # through a recorder: no worker runs them)
    recorder = RecordingDispatcher()
    sid = _new(client)
    running = turns.start_turn(store, recorder, sid, "think 30")
    queued = turns.start_turn(store, recorder, sid, "say later")
    reminders.create_reminder(store, sid, 60, "later")
    # When the session is closed (or cancelled)
    resp = client.post(f"/sessions/{sid}/{action}")
    # Then both turns are cancelled, and the reminder is left alone
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["turns"] == {running: "cancelled", queued: "cancelled"}
    assert body.get("closed", action == "close") is (action == "close")
    for tid in (running, queued):
        assert client.get(f"/turns/{tid}").json()["state"] == "cancelled"
    live = client.get(f"/sessions/{sid}/activity").json()["activity"]
    assert [item["family"] for item in live] == ["reminder"]
    # And again, with nothing left to cancel
    assert client.post(f"/sessions/{sid}/{action}").json()["turns"] == {}


@pytest.mark.parametrize("action", ["close", "cancel"])
def test_close_and_cancel_of_an_unknown_session_are_404(client: TestClient, action: str) -> None:
    _error(client.post(f"/sessions/sess_{'0' * 24}/{action}"), 404, "session_not_found")
    _error(client.post(f"/sessions/a*b/{action}"), 404, "session_not_found")


# --------------------------------------------------------------------------- search


def _pages(client: TestClient, **params: Any) -> list[list[str]]:
    pages: list[list[str]] = []
    cursor = None
    for _ in range(100):
        query = dict(params, **({"cursor": cursor} if cursor else {}))
        resp = client.get("/sessions", params=query)
        assert resp.status_code == 200, resp.text
        body = resp.json()
        pages.append([s["sessionId"] for s in body["sessions"]])
        cursor = body.get("nextCursor")
        if not cursor:
            return pages
    raise AssertionError("pagination never ended")


@pytest.fixture(scope="module")
def titled(client: TestClient) -> tuple[str, list[str], list[str]]:
    """A cwd with 25 sessions, newest first; 10 of them have "alpha" in their title."""
    cwd = _cwd()
    made = []
    for i in range(25):
        sid = _new(client, cwd)
        if i % 5 == 0:
            title = f"Alpha one {i}"
        elif i % 5 == 2:
            title = f"the ALPHABET {i}"
        elif i % 5 == 4:
            title = ""
        else:
            title = f"beta {i}"
        if title:
            assert _title(client, sid, {"title": title}).status_code == 200
        made.append((sid, title))
    newest_first = [sid for sid, _ in reversed(made)]
    matching = [sid for sid, t in reversed(made) if "alpha" in t.lower()]
    assert len(matching) == 10
    return cwd, newest_first, matching


def test_q_filters_before_pagination(client: TestClient, titled: Any) -> None:
    cwd, _, matching = titled
    pages = _pages(client, cwd=cwd, q="ALPHA", limit=3)
    assert [len(p) for p in pages] == [3, 3, 3, 1]
    assert [sid for page in pages for sid in page] == matching
    # One page holding them all has no cursor
    assert _pages(client, cwd=cwd, q="alpha", limit=10) == [matching]
    assert _pages(client, cwd=cwd, q="no such title") == [[]]


def test_q_is_a_case_insensitive_substring_and_blank_means_no_search(
    client: TestClient, titled: Any
) -> None:
    cwd, newest_first, _ = titled
    found = _pages(client, cwd=cwd, q="HABE", limit=50)[0]
    assert len(found) == 5  # the five "the ALPHABET <i>"
    assert _pages(client, cwd=cwd, q="  ", limit=50) == [newest_first]


def test_a_bounded_scan_still_finds_every_match_exactly_once(
    client: TestClient, titled: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    cwd, _, matching = titled
    monkeypatch.setattr(listing, "SEARCH_SCAN", 4)
    monkeypatch.setattr(listing, "SEARCH_BATCH", 2)
    pages = _pages(client, cwd=cwd, q="alpha", limit=3)
    assert [sid for page in pages for sid in page] == matching
    # Pages end early when the scan budget runs out, and still carry a cursor
    assert any(len(page) < 3 for page in pages[:-1])


def test_q_combines_with_the_archived_filter(client: TestClient) -> None:
    cwd = _cwd()
    kept, gone = _new(client, cwd), _new(client, cwd)
    for sid in (kept, gone):
        _title(client, sid, {"title": "needle"})
    client.post(f"/sessions/{gone}/archive")
    assert _pages(client, cwd=cwd, q="needle") == [[kept]]
    assert _pages(client, cwd=cwd, q="needle", archived="only") == [[gone]]
    assert set(_pages(client, cwd=cwd, q="needle", archived="include")[0]) == {kept, gone}


def test_a_cursor_is_bound_to_its_search(client: TestClient, titled: Any) -> None:
    cwd, _, _ = titled
    cursor = client.get("/sessions", params={"cwd": cwd, "q": "alpha", "limit": 2}).json()[
        "nextCursor"
    ]
    for params in ({"q": "beta"}, {}):
        resp = client.get("/sessions", params={"cwd": cwd, "cursor": cursor, **params})
        assert _error(resp, 422, "invalid_params")["data"] == {"param": "cursor"}


def test_a_search_longer_than_200_characters_is_422(client: TestClient) -> None:
    resp = client.get("/sessions", params={"q": "x" * 201})
    assert _error(resp, 422, "invalid_params")["data"]["param"] == "q"


# --------------------------------------------------------------------------- strict queries


@pytest.mark.parametrize("value", ["true", "false", "1", "yes", "EXCLUDE", "all", ""])
def test_an_unknown_archived_value_is_refused_never_coerced(client: TestClient, value: str) -> None:
    error = _error(client.get("/sessions", params={"archived": value}), 422, "invalid_params")
    assert error["data"]["allowed"] == ["exclude", "include", "only"]


@pytest.mark.parametrize(
    "params",
    [{"limit": "abc"}, {"limit": "0"}, {"limit": "201"}, {"limit": "1.5"}, {"cursor": "nope"}]
    + [{"limit": v} for v in ("1_0", "+1", " 1", "5 ", "\n3\t", "\u0661", "1e1", "0x5")],
)
def test_malformed_query_values_are_422_with_the_reason(
    client: TestClient, params: dict[str, str]
) -> None:
    error = _error(client.get("/sessions", params=params), 422, "invalid_params")
    assert next(iter(params)) in error["message"]


@pytest.mark.parametrize(
    "path", ["/audit", "/sessions/{sid}/audit", "/sessions/{sid}/conversation"]
)
@pytest.mark.parametrize("value", ["1_0", "+1", " 1", "5 ", "1.0"])
def test_a_limit_not_written_in_digits_alone_is_refused_on_every_route(
    client: TestClient, path: str, value: str
) -> None:
    sid = _new(client, _cwd())
    url = path.format(sid=sid)
    error = _error(client.get(url, params={"limit": value}), 422, "invalid_params")
    assert "limit" in error["message"]
    assert client.get(url, params={"limit": "05"}).status_code == 200


# --------------------------------------------------------------------------- bulk archive


def test_bulk_archive_by_ids(client: TestClient, store: Store) -> None:
    cwd = _cwd()
    quiet, done, busy = _new(client, cwd), _new(client, cwd), _new(client, cwd)
    client.post(f"/sessions/{done}/archive")
    rid = reminders.create_reminder(store, busy, 60, "later")
    unknown = "sess_" + "0" * 24
    resp = client.post("/sessions/archive", json={"sessionIds": [quiet, done, busy, unknown]})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["totals"] == {
        "archived": 1,
        "already_archived": 1,
        "refused": 1,
        "not_found": 1,
        "skipped": 0,
        "selected": 4,
    }
    assert body["results"][:2] == [
        {"sessionId": quiet, "outcome": "archived"},
        {"sessionId": done, "outcome": "already_archived"},
    ]
    refused = body["results"][2]
    assert refused["outcome"] == "refused"
    assert [(a["family"], a["id"]) for a in refused["activity"]] == [("reminder", rid)]
    assert body["results"][3] == {"sessionId": unknown, "outcome": "not_found"}
    # The single archive refuses it the same way: 409 session_active with the live items
    error = _error(client.post(f"/sessions/{busy}/archive"), 409, "session_active")
    assert error["data"]["activity"] == refused["activity"]


@pytest.mark.parametrize("dry_run", [False, True])
def test_bulk_results_quote_a_malformed_id_by_its_first_80_characters_as_a_single_archive_does(
    client: TestClient, dry_run: bool
) -> None:
    # Given an id of 100,000 characters, short and long malformed ones, and well-formed ones
    # (the longest form included) in a bulk archive
    huge, longest, sid = "a" * 100_000, "L" * 64, _new(client)
    ids = [sid, huge, "../x", "b" * 81, longest]
    # When it is answered, and the huge id is archived alone over REST and over ACP
    resp = client.post("/sessions/archive", json={"sessionIds": ids, "dryRun": dry_run})
    # (a URL of 100,000 characters is past what the HTTP client sends)
    single = _error(client.post(f"/sessions/{huge[:5_000]}/archive"), 404, "session_not_found")
    with client.websocket_connect("/acp") as ws:
        ws.send_json(
            {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": 1}}
        )
        assert "result" in ws.receive_json()
        request = {"sessionId": huge}
        ws.send_json({"jsonrpc": "2.0", "id": 1, "method": "session/archive", "params": request})
        acp = ws.receive_json()["error"]
    # Then the malformed ids are quoted by their first 80 characters, as the single archives
    # quote them, and the well-formed ones whole: the answer stays short
    assert single["data"] == {"sessionId": "a" * 80}, single
    assert acp["code"] == -32002 and acp["data"] == {"sessionId": "a" * 80}, acp
    assert resp.status_code == 200, resp.text[:300]
    assert [(r["sessionId"], r["outcome"]) for r in resp.json()["results"]] == [
        (sid, "archived"),
        ("a" * 80, "not_found"),
        ("../x", "not_found"),
        ("b" * 80, "not_found"),
        (longest, "not_found"),
    ]
    assert len(resp.content) < 2_000, len(resp.content)


def test_bulk_archive_by_filter_with_a_dry_run_first(client: TestClient) -> None:
    cwd = _cwd()
    ids = [_new(client, cwd) for _ in range(3)]
    _title(client, ids[0], {"title": "Keep me"})
    body = {"filter": {"cwd": cwd, "q": "keep"}, "dryRun": True}
    dry = client.post("/sessions/archive", json=body).json()
    assert dry["dryRun"] is True and dry["totals"]["archived"] == 1
    assert not client.get(f"/sessions/{ids[0]}").json()["archived"]
    real = client.post("/sessions/archive", json=dict(body, dryRun=False)).json()
    assert real["results"] == [{"sessionId": ids[0], "outcome": "archived"}]
    assert client.get(f"/sessions/{ids[0]}").json()["archived"] is True
    # A date in the future selects every session of the cwd left
    later = "2999-01-01T00:00:00Z"
    rest = client.post("/sessions/archive", json={"filter": {"cwd": cwd, "idleSince": later}})
    assert {r["sessionId"] for r in rest.json()["results"]} == set(ids[1:])


def test_bulk_archive_with_stop_activity_archives_busy_sessions(
    client: TestClient, store: Store
) -> None:
    sid = _new(client)
    reminders.create_reminder(store, sid, 60, "later")
    body = client.post("/sessions/archive", json={"sessionIds": [sid], "stopActivity": True})
    assert body.json()["results"] == [{"sessionId": sid, "outcome": "archived"}]
    assert body.json()["stopDispatch"]["sent"] == {"reminder": 1}


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ({}, "sessionIds|filter"),
        ({"sessionIds": [], "filter": {"cwd": "/tmp"}}, "sessionIds|filter"),
        ({"filter": {}}, "filter"),
        ({"filter": {"cwd": "relative"}}, "cwd"),
        ({"filter": {"idleSince": "yesterday"}}, "idleSince"),
        ({"filter": {"idleSince": "2026-01-01T00:00:00"}}, "idleSince"),
        ({"sessionIds": ["x"], "dryRun": "false"}, "dryRun"),
        ({"sessionIds": ["x"], "dryRun": 0}, "dryRun"),
        ({"sessionIds": ["x"], "stopActivity": "true"}, "stopActivity"),
        ({"sessionIds": "sess_x"}, "sessionIds"),
        ({"sessionIds": [5]}, "sessionIds"),
        ({"sessionIds": ["x"], "force": True}, "force"),
        ({"filter": {"cwd": "/tmp", "title": "x"}}, "title"),
    ],
)
def test_bad_bulk_requests_are_422_with_the_reason(
    client: TestClient, body: dict[str, Any], where: str
) -> None:
    error = _error(client.post("/sessions/archive", json=body), 422, "invalid_params")
    assert where in error["message"] or error["data"].get("param") == where, error


@pytest.mark.parametrize(
    ("criteria", "param"),
    [
        ({"cwd": "relative"}, "filter.cwd"),
        ({"q": "   "}, "filter.q"),
        ({"q": "x" * 201}, "filter.q"),
        ({"idleSince": "yesterday"}, "filter.idleSince"),
    ],
)
def test_a_bad_filter_criterion_is_named_by_its_place_in_the_body(
    client: TestClient, criteria: dict[str, Any], param: str
) -> None:
    # As the body's own validation names it (body.filter.cwd for a cwd that is not a string)
    error = _error(
        client.post("/sessions/archive", json={"filter": criteria}), 422, "invalid_params"
    )
    assert error["data"]["param"] == param, error


def test_more_than_ten_thousand_ids_are_422_too_many_sessions(client: TestClient) -> None:
    sid = _new(client)
    ids = [sid] + [f"sess_{i:024d}" for i in range(10_000)]
    error = _error(
        client.post("/sessions/archive", json={"sessionIds": ids}), 422, "too_many_sessions"
    )
    assert error["data"] == {"param": "sessionIds", "max": 10_000, "got": 10_001}
    assert "At most 10000 sessionIds" in error["message"]
    assert client.get(f"/sessions/{sid}").json()["archived"] is False


def test_a_filter_over_the_configured_maximum_is_422_and_archives_nothing(
    client: TestClient,
) -> None:
    cwd = _cwd()
    ids = [_new(client, cwd) for _ in range(3)]
    with rest_client(FLEET_BULK_FILTER_MAX="2") as capped:
        resp = capped.post("/sessions/archive", json={"filter": {"cwd": cwd}})
    error = _error(resp, 422, "too_many_sessions")
    assert error["data"] == {"param": "filter", "max": 2, "setting": "FLEET_BULK_FILTER_MAX"}
    assert "more than 2 sessions" in error["message"]
    assert not any(client.get(f"/sessions/{sid}").json()["archived"] for sid in ids)


def test_the_bulk_route_does_not_shadow_a_single_archive(client: TestClient) -> None:
    sid = _new(client)
    assert client.post(f"/sessions/{sid}/archive").json()["outcome"] == "archived"
    _error(client.get("/sessions/archive"), 404, "session_not_found")


# --------------------------------------------------------------------------- events (SSE)


class Sse:
    """Reads Server-Sent Events frames from a streaming response."""

    def __init__(self, resp: httpx.Response) -> None:
        assert resp.status_code == 200, resp.read()
        assert resp.headers["content-type"].startswith("text/event-stream")
        self.lines = resp.iter_lines()

    def frame(self) -> dict[str, Any]:
        frame: dict[str, Any] = {}
        for line in self.lines:
            if line == "":
                if frame:
                    return frame
                continue
            if line.startswith(":"):
                frame.setdefault("comments", []).append(line[1:].strip())
                continue
            name, _, value = line.partition(":")
            frame[name] = value[1:] if value.startswith(" ") else value
        raise AssertionError("the stream ended")

    def event(self) -> dict[str, Any]:
        """The next frame that is an event (comments skipped)."""
        while True:
            frame = self.frame()
            if "event" in frame:
                import json

                frame["json"] = json.loads(frame["data"])
                return frame


def _stream(client: Any, **kwargs: Any) -> Any:
    return client.stream("GET", "/events", **kwargs)


def _connected(sse: Sse) -> None:
    assert sse.frame() == {"comments": ["connected"]}


def _ids_increase(ids: list[str]) -> bool:
    keys = [tuple(int(p) for p in i.split("-")) for i in ids]
    return keys == sorted(keys) and len(set(keys)) == len(keys)


def test_lifecycle_events_stream_and_resume_after_last_event_id(
    client: TestClient, store: Store
) -> None:
    sid, other = _new(client), _new(client)
    recorder = RecordingDispatcher()
    # Given a client watching one session
    with _stream(client, params={"sessionId": sid}) as resp:
        sse = Sse(resp)
        _connected(sse)
        # When the other session and then this one are archived
        client.post(f"/sessions/{other}/archive")
        client.post(f"/sessions/{sid}/archive")
        # Then only this session's event arrives, with a stream id
        first = sse.event()
        assert first["event"] == "archived"
        assert first["json"] == {
            "type": "archived",
            "sessionId": sid,
            "archived": True,
            "historyLength": 0,
        }
    # When, while the client is away, the session is unarchived, retitled and a turn ends
    client.post(f"/sessions/{sid}/unarchive")
    _title(client, sid, {"title": "back again"})
    tid = turns.start_turn(store, recorder, sid, "think 30")
    client.post(f"/sessions/{sid}/cancel")
    # Then reconnecting with Last-Event-ID resumes right after the archived event
    with _stream(client, params={"sessionId": sid}, headers={"Last-Event-ID": first["id"]}) as resp:
        sse = Sse(resp)
        _connected(sse)
        missed = [sse.event() for _ in range(3)]
    assert [e["event"] for e in missed] == ["unarchived", "title", "turn"]
    assert missed[1]["json"]["title"] == "back again"
    assert missed[2]["json"] == {
        "type": "turn",
        "sessionId": sid,
        "turnId": tid,
        "state": "cancelled",
        "stopReason": "cancelled",
    }
    assert _ids_increase([first["id"], *(e["id"] for e in missed)])
    # And the lastEventId query parameter does the same
    with _stream(client, params={"sessionId": sid, "lastEventId": missed[0]["id"]}) as resp:
        sse = Sse(resp)
        _connected(sse)
        assert sse.event()["id"] == missed[1]["id"]


def test_a_new_client_gets_only_later_events_and_heartbeats(client: TestClient) -> None:
    sid = _new(client)
    client.post(f"/sessions/{sid}/archive")
    with _stream(client, params={"sessionId": sid}) as resp:
        sse = Sse(resp)
        _connected(sse)
        # The heartbeat (0.3 s here, 15 s by default) is a comment; the bound only tells the
        # configured interval from the default, generously for a loaded machine
        started = time.monotonic()
        assert sse.frame() == {"comments": ["heartbeat"]}
        assert time.monotonic() - started < 10
        client.post(f"/sessions/{sid}/unarchive")
        assert sse.event()["event"] == "unarchived"


def test_every_session_is_streamed_without_a_filter(client: TestClient) -> None:
    a, b = _new(client), _new(client)
    with _stream(client) as resp:
        sse = Sse(resp)
        _connected(sse)
        client.post(f"/sessions/{a}/archive")
        client.post(f"/sessions/{b}/archive")
        seen: list[str] = []
        while len(seen) < 2:
            event = sse.event()["json"]
            if event["sessionId"] in (a, b):
                seen.append(event["sessionId"])
    assert seen == [a, b]


@contextmanager
def _own_stream(store: Store) -> Iterator[tuple[TestClient, Store]]:
    """A client and store on a key prefix of their own: an event stream no other test adds
    to or trims."""
    prefix = f"{store.keys.prefix}gap-{uuid.uuid4().hex[:8]}:"
    own = Store(store.url, prefix)
    try:
        with rest_client(FLEET_KEY_PREFIX=prefix, sse_heartbeat_seconds=0.3) as c:
            yield c, own
    finally:
        own.close()


def test_a_resume_older_than_a_trimmed_stream_is_announced_as_a_gap(store: Store) -> None:
    with _own_stream(store) as (client, own):
        client.post(f"/sessions/{_new(client)}/archive")
        # Given a stream that lost its events (trimmed to nothing) and then got a new one
        own.redis.xtrim(own.keys.event_stream, maxlen=0, approximate=False)
        client.post(f"/sessions/{_new(client)}/archive")
        with _stream(client, headers={"Last-Event-ID": "1-0"}) as resp:
            sse = Sse(resp)
            _connected(sse)
            gap = sse.event()
    assert gap["event"] == "gap"
    assert gap["json"]["lastEventId"] == "1-0"
    assert gap["json"]["oldestId"]


def test_a_resume_from_the_start_of_a_stream_never_trimmed_replays_it_without_a_gap(
    store: Store,
) -> None:
    with _own_stream(store) as (client, _own):
        sid = _new(client)
        client.post(f"/sessions/{sid}/archive")
        with _stream(client, headers={"Last-Event-ID": "0-0"}) as resp:
            sse = Sse(resp)
            _connected(sse)
            first = sse.event()
    # Nothing was lost, so the first event is the first one written, not a gap notice
    assert (first["event"], first["json"]["sessionId"]) == ("archived", sid)


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"headers": {"Last-Event-ID": "yesterday"}}, "Last-Event-ID"),
        ({"params": {"lastEventId": "12"}}, "lastEventId"),
        ({"params": {"sessionId": "a*b"}}, "sessionId"),
    ],
)
def test_bad_event_stream_parameters_are_422(
    client: TestClient, kwargs: dict[str, Any], param: str
) -> None:
    error = _error(client.get("/events", **kwargs), 422, "invalid_params")
    assert error["data"]["param"] == param


def test_an_event_stream_of_no_session_is_404_and_of_an_archived_one_streams(
    client: TestClient,
) -> None:
    # A session id that names nothing would stream nothing, forever: refused as elsewhere.
    unknown = "sess_" + uuid.uuid4().hex[:24]
    error = _error(client.get("/events", params={"sessionId": unknown}), 404, "session_not_found")
    assert unknown in error["message"], error
    deleted = _new(client)
    assert client.delete(f"/sessions/{deleted}").json()["deleted"] is True
    _error(client.get("/events", params={"sessionId": deleted}), 404, "session_not_found")
    # An archived session is still a session: its unarchive is streamed.
    sid = _new(client)
    client.post(f"/sessions/{sid}/archive")
    with _stream(client, params={"sessionId": sid}) as resp:
        sse = Sse(resp)
        _connected(sse)
        client.post(f"/sessions/{sid}/unarchive")
        assert sse.event()["json"]["sessionId"] == sid


def test_a_delete_streams_a_deleted_event_for_the_session_and_each_descendant(
    client: TestClient,
) -> None:
    # Given root -> child -> grandchild and a client watching every session
    root = _new(client)
    child = _new(client, parentId=root)
    grand = _new(client, parentId=child)
    with _stream(client) as resp:
        sse = Sse(resp)
        _connected(sse)
        # When the root is deleted
        assert client.delete(f"/sessions/{root}").json()["deleted"] is True
        # Then a deleted event arrives for each of them, the root first
        seen: list[dict[str, Any]] = []
        while len(seen) < 3:
            event = sse.event()
            if event["json"]["sessionId"] in (root, child, grand):
                seen.append(event)
    assert [e["event"] for e in seen] == ["deleted"] * 3
    assert [e["json"] for e in seen] == [
        {"type": "deleted", "sessionId": sid} for sid in (root, child, grand)
    ]
    assert _ids_increase([e["id"] for e in seen])


def _ends(sse: Sse, seconds: float = 10.0) -> bool:
    """Whether the stream ends (its remaining lines read to the end) within ``seconds``."""
    reader = threading.Thread(target=lambda: list(sse.lines), daemon=True)
    reader.start()
    reader.join(seconds)
    return not reader.is_alive()


@pytest.mark.parametrize("deleted", ["itself", "its parent"])
def test_a_sessions_event_stream_ends_after_its_deleted_event(
    client: TestClient, deleted: str
) -> None:
    # Given a client watching a subagent session (heartbeats every 0.3 s here)
    parent = _new(client)
    sid = _new(client, parentId=parent)
    with _stream(client, params={"sessionId": sid}) as resp:
        sse = Sse(resp)
        _connected(sse)
        # When it, or its parent (taking it along), is deleted
        target = sid if deleted == "itself" else parent
        assert client.delete(f"/sessions/{target}").json()["deleted"] is True
        # Then its deleted event arrives, and the stream ends: nothing more of it can come
        event = sse.event()
        assert (event["event"], event["json"]) == (
            "deleted",
            {"type": "deleted", "sessionId": sid},
        )
        assert _ends(sse), "the stream went on after the session was deleted"


def test_a_client_that_missed_a_sessions_deleted_event_resumes_and_reads_it(
    client: TestClient,
) -> None:
    # Given a client watching a session, which saw its archive and then lost the connection
    sid = _new(client)
    with _stream(client, params={"sessionId": sid}) as resp:
        sse = Sse(resp)
        _connected(sse)
        client.post(f"/sessions/{sid}/archive")
        seen = sse.event()
    assert seen["event"] == "archived", seen
    # When the session is deleted meanwhile, and the client reconnects after what it saw
    assert client.delete(f"/sessions/{sid}").json()["deleted"] is True
    resume = {"Last-Event-ID": seen["id"]}
    with _stream(client, params={"sessionId": sid}, headers=resume) as resp:
        # Then it reads the deleted event it missed, and the stream ends
        assert resp.status_code == 200
        sse = Sse(resp)
        _connected(sse)
        event = sse.event()
        assert (event["event"], event["json"]) == ("deleted", {"type": "deleted", "sessionId": sid})
        assert _ends(sse), "the stream went on after the session was deleted"
    # And a client that had read the deleted event gets 404: nothing of it follows (nor after
    # the largest id a stream can hold, nor for a session that never was)
    last = f"{2**64 - 1}-{2**64 - 1}"
    unknown = "sess_" + uuid.uuid4().hex[:24]
    for who, resume_id in ((sid, event["id"]), (sid, last), (unknown, "0-0")):
        resume = {"Last-Event-ID": resume_id}
        answer = client.get("/events", params={"sessionId": who}, headers=resume)
        _error(answer, 404, "session_not_found")


def test_the_event_stream_and_bulk_archive_need_the_token() -> None:
    with rest_client(FLEET_API_TOKEN="s3cret") as client:
        _error(client.get("/events"), 401, "unauthorized")
        _error(client.post("/sessions/archive", json={"sessionIds": []}), 401, "unauthorized")
        _error(client.put("/sessions/x/title", json={"title": "t"}), 401, "unauthorized")


@pytest.fixture
def server() -> Iterator[str]:
    """The app served by uvicorn on a free port, in a thread."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("FLEET_API_TOKEN", raising=False)
        get_settings.cache_clear()
        app = api.rest.create_app(FleetSettings(), sse_heartbeat_seconds=0.5)
        config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2)
        srv = uvicorn.Server(config)
        thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        deadline = time.monotonic() + 15
        while not srv.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.02)
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            srv.should_exit = True
            thread.join(15)
            sock.close()
    get_settings.cache_clear()


def test_a_real_server_streams_and_resumes_across_reconnects(server: str, store: Store) -> None:
    recorder = RecordingDispatcher()
    with httpx.Client(base_url=server, timeout=10) as http:
        sid = http.post("/sessions", json={"cwd": _cwd()}).json()["sessionId"]
        with http.stream("GET", "/events", params={"sessionId": sid}) as resp:
            sse = Sse(resp)
            _connected(sse)
            archive.archive(store, recorder, sid)
            first = sse.event()
            assert first["event"] == "archived"
            assert sse.frame() == {"comments": ["heartbeat"]}
        # The client went away; two more events happen
        archive.unarchive(store, sid)
        titles.set_title(store, sid, "resumed")
        with http.stream(
            "GET", "/events", params={"sessionId": sid}, headers={"Last-Event-ID": first["id"]}
        ) as resp:
            sse = Sse(resp)
            _connected(sse)
            assert [sse.event()["event"] for _ in range(2)] == ["unarchived", "title"]


def test_the_conversation_is_served_oldest_first_and_kept_after_archive(
    client: TestClient, fleet: Any
) -> None:
    sid = client.post("/sessions", json={"cwd": "/tmp/fleet-conv"}).json()["sessionId"]
    tid = client.post(f"/sessions/{sid}/prompt", json={"prompt": "say first\nsay second"}).json()[
        "turnId"
    ]
    wait_for(lambda: client.get(f"/turns/{tid}").json()["state"] == "completed", 20)
    assert client.post(f"/sessions/{sid}/archive", json={}).status_code == 200
    updates = client.get(f"/sessions/{sid}/conversation").json()["updates"]
    texts = [u["content"]["text"] for u in updates if u["sessionUpdate"].endswith("_chunk")]
    assert texts == ["say first\nsay second", "first", "second"]
    assert client.get(f"/sessions/{sid}/conversation", params={"limit": 0}).status_code == 422
    assert client.get("/sessions/sess_nope/conversation").status_code == 404


def _raw_request(server: str, request: bytes) -> bytes:
    """What a served socket answers ``request`` (raw bytes), up to the end of its body."""
    port = int(server.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(request)
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
            head, _, body = answer.partition(b"\r\n\r\n")
            length = [ln for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length")]
            if length and len(body) >= int(length[0].split(b":")[1]):
                break
        return answer


def test_raw_non_ascii_bytes_in_a_query_are_refused_before_the_api_and_escaped_ones_reach_it(
    server: str,
) -> None:
    # As docs/rest.md says: raw bytes that are not HTTP get uvicorn's plain-text 400, the same
    # value percent-encoded gets the API's JSON 422 naming the parameter.
    raw = _raw_request(server, b"GET /sessions?limit=\xc3\xa9 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert raw.startswith(b"HTTP/1.1 400 ") and raw.endswith(b"Invalid HTTP request received.")
    escaped = _raw_request(
        server, b"GET /sessions?limit=%C3%A9 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    )
    head, _, body = escaped.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 422 "), escaped
    assert b'"code":"invalid_params"' in body and b"limit" in body, body


def test_where_xinfo_is_refused_the_stream_ends_are_read_and_it_counts_as_trimmed(
    store: Store,
) -> None:
    import asyncio

    import redis
    import redis.asyncio as aioredis

    from api.routes.events import _ends

    key = f"{store.keys.prefix}ends-{uuid.uuid4().hex[:8]}"
    first, last = store.redis.xadd(key, {"e": "1"}), store.redis.xadd(key, {"e": "2"})

    async def ends(refuse: bool) -> tuple[str | None, str | None, bool]:
        client = aioredis.Redis.from_url(store.url, decode_responses=True)
        if refuse:  # as a server older than 7, or a user without XINFO, answers

            async def refused(*_: Any, **__: Any) -> Any:
                raise redis.ResponseError("NOPERM this user has no permissions to run 'xinfo'")

            client.xinfo_stream = refused  # type: ignore[method-assign]
        try:
            return await _ends(client, key)
        finally:
            await client.aclose()

    ids = (str(first), str(last))
    assert asyncio.run(ends(refuse=False)) == (*ids, False)
    assert asyncio.run(ends(refuse=True)) == (*ids, True)
    store.redis.delete(key)
    assert asyncio.run(ends(refuse=False)) == (None, None, False)
