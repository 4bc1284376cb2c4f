"""Lifecycle writes that fewer replicas acknowledged than ``FLEET_REDIS_MIN_REPLICAS_ACK``
answer ``WriteUnconfirmed``, never a silent success.

The test Redis has no replica, so a store that requires one sees every ``WAIT`` time out with
0 acknowledgements; the write itself is applied on the primary, as the error says. A real
replica acknowledging is covered by ``tests/faults/test_failover.py``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from orchestrator.archiving import archive, bulk, deletion
from orchestrator.errors import WriteUnconfirmed
from orchestrator.session import sessions, titles
from orchestrator.storage.store import Store
from tests.helpers import RecordingDispatcher, rest_client


@pytest.fixture
def strict(redis_url: str, key_prefix: str) -> Iterator[Store]:
    """The test prefix's store, requiring one replica's acknowledgement within 20 ms."""
    s = Store(redis_url, key_prefix, min_replicas_ack=1, replica_ack_timeout_ms=20)
    yield s
    s.close()


def test_every_lifecycle_write_raises_when_no_replica_acknowledges(
    store: Store, strict: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    sid = sessions.create_session(store, cwd).session_id
    with pytest.raises(WriteUnconfirmed) as raised:
        archive.archive(strict, recorder, sid)
    assert raised.value.data == {"replicasAcked": 0, "replicasRequired": 1}
    assert "may or may not survive a failover" in raised.value.message
    assert "Retrying is safe" in raised.value.message
    # Applied on the primary all the same; a retry is refused the same way, not a 200.
    assert sessions.get_session(store, sid).archived
    with pytest.raises(WriteUnconfirmed):
        archive.archive(strict, recorder, sid)
    with pytest.raises(WriteUnconfirmed):
        archive.unarchive(strict, sid)
    with pytest.raises(WriteUnconfirmed):
        titles.set_title(strict, sid, "a title")
    other = sessions.create_session(store, cwd).session_id
    with pytest.raises(WriteUnconfirmed):
        bulk.bulk_archive(strict, recorder, session_ids=[other])
    with pytest.raises(WriteUnconfirmed):
        deletion.delete(strict, recorder, other)


def test_no_replica_required_writes_without_waiting(
    store: Store, recorder: RecordingDispatcher, cwd: str
) -> None:
    sid = sessions.create_session(store, cwd).session_id
    assert store.min_replicas_ack == 0
    assert archive.archive(store, recorder, sid).outcome == "archived"


def test_rest_answers_503_write_unconfirmed(store: Store, strict: Store, cwd: str) -> None:
    sid = sessions.create_session(store, cwd).session_id
    with rest_client(allowed_5xx=("/sessions/",), store=strict) as client:
        resp = client.post(f"/sessions/{sid}/archive")
        assert resp.status_code == 503, resp.text
        error = resp.json()["error"]
        assert error["code"] == "write_unconfirmed"
        assert error["data"] == {"replicasAcked": 0, "replicasRequired": 1}
