"""Operating the fleet through the API and the CLI: ``GET /metrics`` (Prometheus), ``GET
/ready``, the audit trail (``GET /audit``, ``GET /sessions/{id}/audit``, ``fleet audit``) and the
worker logs. Tests that need running work use the session-scoped ``fleet`` fixture (real
worker processes)."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

import api.metrics
from api.cli import app as cli_app
from orchestrator.errors import SessionArchived
from orchestrator.process import containment
from orchestrator.settings import get_settings
from orchestrator.storage import audit
from orchestrator.storage.store import Store
from orchestrator.turn import turns
from tests.api.test_acp_stdio import new_session, stdio_agent
from tests.api.test_acp_websocket import acp_socket
from tests.helpers import rest_client, wait_for

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with rest_client(allowed_5xx=("/ready",)) as c:
        yield c


def _cwd() -> str:
    return f"/tmp/fleet-ops-test/{uuid.uuid4().hex}"


def _new(client: TestClient) -> str:
    resp = client.post("/sessions", json={"cwd": _cwd()})
    assert resp.status_code == 201, resp.text
    sid: str = resp.json()["sessionId"]
    return sid


def scrape(client: TestClient) -> tuple[Samples, dict[str, str]]:
    """Every sample of ``GET /metrics`` by (name, labels), and the type of each family."""
    resp = client.get("/metrics")
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith("text/plain")
    samples: Samples = {}
    types: dict[str, str] = {}
    for family in text_string_to_metric_families(resp.text):
        types[family.name] = family.type
        for s in family.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return samples, types


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


# --------------------------------------------------------------------------- /metrics


def test_metrics_count_archives_refusals_stops_refused_wakeups_and_quiet(
    client: TestClient, fleet: Any, store: Store, dispatcher: Any
) -> None:
    # Given a session whose turn is in a long model step
    sid = _new(client)
    resp = client.post(f"/sessions/{sid}/prompt", json={"prompt": "think 30\nsay done"})
    tid = resp.json()["turnId"]
    wait_for(
        lambda: any(
            json.loads(r)["turnId"] == tid
            for r in store.redis.lrange(store.keys.model_requests(sid), 0, -1)
        ),
        message="the turn's first model request",
    )
    before, _ = scrape(client)

    # When a plain archive is refused, then it is archived with stopActivity
    assert client.post(f"/sessions/{sid}/archive").status_code == 409
    resp = client.post(f"/sessions/{sid}/archive", json={"stopActivity": True})
    assert resp.json()["outcome"] == "archived"
    # And once its turn has stopped (nobody reads its activity), a late wake-up is refused
    wait_for(
        lambda: "quietAt" in client.get(f"/sessions/{sid}").json()["_meta"]["agentFleet"],
        message="the archived session to be recorded quiet",
    )
    with pytest.raises(SessionArchived):
        turns.start_turn(store, dispatcher, sid, "say late", source="reminder")

    # Then the scrape shows each of them under its name and labels
    def gained(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    # (the stop counts are bookkeeping the API writes after its answer, within a moment)
    after, types = wait_for(
        lambda: (
            (s := scrape(client))
            and value(s[0], "fleet_wakeups_refused_total", source="reminder")
            > value(before, "fleet_wakeups_refused_total", source="reminder")
            and value(s[0], "fleet_stop_dispatches_total", family="turn")
            > value(before, "fleet_stop_dispatches_total", family="turn")
            and s
        ),
        message="the refused wake-up and the turn's stop to be counted",
    )
    assert gained("fleet_archives_total", outcome="refused") == 1
    assert gained("fleet_archives_total", outcome="archived") == 1
    assert gained("fleet_archive_refusals_total", family="turn") == 1
    assert gained("fleet_stop_dispatches_total", family="turn") == 1
    assert gained("fleet_stop_failures_total", family="turn") == 0
    assert gained("fleet_wakeups_refused_total", source="reminder") == 1
    assert gained("fleet_archive_quiet_seconds_count") == 1
    assert gained("fleet_archive_quiet_seconds_bucket", le="+Inf") == 1
    assert value(after, "fleet_sessions", state="archived") >= 1
    assert value(after, "fleet_store_up") == 1
    assert types == {
        "fleet_store_up": "gauge",
        "fleet_archives": "counter",
        "fleet_archive_refusals": "counter",
        "fleet_archive_hazards": "counter",
        "fleet_stop_dispatches": "counter",
        "fleet_stop_failures": "counter",
        "fleet_gate_refusals": "counter",
        "fleet_turn_sweeps": "counter",
        "fleet_wakeups_refused": "counter",
        "fleet_archive_quiet_seconds": "histogram",
        "fleet_model_tokens": "counter",
        "fleet_model_requests": "counter",
        "fleet_model_request_seconds": "histogram",
        "fleet_sessions": "gauge",
    }


def test_metrics_need_the_token_when_one_is_configured_and_ready_never_does() -> None:
    token = f"tok-{uuid.uuid4().hex}"
    with rest_client(allowed_5xx=("/ready",), FLEET_API_TOKEN=token) as client:
        assert client.get("/metrics").status_code == 401
        assert client.get("/audit").status_code == 401
        ok = client.get("/metrics", headers={"Authorization": f"Bearer {token}"})
        assert ok.status_code == 200
        assert client.get("/ready").status_code in (200, 503)


def test_health_and_ready_answer_head_probes_without_a_token_or_a_body() -> None:
    # Load balancers and health checkers probe with HEAD.
    token = f"tok-{uuid.uuid4().hex}"
    with rest_client(allowed_5xx=("/ready",), FLEET_API_TOKEN=token) as client:
        health = client.head("/health")
        assert (health.status_code, health.content) == (200, b"")
        ready = client.head("/ready")
        assert ready.status_code in (200, 503) and ready.content == b""
        assert client.head("/metrics").status_code == 405  # not a probe: GET alone
        paths = client.get("/openapi.json", headers={"Authorization": f"Bearer {token}"})
        assert set(paths.json()["paths"]["/health"]) == {"get"}


def test_metrics_say_store_down_when_redis_does_not_answer(store: Store) -> None:
    dead = Store("redis://127.0.0.1:1/0", store.keys.prefix, connect_timeout=0.2)
    text = api.metrics.render(api.metrics.registry(lambda: dead)).decode()
    assert "fleet_store_up 0.0" in text
    assert "fleet_archives" not in text


# --------------------------------------------------------------------------- /ready


def test_ready_names_every_familys_workers_when_the_fleet_is_up(
    client: TestClient, fleet: Any
) -> None:
    resp = client.get("/ready")
    assert resp.status_code == 200, resp.text
    assert resp.json() == {
        "redis": True,
        "broker": True,
        "workers": {
            "turn": ["turn@test"],
            "job": ["job@test-1", "job@test-2"],
            "subagent": ["subagent@test"],
            "reminder": ["reminder@test"],
        },
        # how this host contains the process trees of jobs and shell commands
        "containment": containment.mode().value,
    }
    assert resp.json()["containment"] in {m.value for m in containment.Mode}


@pytest.fixture
def empty_prefix(redis_url: str) -> Iterator[Store]:
    """A key prefix of its own (no worker has a heartbeat there)."""
    fresh = Store(redis_url, f"fleet-ops-{uuid.uuid4().hex[:8]}:")
    yield fresh
    for key in fresh.redis.scan_iter(match=f"{fresh.keys.prefix}*"):
        fresh.redis.delete(key)
    fresh.close()


def test_ready_is_503_while_a_family_has_no_worker(empty_prefix: Store) -> None:
    with rest_client(allowed_5xx=("/ready",), store=empty_prefix) as client:
        _ready_follows_the_heartbeats(client, empty_prefix)


def _ready_follows_the_heartbeats(client: TestClient, empty_prefix: Store) -> None:
    # Given heartbeats for three families only
    k = empty_prefix.keys
    for family, node in [("turn", "turn@a"), ("job", "job@a"), ("subagent", "subagent@a")]:
        empty_prefix.redis.set(k.worker_heartbeat(family, node), "a", ex=30)
    # Then the API is not ready, and says which family is missing (HEAD: the status alone)
    head = client.head("/ready")
    assert (head.status_code, head.content) == (503, b"")
    resp = client.get("/ready")
    assert resp.status_code == 503
    assert resp.json() == {
        "redis": True,
        "broker": True,
        "workers": {
            "turn": ["turn@a"],
            "job": ["job@a"],
            "subagent": ["subagent@a"],
            "reminder": [],
        },
        "containment": containment.mode().value,
    }
    # And once the last family's worker beats, it is
    empty_prefix.redis.set(k.worker_heartbeat("reminder", "reminder@a"), "a", ex=30)
    assert client.get("/ready").status_code == 200
    head = client.head("/ready")
    assert (head.status_code, head.content) == (200, b"")


def test_ready_is_503_when_redis_does_not_answer() -> None:
    from celery import Celery

    from workers.app import configure
    from workers.dispatch import CeleryDispatcher

    dead_url = "redis://127.0.0.1:1/0"
    dead_app = Celery("dead")
    configure(dead_app, get_settings().model_copy(update={"redis_url": dead_url}))
    dead = Store(dead_url, "x:", connect_timeout=0.2)
    with rest_client(
        allowed_5xx=("/ready",), store=dead, dispatcher=CeleryDispatcher(dead_app)
    ) as client:
        resp = client.get("/ready")
    assert resp.status_code == 503
    assert resp.json() == {
        "redis": False,
        "broker": False,
        "workers": {},
        "containment": containment.mode().value,
    }


# --------------------------------------------------------------------------- audit


def test_rest_changes_are_audited_as_made_by_the_client(client: TestClient) -> None:
    # Given a session archived, unarchived, retitled and deleted over REST
    sid = _new(client)
    assert client.post(f"/sessions/{sid}/archive").status_code == 200
    assert client.post(f"/sessions/{sid}/unarchive").status_code == 200
    assert client.put(f"/sessions/{sid}/title", json={"title": "Ops"}).status_code == 200
    assert client.delete(f"/sessions/{sid}").json()["deleted"] is True
    # Then its trail (still readable after the delete) has each change, newest first
    resp = client.get(f"/sessions/{sid}/audit")
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["sessionId"] == sid
    assert [(e["action"], e["outcome"], e["actor"]) for e in body["entries"]] == [
        ("delete", "deleted", "rest:testclient"),
        ("set_title", "set", "rest:testclient"),
        ("unarchive", "unarchived", "rest:testclient"),
        ("archive", "archived", "rest:testclient"),
    ]
    assert "nextBefore" not in body
    # And the fleet-wide trail pages through the same entries
    first = client.get("/audit", params={"limit": 2}).json()
    assert [e["action"] for e in first["entries"]] == ["delete", "set_title"]
    rest = client.get("/audit", params={"limit": 2, "before": first["nextBefore"]}).json()
    assert [e["action"] for e in rest["entries"]] == ["unarchive", "archive"]
    assert {e["sessionId"] for e in first["entries"] + rest["entries"]} == {sid}


def test_a_childs_trail_shows_the_archive_and_unarchive_of_its_parent(client: TestClient) -> None:
    # Given a parent with a child, archived and unarchived over REST
    parent = _new(client)
    resp = client.post("/sessions", json={"cwd": _cwd(), "parentId": parent})
    assert resp.status_code == 201, resp.text
    child = resp.json()["sessionId"]
    assert client.post(f"/sessions/{parent}/archive").json()["archivedCount"] == 2
    assert client.post(f"/sessions/{parent}/unarchive").json()["restored"] == 2
    # When the child's trail is read one entry a page
    first = client.get(f"/sessions/{child}/audit", params={"limit": 1}).json()
    rest = client.get(
        f"/sessions/{child}/audit", params={"limit": 1, "before": first["nextBefore"]}
    ).json()
    last = client.get(
        f"/sessions/{child}/audit", params={"limit": 1, "before": rest["nextBefore"]}
    ).json()
    # Then it shows both, naming the parent, under the ids of the parent's entries
    entries = first["entries"] + rest["entries"]
    assert [(e["action"], e["outcome"], e["actor"], e["detail"]) for e in entries] == [
        ("unarchive", "unarchived", "rest:testclient", {"ancestorId": parent}),
        ("archive", "archived", "rest:testclient", {"ancestorId": parent}),
    ]
    assert last == {"sessionId": child, "entries": []}
    parents = client.get(f"/sessions/{parent}/audit").json()["entries"]
    assert [e["id"] for e in entries] == [e["id"] for e in parents]


def test_audit_of_an_unknown_session_is_404_and_a_bad_page_is_422(client: TestClient) -> None:
    assert client.get("/sessions/sess_doesnotexist/audit").status_code == 404
    assert client.get("/audit", params={"limit": 0}).status_code == 422
    assert client.get("/audit", params={"before": "yesterday"}).status_code == 422


def test_acp_changes_are_audited_as_made_by_their_transport(client: TestClient) -> None:
    # Given a session created and closed over ACP stdio (a `fleet acp` process)
    with stdio_agent("audit") as agent:
        sid = new_session(agent, _cwd())
        agent.call("session/close", {"sessionId": sid})
    # And archived over ACP on the API's WebSocket
    with acp_socket(client, "audit-ws") as ws:
        ws.call("session/archive", {"sessionId": sid})
    # Then the trail names each transport
    entries = client.get(f"/sessions/{sid}/audit").json()["entries"]
    assert [(e["action"], e["outcome"], e["actor"]) for e in entries] == [
        ("archive", "archived", "acp:ws:testclient"),
        ("close", "closed", "acp:stdio"),
    ]
    assert entries[0]["detail"]["stopActivity"] is True
    assert entries[1]["detail"] == {"cancelledTurns": 0}


# --------------------------------------------------------------------------- fleet audit


runner = CliRunner()


def test_fleet_audit_shows_a_sessions_trail_with_the_cli_as_actor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "300")
    saved = audit.current_actor()
    try:
        # Given a session archived and unarchived from the command line
        sid = runner.invoke(cli_app, ["sessions", "new", _cwd()]).stdout.strip()
        assert runner.invoke(cli_app, ["archive", sid]).exit_code == 0
        assert runner.invoke(cli_app, ["unarchive", sid]).exit_code == 0
        # When its trail is shown
        table = runner.invoke(cli_app, ["audit", sid])
        as_json = runner.invoke(cli_app, ["audit", sid, "--json", "--limit", "1"])
    finally:
        audit.set_default_actor(saved)
    # Then both changes are listed, newest first, as done by "cli"
    assert table.exit_code == 0, table.output
    # (the time reads as people read it: "just now", "3 min ago")
    rows = [ln for ln in table.stdout.splitlines() if re.search(r"just now|\bago\b", ln)]
    cells = [re.split(r"\s{2,}", r.strip()) for r in rows]
    assert [c[1:4] for c in cells] == [
        ["unarchive", "unarchived", "cli"],
        ["archive", "archived", "cli"],
    ]
    [entry] = json.loads(as_json.stdout)
    assert (entry["action"], entry["actor"], entry["sessionId"]) == ("unarchive", "cli", sid)


def test_fleet_audit_of_an_unknown_session_fails_with_the_error() -> None:
    result = runner.invoke(cli_app, ["audit", "sess_doesnotexist"])
    assert result.exit_code == 2
    assert "session_not_found" in result.output


# --------------------------------------------------------------------------- worker logs


def test_worker_logs_are_json_lines_with_the_tasks_context(client: TestClient, fleet: Any) -> None:
    # Given a turn that ran on the turn worker (its log file is not a terminal: JSON)
    sid = _new(client)
    tid = client.post(f"/sessions/{sid}/prompt", json={"prompt": "say hi"}).json()["turnId"]
    wait_for(lambda: client.get(f"/turns/{tid}").json()["state"] == "completed", message="turn")
    turn_worker = next(w for w in fleet.workers if w.family.value == "turn")

    def ended() -> dict[str, Any] | None:
        for line in turn_worker.log_path.read_text(errors="replace").splitlines():
            if line.startswith("{") and f"turn {tid} ended completed" in line:
                found: dict[str, Any] = json.loads(line)
                return found
        return None

    entry = wait_for(ended, message="the turn's end in the worker log")
    # Then the line carries the session, the turn, the family and the Celery task
    assert entry["session_id"] == sid
    assert entry["turn_id"] == tid
    assert entry["family"] == "turn"
    # (a step's task id names its turn and step: families.step_message_id)
    assert re.fullmatch(rf"{re.escape(tid)}\.step\.\d+", entry["task_id"])
    assert entry["level"] == "INFO" and entry["logger"] == "orchestrator.turn.turns"
