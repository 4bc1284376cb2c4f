"""Fixtures of the orchestrator tests (no worker processes: ``recorder`` is the dispatcher)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.orchestrator.support import unique_cwd


@pytest.fixture
def cwd() -> str:
    """A cwd of this test alone."""
    return unique_cwd()


@pytest.fixture
def probe() -> Iterator[str]:
    """The test-only ``probe`` family (``tests/orchestrator/probe.py``; it names no item key),
    registered for one test."""
    from orchestrator import families
    from tests.orchestrator.probe import SPEC

    families.register(SPEC)
    try:
        yield SPEC.name
    finally:
        families.unregister(SPEC.name)
