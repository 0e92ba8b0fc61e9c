"""The deterministic simulation (``tests/simulation/``): the suite's share of schedules, proof
that it finds deliberate bugs, and the defects it found, each kept as a test.

Hypothesis draws each schedule's decisions (derandomized: the same schedules on every run, so
a failure here is never a flake; ``make simulate`` explores new seeds). A failure shows the
minimal schedule Hypothesis shrank it to, as a trace of steps.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_redis_lock.backends import backend_of
from django_redis_lock.core import flows
from django_redis_lock.core.lease import OwnerRecord
from django_redis_lock.primitives.keys import lock_keys
from tests.simulation import (
    FAULTS_ON,
    WORKLOADS,
    ClusterSplit,
    Faults,
    HypothesisChoices,
    SeededChoices,
    ServerWorld,
    SimulationFailed,
    Stalled,
    combinations,
    run_schedule,
    simulated_scripts,
    simulated_topology,
)
from tests.simulation.mutations import MUTATIONS, patch_for
from tests.support.helpers import wait_until

# The suite's share: this many schedules per workload and topology, with faults and without;
# fewer on a quorum, whose waiters poll (hundreds of steps to a schedule): 1,920 + 200.
SCHEDULES = {"server": 80, "cluster": 80, "quorum": 20}


@pytest.fixture(scope="module")
def server_world(redis_url: str) -> Any:
    world = ServerWorld(redis_url)
    yield world
    world.stop()


@pytest.fixture(scope="module")
def cluster_world(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A private cluster of its own. Its slot stays put here (``ClusterWorld``: moves are
    ``make simulate``'s until the simulated cluster's own ownership flips are fixed)."""
    directory = str(tmp_path_factory.mktemp("simulated-cluster"))
    world = simulated_topology("cluster", directory, moves=False)
    yield world
    world.stop()


@pytest.fixture(scope="module")
def quorum_world(tmp_path_factory: pytest.TempPathFactory) -> Any:
    world = simulated_topology("quorum", str(tmp_path_factory.mktemp("simulated-quorum")))
    yield world
    world.stop()


