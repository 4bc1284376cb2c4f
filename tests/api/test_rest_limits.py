"""A subagent created over REST over a ``FLEET_MAX_*`` limit answers 429 ``limit_reached``
in the shared error shape (``api/errors.py``), never a 500."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from orchestrator.settings import get_settings
from tests.helpers import error_shape, rest_client


@pytest.fixture
def client(monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    monkeypatch.setenv("FLEET_MAX_SUBAGENT_DEPTH", "1")
    get_settings.cache_clear()
    try:
        with rest_client() as c:
            yield c
    finally:
        monkeypatch.undo()
        get_settings.cache_clear()


def test_a_child_deeper_than_the_depth_limit_is_429_naming_the_limit(client: TestClient) -> None:
    cwd = f"/tmp/fleet-api-test/{uuid.uuid4().hex}"
    root = client.post("/sessions", json={"cwd": cwd}).json()["sessionId"]
    child = client.post("/sessions", json={"cwd": cwd, "parentId": root})
    assert child.status_code == 201, child.text

    deeper = client.post("/sessions", json={"cwd": cwd, "parentId": child.json()["sessionId"]})

    error = error_shape(deeper, 429, "limit_reached")
    assert (
        error["message"]
        == "limit FLEET_MAX_SUBAGENT_DEPTH=1 reached (the spawning session is at depth 1)"
    )
    assert error["data"] == {"limit": "FLEET_MAX_SUBAGENT_DEPTH", "max": 1, "count": 1}
