"""Edge inputs found by trying the product as a user: each must be a clear 4xx, never a 503
that invites retries, a silent choice, or a stream that never ends."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from api.rest import create_app
from orchestrator.errors import InvalidParams
from orchestrator.session.titles import normalize_title
from orchestrator.settings import FleetSettings
from orchestrator.storage import audit
from orchestrator.storage.store import Store


@pytest.fixture
def client() -> Iterator[TestClient]:
    with TestClient(create_app(FleetSettings(api_token=""))) as c:
        yield c


@pytest.mark.parametrize("before", ["99999999999999999999-0", "1-99999999999999999999"])
def test_an_audit_cursor_past_the_id_range_is_invalid_params_not_an_outage(
    client: TestClient, before: str
) -> None:
    r = client.get("/audit", params={"before": before})
    assert r.status_code == 422, r.text
    assert r.json()["error"]["code"] == "invalid_params"


@pytest.mark.parametrize("first", ["0-0", "0-00", "00-0", "000-000"])
def test_nothing_comes_before_the_first_audit_id_however_it_is_spelled(
    store: Store, client: TestClient, first: str
) -> None:
    assert audit.read(store, before=first) == []
    # Over HTTP too, fleet-wide and for a session: an empty page, not a store outage
    sid = client.post("/sessions", json={"cwd": "/srv/edges"}).json()["sessionId"]
    for path in ("/audit", f"/sessions/{sid}/audit"):
        r = client.get(path, params={"before": first})
        assert r.status_code == 200, r.text
        assert r.json()["entries"] == []


@pytest.mark.parametrize("bad", ["99999999999999999999-0", "1-99999999999999999999", "x"])
def test_a_last_event_id_outside_the_id_range_is_refused(client: TestClient, bad: str) -> None:
    r = client.get("/events", headers={"Last-Event-ID": bad})
    assert r.status_code == 422, r.text


@pytest.mark.parametrize(
    ("query", "param"), [("q=%ff", "q"), ("q=caf%C3", "q"), ("%ff=1", "\ufffd")]
)
def test_a_query_parameter_that_is_not_utf8_once_decoded_is_refused_saying_so(
    client: TestClient, query: str, param: str
) -> None:
    # Not read as U+FFFD and answered with an empty list: refused, naming the byte
    r = client.get(f"/sessions?{query}")
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["code"] == "invalid_params"
    assert "not UTF-8 once its %XX escapes are decoded" in error["message"]
    assert "byte 0x" in error["message"]
    assert error["data"]["param"] == param


def test_percent_encoded_utf8_and_the_probes_query_pass(client: TestClient) -> None:
    assert client.get("/sessions?q=caf%C3%A9+au+lait").status_code == 200
    assert client.get("/health?cachebust=%ff").status_code == 200


def test_a_repeated_query_parameter_is_refused_not_silently_chosen(client: TestClient) -> None:
    r = client.get("/sessions", params=[("archived", "only"), ("archived", "include")])
    assert r.status_code == 422
    assert "more than once" in r.json()["error"]["message"]


@pytest.mark.parametrize(
    ("url", "param", "meant", "accepted"),
    [
        (
            "/events?sessionid=sess_x",
            "sessionid",
            "sessionId",
            ["sessionId", "lastEventId", "token"],
        ),
        (
            "/sessions?archive=only",
            "archive",
            "archived",
            ["archived", "cwd", "cursor", "limit", "q"],
        ),
        ("/sessions/sess_x/conversation?limt=5", "limt", "limit", ["limit"]),
        ("/audit?since=1", "since", None, ["limit", "before"]),
        ("/turns/turn_x?verbose=1", "verbose", None, []),
        ("/sessions/sess_x/archive?stopActivity=true", "stopActivity", None, []),
    ],
)
def test_a_query_parameter_the_route_does_not_take_is_refused_naming_those_it_takes(
    client: TestClient, url: str, param: str, meant: str | None, accepted: list[str]
) -> None:
    r = client.post(url) if "/archive" in url else client.get(url)
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["code"] == "invalid_params"
    assert error["data"] == {"param": param, "accepted": accepted}, error
    assert f"query parameter {param!r} is not taken by" in error["message"], error
    assert (f"(did you mean {meant!r}?)" in error["message"]) is (meant is not None), error
    takes = ", ".join(accepted) if accepted else "no query parameters"
    assert error["message"].endswith(f"it takes {takes}."), error


def test_the_query_parameters_the_console_and_clients_use_are_taken(client: TestClient) -> None:
    sid = client.post("/sessions", json={"cwd": "/tmp/query-edges"}).json()["sessionId"]
    for url in (
        "/sessions?archived=include&limit=50&cwd=/tmp/query-edges&q=x",
        f"/sessions/{sid}/conversation?limit=200",
        f"/sessions/{sid}/audit?limit=5",
        "/audit?limit=5",
        "/health?cache-buster=1",  # probes ignore their query string
    ):
        assert client.get(url).status_code == 200, (url, client.get(url).text)
    with client.stream("GET", f"/events?sessionId={sid}&lastEventId=0-0&token=unused") as r:
        assert r.status_code == 200


def test_an_acp_socket_with_a_query_parameter_it_does_not_take_is_refused(
    client: TestClient,
) -> None:
    from starlette.testclient import WebSocketDenialResponse

    with pytest.raises(WebSocketDenialResponse) as refused, client.websocket_connect("/acp?tokn=x"):
        pass
    assert refused.value.status_code == 422
    assert "(did you mean 'token'?)" in refused.value.json()["error"]["message"]
    with client.websocket_connect("/acp?token=unused") as ws:  # no token set: taken, unused
        ws.send_text(
            '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}'
        )
        assert '"protocolVersion"' in ws.receive_text()


@pytest.mark.parametrize("raw", ["\u200f", "\u200e\u200f", " \u061c "])
def test_a_title_of_direction_marks_only_is_empty(raw: str) -> None:
    with pytest.raises(InvalidParams, match="Title must not be empty"):
        normalize_title(raw)


def test_a_title_of_lone_surrogates_says_so() -> None:
    with pytest.raises(InvalidParams, match="lone surrogate"):
        normalize_title("\ud800")


def test_combining_marks_cannot_inflate_a_title_past_its_code_point_cap() -> None:
    from orchestrator.session.titles import MAX_TITLE_CODEPOINTS

    stored = normalize_title("e" + "\u0301" * 5000 + " tail")
    assert len(stored) <= MAX_TITLE_CODEPOINTS
