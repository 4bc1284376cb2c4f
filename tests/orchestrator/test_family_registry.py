"""Families as a registry: a fifth family needs its own module and one registry entry, and
an unknown family is an error everywhere, never a fallthrough to another family."""

from __future__ import annotations

import pytest

from orchestrator.archiving import archive
from orchestrator.archiving.stops import (
    StopMessage,
    dispatch_stops,
    stop_messages,
    stop_messages_many,
)
from orchestrator.census.activity import ActivityItem, census
from orchestrator.errors import InvalidParams, SessionActive
from orchestrator.session import sessions
from orchestrator.storage.store import Store
from tests.helpers import RecordingDispatcher

# --------------------------------------------------------------------------- unknown families


def test_a_bulk_stop_of_an_unknown_family_raises_instead_of_stopping_reminders() -> None:
    # Given an item of a family nobody registered
    fish = ActivityItem("fish", "f1", "a fish", "sess_a")
    # When its bulk stop messages are built, Then it is refused, never sent as a reminder stop
    with pytest.raises(InvalidParams, match="fish"):
        stop_messages_many({"sess_a": [fish]})


def test_a_single_stop_of_an_unknown_family_raises() -> None:
    fish = ActivityItem("fish", "f1", "a fish", "sess_a")
    with pytest.raises(InvalidParams, match="fish"):
        stop_messages("sess_a", [fish])


def test_the_queues_of_an_unknown_family_raise() -> None:
    from workers.app import worker_queues

    with pytest.raises(InvalidParams, match="fish"):
        worker_queues("fish", "host1")  # type: ignore[arg-type]

    # --------------------------------------------------------------------------- a fifth family


# --------------------------------------------------------------------------- a fifth family


def test_the_census_and_the_archive_scripts_see_a_registered_family(
    store: Store, recorder: RecordingDispatcher, cwd: str, probe: str
) -> None:
    from tests.orchestrator.probe import start_probe

    # Given a session with one live probe
    sid = sessions.create_session(store, cwd).session_id
    start_probe(store, sid, "p1", "warming up")
    # Then the census lists it with its own label
    assert census(store, sid) == [ActivityItem(probe, "p1", "probe warming up", sid)]
    # And the archive script (the same liveness rule, in Lua) refuses the archive
    with pytest.raises(SessionActive) as refused:
        archive.archive(store, recorder, sid)
    assert [(i.family, i.id) for i in refused.value.items] == [(probe, "p1")]


def test_a_registered_family_gets_its_single_and_bulk_stops(
    store: Store, recorder: RecordingDispatcher, cwd: str, probe: str
) -> None:
    a = ActivityItem(probe, "p1", "", "sess_a")
    b = ActivityItem(probe, "p2", "", "sess_b")
    # Single: one message with the family's own task, arguments and control queue
    assert stop_messages("sess_a", [a]) == [
        StopMessage(probe, 1, "probe.stop", ["sess_a", ["p1"]], "probe.ctl")
    ]
    # Bulk: one message for the whole batch
    assert stop_messages_many({"sess_a": [a], "sess_b": [b]}) == [
        StopMessage(
            probe, 2, "probe.stop_many", [{"sess_a": ["p1"], "sess_b": ["p2"]}], "probe.ctl"
        )
    ]
    # And dispatching sends it
    report = dispatch_stops(recorder, "sess_a", [a], store=store)
    assert report.sent == {probe: 1}
    assert recorder.sent == [("probe.stop", ["sess_a", ["p1"]], "probe.ctl")]


def test_a_subagent_stop_names_a_registered_familys_items(
    store: Store, recorder: RecordingDispatcher, cwd: str, probe: str
) -> None:
    from tests.orchestrator.probe import start_probe

    # Given a child session with a live probe
    parent = sessions.create_session(store, cwd).session_id
    child = sessions.create_session(store, cwd, parent).session_id
    start_probe(store, child, "p9", "deep")
    # Then the parent's census has a subagent item whose plan names the probe
    [item] = census(store, parent)
    assert (item.family, item.id, item.label) == ("subagent", child, f"subagent {child} (1 probe)")
    [message] = stop_messages(parent, [item])
    assert message.args == [
        parent,
        {child: {"turns": [], "jobs": [], "probes": ["p9"], "reminders": []}},
    ]


def test_worker_queues_and_cli_choices_come_from_the_registry(probe: str) -> None:
    from workers.app import static_queues, worker_queues

    assert worker_queues(probe, "host1") == ["probe.ctl", "probe"]
    assert {"probe.ctl", "probe"} <= {q.name for q in static_queues()}


def test_families_are_listed_read_and_stopped_in_registry_order() -> None:
    from orchestrator import families

    assert families.names() == ["turn", "job", "subagent", "reminder"]
    sid = "sess_a"
    items = [
        ActivityItem("reminder", "r1", "", sid),
        ActivityItem("subagent", "sess_b", "", "sess_b"),
        ActivityItem("job", "j1", "", sid, "h1"),
        ActivityItem("turn", "t1", "", sid),
        ActivityItem("job", "j2", "", sid, None),
    ]
    assert [(m.task, m.queue) for m in stop_messages(sid, items)] == [
        ("turn.stop", "turn.ctl"),
        ("job.stop", "job.ctl.h1"),
        ("job.stop", "job.ctl"),
        ("subagent.stop", "subagent.ctl"),
        ("reminder.stop", "reminder.ctl"),
    ]
