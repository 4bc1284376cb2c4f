"""The HTTP API (``api/rest.py``) in process, against the real test Redis.

Every response goes through ``_NoServerErrors``, so any 5xx fails the test that caused it. Tests
that need running work use the session-scoped ``fleet`` fixture (real worker processes).
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from orchestrator.settings import get_settings
from tests.helpers import deleted_leftovers, rest_client, wait_for
from tests.helpers import error_shape as _error

ALLOWED_ARCHIVED = ("exclude", "include", "only")
LIVE_TURN_STATES = {"queued", "running", "cancelling"}


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    # The API reads FLEET_API_TOKEN per request; these tests run without one unless they ask.
    with rest_client() as c:
        yield c


def _cwd() -> str:
    """A directory no other test uses, so cwd-filtered listings hold only our sessions."""
    return f"/tmp/fleet-api-test/{uuid.uuid4().hex}"


def _new(client: TestClient, cwd: str | None = None, **extra: Any) -> dict[str, Any]:
    resp = client.post("/sessions", json={"cwd": cwd or _cwd(), **extra})
    assert resp.status_code == 201, resp.text
    info: dict[str, Any] = resp.json()
    return info


def _activity(client: TestClient, sid: str) -> list[dict[str, Any]]:
    resp = client.get(f"/sessions/{sid}/activity")
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["sessionId"] == sid
    items: list[dict[str, Any]] = body["activity"]
    return items


def _turn_state(client: TestClient, tid: str) -> str:
    resp = client.get(f"/turns/{tid}")
    assert resp.status_code == 200, resp.text
    state: str = resp.json()["state"]
    return state


def _list_ids(client: TestClient, **params: Any) -> list[str]:
    resp = client.get("/sessions", params=params)
    assert resp.status_code == 200, resp.text
    return [s["sessionId"] for s in resp.json()["sessions"]]


def _cursor(raw: str) -> str:
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


# --------------------------------------------------------------------------- health and create


def test_health(client: TestClient) -> None:
    resp = client.get("/health")
    assert resp.status_code == 200
    assert resp.json() == {"status": "ok"}


def test_create_session_returns_session_info(client: TestClient) -> None:
    cwd = _cwd()
    resp = client.post("/sessions", json={"cwd": cwd})
    assert resp.status_code == 201, resp.text
    info = resp.json()
    assert info["sessionId"].startswith("sess_")
    assert info["cwd"] == cwd
    assert info["archived"] is False
    assert isinstance(info["updatedAt"], str) and info["updatedAt"].endswith("Z")
    assert "createdAt" in info["_meta"]["agentFleet"]
    assert "archivedAt" not in info["_meta"]["agentFleet"]

    got = client.get(f"/sessions/{info['sessionId']}")
    assert got.status_code == 200
    assert got.json() == info


def test_create_child_session_names_its_parent(client: TestClient) -> None:
    parent = _new(client)
    child = _new(client, parentId=parent["sessionId"])
    assert child["_meta"]["agentFleet"]["parentId"] == parent["sessionId"]
    assert child["archived"] is False


def test_a_session_names_its_model_and_shows_its_usage(client: TestClient) -> None:
    # Given a session created with a model of its own, and a subagent of it given none
    parent = _new(client, model="llama3.1:8b")
    child = _new(client, parentId=parent["sessionId"])

    # Then both show the model and a usage of zero tokens so far
    for info in (parent, client.get(f"/sessions/{parent['sessionId']}").json(), child):
        meta = info["_meta"]["agentFleet"]
        assert meta["model"] == "llama3.1:8b"
        assert meta["usage"] == {"inputTokens": 0, "outputTokens": 0}
    assert "model" not in _new(client)["_meta"]["agentFleet"]


@pytest.mark.parametrize("model", [7, "x" * 201, "bad\nname"])
def test_a_bad_model_name_is_refused_naming_the_field(client: TestClient, model: Any) -> None:
    resp = client.post("/sessions", json={"cwd": _cwd(), "model": model})
    assert resp.status_code in (400, 422), resp.text
    assert "model" in resp.text


def test_create_child_of_unknown_parent_is_404(client: TestClient) -> None:
    resp = client.post("/sessions", json={"cwd": _cwd(), "parentId": "sess_doesnotexist"})
    _error(resp, 404, "session_not_found")


@pytest.mark.parametrize("cwd", ["relative/path", "", "./here", "~/home", "tmp/x"])
def test_create_with_relative_cwd_is_422(client: TestClient, cwd: str) -> None:
    error = _error(client.post("/sessions", json={"cwd": cwd}), 422, "invalid_params")
    assert "absolute" in error["message"]
    assert error["data"] == {"param": "cwd"}


def test_create_with_nul_in_cwd_is_422(client: TestClient) -> None:
    _error(client.post("/sessions", json={"cwd": "/tmp/a\x00b"}), 422, "invalid_params")


@pytest.mark.parametrize(
    "body",
    [
        {"cwd": "/tmp", "foo": 1},
        {"cwd": "/tmp", "archived": True},
        {"cwd": "/tmp", "sessionId": "sess_mine"},
        {"cwd": "/tmp", "parent_id": None},
    ],
)
def test_create_rejects_unknown_fields(client: TestClient, body: dict[str, Any]) -> None:
    error = _error(client.post("/sessions", json=body), 422, "invalid_params")
    extra = next(k for k in body if k != "cwd")
    assert ["body", extra] in [e["loc"] for e in error["data"]["errors"]]


@pytest.mark.parametrize(
    "body", [{}, {"cwd": 5}, {"cwd": None}, {"cwd": ["/tmp"]}, {"cwd": "/tmp", "parentId": 7}]
)
def test_create_rejects_missing_or_ill_typed_fields(
    client: TestClient, body: dict[str, Any]
) -> None:
    _error(client.post("/sessions", json=body), 422, "invalid_params")


def test_create_rejects_a_body_that_is_not_json(client: TestClient) -> None:
    resp = client.post(
        "/sessions", content=b"cwd=/tmp", headers={"content-type": "application/json"}
    )
    error = _error(resp, 422, "invalid_params")
    # It says where the body stops being JSON and what to send instead
    assert error["message"] == (
        "Invalid request: body.0: not valid JSON at character 0 (Expecting value);"
        " send a JSON object"
    ), error["message"]


def test_a_route_that_needs_a_body_says_so_when_it_is_empty(client: TestClient) -> None:
    resp = client.post("/sessions", content=b"", headers={"content-type": "application/json"})
    error = _error(resp, 422, "invalid_params")
    assert error["message"] == (
        "Invalid request: body: a JSON object is required (the body is empty)"
    ), error["message"]


# --------------------------------------------------------------------------- get and malformed ids


def test_get_unknown_session_is_404(client: TestClient) -> None:
    error = _error(client.get("/sessions/sess_doesnotexist"), 404, "session_not_found")
    assert error["data"] == {"sessionId": "sess_doesnotexist"}


# Ids that reach the routes (one path segment) but are not in the id alphabet.
MALFORMED_IDS = [
    "a*b",
    "a%2Ab",
    "%2e%2e",
    "a%20b",
    "a:b",
    "a%00b",
    "x" * 65,
    "sess_*",
    "a?b",
    "sess_x%0A",
]


@pytest.mark.parametrize("raw", MALFORMED_IDS)
def test_malformed_ids_are_404_never_500(client: TestClient, raw: str) -> None:
    quoted = raw.replace("?", "%3F")
    for method, path, body in [
        ("GET", f"/sessions/{quoted}", None),
        ("GET", f"/sessions/{quoted}/activity", None),
        ("POST", f"/sessions/{quoted}/archive", None),
        ("POST", f"/sessions/{quoted}/archive", {"stopActivity": True}),
        ("POST", f"/sessions/{quoted}/unarchive", None),
        ("POST", f"/sessions/{quoted}/prompt", {"prompt": "say hi"}),
    ]:
        resp = client.request(method, path, json=body)
        _error(resp, 404, "session_not_found")
    # Delete is idempotent: a malformed id names nothing to delete.
    resp = client.delete(f"/sessions/{quoted}")
    assert resp.status_code == 200, resp.text
    assert resp.json()["deleted"] is False


def test_a_delete_of_a_long_malformed_id_quotes_its_first_80_characters(
    client: TestClient,
) -> None:
    raw = "x" * 5000
    resp = client.delete(f"/sessions/{raw}")
    assert resp.status_code == 200, resp.text
    assert resp.json()["sessionId"] == raw[:80]


@pytest.mark.parametrize("raw", ["..%2F..", "a%2Fb", "..%2F..%2Fhealth", "%2F..%2F.."])
def test_ids_with_an_encoded_slash_are_404_never_500(client: TestClient, raw: str) -> None:
    for method, path in [
        ("GET", f"/sessions/{raw}"),
        ("GET", f"/sessions/{raw}/activity"),
        ("POST", f"/sessions/{raw}/archive"),
        ("POST", f"/sessions/{raw}/unarchive"),
        ("DELETE", f"/sessions/{raw}"),
    ]:
        resp = client.request(method, path)
        assert resp.status_code in (404, 405), (method, path, resp.status_code, resp.text)


def test_unrouted_ids_use_the_shared_error_shape(client: TestClient) -> None:
    _error(client.get("/sessions/..%2F.."), 404, "not_found")


# --------------------------------------------------------------------------- list


def test_list_archived_filter(client: TestClient) -> None:
    cwd = _cwd()
    kept = _new(client, cwd)["sessionId"]
    gone = _new(client, cwd)["sessionId"]
    assert client.post(f"/sessions/{gone}/archive").json()["outcome"] == "archived"

    assert _list_ids(client, cwd=cwd) == [kept]
    assert _list_ids(client, cwd=cwd, archived="exclude") == [kept]
    assert set(_list_ids(client, cwd=cwd, archived="include")) == {kept, gone}
    assert _list_ids(client, cwd=cwd, archived="only") == [gone]

    only = client.get("/sessions", params={"cwd": cwd, "archived": "only"}).json()["sessions"]
    assert only[0]["archived"] is True
    assert "archivedAt" in only[0]["_meta"]["agentFleet"]


@pytest.mark.parametrize("value", ["true", "false", "yes", "", "EXCLUDE", "1", "all"])
def test_list_rejects_other_archived_values(client: TestClient, value: str) -> None:
    resp = client.get("/sessions", params={"archived": value})
    error = _error(resp, 422, "invalid_params")
    for allowed in ALLOWED_ARCHIVED:
        assert allowed in error["message"]
    assert error["data"]["param"] == "archived"
    assert error["data"]["allowed"] == list(ALLOWED_ARCHIVED)


def test_list_rejects_a_relative_cwd(client: TestClient) -> None:
    _error(client.get("/sessions", params={"cwd": "rel/dir"}), 422, "invalid_params")


@pytest.mark.parametrize("archived", ["exclude", "include"])
def test_cursor_pagination_visits_every_session_once(client: TestClient, archived: str) -> None:
    cwd = _cwd()
    created = [_new(client, cwd)["sessionId"] for _ in range(5)]
    seen: list[str] = []
    stamps: list[str] = []
    pages = 0
    cursor: str | None = None
    while True:
        params: dict[str, Any] = {"cwd": cwd, "limit": 2, "archived": archived}
        if cursor is not None:
            params["cursor"] = cursor
        resp = client.get("/sessions", params=params)
        assert resp.status_code == 200, resp.text
        body = resp.json()
        pages += 1
        assert len(body["sessions"]) <= 2
        seen.extend(s["sessionId"] for s in body["sessions"])
        stamps.extend(s["updatedAt"] for s in body["sessions"])
        cursor = body.get("nextCursor")
        if cursor is None:
            break
        assert pages < 10, "pagination does not end"
    assert sorted(seen) == sorted(created)
    assert len(seen) == len(set(seen))
    assert pages == 3
    assert stamps == sorted(stamps, reverse=True), "not newest activity first"


def test_cursor_of_another_listing_is_422(client: TestClient) -> None:
    cwd = _cwd()
    for _ in range(3):
        _new(client, cwd)
    first = client.get("/sessions", params={"cwd": cwd, "limit": 1}).json()
    cursor = first["nextCursor"]
    for params in (
        {"cwd": cwd, "archived": "include"},
        {"cwd": _cwd()},
        {},
    ):
        resp = client.get("/sessions", params={**params, "cursor": cursor, "limit": 1})
        assert _error(resp, 422, "invalid_params")["data"] == {"param": "cursor"}


@pytest.mark.parametrize(
    "cursor",
    [
        "garbage!!",
        "",
        "a",
        "%%%%",
        "x" * 9000,
        _cursor("null"),
        _cursor("[1, 2]"),
        _cursor('{"a": "exclude", "c": null, "s": "1", "i": "sess_x"}'),
        _cursor('{"a": "exclude", "c": null, "s": 1, "i": 5}'),
        _cursor('{"a": "exclude", "c": null, "s": true, "i": "sess_x"}'),
        base64.urlsafe_b64encode(b"\xff\xfe\xfd").decode(),
    ],
)
def test_garbled_cursor_is_422(client: TestClient, cursor: str) -> None:
    error = _error(client.get("/sessions", params={"cursor": cursor}), 422, "invalid_params")
    assert error["data"] == {"param": "cursor"}


@pytest.mark.parametrize("score", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_cursor_with_a_non_finite_score_is_400_input_rejected(
    client: TestClient, score: str
) -> None:
    # Regression: NaN answered 503 (Redis rejected the range), then 422 as a garbled cursor
    # while 1e999 answered 400: NaN and Infinity are not JSON, refused as any non-finite number.
    cursor = _cursor('{"a":"exclude","c":null,"s":' + score + ',"i":"sess_x"}')
    error = _error(client.get("/sessions", params={"cursor": cursor}), 400, "input_rejected")
    assert error["data"]["param"] == "cursor" and error["data"]["limit"] == "number", error
    assert error["data"]["path"] == "$.s", error
    assert f"{score} is not finite" in error["message"], error
    assert "start again without a cursor" in error["message"], error


def test_cursor_with_a_float_overflowing_score_is_400(client: TestClient) -> None:
    # Regression: a float-overflowing integer answered 500 (bare OverflowError). Now a number
    # literal that long is over the parse limit (orchestrator.untrusted).
    cursor = _cursor('{"a":"exclude","c":null,"s":1' + "0" * 400 + ',"i":"sess_x"}')
    error = _error(client.get("/sessions", params={"cursor": cursor}), 400, "input_rejected")
    assert error["data"]["param"] == "cursor" and error["data"]["limit"] == "number"


@pytest.mark.parametrize("limit", [0, -1, 201, 1000, "abc"])
def test_limit_out_of_range_is_422(client: TestClient, limit: Any) -> None:
    error = _error(client.get("/sessions", params={"limit": limit}), 422, "invalid_params")
    assert ["query", "limit"] in [e["loc"] for e in error["data"]["errors"]]


@pytest.mark.parametrize("limit", [1, 200])
def test_limit_bounds_are_accepted(client: TestClient, limit: int) -> None:
    assert client.get("/sessions", params={"limit": limit}).status_code == 200


# --------------------------------------------------------------------------- archive / unarchive


def test_archive_quiet_session_then_again(client: TestClient) -> None:
    sid = _new(client)["sessionId"]
    resp = client.post(f"/sessions/{sid}/archive")
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["sessionId"] == sid
    assert body["outcome"] == "archived"
    assert body["archivedCount"] == 1
    assert body["stopped"] == []

    info = client.get(f"/sessions/{sid}").json()
    assert info["archived"] is True
    assert "archivedAt" in info["_meta"]["agentFleet"]

    again = client.post(f"/sessions/{sid}/archive", json={"stopActivity": True})
    assert again.status_code == 200, again.text
    assert again.json()["outcome"] == "already_archived"
    assert again.json()["archivedCount"] == 0


@pytest.mark.parametrize("body", [None, {}, {"stopActivity": False}])
def test_archive_body_is_optional(client: TestClient, body: dict[str, Any] | None) -> None:
    sid = _new(client)["sessionId"]
    resp = client.post(f"/sessions/{sid}/archive", json=body)
    assert resp.status_code == 200, resp.text
    assert resp.json()["outcome"] == "archived"


@pytest.mark.parametrize(
    "body",
    [
        {"stopActivity": "false"},
        {"stopActivity": "true"},
        {"stopActivity": 0},
        {"stopActivity": 1},
        {"stopActivity": None},
        {"stopActivity": "yes"},
        {"stopActivity": True, "force": True},
        [],
    ],
)
def test_archive_stop_activity_is_never_coerced(client: TestClient, body: Any) -> None:
    sid = _new(client)["sessionId"]
    _error(client.post(f"/sessions/{sid}/archive", json=body), 422, "invalid_params")
    assert client.get(f"/sessions/{sid}").json()["archived"] is False


def test_archive_with_a_form_body_is_415(client: TestClient) -> None:
    sid = _new(client)["sessionId"]
    resp = client.post(
        f"/sessions/{sid}/archive",
        content=b"stopActivity=true",
        headers={"content-type": "application/x-www-form-urlencoded"},
    )
    _error(resp, 415, "unsupported_media_type")
    assert client.get(f"/sessions/{sid}").json()["archived"] is False


def test_archive_unknown_session_is_404(client: TestClient) -> None:
    _error(client.post("/sessions/sess_doesnotexist/archive"), 404, "session_not_found")


def test_unarchive_restores_and_is_idempotent(client: TestClient) -> None:
    cwd = _cwd()
    sid = _new(client, cwd)["sessionId"]
    client.post(f"/sessions/{sid}/archive")
    assert _list_ids(client, cwd=cwd) == []

    resp = client.post(f"/sessions/{sid}/unarchive")
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"sessionId": sid, "archived": False, "restored": 1}
    info = client.get(f"/sessions/{sid}").json()
    assert info["archived"] is False
    assert "archivedAt" not in info["_meta"]["agentFleet"]
    assert _list_ids(client, cwd=cwd) == [sid]

    again = client.post(f"/sessions/{sid}/unarchive")
    assert again.status_code == 200, again.text
    assert again.json() == {"sessionId": sid, "archived": False, "restored": 0}

    never = _new(client)["sessionId"]
    resp = client.post(f"/sessions/{never}/unarchive")
    assert resp.status_code == 200
    assert resp.json()["restored"] == 0


def test_unarchive_unknown_session_is_404(client: TestClient) -> None:
    _error(client.post("/sessions/sess_doesnotexist/unarchive"), 404, "session_not_found")


def test_unarchive_child_under_archived_parent_is_409(client: TestClient) -> None:
    parent = _new(client)["sessionId"]
    child = _new(client, parentId=parent)["sessionId"]
    assert client.post(f"/sessions/{parent}/archive").json()["archivedCount"] == 2
    error = _error(client.post(f"/sessions/{child}/unarchive"), 409, "ancestor_archived")
    assert error["data"]["archivedAncestor"] == parent
    assert client.get(f"/sessions/{child}").json()["archived"] is True


def test_archive_and_unarchive_leave_updated_at_alone(client: TestClient) -> None:
    info = _new(client)
    sid, before = info["sessionId"], info["updatedAt"]
    client.post(f"/sessions/{sid}/archive")
    assert client.get(f"/sessions/{sid}").json()["updatedAt"] == before
    client.post(f"/sessions/{sid}/unarchive")
    assert client.get(f"/sessions/{sid}").json()["updatedAt"] == before


# --------------------------------------------------------------------------- prompt and turns


def test_prompt_on_archived_session_is_409(client: TestClient) -> None:
    sid = _new(client)["sessionId"]
    client.post(f"/sessions/{sid}/archive")
    error = _error(
        client.post(f"/sessions/{sid}/prompt", json={"prompt": "say hi"}),
        409,
        "session_archived",
    )
    assert error["data"] == {"sessionId": sid}
    assert _activity(client, sid) == []


def test_prompt_on_child_of_archived_parent_is_409(client: TestClient) -> None:
    parent = _new(client)["sessionId"]
    child = _new(client, parentId=parent)["sessionId"]
    client.post(f"/sessions/{parent}/archive")
    resp = client.post(f"/sessions/{child}/prompt", json={"prompt": "say hi"})
    _error(resp, 409, "session_archived")


def test_prompt_on_unknown_session_is_404(client: TestClient) -> None:
    resp = client.post("/sessions/sess_doesnotexist/prompt", json={"prompt": "say hi"})
    _error(resp, 404, "session_not_found")


@pytest.mark.parametrize(
    "body",
    [
        None,
        {},
        {"prompt": None},
        {"prompt": 5},
        {"prompt": ["say hi"]},
        {"prompt": {"text": "say hi"}},
        {"prompt": "say hi", "extra": 1},
        {"prompt": "x" * 100_001},
        "say hi",
    ],
)
def test_prompt_body_must_be_a_string_prompt(client: TestClient, body: Any) -> None:
    sid = _new(client)["sessionId"]
    _error(client.post(f"/sessions/{sid}/prompt", json=body), 422, "invalid_params")
    assert _activity(client, sid) == []


def test_unknown_turn_is_404(client: TestClient) -> None:
    _error(client.get("/turns/turn_doesnotexist"), 404, "turn_not_found")


@pytest.mark.parametrize("raw", ["a*b", "%2e%2e", "t" * 65])
def test_malformed_turn_id_is_404(client: TestClient, raw: str) -> None:
    assert client.get(f"/turns/{raw}").status_code == 404


def test_malformed_turn_id_answers_turn_not_found(client: TestClient) -> None:
    _error(client.get("/turns/a*b"), 404, "turn_not_found")


def test_a_long_turn_id_is_quoted_by_its_first_80_characters(client: TestClient) -> None:
    error = _error(client.get(f"/turns/{'t' * 5000}"), 404, "turn_not_found")
    assert error["data"] == {"turnId": "t" * 80}
    assert "t" * 81 not in error["message"]


def test_prompted_turn_runs_to_completion(client: TestClient, fleet: Any) -> None:
    sid = _new(client)["sessionId"]
    resp = client.post(f"/sessions/{sid}/prompt", json={"prompt": "say hello"})
    assert resp.status_code == 202, resp.text
    tid = resp.json()["turnId"]
    assert resp.json()["sessionId"] == sid

    turn = client.get(f"/turns/{tid}").json()
    assert turn["turnId"] == tid
    assert turn["sessionId"] == sid
    assert turn["source"] == "prompt"
    assert turn["state"] in LIVE_TURN_STATES | {"completed"}

    wait_for(lambda: _turn_state(client, tid) == "completed", message="the turn to complete")
    turn = client.get(f"/turns/{tid}").json()
    assert turn["stopReason"] == "end_turn"
    assert "error" not in turn
    wait_for(lambda: _activity(client, sid) == [], message="the activity to drain")


def test_failed_turn_names_the_line(client: TestClient, fleet: Any) -> None:
    sid = _new(client)["sessionId"]
    tid = client.post(f"/sessions/{sid}/prompt", json={"prompt": "dance wildly"}).json()["turnId"]
    wait_for(lambda: _turn_state(client, tid) == "failed", message="the turn to fail")
    turn = client.get(f"/turns/{tid}").json()
    assert "line 1" in turn["error"]
    assert "dance" in turn["error"]
    # A failure is no ACP stop reason (end_turn would read as a normal end): null
    assert "stopReason" in turn and turn["stopReason"] is None, turn


# --------------------------------------------------------------------------- archive of live work


def test_archive_busy_session_refused_then_stopped(client: TestClient, fleet: Any) -> None:
    sid = _new(client)["sessionId"]
    resp = client.post(f"/sessions/{sid}/prompt", json={"prompt": "think 30"})
    assert resp.status_code == 202, resp.text
    tid = resp.json()["turnId"]
    wait_for(
        lambda: any(i["family"] == "turn" for i in _activity(client, sid)),
        message="the activity to list the turn",
    )
    wait_for(lambda: _turn_state(client, tid) == "running", message="the turn to run")

    try:
        # A plain archive is refused and names the live turn.
        error = _error(client.post(f"/sessions/{sid}/archive"), 409, "session_active")
        assert error["data"]["sessionId"] == sid
        items = error["data"]["activity"]
        assert items, error
        for item in items:
            assert {"family", "id", "label"} <= set(item), item
            assert item["family"] in {"turn", "job", "subagent", "reminder"}
            assert isinstance(item["label"], str) and item["label"]
        turn_items = [i for i in items if i["family"] == "turn"]
        assert [i["id"] for i in turn_items] == [tid]
        assert "think 30" in turn_items[0]["label"]
        assert "turn" in error["message"]

        # The refusal changed nothing: not archived, the turn still runs.
        assert client.get(f"/sessions/{sid}").json()["archived"] is False
        assert _turn_state(client, tid) == "running"

        # A string is never coerced into stopActivity.
        _error(
            client.post(f"/sessions/{sid}/archive", json={"stopActivity": "false"}),
            422,
            "invalid_params",
        )
        _error(
            client.post(f"/sessions/{sid}/archive", json={"stopActivity": "true"}),
            422,
            "invalid_params",
        )
        assert client.get(f"/sessions/{sid}").json()["archived"] is False
        assert _turn_state(client, tid) == "running"
    finally:
        resp = client.post(f"/sessions/{sid}/archive", json={"stopActivity": True})

    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["outcome"] == "archived"
    assert tid in [i["id"] for i in body["stopped"] if i["family"] == "turn"]
    assert body["stopDispatch"]["sent"].get("turn") == 1
    assert body["stopDispatch"]["failed"] == []
    assert client.get(f"/sessions/{sid}").json()["archived"] is True

    wait_for(lambda: _activity(client, sid) == [], message="the activity to drain")
    wait_for(lambda: _turn_state(client, tid) == "cancelled", message="the turn to cancel")
    assert client.get(f"/turns/{tid}").json()["stopReason"] == "cancelled"

    # Unarchive restores nothing that was stopped.
    assert client.post(f"/sessions/{sid}/unarchive").json()["restored"] == 1
    assert _activity(client, sid) == []
    assert _turn_state(client, tid) == "cancelled"


# --------------------------------------------------------------------------- delete


def test_delete_then_get_is_404_and_delete_is_idempotent(client: TestClient) -> None:
    cwd = _cwd()
    sid = _new(client, cwd)["sessionId"]
    first = client.delete(f"/sessions/{sid}")
    assert first.status_code == 200, first.text
    assert first.json() == {"sessionId": sid, "deleted": True, "deletedDescendants": []}
    _error(client.get(f"/sessions/{sid}"), 404, "session_not_found")

    second = client.delete(f"/sessions/{sid}")
    assert second.status_code == 200, second.text
    assert second.json() == {"sessionId": sid, "deleted": False, "deletedDescendants": []}

    assert _list_ids(client, cwd=cwd, archived="include") == []
    _error(client.post(f"/sessions/{sid}/archive"), 404, "session_not_found")
    _error(client.post(f"/sessions/{sid}/unarchive"), 404, "session_not_found")
    _error(client.get(f"/sessions/{sid}/activity"), 404, "session_not_found")
    resp = client.post(f"/sessions/{sid}/prompt", json={"prompt": "say hi"})
    _error(resp, 404, "session_not_found")
    resp = client.post("/sessions", json={"cwd": cwd, "parentId": sid})
    _error(resp, 404, "session_not_found")


def test_delete_unknown_session_is_200(client: TestClient) -> None:
    resp = client.delete("/sessions/sess_doesnotexist")
    assert resp.status_code == 200
    assert resp.json() == {
        "sessionId": "sess_doesnotexist",
        "deleted": False,
        "deletedDescendants": [],
    }


def test_delete_of_a_root_deletes_its_subtree_and_names_the_descendants(
    client: TestClient, store: Any
) -> None:
    # Given an idle tree of depth 3 (root -> child -> grandchild -> great-grandchild), the
    # child's branch archived
    cwd = _cwd()
    ids = [_new(client, cwd)["sessionId"]]
    for _ in range(3):
        ids.append(_new(client, cwd, parentId=ids[-1])["sessionId"])
    assert client.post(f"/sessions/{ids[1]}/archive").status_code == 200

    # When the root is deleted
    resp = client.delete(f"/sessions/{ids[0]}")

    # Then the answer names every descendant it deleted, breadth first
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"sessionId": ids[0], "deleted": True, "deletedDescendants": ids[1:]}
    # none is listed or readable any more, nothing of theirs is left in an index or set
    for archived in ALLOWED_ARCHIVED:
        assert _list_ids(client, cwd=cwd, archived=archived) == []
    for sid in ids:
        _error(client.get(f"/sessions/{sid}"), 404, "session_not_found")
    assert deleted_leftovers(store, set(ids)) == []
    # and each descendant's trail holds the root's delete
    root_entry = client.get(f"/sessions/{ids[0]}/audit").json()["entries"][0]
    assert (root_entry["action"], root_entry["outcome"]) == ("delete", "deleted")
    for sid in ids[1:]:
        newest = client.get(f"/sessions/{sid}/audit").json()["entries"][0]
        assert (newest["id"], newest["action"], newest["detail"]) == (
            root_entry["id"],
            "delete",
            {"ancestorId": ids[0]},
        )


# --------------------------------------------------------------------------- bad input, found bugs


def test_create_with_a_lone_surrogate_in_cwd_is_422(client: TestClient) -> None:
    resp = client.post(
        "/sessions",
        content=b'{"cwd": "/tmp/\\ud800"}',
        headers={"content-type": "application/json"},
    )
    _error(resp, 422, "invalid_params")


def test_prompt_with_a_lone_surrogate_is_422(client: TestClient) -> None:
    sid = _new(client)["sessionId"]
    resp = client.post(
        f"/sessions/{sid}/prompt",
        content=b'{"prompt": "say \\ud800"}',
        headers={"content-type": "application/json"},
    )
    _error(resp, 422, "invalid_params")


# --------------------------------------------------------------------------- bearer token


@pytest.fixture
def api_token() -> str:
    return f"tok-{uuid.uuid4().hex}"


@pytest.fixture
def token_client(api_token: str) -> Iterator[TestClient]:
    """The app built with ``FLEET_API_TOKEN`` set to ``api_token``."""
    with rest_client(FLEET_API_TOKEN=api_token) as c:
        yield c


def test_token_is_required_when_configured(token_client: TestClient, api_token: str) -> None:
    requests: list[tuple[str, str, Any]] = [
        ("GET", "/sessions", None),
        ("POST", "/sessions", {"cwd": "/tmp"}),
        ("GET", "/sessions/sess_doesnotexist", None),
        ("GET", "/sessions/sess_doesnotexist/activity", None),
        ("POST", "/sessions/sess_doesnotexist/archive", None),
        ("POST", "/sessions/sess_doesnotexist/unarchive", None),
        ("POST", "/sessions/sess_doesnotexist/prompt", {"prompt": "say hi"}),
        ("DELETE", "/sessions/sess_doesnotexist", None),
        ("GET", "/turns/turn_doesnotexist", None),
        # Validation never answers before authentication.
        ("POST", "/sessions", {"cwd": "relative"}),
        ("GET", "/sessions?archived=yes", None),
    ]
    for headers in (
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": f"Bearer {api_token}x"},
        {"Authorization": "Bearer "},
        {"Authorization": f"Basic {api_token}"},
    ):
        for method, path, body in requests:
            resp = token_client.request(method, path, json=body, headers=headers)
            _error(resp, 401, "unauthorized")
            assert resp.headers["www-authenticate"] == "Bearer"


def test_right_token_is_accepted(token_client: TestClient, api_token: str) -> None:
    auth = {"Authorization": f"Bearer {api_token}"}
    resp = token_client.post("/sessions", json={"cwd": _cwd()}, headers=auth)
    assert resp.status_code == 201, resp.text
    sid = resp.json()["sessionId"]
    assert token_client.get(f"/sessions/{sid}", headers=auth).status_code == 200
    assert token_client.get("/sessions", headers=auth).status_code == 200
    assert token_client.post(f"/sessions/{sid}/archive", headers=auth).status_code == 200
    assert token_client.post(f"/sessions/{sid}/unarchive", headers=auth).status_code == 200
    # Errors behind the token keep their own status.
    _error(token_client.get("/sessions/sess_doesnotexist", headers=auth), 404, "session_not_found")


def test_health_needs_no_token(token_client: TestClient, api_token: str) -> None:
    assert token_client.get("/health").status_code == 200
    assert token_client.get("/health", headers={"Authorization": "Bearer wrong"}).status_code == 200


def test_no_token_configured_means_open(client: TestClient) -> None:
    get_settings.cache_clear()
    assert get_settings().api_token == ""
    assert client.get("/sessions", params={"limit": 1}).status_code == 200


def test_token_scheme_is_case_insensitive(token_client: TestClient, api_token: str) -> None:
    resp = token_client.get("/sessions", headers={"Authorization": f"bearer {api_token}"})
    assert resp.status_code == 200, resp.text
