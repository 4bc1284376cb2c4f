"""Benchmark 9's memory figure (``bench/memory.py``): a hash table doubling inside the measured
span is not read as bytes per session."""

from __future__ import annotations

import pytest

from bench.memory import Step, Table, dict_slots, per_session

pytestmark = pytest.mark.unit

MIB = 1 << 20


def _series(doubling_at: int | None, *, named: bool) -> list[Step]:
    """Ten steps of 10,000 sessions growing 950-959 bytes each; at ``doubling_at`` a 16 MiB
    bucket array more (named in the step when ``named``)."""
    steps = [Step(10_000, (950 + i) * 10_000) for i in range(10)]
    if doubling_at is not None:
        doubled = steps[doubling_at]
        steps[doubling_at] = Step(
            doubled.sessions, doubled.growth + 16 * MIB, ("idx:all",) if named else ()
        )
    return steps


@pytest.mark.parametrize("named", [True, False])
def test_a_step_with_a_doubling_is_left_out_and_the_others_median_taken(named: bool) -> None:
    # Given ten steps, the fifth holding a 16 MiB bucket array (named by the counts or not)
    steps = _series(4, named=named)

    figure = per_session(steps, [])

    # Then the figure is the median of the other nine (950..959 without 954: 955), while the
    # whole span reads the doubling as about 168 bytes a session more
    assert figure.left_out == (4,)
    assert figure.steady == 955
    assert figure.per_session == 955
    assert figure.span == pytest.approx(954.5 + 16 * MIB / 100_000)


def test_a_step_beside_a_fork_child_is_left_out() -> None:
    steps = _series(None, named=False)
    steps[9] = Step(10_000, 900 * 10_000, forked=True)  # resizing held back by the child

    assert per_session(steps, []).left_out == (9,)


def test_each_session_pays_its_share_of_the_tables_buckets() -> None:
    # Given a fleet-wide index of 1,000,000 entries in 2^20 slots, and a keyspace to which
    # each session adds 1.2 keys (2^21 slots, 1,500,000 keys)
    tables = [
        Table("idx:all", 1 << 20, 1_000_000, 1.0),
        Table("keyspace", 1 << 21, 1_500_000, 1.2),
    ]

    figure = per_session(_series(None, named=False), tables)

    # Then the figure is the quiet median plus 8 bytes a slot per entry, per entry added
    share = 8 * (1 << 20) / 1_000_000 + 8 * (1 << 21) / 1_500_000 * 1.2
    assert figure.buckets == pytest.approx(share)
    assert figure.per_session == pytest.approx(954.5 + share)


def test_no_quiet_step_is_an_error_not_a_figure() -> None:
    with pytest.raises(ValueError):
        per_session([Step(10, 1000, ("keyspace",)), Step(10, 1000, forked=True)], [])


def test_a_dict_that_only_grew_has_the_next_power_of_two_slots() -> None:
    assert [dict_slots(n) for n in (0, 1, 4, 5, 1_000_000, 1 << 20, (1 << 20) + 1)] == [
        0,
        4,
        4,
        8,
        1 << 20,
        1 << 20,
        1 << 21,
    ]
