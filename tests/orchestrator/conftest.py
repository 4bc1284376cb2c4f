"""Fixtures of the orchestrator tests (no worker processes: ``recorder`` is the dispatcher)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from orchestrator.store import Store
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


@pytest.fixture
def own_store(redis_url: str, key_prefix: str) -> Iterator[Store]:
    """A store on a prefix of this test alone (for tests whose code acts on every member of a
    fleet-wide index, as a sweep does); its keys are deleted after the test."""
    prefix = f"{key_prefix}own-{uuid.uuid4().hex[:8]}:"
    s = Store(redis_url, prefix)
    try:
        yield s
    finally:
        for key in s.redis.scan_iter(match=f"{prefix}*", count=1000):
            s.redis.delete(key)
        s.close()
