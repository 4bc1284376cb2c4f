"""Not one acknowledged archive lost through a Sentinel failover.

On loopback: a primary, two replicas and three Sentinels (``redis-server`` processes of the
test), one real worker per family, ``fleet beat`` and the API, all pointed at the Sentinels,
with ``FLEET_REDIS_MIN_REPLICAS_ACK=1``. Client threads loop archives with ``stopActivity`` on
busy sessions; mid-loop the replicas are made to fall behind (stopped, links closed), six more
busy sessions are archived, and the primary is SIGKILLed by PID; Sentinel promotes a replica
and the loop goes on (``bench/failover.py`` drives it; run it with ``--ack 0`` to see what is
lost without the setting).

Checked on the new primary: every archive answered 200 is archived there, no model request of
those sessions was admitted after its 200, all their turns end, no fleet process exited, and a
new turn completes. The time from the kill to the first acknowledged archive is printed."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.failover import run

pytestmark = pytest.mark.timeout(420)


def test_no_acknowledged_archive_is_lost_when_the_primary_dies(tmp_path: Path) -> None:
    out = run(tmp_path, ack=1, lag_ms=500)
    print(
        f"\nacknowledged {out.acknowledged}, answers {out.statuses}, promoted after "
        f"{out.promoted_after_s} s, first archive {out.kill_to_first_archive_s} s after the kill"
    )
    assert out.acknowledged >= 24
    assert out.kill_to_first_archive_s is not None
    assert out.lost == []
    assert out.late_requests == []
    assert out.not_final == []
    assert out.exits == []
    assert out.new_turn_completed


def test_the_fleet_follows_the_sentinels_away_from_a_hung_primary(tmp_path: Path) -> None:
    # A hung primary (SIGSTOP): every connection to it stays open and silent, so each process
    # must notice by its own timeouts and ask the Sentinels for the promoted replica.
    out = run(tmp_path, ack=1, hang=True)
    print(
        f"\nacknowledged {out.acknowledged}, answers {out.statuses}, promoted after "
        f"{out.promoted_after_s} s, first archive {out.kill_to_first_archive_s} s after the hang"
    )
    # Every archive was answered (status 0: the client gave up waiting, 10 s)
    assert not [status for status in out.statuses if status.startswith("0 ")], out.statuses
    assert out.lost == []
    assert out.late_requests == []
    assert out.not_final == []
    assert out.exits == []
    assert out.new_turn_completed
