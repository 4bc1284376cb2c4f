"""Fixtures of the orchestrator tests (no worker processes: ``recorder`` is the dispatcher)."""

from __future__ import annotations

import pytest

from tests.orchestrator.support import unique_cwd


@pytest.fixture
def cwd() -> str:
    """A cwd of this test alone."""
    return unique_cwd()
