"""Fixtures of the operations tests: what an operator runs beside the fleet (Flower, several
job hosts). They use real processes and read only what those processes expose."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from orchestrator.activity import census
from orchestrator.archive import archive
from orchestrator.stops import dispatch_stops
from tests.helpers import wait_for
from tests.workers.support import new_session


class OpsSessions:
    """Creates sessions on the run's store and remembers them for teardown."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.ids: list[str] = []

    def new(self, parent_id: str | None = None) -> str:
        sid = new_session(self.store, parent_id)
        self.ids.append(sid)
        return sid


@pytest.fixture
def sessions(store: Any, dispatcher: Any, fleet: Any) -> Iterator[OpsSessions]:
    """A session factory; at teardown every session is archived with its work stopped, so no
    turn keeps a worker thread busy and no job process outlives its test."""
    made = OpsSessions(store)
    yield made
    for sid in made.ids:
        result = archive(store, dispatcher, sid, stop_activity=True)
        if result.outcome == "already_archived":
            dispatch_stops(dispatcher, sid, census(store, sid))
    with contextlib.suppress(pytest.fail.Exception):
        wait_for(
            lambda: not any(census(store, sid) for sid in made.ids),
            10,
            message="the test's sessions to drain",
        )
