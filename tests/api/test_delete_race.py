"""Concurrent ``DELETE /sessions/{id}`` with ``stopActivity`` on a tree with a live turn,
served by the shared ``fleet`` (real workers stop the turn): every answer is 200, and of two
deletes of the same session exactly one says ``deleted: true`` (the other found it gone
during its wait: ``deleted: false``, never 404)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from tests.helpers import rest_client, wait_for

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with rest_client() as c:
        yield c


def _tree(client: TestClient) -> list[str]:
    """root -> child -> grandchild, the grandchild running a long turn."""
    cwd = f"/tmp/fleet-delete-race/{uuid.uuid4().hex}"
    ids: list[str] = []
    for _ in range(3):
        body: dict[str, Any] = {"cwd": cwd, **({"parentId": ids[-1]} if ids else {})}
        ids.append(client.post("/sessions", json=body).json()["sessionId"])
    tid = client.post(f"/sessions/{ids[2]}/prompt", json={"prompt": "think 30"}).json()["turnId"]
    wait_for(lambda: client.get(f"/turns/{tid}").json()["state"] == "running", 20)
    return ids


def _race(client: TestClient, ids: list[str]) -> list[httpx.Response]:
    barrier = threading.Barrier(len(ids))
    out: list[Any] = [None] * len(ids)

    def run(i: int) -> None:
        barrier.wait()
        out[i] = client.request("DELETE", f"/sessions/{ids[i]}", json={"stopActivity": True})

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(ids))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out


def test_racing_deletes_of_a_busy_tree_all_answer_200(client: TestClient, fleet: Any) -> None:
    for _ in range(3):
        # Given R -> C -> G with a running turn on G
        _root, child, grand = _tree(client)
        # When C is deleted twice at once
        twice = _race(client, [child, child])
        # Then both answer 200 and exactly one deleted it (with G)
        assert [r.status_code for r in twice] == [200, 200], [r.text for r in twice]
        bodies = [r.json() for r in twice]
        assert sorted(b["deleted"] for b in bodies) == [False, True]
        winner = next(b for b in bodies if b["deleted"])
        assert winner["deletedDescendants"] == [grand]

        # Given another busy tree, When R and C are deleted at once
        root, child, grand = _tree(client)
        pair = _race(client, [root, child])
        # Then both answer 200, R's delete deleted R, and the tree is gone
        assert [r.status_code for r in pair] == [200, 200], [r.text for r in pair]
        by_root, by_child = (r.json() for r in pair)
        assert by_root["deleted"] is True
        assert isinstance(by_child["deleted"], bool)
        for sid in (root, child, grand):
            assert client.get(f"/sessions/{sid}").status_code == 404
