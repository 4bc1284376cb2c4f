"""A stop request stands for an intent: an archive with stop is bound to
the list the user confirmed, a cancel to the turns it names (or the ones live when it
arrives), and a delete never hides running work. In process (TestClient) against the real test
Redis; turns started through a ``RecordingDispatcher`` run nowhere, so their states move only
when a test moves them. The delete of real work uses the shared ``fleet`` (worker processes).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from orchestrator.reminder import reminders
from orchestrator.storage.store import Store
from orchestrator.turn import turns
from tests.helpers import RecordingDispatcher, rest_client, wait_for
from tests.helpers import error_shape as _error

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with rest_client() as c:
        yield c


def _new(client: TestClient, **extra: Any) -> str:
    resp = client.post("/sessions", json={"cwd": f"/tmp/fleet-intent/{uuid.uuid4().hex}", **extra})
    assert resp.status_code == 201, resp.text
    sid: str = resp.json()["sessionId"]
    return sid


def _state(client: TestClient, tid: str) -> str:
    state: str = client.get(f"/turns/{tid}").json()["state"]
    return state


def _activity(client: TestClient, sid: str) -> list[dict[str, Any]]:
    resp = client.get(f"/sessions/{sid}/activity")
    assert resp.status_code == 200, resp.text
    items: list[dict[str, Any]] = resp.json()["activity"]
    return items


def _delete(client: TestClient, sid: str, body: Any = None) -> httpx.Response:
    return client.request("DELETE", f"/sessions/{sid}", json=body)


# --------------------------------------------------------------------------- 1. archive binding


def test_confirming_an_old_list_answers_activity_changed_and_archives_nothing(
    client: TestClient, store: Store
) -> None:
    recorder = RecordingDispatcher()
    sid = _new(client)
    # Given a refusal that lists the running turn T1
    t1 = turns.start_turn(store, recorder, sid, "think 30")
    refusal = _error(client.post(f"/sessions/{sid}/archive"), 409, "session_active")
    shown = refusal["data"]["activity"]
    assert [(i["family"], i["id"]) for i in shown] == [("turn", t1)]
    # When T1 ends and T2 starts before the user confirms "stop and archive" on that list
    assert turns.cancel_turns(store, recorder, sid, [t1]) == {t1: "cancelled"}
    t2 = turns.start_turn(store, recorder, sid, "think 60")
    assert _state(client, t2) == "running"
    resp = client.post(
        f"/sessions/{sid}/archive", json={"stopActivity": True, "confirmedActivity": shown}
    )
    # Then a new refusal names T2, and nothing was written or stopped
    changed = _error(resp, 409, "activity_changed")
    assert [(i["family"], i["id"]) for i in changed["data"]["activity"]] == [("turn", t2)]
    assert changed["data"]["sessionId"] == sid
    assert client.get(f"/sessions/{sid}").json()["archived"] is False
    assert _state(client, t2) == "running"
    # And confirming the list it answered archives and stops exactly that
    resp = client.post(
        f"/sessions/{sid}/archive",
        json={"stopActivity": True, "confirmedActivity": changed["data"]["activity"]},
    )
    assert resp.status_code == 200, resp.text
    assert [i["id"] for i in resp.json()["stopped"]] == [t2]
    assert _state(client, t2) == "cancelled"


def test_a_confirmation_covering_what_is_live_archives_even_if_some_of_it_ended(
    client: TestClient, store: Store
) -> None:
    recorder = RecordingDispatcher()
    sid = _new(client)
    t1 = turns.start_turn(store, recorder, sid, "think 30")
    rid = reminders.create_reminder(store, sid, 600, "later")
    shown = _error(client.post(f"/sessions/{sid}/archive"), 409, "session_active")["data"][
        "activity"
    ]
    turns.cancel_turns(store, recorder, sid, [t1])
    resp = client.post(
        f"/sessions/{sid}/archive", json={"stopActivity": True, "confirmedActivity": shown}
    )
    assert resp.status_code == 200, resp.text
    assert [(i["family"], i["id"]) for i in resp.json()["stopped"]] == [("reminder", rid)]


def test_a_subagent_that_starts_working_after_the_refusal_is_not_confirmed(
    client: TestClient, store: Store
) -> None:
    recorder = RecordingDispatcher()
    parent = _new(client)
    child = _new(client, parentId=parent)
    turns.start_turn(store, recorder, parent, "think 30")
    shown = _error(client.post(f"/sessions/{parent}/archive"), 409, "session_active")["data"][
        "activity"
    ]
    tid = turns.start_turn(store, recorder, child, "think 30")
    resp = client.post(
        f"/sessions/{parent}/archive", json={"stopActivity": True, "confirmedActivity": shown}
    )
    changed = _error(resp, 409, "activity_changed")
    assert ("subagent", child) in [(i["family"], i["id"]) for i in changed["data"]["activity"]]
    assert _state(client, tid) == "running"
    assert client.get(f"/sessions/{child}").json()["archived"] is False


@pytest.mark.parametrize(
    "body",
    [
        {"confirmedActivity": []},
        {"stopActivity": False, "confirmedActivity": []},
        {"stopActivity": True, "confirmedActivity": [{"family": "turtle", "id": "x"}]},
        {"stopActivity": True, "confirmedActivity": [{"family": "turn"}]},
        {"stopActivity": True, "confirmedActivity": "turn:x"},
    ],
)
def test_a_malformed_confirmation_is_422_and_archives_nothing(
    client: TestClient, body: dict[str, Any]
) -> None:
    sid = _new(client)
    _error(client.post(f"/sessions/{sid}/archive", json=body), 422, "invalid_params")
    assert client.get(f"/sessions/{sid}").json()["archived"] is False


# --------------------------------------------------------------------------- 2. cancel by turn


@pytest.mark.parametrize("action", ["cancel", "close"])
def test_a_cancel_naming_an_ended_turn_leaves_the_next_one_running(
    client: TestClient, store: Store, action: str
) -> None:
    recorder = RecordingDispatcher()
    sid = _new(client)
    # Given T1 running and T2 queued behind it
    t1 = turns.start_turn(store, recorder, sid, "think 30")
    t2 = turns.start_turn(store, recorder, sid, "think 30")
    assert _state(client, t2) == "queued"
    # When T1 ends (T2 starts) and only then the cancel sent for T1 arrives
    turns.cancel_turns(store, recorder, sid, [t1])
    assert _state(client, t2) == "running"
    resp = client.post(f"/sessions/{sid}/{action}", json={"turnIds": [t1]})
    # Then it stops nothing: T1 is answered with its end state, T2 keeps running
    assert resp.status_code == 200, resp.text
    assert resp.json()["turns"] == {t1: "cancelled"}
    assert _state(client, t2) == "running"


def test_a_cancel_never_touches_a_turn_of_another_session(client: TestClient, store: Store) -> None:
    recorder = RecordingDispatcher()
    sid, other = _new(client), _new(client)
    theirs = turns.start_turn(store, recorder, other, "think 30")
    resp = client.post(f"/sessions/{sid}/cancel", json={"turnIds": [theirs, "turn_nope"]})
    assert resp.status_code == 200, resp.text
    assert resp.json()["turns"] == {theirs: "missing", "turn_nope": "missing"}
    assert _state(client, theirs) == "running"


def test_a_cancel_naming_no_turn_answers_the_turns_it_took(
    client: TestClient, store: Store
) -> None:
    recorder = RecordingDispatcher()
    sid = _new(client)
    tid = turns.start_turn(store, recorder, sid, "think 30")
    resp = client.post(f"/sessions/{sid}/cancel", json={})
    assert resp.json()["turns"] == {tid: "cancelled"}
    _error(client.post(f"/sessions/{sid}/cancel", json={"turnIds": "x"}), 422, "invalid_params")


# --------------------------------------------------------------------------- 3. delete


def test_delete_of_a_session_with_live_work_is_refused_with_the_items(
    client: TestClient, store: Store
) -> None:
    recorder = RecordingDispatcher()
    parent = _new(client)
    child = _new(client, parentId=parent)
    rid = reminders.create_reminder(store, parent, 600, "later")
    tid = turns.start_turn(store, recorder, child, "think 30")
    # When the parent is deleted without stopActivity
    refusal = _error(_delete(client, parent), 409, "session_active")
    # Then the refusal names the live items (the archive refusal's shape) and nothing changed
    assert refusal["data"]["sessionId"] == parent
    items = {(i["family"], i["id"]) for i in refusal["data"]["activity"]}
    assert items == {("reminder", rid), ("subagent", child)}
    assert "delete with stopActivity" in refusal["message"]
    assert client.get(f"/sessions/{parent}").status_code == 200
    assert client.get(f"/sessions/{parent}").json()["archived"] is False
    assert _state(client, tid) == "running"
    assert len(_activity(client, parent)) == 2


def test_delete_with_an_old_confirmation_answers_activity_changed(
    client: TestClient, store: Store
) -> None:
    recorder = RecordingDispatcher()
    sid = _new(client)
    t1 = turns.start_turn(store, recorder, sid, "think 30")
    shown = _error(_delete(client, sid), 409, "session_active")["data"]["activity"]
    turns.cancel_turns(store, recorder, sid, [t1])
    t2 = turns.start_turn(store, recorder, sid, "think 30")
    resp = _delete(client, sid, {"stopActivity": True, "confirmedActivity": shown})
    changed = _error(resp, 409, "activity_changed")
    assert [i["id"] for i in changed["data"]["activity"]] == [t2]
    assert client.get(f"/sessions/{sid}").json()["archived"] is False
    assert _state(client, t2) == "running"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie no one reaped yet is dead too.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_delete_with_stop_kills_the_job_drops_the_reminder_and_stops_the_subagent(
    client: TestClient, store: Store, fleet: Any
) -> None:
    # Given a session with a job (run 300), a reminder and a thinking subagent
    sid = _new(client)
    prompt = "spawn think 60|say done\nrun 300\nremind 600 say later\nthink 60"
    assert client.post(f"/sessions/{sid}/prompt", json={"prompt": prompt}).status_code == 202
    wait_for(
        lambda: {i["family"] for i in _activity(client, sid)} >= {"job", "reminder", "subagent"},
        timeout=30,
        message="a job, a reminder and a subagent to be live",
    )
    job = next(i for i in _activity(client, sid) if i["family"] == "job")
    child = next(i for i in _activity(client, sid) if i["family"] == "subagent")["id"]
    pid = int(wait_for(lambda: store.redis.hget(store.keys.job(job["id"]), "pid"), 15))
    assert _alive(pid)
    # When it is deleted plainly: refused, the job still runs
    _error(_delete(client, sid), 409, "session_active")
    assert _alive(pid)
    # And then deleted with stopActivity
    resp = _delete(client, sid, {"stopActivity": True})
    # Then it is deleted only once its work has ended: the job's process is gone, the
    # reminder dropped, the subagent stopped and deleted with it
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["deleted"] is True
    assert body["deletedDescendants"] == [child]
    assert {i["family"] for i in body["stopped"]} >= {"job", "reminder", "subagent"}
    assert not _alive(pid)
    assert store.redis.hget(store.keys.job(job["id"]), "state") not in ("starting", "running")
    assert store.redis.scard(store.keys.live_reminders(sid)) == 0
    assert store.redis.zcard(store.keys.live_turns(child)) == 0
    assert client.get(f"/sessions/{child}").status_code == 404
    assert client.get(f"/sessions/{sid}").status_code == 404
    # And a second delete has nothing left to do
    assert _delete(client, sid, {"stopActivity": True}).json()["deleted"] is False
