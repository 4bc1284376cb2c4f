"""Bodies a route cannot use answer a short 422 and change nothing: a body of the allowed
size full of wrong values lists at most ``MAX_LISTED_ERRORS`` problems and counts the rest, a
list longer than its cap is refused by its length before any item is validated, unarchive
(which takes no options) refuses any body but ``{}``, and a key given twice in an object is
refused naming it rather than read as its last value."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.errors import MAX_LISTED_ERRORS
from orchestrator.archiving import archive, bulk
from orchestrator.untrusted import MAX_NUMBER_CHARS
from tests.helpers import error_shape, rest_client


@pytest.fixture
def client() -> Iterator[TestClient]:
    with rest_client() as c:
        yield c


def _post(client: TestClient, path: str, body: str) -> Any:
    return client.post(path, content=body, headers={"Content-Type": "application/json"})


def test_half_a_million_wrong_ids_are_refused_by_count_in_one_short_answer(
    client: TestClient,
) -> None:
    body = '{"sessionIds":[' + ",".join(["1"] * 500_000) + "]}"  # 1 MB of wrong ids
    answer = _post(client, "/sessions/archive", body)
    error = error_shape(answer, 422, "too_many_sessions")
    assert error["data"] == {"param": "sessionIds", "max": bulk.MAX_IDS, "got": 500_000}
    assert len(answer.content) < 1_000, len(answer.content)


def test_a_null_body_is_refused_not_read_as_no_body(client: TestClient) -> None:
    # Given an idle session: an archive with `null` would have archived it, as `{}` does
    sid = client.post("/sessions", json={"cwd": f"/tmp/big-{uuid.uuid4().hex}"}).json()
    path = f"/sessions/{sid['sessionId']}/archive"
    error = error_shape(_post(client, path, "null"), 422, "invalid_params")
    assert "got null" in error["message"] and error["data"] == {"param": "body"}
    assert client.get(f"/sessions/{sid['sessionId']}").json()["archived"] is False


def test_too_many_confirmed_items_are_refused_by_count(client: TestClient) -> None:
    sid = client.post("/sessions", json={"cwd": f"/tmp/big-{uuid.uuid4().hex}"}).json()
    items = ",".join(['{"family":"nope","id":"x"}'] * (archive.MAX_CONFIRMED + 1))
    body = '{"stopActivity":true,"confirmedActivity":[' + items + "]}"
    answer = _post(client, f"/sessions/{sid['sessionId']}/archive", body)
    error = error_shape(answer, 422, "invalid_params")
    assert error["data"]["param"] == "confirmedActivity", error
    assert len(answer.content) < 1_000, len(answer.content)


def test_sixty_thousand_unknown_keys_list_twenty_and_count_them_all(client: TestClient) -> None:
    body = json.dumps({f"k{i}": 1 for i in range(60_000)} | {"stopActivity": True})
    answer = _post(client, "/sessions/archive", body)
    error = error_shape(answer, 422, "invalid_params")
    assert error["data"]["errorCount"] == 60_000
    assert len(error["data"]["errors"]) == MAX_LISTED_ERRORS
    assert error["message"].endswith("(and 59995 more)"), error["message"][-80:]
    assert len(answer.content) < 10_000, len(answer.content)


def test_a_few_wrong_values_are_all_listed(client: TestClient) -> None:
    answer = _post(client, "/sessions/archive", '{"sessionIds":[1,2,3]}')
    error = error_shape(answer, 422, "invalid_params")
    assert error["data"]["errorCount"] == 3 and len(error["data"]["errors"]) == 3
    assert [e["loc"] for e in error["data"]["errors"]] == [
        ["body", "sessionIds", i] for i in range(3)
    ]
    assert "more)" not in error["message"]


def test_an_acp_request_with_many_bad_members_names_five_and_lists_twenty() -> None:
    from pydantic import BaseModel, ConfigDict

    from api.acp.params import parse
    from orchestrator.errors import InvalidParams

    class Params(BaseModel):
        model_config = ConfigDict(extra="forbid")
        sessionId: str

    with pytest.raises(InvalidParams) as refused:
        parse(Params, {"sessionId": "s", **{f"k{i}": 1 for i in range(1_000)}})
    data = refused.value.data
    assert data["errorCount"] == 1_000 and len(data["errors"]) == MAX_LISTED_ERRORS
    assert str(refused.value).endswith("(and 995 more)."), str(refused.value)[-60:]


@pytest.mark.parametrize("body", ["{", "[]", '"str"', '{"stopActivity":true}', "1", " null "])
def test_unarchive_refuses_a_body_it_would_ignore(client: TestClient, body: str) -> None:
    sid = client.post("/sessions", json={"cwd": f"/tmp/big-{uuid.uuid4().hex}"}).json()
    path = f"/sessions/{sid['sessionId']}/unarchive"
    assert client.post(f"/sessions/{sid['sessionId']}/archive").status_code == 200
    error_shape(_post(client, path, body), 422, "invalid_params")
    # Nothing was done: still archived; then no body and {} both unarchive.
    assert client.get(f"/sessions/{sid['sessionId']}").json()["archived"] is True
    assert _post(client, path, "{}").status_code == 200
    assert client.post(path).status_code == 200


@pytest.mark.parametrize(
    ("body", "offset"),
    [
        (b'{"stopActivity": \xff}', 17),  # a byte no UTF-8 text holds
        (b'{"stopActivity": "\xc3"}', 18),  # a sequence cut short inside a string
        (b"\xff\xfe{}", 0),  # UTF-16's byte order mark: JSON is UTF-8 alone
    ],
)
@pytest.mark.parametrize("content_type", ["application/json", "application/merge-patch+json"])
def test_a_body_that_is_not_utf8_is_invalid_params_saying_so(
    client: TestClient, body: bytes, offset: int, content_type: str
) -> None:
    sid = client.post("/sessions", json={"cwd": f"/tmp/utf8-{uuid.uuid4().hex}"}).json()
    path = f"/sessions/{sid['sessionId']}/archive"
    headers = {"Content-Type": content_type}
    error = error_shape(client.post(path, content=body, headers=headers), 422, "invalid_params")
    assert error["message"].startswith("Request body is not valid UTF-8 JSON: byte 0x"), error
    assert f"at offset {offset}" in error["message"], error
    assert error["data"] == {"param": "body", "offset": offset}, error
    assert client.get(f"/sessions/{sid['sessionId']}").json()["archived"] is False
    # Malformed JSON in UTF-8 is answered 422 invalid_params too, by the route.
    error_shape(_post(client, path, '{"stopActivity": tru'), 422, "invalid_params")


_CONFIRMED_ID = "$.confirmedActivity[0].id"


@pytest.mark.parametrize(
    ("path", "body", "key", "where"),
    [
        ("archive", '{"stopActivity":false,"stopActivity":true}', "stopActivity", "$.stopActivity"),
        (None, '{"dryRun":false,"dryRun":true,"sessionIds":[]}', "dryRun", "$.dryRun"),
        (None, '{"filter":{"cwd":"/a","cwd":"/b"}}', "cwd", "$.filter.cwd"),
        ("archive", '{"confirmedActivity":[{"id":"x","id":"y"}]}', "id", _CONFIRMED_ID),
        ("title", '{"title":"a","title":"b","title":"c"}', "title", "$.title"),
    ],
)
def test_a_key_given_twice_is_refused_naming_it_never_the_last_one_taken(
    client: TestClient, path: str | None, body: str, key: str, where: str
) -> None:
    sid = client.post("/sessions", json={"cwd": f"/tmp/dup-{uuid.uuid4().hex}"}).json()
    url = f"/sessions/{sid['sessionId']}/{path}" if path else "/sessions/archive"
    send = client.put if path == "title" else client.post
    error = error_shape(
        send(url, content=body, headers={"Content-Type": "application/json"}),
        422,
        "invalid_params",
    )
    times = "3 times" if body.count(f'"{key}"') == 3 else "twice"
    assert f"key {key!r} was given {times}" in error["message"], error
    assert error["data"] == {"param": key, "path": where, "in": "body"}, error
    session = client.get(f"/sessions/{sid['sessionId']}").json()
    assert session["archived"] is False and session.get("title") is None, session


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_a_number_that_is_not_finite_is_refused_as_input_rejected_naming_it_and_where(
    client: TestClient, literal: str
) -> None:
    # NaN and Infinity are not JSON (RFC 8259), though Python's parser takes them: refused as
    # 1e999 is, never read as a float and then blamed on the field's type.
    body = '{"sessionIds":[],"dryRun":' + literal + "}"
    error = error_shape(_post(client, "/sessions/archive", body), 400, "input_rejected")
    assert error["data"] == {
        "limit": "number",
        "max": MAX_NUMBER_CHARS,
        "path": "$.dryRun",
        "param": "body",
    }, error
    assert error["message"].startswith(f"body at $.dryRun: {literal} is not finite"), error
    assert "send a finite number" in error["message"], error
    # Deeper in a body too, on a route that stores what it is sent
    sid = client.post("/sessions", json={"cwd": f"/tmp/nan-{uuid.uuid4().hex}"}).json()
    confirmed = '{"stopActivity":true,"confirmedActivity":[{"id":"x","n":' + literal + "}]}"
    answer = _post(client, f"/sessions/{sid['sessionId']}/archive", confirmed)
    error = error_shape(answer, 400, "input_rejected")
    assert error["data"]["path"] == "$.confirmedActivity[0].n", error
    assert client.get(f"/sessions/{sid['sessionId']}").json()["archived"] is False


#: Every route taking a JSON body: (method, path with {sid}, a body it would take as JSON).
JSON_ROUTES = [
    ("POST", "/sessions", '{"cwd": "/tmp/form"}'),
    ("POST", "/sessions/{sid}/archive", '{"stopActivity": true}'),
    ("POST", "/sessions/{sid}/unarchive", "{}"),
    ("POST", "/sessions/archive", '{"sessionIds": ["{sid}"]}'),
    ("DELETE", "/sessions/{sid}", '{"stopActivity": true}'),
    ("PUT", "/sessions/{sid}/title", '{"title": "form"}'),
    ("POST", "/sessions/{sid}/prompt", '{"prompt": "say hi"}'),
    ("POST", "/sessions/{sid}/cancel", '{"turnIds": []}'),
    ("POST", "/sessions/{sid}/close", '{"turnIds": []}'),
]


@pytest.mark.parametrize(("method", "path", "body"), JSON_ROUTES)
@pytest.mark.parametrize(
    "content_type", ["application/x-www-form-urlencoded", "text/plain", "text/json", None]
)
def test_a_body_not_sent_as_json_is_415_saying_which_content_type_to_send(
    client: TestClient, method: str, path: str, body: str, content_type: str | None
) -> None:
    sid = client.post("/sessions", json={"cwd": f"/tmp/ct-{uuid.uuid4().hex}"}).json()
    url, content = path.format(sid=sid["sessionId"]), body.replace("{sid}", sid["sessionId"])
    headers = {"Content-Type": content_type} if content_type else {}
    answer = client.request(method, url, content=content, headers=headers)
    error = error_shape(answer, 415, "unsupported_media_type")
    assert error["message"].endswith(
        "send the body as JSON with Content-Type: application/json."
    ), error
    assert error["data"] == {"contentType": content_type, "accepted": "application/json"}
    session = client.get(f"/sessions/{sid['sessionId']}").json()
    assert session["archived"] is False and session.get("title") is None, session
    # The same body as JSON is taken.
    json_headers = {"Content-Type": "application/json; charset=utf-8"}
    assert client.request(method, url, content=content, headers=json_headers).status_code < 300


@pytest.mark.parametrize("content_type", ["application/x-www-form-urlencoded", None])
def test_a_request_without_a_body_is_taken_whatever_its_content_type(
    client: TestClient, content_type: str | None
) -> None:
    sid = client.post("/sessions", json={"cwd": f"/tmp/ct-{uuid.uuid4().hex}"}).json()
    path = f"/sessions/{sid['sessionId']}"
    headers = {"Content-Type": content_type} if content_type else {}
    for action in ("archive", "unarchive", "cancel", "close"):
        assert client.post(f"{path}/{action}", headers=headers).status_code == 200, action
    assert client.request("DELETE", path, headers=headers).json()["deleted"] is True


def test_a_form_post_from_another_origin_is_still_refused_by_its_origin(
    client: TestClient,
) -> None:
    sid = client.post("/sessions", json={"cwd": f"/tmp/ct-{uuid.uuid4().hex}"}).json()
    answer = client.post(
        f"/sessions/{sid['sessionId']}/archive",
        content="stopActivity=true",
        headers={
            "Content-Type": "application/x-www-form-urlencoded",
            "Origin": "https://evil.example",
        },
    )
    error_shape(answer, 403, "origin_forbidden")
