"""The live-work check of a bulk archive (``archive.lua``) finds a session busy whatever
family its one live item belongs to, though most sessions are known idle from one EXISTS
over their children set and every family's item key (``item_keys``/``has_live`` in
``_lib.lua``): a family whose key the check missed would let its work run on after the
archive. A family that names no key (the test-only ``probe``) is still read on its own.
A batch counts its stop dispatches, and its refusals, in one round trip each."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import redis

from orchestrator.archiving import archive, bulk
from orchestrator.census.activity import census
from orchestrator.errors import SessionActive
from orchestrator.job import jobs
from orchestrator.reminder import reminders
from orchestrator.session import sessions
from orchestrator.storage import metrics
from orchestrator.storage.store import Store
from orchestrator.turn import turns
from tests.helpers import RecordingDispatcher
from tests.orchestrator.support import STOP_MANY_TASKS, claim_job, deliver

#: Gives session ``sid`` (in ``cwd``) one live item, directly or through descendants it
#: creates there; returns the (family, item id) its census lists.
Maker = Callable[[Store, RecordingDispatcher, str, str], tuple[str, str]]


def _turn(store: Store, rec: RecordingDispatcher, sid: str, cwd: str) -> tuple[str, str]:
    return "turn", turns.start_turn(store, rec, sid, "think 5")


def _job(store: Store, rec: RecordingDispatcher, sid: str, cwd: str) -> tuple[str, str]:
    jid = jobs.create_job(store, rec, sid, 30, "sleep 30s")
    assert claim_job(store, jid, "hostA") == "ok"
    return "job", jid


def _reminder(store: Store, rec: RecordingDispatcher, sid: str, cwd: str) -> tuple[str, str]:
    return "reminder", reminders.create_reminder(store, sid, 60, "say hi")


def _subagent(store: Store, rec: RecordingDispatcher, sid: str, cwd: str) -> tuple[str, str]:
    child = sessions.create_session(store, cwd, parent_id=sid).session_id
    turns.start_turn(store, rec, child, "think 5", source="subagent")
    return "subagent", child


def _grandchild(store: Store, rec: RecordingDispatcher, sid: str, cwd: str) -> tuple[str, str]:
    # An idle child whose own child holds the only live item, a reminder.
    child = sessions.create_session(store, cwd, parent_id=sid).session_id
    grandchild = sessions.create_session(store, cwd, parent_id=child).session_id
    reminders.create_reminder(store, grandchild, 60, "later")
    return "subagent", grandchild


MAKERS: dict[str, Maker] = {
    "turn": _turn,
    "job": _job,
    "reminder": _reminder,
    "subagent": _subagent,
    "grandchild": _grandchild,
}


def _fleet(store: Store, rec: RecordingDispatcher, cwd: str, make: Maker) -> tuple[str, str]:
    """Idle sessions (some with idle children) around one busy session; returns the busy
    session's id and its one live item's id."""
    for i in range(6):
        sid = sessions.create_session(store, cwd).session_id
        if i % 2:
            sessions.create_session(store, cwd, parent_id=sid)
    busy = sessions.create_session(store, cwd).session_id
    _, item = make(store, rec, busy, cwd)
    for _ in range(4):
        sessions.create_session(store, cwd)
    return busy, item


@pytest.mark.parametrize("case", list(MAKERS))
def test_a_session_whose_only_live_item_is_of_one_family_is_refused(
    store: Store, recorder: RecordingDispatcher, cwd: str, case: str
) -> None:
    # Given idle sessions and one whose only live work is of one family
    busy, item = _fleet(store, recorder, cwd, MAKERS[case])
    family = "subagent" if case == "grandchild" else case
    # Then a single archive refuses it
    with pytest.raises(SessionActive):
        archive.archive(store, recorder, busy)
    # When the cwd is archived by filter without stopActivity
    result = bulk.bulk_archive(store, recorder, flt=bulk.BulkFilter(cwd=cwd))
    # Then it alone is refused, naming its item, and stays as it was
    [refused] = [i for i in result.results if i.session_id == busy]
    assert refused.outcome == "refused"
    assert [(a.family.value, a.id) for a in refused.activity or []] == [(family, item)]
    assert sessions.get_session(store, busy).archived is False
    assert result.totals["archived"] == 10


@pytest.mark.parametrize("case", list(MAKERS))
def test_a_session_whose_only_live_item_is_of_one_family_is_stopped_with_stop_activity(
    store: Store, recorder: RecordingDispatcher, cwd: str, case: str
) -> None:
    # Given idle sessions and one whose only live work is of one family
    busy, _ = _fleet(store, recorder, cwd, MAKERS[case])
    assert census(store, busy) != []
    before = len(recorder.sent)
    # When the cwd is archived by filter with stopActivity
    result = bulk.bulk_archive(
        store, recorder, flt=bulk.BulkFilter(cwd=cwd), stop_activity=True, batch_size=4
    )
    # Then every session is archived, and the busy one's work is stopped once the stops
    # arrive (a turn may be stopped by the archive script itself)
    assert result.totals["archived"] == 11
    assert sessions.get_session(store, busy).archived is True
    deliver(store, recorder, [m for m in recorder.sent[before:] if m[0] in STOP_MANY_TASKS])
    assert census(store, busy) == []


def test_a_family_that_names_no_item_key_is_still_read(
    store: Store, recorder: RecordingDispatcher, cwd: str, probe: str
) -> None:
    from tests.orchestrator.probe import start_probe

    # Given idle sessions and one whose only live work is a probe
    def make(store: Store, rec: RecordingDispatcher, sid: str, cwd: str) -> tuple[str, str]:
        start_probe(store, sid, "p1", "warming up")
        return probe, "p1"

    busy, _ = _fleet(store, recorder, cwd, make)
    # When the cwd is archived by filter, Then the probe's session is refused
    result = bulk.bulk_archive(store, recorder, flt=bulk.BulkFilter(cwd=cwd))
    [refused] = [i for i in result.results if i.session_id == busy]
    assert refused.outcome == "refused"
    assert [(a.family, a.id) for a in refused.activity or []] == [(probe, "p1")]
    # And with stopActivity it is archived and its probe asked to stop
    result = bulk.bulk_archive(store, recorder, flt=bulk.BulkFilter(cwd=cwd), stop_activity=True)
    assert result.totals["archived"] == 1
    assert ("probe.stop_many", [{busy: ["p1"]}], "probe.ctl") in recorder.sent


# --------------------------------------------------------------------------- counting


class MetricTrips:
    """Counts the Redis round trips that add to a metric (an ``HINCRBY`` of a metric hash
    sent on its own or in a pipeline; those inside a script are not round trips of theirs)."""

    def __init__(self, store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        prefix = store.keys.metric("")
        plain = redis.Redis.execute_command
        execute = redis.client.Pipeline.execute

        def is_metric(args: tuple[Any, ...]) -> bool:
            return str(args[0]).upper() == "HINCRBY" and str(args[1]).startswith(prefix)

        def command(client: Any, *args: Any, **kwargs: Any) -> Any:
            self.count += is_metric(args)
            return plain(client, *args, **kwargs)

        def pipeline(pipe: Any, *args: Any, **kwargs: Any) -> Any:
            self.count += any(is_metric(c[0]) for c in pipe.command_stack)
            return execute(pipe, *args, **kwargs)

        monkeypatch.setattr(redis.Redis, "execute_command", command)
        monkeypatch.setattr(redis.client.Pipeline, "execute", pipeline)


def _busy_everywhere(store: Store, rec: RecordingDispatcher, cwd: str, host: str) -> str:
    """A session with a live item of every family (jobs claimed on ``host``)."""
    sid = sessions.create_session(store, cwd).session_id
    for make in (_turn, _reminder, _subagent):
        make(store, rec, sid, cwd)
    jid = jobs.create_job(store, rec, sid, 30, "sleep 30s")
    assert claim_job(store, jid, host) == "ok"
    return sid


def test_a_batch_counts_its_stops_in_one_round_trip(
    store: Store, recorder: RecordingDispatcher, cwd: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given busy sessions with work of every family, jobs on two hosts
    ids = [_busy_everywhere(store, recorder, cwd, f"host{i % 2}") for i in range(4)]
    before = metrics.snapshot(store).counters["fleet_stop_dispatches"]
    # When they are archived with stopActivity in one batch
    trips = MetricTrips(store, monkeypatch)
    result = bulk.bulk_archive(store, recorder, session_ids=ids, stop_activity=True)
    # Then its five stop messages (one per family, jobs per host) are counted in one trip
    assert result.totals["archived"] == 4
    assert trips.count == 1
    monkeypatch.undo()
    after = metrics.snapshot(store).counters["fleet_stop_dispatches"]
    grew = {k[0]: n - before.get(k, 0) for k, n in after.items() if n != before.get(k, 0)}
    assert grew == {"turn": 1, "job": 2, "subagent": 1, "reminder": 1}


def test_a_batch_counts_its_refusals_in_one_round_trip(
    store: Store, recorder: RecordingDispatcher, cwd: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given busy sessions with work of every family
    ids = [_busy_everywhere(store, recorder, cwd, "hostA") for _ in range(3)]
    before = metrics.snapshot(store).counters
    # When they are archived without stopActivity in one batch
    trips = MetricTrips(store, monkeypatch)
    result = bulk.bulk_archive(store, recorder, session_ids=ids)
    # Then the refusals, by outcome and by family, are counted in one trip
    assert result.totals["refused"] == 3
    assert trips.count == 1
    monkeypatch.undo()
    after = metrics.snapshot(store).counters
    refusals = after["fleet_archive_refusals"]
    old = before["fleet_archive_refusals"]
    assert {k[0]: n - old.get(k, 0) for k, n in refusals.items() if n != old.get(k, 0)} == {
        f: 3 for f in ("turn", "job", "subagent", "reminder")
    }
    refused = ("refused",)
    assert after["fleet_archives"][refused] - before["fleet_archives"].get(refused, 0) == 3
