"""The ``sessions`` fixture of tests that drive real workers (tests/workers, tests/ops):
sessions that are stopped when the test ends. Import it into a folder's conftest."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from orchestrator.archiving.archive import archive
from orchestrator.census.activity import census
from tests.helpers import wait_for
from tests.workers.support import new_session


class Sessions:
    """Creates sessions and remembers them, so whatever a test leaves running is stopped."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.ids: list[str] = []

    def new(self, parent_id: str | None = None) -> str:
        sid = new_session(self.store, parent_id)
        self.ids.append(sid)
        return sid


@pytest.fixture
def sessions(store: Any, dispatcher: Any, fleet: Any) -> Iterator[Sessions]:
    """A session factory; at teardown every session is archived with its work stopped (an
    already archived one has its stops sent again), so no turn keeps a worker thread busy and
    no job process outlives its test."""
    made = Sessions(store)
    yield made
    for sid in made.ids:
        archive(store, dispatcher, sid, stop_activity=True)
    # Best effort: a failing test has already reported what went wrong.
    with contextlib.suppress(pytest.fail.Exception):
        wait_for(
            lambda: not any(census(store, sid) for sid in made.ids),
            10,
            message="the test's sessions to drain",
        )
