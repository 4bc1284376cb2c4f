"""Helpers shared by the tests (import as ``from tests.helpers import ...``)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient


class RecordingDispatcher:
    """A dispatcher that records what it would send (for tests of the orchestrator alone)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, list[Any], str]] = []

    def send(self, task: str, args: list[Any], queue: str) -> None:
        self.sent.append((task, args, queue))


def wait_for(
    predicate: Callable[[], Any],
    timeout: float = 15.0,
    interval: float = 0.05,
    message: str = "condition",
) -> Any:
    """Poll ``predicate`` until it returns a truthy value; fail the test after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)


class NoServerErrors(TestClient):
    """A TestClient that fails the test on any 5xx answer (the app's 500s included), except
    on paths starting with one of ``allowed_5xx`` (``/ready`` answers 503 by design)."""

    allowed_5xx: tuple[str, ...] = ()

    def request(self, method: str, url: Any, *args: Any, **kwargs: Any) -> httpx.Response:  # type: ignore[override]
        resp = super().request(method, url, *args, **kwargs)
        if not (self.allowed_5xx and str(url).startswith(self.allowed_5xx)):
            assert resp.status_code < 500, (
                f"{method} {url} answered {resp.status_code}: {resp.text}"
            )
        return resp


@contextmanager
def rest_client(
    allowed_5xx: tuple[str, ...] = (),
    *,
    store: Any = None,
    dispatcher: Any = None,
    **env: str,
) -> Iterator[TestClient]:
    """The in-process REST app without a token (unless ``env`` sets one), built for the
    settings ``env`` makes (the domain reads them too, so they stay applied meanwhile), on
    ``store``/``dispatcher`` when given; a ``NoServerErrors`` client."""
    from api.rest import create_app
    from orchestrator.settings import FleetSettings, get_settings

    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("FLEET_API_TOKEN", raising=False)
        for name, value in env.items():
            mp.setenv(name, value)
        get_settings.cache_clear()
        app = create_app(FleetSettings(), store=store, dispatcher=dispatcher)
        client = NoServerErrors(app, raise_server_exceptions=False)
        client.allowed_5xx = allowed_5xx
        with client as c:
            yield c
    get_settings.cache_clear()


def error_shape(resp: httpx.Response, status: int, code: str) -> dict[str, Any]:
    """Assert the one error shape, ``{"error": {"code", "message", "data"}}``; return it."""
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"error"}, body
    error: dict[str, Any] = body["error"]
    assert set(error) == {"code", "message", "data"}, error
    assert error["code"] == code, error
    assert isinstance(error["message"], str) and error["message"], error
    assert isinstance(error["data"], dict), error
    return error


class FaultyDispatcher:
    """Forwards to a real dispatcher and records what it sent, except tasks in ``drop``
    (a stop message lost on its way) and, while ``broken``, everything (the broker refuses)."""

    def __init__(self, inner: Any, drop: frozenset[str] = frozenset()) -> None:
        self.inner = inner
        self.drop = drop
        self.broken = False
        self.sent: list[tuple[str, list[Any], str]] = []
        self.dropped: list[tuple[str, list[Any], str]] = []

    @property
    def app(self) -> Any:
        return self.inner.app

    def send(self, task: str, args: list[Any], queue: str) -> None:
        if self.broken:
            raise ConnectionError("broker unavailable (injected)")
        if task in self.drop:
            self.dropped.append((task, args, queue))
            return
        self.inner.send(task, args, queue)
        self.sent.append((task, args, queue))

    def sent_for(self, sid: str) -> list[tuple[str, list[Any], str]]:
        return [m for m in self.sent if m[1] and m[1][0] == sid]