@pytest.mark.parametrize("faults", [Faults(), FAULTS_ON], ids=["no-faults", "faults"])
@pytest.mark.parametrize(("topology", "workload"), combinations(WORKLOADS))
def test_every_schedule_keeps_the_invariants(
    request: pytest.FixtureRequest, topology: str, workload: str, faults: Any
) -> None:
    world = request.getfixturevalue(f"{topology}_world")

    @settings(
        max_examples=SCHEDULES[topology],
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(st.data())
    def schedule(data: Any) -> None:
        run_schedule(world, workload, HypothesisChoices(data), faults)

    schedule()


def _trace_of(world: Any, seed: int) -> list[str]:
    simulation = run_schedule(world, "many", SeededChoices(seed), FAULTS_ON)
    # (A bare SET's lease carries the client's wall clock, the one thing not simulated.)
    return [re.sub(r"\|\d{13}\|", "|since|", line) for line in simulation.trace.lines]


def test_a_seed_replays_the_same_schedule(server_world: Any) -> None:
    for seed in (3, 11, 40):
        assert _trace_of(server_world, seed) == _trace_of(server_world, seed)


# Each deliberate bug is found searching seeds from ``first``, within ``bound`` schedules: the
# issue's bounds (the double run within 1,000 schedules, the others within 10,000). A search
# from 0 finds them at seeds 15, 6, 1, 3,775, 0 and 12: the late push's starts near its own.
@pytest.mark.parametrize(
    ("mutation", "first", "bound"),
    [
        ("join forgets the result", 0, 1_000),
        ("release ignores the token", 0, 10_000),
        ("extend ignores the token", 0, 10_000),
        ("join forgets when it queued", 3_700, 10_000 - 3_700),
        ("semaphore miscounts", 0, 10_000),
        ("unfair release never serves the starved", 0, 10_000),
    ],
)
def test_the_simulation_finds_a_deliberate_bug(
    redis_url: str, mutation: str, first: int, bound: int
) -> None:
    workload = MUTATIONS[mutation][3]
    world = ServerWorld(redis_url, simulated_scripts(patch_for(mutation)))
    try:
        for seed in range(first, first + bound):
            try:
                run_schedule(world, workload, SeededChoices(seed), FAULTS_ON)
            except SimulationFailed:
                return
    finally:
        world.stop()
    pytest.fail(f"{mutation!r} went unnoticed in {bound} schedules")


def test_the_simulation_finds_an_unfair_waiter_that_does_not_ask_again_soon(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The mark of a waiter that lost the race for a free lock (fair=False) says it asks again
    by LOST_RACE_RETRY_MS, and releases leave the lock free without waking it until then: a
    waiter that blocked as long as ever after it (a flow's bug, not a script's) would leave
    the lock idle with a live waiter in line, which the ledger notices. (A search from 0
    finds it at seed 1,629.)"""
    monkeypatch.setattr(flows, "LOST_RACE_RETRY_MS", 1000)
    world = ServerWorld(redis_url, simulated_scripts())
    try:
        for seed in range(1_600, 10_000):
            try:
                run_schedule(world, "lock", SeededChoices(seed), FAULTS_ON)
            except SimulationFailed as failed:
                noticed = failed.violation.message
                break
        else:
            pytest.fail("a waiter blocking past its mark went unnoticed in 10,000 schedules")
    finally:
        world.stop()
    assert "was left free" in noticed


# -- defects the simulation found ------------------------------------------------------------


class _FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


_RECORD = OwnerRecord(3, 42, "host", "MainThread").encode()


def _plan(keys: Any, token: str, clock: Any, wait: float, **options: Any) -> flows.AcquirePlan:
    """An acquisition of a 3 s lease, its first try a join unless ``options`` say otherwise."""
    options.setdefault("first", "join")
    return flows.AcquirePlan(
        keys=keys, token=token, lease_ms=3000, record=_RECORD, max_wait=wait,
        clock=clock, started=clock(), **options,
    )  # fmt: skip


def _answer(flow: Any, reply: Any) -> Any:
    try:
        return flow.send(reply)
    except StopIteration as stop:
        return stop


def test_a_waiter_that_learns_of_its_grant_after_the_lease_ended_does_not_take_it(redis_client):
    """Minimal trace (lock workload, faults): c3 holds; c1 queues and blocks; c1 PAUSES for
    3 s; c3 releases, handing c1 a lease of 504 ms (until c1's liveness deadline); the lease
    runs out; c3 takes the free lock again; c1 wakes with the wake-up message and was told it
    held the lock beside c3. Now a grant it learns of only after the lease ended by its own
    clock is asked for again, and c3's lease keeps it out."""
    backend = backend_of("default")
    keys = lock_keys("sim-found:paused-waiter", "default")
    clock = _FakeClock()

    def plan(token: str, wait: float) -> flows.AcquirePlan:
        return _plan(keys, token, clock, wait)

    assert isinstance(backend.perform(next(flows.acquire(plan("c3", 0)))), list)
    waiter = flows.acquire(plan("c1", 5))
    block = next(waiter)  # join.lua with its block: queued
    joined = backend.perform(block.first)
    assert int(joined[0]) == 0
    release = flows.release(keys, "c3", "c1")
    assert _answer(release, backend.perform(next(release))).value == 0  # handed to c1, pushed
    message = redis_client.lpop(keys.wake("c1"))
    assert message is not None
    # c1 was paused: its handed lease ran out, and c3 took the free lock again.
    redis_client.delete(keys.lease)
    assert isinstance(backend.perform(next(flows.acquire(plan("c3-again", 0)))), list)
    clock.now += 10  # c1 wakes, 10 s later by its clock
    step = _answer(waiter, (joined, message))
    while not isinstance(step, StopIteration):
        step = _answer(waiter, backend.perform(step))
    assert not isinstance(step.value, flows.Acquired)
    assert redis_client.get(keys.lease).startswith(b"c3-again|")


def test_a_wake_up_pushed_after_its_lease_ended_is_not_taken_for_a_grant(redis_client):
    """Minimal trace (fenced workload, faults; campaign seed 4917): c1 holds, c2 queues; c1's
    release hands c2 the lease and must push the wake-up itself, but STALLS; the handed lease
    runs out; c2's block ends; c1's push lands; c3 takes the free lock; c2 joins again and
    pops that push, and was told it held the lock beside c3. Now a message handed before a
    waiter's latest join is known to be late (that join would have found the lease its own)."""
    backend = backend_of("default")
    keys = lock_keys("sim-found:late-push", "default")
    clock = _FakeClock()

    def plan(token: str, wait: float) -> flows.AcquirePlan:
        return _plan(keys, token, clock, wait, fencing=True)

    assert int(backend.perform(next(flows.acquire(plan("c1", 0))))[0]) == 1
    waiter = flows.acquire(plan("c2", 5))
    block = next(waiter)
    joined = backend.perform(block.first)
    assert int(joined[0]) == 0  # queued
    release = flows.release(keys, "c1", "")  # expects nobody: the push is its own round trip
    push = _answer(release, backend.perform(next(release)))
    assert (push.script, push.keys) == ("wake", (keys.wake("c2"),))  # ...and c1 stalls before it
    redis_client.delete(keys.lease)  # the lease handed to c2 runs out
    block = _answer(waiter, (joined, None))  # c2's block ends: it will join again
    backend.perform(push)  # the stalled push lands
    assert int(backend.perform(next(flows.acquire(plan("c3", 0))))[0]) == 1  # c3 takes it
    rejoined = backend.perform(block.first)
    assert int(rejoined[0]) == 0  # queued behind c3
    late = redis_client.lpop(keys.wake("c2"))  # what its block pops at once
    assert late is not None
    step = _answer(waiter, (rejoined, late))
    assert not isinstance(step, StopIteration)  # not acquired: it waits on, in line
    assert redis_client.get(keys.lease).startswith(b"c3|")


def test_a_take_whose_reply_never_came_gives_back_its_lease_unless_it_took_a_reservation():
    """Minimal trace (task workload, faults; campaign seed 362, with the give-back first made
    for every take): c1 reserves the key for job j1; c2, j1's run, takes the reservation over,
    and its reply times out; the give-back sent after it deleted the job's key, and c4 reserved
    it for job j2 while j1 was still to run. A take gives its lease back after a lost reply
    (not held by nobody for a whole lease), except one that took a job's reservation over."""
    keys = lock_keys("sim-found:give-back", "default")

    def first_request(**options: Any) -> Any:
        return next(flows.acquire(_plan(keys, "j1~c2", _FakeClock(), 0, first="take", **options)))

    assert first_request(fencing=True).give_back is not None
    assert first_request(want_result=True, job=True, takeover=("j1~queued|",)).give_back is None


def test_a_failure_after_a_server_expired_a_key_by_its_own_clock_is_the_worlds(redis_url):
    """A machine that stalls the simulation (paused, starved) lets a server expire a key by its
    own clock, cutting a lease short that no client ended: what fails then is the world's
    (``Stalled``, run again by ``make simulate``), never reported as the protocol's. Here the
    expiries are told, and a deliberate bug makes the schedule fail."""

    class Stalling(ServerWorld):
        looks = 0

        def expirations(self) -> int:
            self.looks += 1  # (one more at each look: an expiry in between)
            return self.looks

    mutation = "extend ignores the token"
    world = Stalling(redis_url, simulated_scripts(patch_for(mutation)))
    try:
        for seed in range(100):
            try:  # (a SimulationFailed goes on up: it should have been called the world's)
                run_schedule(world, MUTATIONS[mutation][3], SeededChoices(seed), FAULTS_ON)
            except Stalled:
                return
    finally:
        world.stop()
    pytest.fail("no schedule failed")


def test_the_worlds_expiry_count_counts_a_key_the_server_expired(redis_url, redis_client):
    world = ServerWorld(redis_url)
    try:
        before = world.expirations()
        redis_client.set("drl-sim:{sim}:gone", 1, px=1)
        wait_until(lambda: world.expirations() > before, 10, "the server to expire the key")
    finally:
        world.stop()


def test_a_node_that_claims_the_slot_as_well_is_the_clusters_split(tmp_path):
    """A second node acting as the slot's owner (Redis Cluster's gossip brought an older
    claim back) is told by the probe after the step, as the world's fault (``ClusterSplit``),
    before any outcome of the step is judged."""
    world = simulated_topology("cluster", str(tmp_path), moves=False)
    try:
        world.reset(0)
        world.observe(0, 0, [])  # one owner: no complaint
        other = next(node for node in world.nodes if node is not world.home())
        other_id = other.client.execute_command("CLUSTER", "MYID")
        other.client.execute_command("CLUSTER", "SETSLOT", world.slot, "NODE", other_id)
        with pytest.raises(ClusterSplit, match="says"):
            world.observe(0, 0, [])
    finally:
        world.stop()
