"""The direct handoff's races, forced step by step against a real server.

A release hands the lease to the first live waiter and tells it so in a wake-up message; that
message can arrive late (pushed in a second round trip when the release did not expect that
waiter), be popped by a block whose reply the client abandoned, or never arrive (the push
failed). Whatever became of it, a waiter that finds the lease handed to it must learn from Redis
what the message would have said, above all that the guarded work is done already: a waiter that
asked for the result must never run the work a second time.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from typing import Any

import pytest

from django_redis_lock import Lock, lock_contended, run_once
from django_redis_lock.backends import backend_of
from django_redis_lock.backends.scripts import JOIN, PERMIT_ACQUIRE, RELEASE, TAKE, Script
from django_redis_lock.backends.server import ServerBackend
from django_redis_lock.core import flows
from django_redis_lock.core.lease import OwnerRecord
from django_redis_lock.core.permits import PermitKeys
from django_redis_lock.core.requests import Block, Eval
from django_redis_lock.primitives.keys import lock_keys
from django_redis_lock.primitives.strays import Strays
from tests.support import workers
from tests.support.helpers import wait_until

SPAWN = multiprocessing.get_context("spawn")

RECORD = OwnerRecord(10, 42, "host", "MainThread").encode()


def _join(
    client: Any, keys: Any, token: str, flags: str = "d", liveness_ms: int = 3000,
    join: Script = JOIN,
) -> Any:  # fmt: skip
    return join(
        client,
        (keys.lease, keys.queue, keys.waiters, keys.wake(token), keys.result),
        (token, 10_000, RECORD, flows.QUEUE, flags, liveness_ms),
    )


def test_a_waiter_that_rejoins_before_its_wake_up_arrives_is_told_the_work_is_done(
    redis_client,
):
    keys = lock_keys("handoff-done", "default")
    assert TAKE(redis_client, (keys.lease, keys.result), ("holder", 10_000, RECORD, "d"))[0] == 1
    assert _join(redis_client, keys, "waiter")[0] == 0  # queued
    # The release did not expect this waiter: it hands it the lease and leaves the wake-up to
    # its caller's next round trip, which has not happened yet.
    arguments = ("holder", "", "", b"the response", 60_000)  # (fair; the result kept a minute)
    reply = RELEASE(redis_client, keys.release_keys(""), arguments)
    assert reply[0] == 2
    assert reply[1] == b"waiter"
    assert reply[2].split(b"|")[2] == b"1"  # the message says: done
    # The waiter's block ended (its cap) before the push: it asks again.
    rejoined = _join(redis_client, keys, "waiter")
    assert rejoined[0] == 1  # the lease is its own...
    fence, lease_ms, done, _handed_at, next_token = rejoined[3].decode().split("|", 4)
    assert done == "1"  # ...and it knows the work is done: it passes it on, never runs it
    assert (fence, next_token) == ("0", "")
    # It is alive (it asked): the short handed lease became its whole lease.
    assert int(lease_ms) == int(rejoined[2]) == 10_000
    assert 9_000 < redis_client.pttl(keys.lease) <= 10_000


def test_a_rebuilt_message_names_the_fence_and_the_next_waiter(redis_client):
    keys = lock_keys("handoff-next", "default")
    assert TAKE(redis_client, (keys.lease,), ("holder", 10_000, RECORD, "f"))[0] == 1
    assert _join(redis_client, keys, "first", "f")[0] == 0
    assert _join(redis_client, keys, "second", "f")[0] == 0
    reply = RELEASE(redis_client, keys.release_keys(""), ("holder", ""))
    sent = reply[2].decode().split("|", 4)
    redis_client.delete(keys.wake("first"))  # the wake-up was lost
    rejoined = _join(redis_client, keys, "first", "f")
    assert rejoined[0] == 1
    rebuilt = rejoined[3].decode().split("|", 4)
    assert rebuilt[0] == sent[0] == rejoined[1].decode()  # the fence the release gave
    assert rebuilt[2] == sent[2] == "0"  # not done
    assert rebuilt[4] == sent[4] == "second"  # who is next
    assert int(rebuilt[3]) > int(sent[3])  # made again after it was handed


class _Steps:
    """Runs one flow's requests on the real server, one at a time, as the test says."""

    def __init__(self, flow: Any) -> None:
        self.flow = flow
        self.backend: ServerBackend = backend_of("default")
        self.request: Any = next(flow)
        self.outcome: Any = None

    def perform(self, reply: Any = None) -> Any:
        return self.backend.perform(self.request) if reply is None else reply

    def answer(self, reply: Any) -> None:
        try:
            self.request = self.flow.send(reply)
        except StopIteration as stop:
            self.request, self.outcome = None, stop.value

    def block_times_out(self) -> None:
        """The request is a join sent with a block: the join runs, the block ends empty."""
        assert isinstance(self.request, Block)
        assert self.request.first is not None
        self.answer((self.backend.perform(self.request.first), None))


def _plan(keys: Any, token: str, **options: Any) -> flows.AcquirePlan:
    return flows.AcquirePlan(
        keys=keys, token=token, lease_ms=10_000, record=RECORD, max_wait=10.0,
        clock=time.monotonic, started=time.monotonic(), **options,
    )  # fmt: skip


def test_a_waiter_for_the_result_never_runs_the_work_when_its_wake_up_is_late(redis_client):
    keys = lock_keys("handoff-flows", "default")
    holder = _Steps(flows.acquire(_plan(keys, "holder", first="take", want_result=True)))
    holder.answer(holder.perform())
    assert isinstance(holder.outcome, flows.Acquired)

    waiter = _Steps(flows.acquire(_plan(keys, "waiter", first="take", want_result=True)))
    waiter.answer(waiter.perform())  # take.lua: held
    waiter.block_times_out()  # queued; its first block ends at its cap, nothing pushed

    release = _Steps(
        flows.release(keys, "holder", "", result=b"the response", result_ttl_ms=60_000)
    )
    release.answer(release.perform())  # release.lua hands the lease over...
    assert release.request.script == "wake"  # ...and its push is held back here

    waiter.block_times_out()  # the waiter asks again before the push
    # Handed the lock after the work was done: it reads the result and passes the lock on.
    while waiter.request is not None:
        assert not (isinstance(waiter.request, Eval) and waiter.request.script == "take")
        waiter.answer(waiter.perform())
    assert waiter.outcome == flows.Done(b"the response")

    release.answer(release.perform())  # the late push lands on a waiter that is gone
    assert release.outcome == 0
    assert not redis_client.exists(keys.lease)


@pytest.fixture
def held_back_wake_ups(monkeypatch):
    """Wake-up pushes (a release's second round trip) wait until the test lets them go."""
    go = threading.Event()
    held = threading.Event()
    perform = ServerBackend.perform

    def delayed(self: ServerBackend, request: Any) -> Any:
        if isinstance(request, Eval) and request.script == "wake":
            held.set()
            go.wait(30)
        return perform(self, request)

    monkeypatch.setattr(ServerBackend, "perform", delayed)
    monkeypatch.setattr(flows, "BLOCK_CAP", 0.2)  # blocks end sooner: the race comes sooner
    return held, go


def test_run_once_runs_its_body_once_when_the_wake_up_is_late(held_back_wake_ups):
    held, go = held_back_wake_ups
    runs: list[str] = []
    inside = threading.Event()
    leave = threading.Event()

    @run_once("late-wake-up", ttl=60, wait=10)
    def handle(who: str) -> str:
        runs.append(who)
        inside.set()
        leave.wait(10)
        return who

    first = threading.Thread(target=handle, args=("first",))
    first.start()
    assert inside.wait(10)
    answers: list[Any] = []
    second = threading.Thread(target=lambda: answers.append(handle("second")))
    second.start()
    # The second waits in line (a few blocks of 0.2 s); the first finishes, its release hands
    # the lease to the second and its push is held back: the second asks again meanwhile.
    keys = lock_keys("once:late-wake-up", "default")
    client = backend_of("default").client
    wait_until(lambda: client.llen(keys.queue) == 1, 10, "the second in line")
    leave.set()
    assert held.wait(10)
    second.join(10)
    go.set()
    first.join(10)
    assert not second.is_alive()
    assert not first.is_alive()
    assert runs == ["first"]
    assert answers == [None]  # a duplicate: run_once answers None
    assert not client.exists(keys.lease)  # and the lock it was handed, it passed on


# -- a waiter that died in the queue holds up those behind it only while it counts as alive --


def test_a_lease_handed_to_a_waiter_ends_by_its_liveness_deadline(redis_client, server_clock):
    """Released 300 ms before the queue would count the waiter dead: it is handed the lease
    for those 300 ms, not the 3 s (HANDOFF_MS) of a handed lease. On the driven server clock:
    the length is the one the release set, exactly (read back against Redis's own clock, a
    loaded machine moved it by a few ms between two commands)."""
    take, join, release = (server_clock.script(name) for name in ("take", "join", "release"))
    keys = lock_keys("handoff-dead", "default")
    assert take(redis_client, (keys.lease,), ("holder", 10_000, RECORD, ""))[0] == 1
    # The queue counts this waiter alive for 1.5 s more (it may have died just after asking).
    assert _join(redis_client, keys, "waiter", "", liveness_ms=1500, join=join)[0] == 0
    deadline = int(redis_client.hget(keys.waiters, "waiter").split(b"|", 1)[0])
    assert deadline == server_clock.now_ms + 1500
    server_clock.advance(1200)
    reply = release(redis_client, keys.release_keys(""), ("holder", ""))
    assert reply[:2] == [2, b"waiter"]  # handed (the release did not expect it)
    handed_ms = int(reply[2].split(b"|")[1])  # the wake-up message: fence|ms|done|when|next
    assert handed_ms == deadline - server_clock.now_ms == 300
    assert 0 < redis_client.pttl(keys.lease) <= 300
    assert redis_client.get(keys.lease).startswith(b"waiter|")


def test_a_waiter_is_told_when_the_live_waiter_ahead_of_it_is_counted_dead(redis_client):
    keys = lock_keys("handoff-ahead", "default")
    assert TAKE(redis_client, (keys.lease,), ("holder", 10_000, RECORD, ""))[0] == 1
    first = _join(redis_client, keys, "first", "", liveness_ms=2500)
    assert first[0] == 0
    assert int(first[3]) == 0
    assert 9_000 < int(first[1]) <= 10_000  # first in line: the holder's lease is what it waits on
    deadline = int(redis_client.hget(keys.waiters, "first").split(b"|", 1)[0])
    # (Read before the join: the join's own clock is no earlier, however loaded the machine.)
    seconds, micros = redis_client.time()
    now = seconds * 1000 + micros // 1000
    second = _join(redis_client, keys, "second", "")
    assert second[0] == 0
    assert 0 < int(second[3]) <= deadline - now  # its block ends by then
    assert int(second[3]) <= 2500
    assert int(second[1]) == 0  # (not read: should the lease end, the first takes the lock)
    # A waiter ahead whose deadline passed already is passed over: the one after it counts.
    redis_client.hset(keys.waiters, "first", b"1|" + RECORD.encode())
    third = _join(redis_client, keys, "third", "")
    second_deadline = int(redis_client.hget(keys.waiters, "second").split(b"|", 1)[0])
    assert 2500 < int(third[3]) <= second_deadline - now


def test_a_waiter_for_a_permit_is_told_of_the_live_waiter_ahead_too(redis_client):
    keys = PermitKeys.of("sem{handoff-ahead}")

    def acquire(token: str) -> Any:
        wake = keys.wake(token)
        return PERMIT_ACQUIRE(
            redis_client, (keys.holders, keys.owners, keys.queue, keys.waiters, wake),
            (token, 10_000, RECORD, flows.QUEUE, "", 2000, 1),
        )  # fmt: skip

    assert acquire("holder")[0] == 1  # the one permit
    first = acquire("first")
    assert (first[0], first[3]) == (0, 0)  # queued, nobody ahead
    second = acquire("second")
    assert second[0] == 0
    assert 0 < int(second[3]) <= 2000


def _server_ms(client: Any) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def test_a_waiter_killed_in_line_holds_up_the_next_only_while_it_counts_as_alive(
    redis_url, redis_client
):
    """SIGKILL a queued waiter, then release: the queue counts it alive until its liveness
    deadline (3 s after it last asked), and may hand it the lease until then, but the live
    waiter behind it gets the lock, not a lease that outlives the dead one's liveness. The
    exact bounds, which depend on when the release comes, are on the driven server clock
    above (a lease handed to it ends at its deadline; the one behind is told when that is)."""
    name = "dead-in-line"
    keys = lock_keys(name, "default")
    holder = Lock(name)
    assert holder.acquire(wait=0)
    doomed = SPAWN.Process(target=workers.wait_in_line, args=(redis_url, name))
    doomed.start()
    try:
        wait_until(lambda: redis_client.llen(keys.queue) == 1, 30, "the doomed waiter in line")
        got: list[tuple[int, bytes]] = []

        def live_waiter() -> None:
            with Lock(name, wait=60):
                got.append((_server_ms(redis_client), redis_client.get(keys.lease)))

        behind = threading.Thread(target=live_waiter, daemon=True)
        behind.start()
        wait_until(lambda: redis_client.llen(keys.queue) == 2, 30, "the live waiter behind it")
        dead = redis_client.lindex(keys.queue, 0)
        os.kill(doomed.pid, signal.SIGKILL)
        doomed.join(30)
        # Its last word: the liveness deadline it asked for (server ms), 3 s after it asked.
        deadline = int(redis_client.hget(keys.waiters, dead).split(b"|", 1)[0])
        last_asked = deadline - int((flows.BLOCK_CAP + flows.LIVENESS_SLACK) * 1000)
        holder.release()
        behind.join(60)
        [(acquired_at, lease)] = got
        assert not lease.startswith(dead + b"|")
        # About 3 s after its last word, by its deadline. Held up for the holder's lease
        # (30 s), or until the dead one timed out (60 s), it would be far later: the bound
        # leaves a loaded machine 10 s of scheduling and still tells those apart.
        assert acquired_at - last_asked < 3000 + 10_000, acquired_at - last_asked
    finally:
        doomed.kill()
        doomed.join(10)


def _take_and_release(name: str) -> None:
    with Lock(name, wait=30):
        pass


def test_lock_contended_is_sent_when_the_waiter_queues(monkeypatch):
    """Not when its first block ends (up to 2 s later): the contended metric and the admin's
    waiters are read from it."""
    monkeypatch.setattr(flows, "BLOCK_CAP", 60.0)  # a first block that would outlast the test
    seen = threading.Event()

    def on_contended(**kwargs: Any) -> None:
        if kwargs["name"] == "queued-now":
            seen.set()

    lock_contended.connect(on_contended, weak=False, dispatch_uid="queued-now")
    try:
        with Lock("queued-now", timeout=60):
            waiter = threading.Thread(target=_take_and_release, args=("queued-now",))
            waiter.start()
            assert seen.wait(10)  # the waiter is still blocked in its first block
            assert waiter.is_alive()
        waiter.join(10)
    finally:
        lock_contended.disconnect(dispatch_uid="queued-now")


# -- a waiter cut off in the line: its place is given up at the process's next acquisition --


def test_a_place_left_in_line_is_given_up_by_the_next_acquisition(redis_client):
    keys = lock_keys("stray", "default")
    assert TAKE(redis_client, (keys.lease,), ("holder", 10_000, RECORD, ""))[0] == 1
    left: list[tuple[str, float]] = []
    waiter = _Steps(
        flows.acquire(
            _plan(
                keys, "cut-off", first="join", strayed=lambda p, t, until: left.append((t, until))
            )
        )
    )
    waiter.block_times_out()  # queued
    assert redis_client.lrange(keys.queue, 0, -1) == [b"cut-off"]
    # The connection is cut while it blocks, and Redis cannot be reached to step out either.
    leave = waiter.flow.throw(ConnectionError("cut"))
    assert isinstance(leave, Eval)
    assert leave.args[3] == flows.LEAVE
    with pytest.raises(ConnectionError):
        waiter.flow.throw(ConnectionError("refused"))
    [(token, until)] = left
    assert token == "cut-off"
    assert until > time.monotonic()  # the queue counts it alive for a while yet
    assert redis_client.lrange(keys.queue, 0, -1) == [b"cut-off"]  # a place nobody will take
    # Redis is back: the next acquisition of the lock in this process steps it out first.
    again = _Steps(flows.acquire(_plan(keys, "again", first="join", strays=tuple(left))))
    assert isinstance(again.request, Eval)
    assert again.request.args[:1] == ("cut-off",)
    assert again.request.args[3] == flows.LEAVE
    again.answer(again.perform())
    assert redis_client.lrange(keys.queue, 0, -1) == []
    again.block_times_out()  # and queues itself, first in line
    assert redis_client.lrange(keys.queue, 0, -1) == [b"again"]


def test_the_places_left_in_a_lock_line_are_kept_per_lock_until_they_lapse():
    left = Strays()
    one, other = (flows.AcquirePlan(lock_keys(n, "default"), "t", 1, "", 1.0, time.monotonic)
                  for n in ("one", "other"))  # fmt: skip
    left.left(one, "a", 10.0)
    left.left(one, "b", 5.0)
    left.left(other, "c", 10.0)
    assert left.take(one.keys.lease, now=6.0) == (("a", 10.0),)  # "b" lapsed
    assert left.take(one.keys.lease, now=6.0) == ()  # given to one acquisition only
    assert left.take(other.keys.lease, now=11.0) == ()  # lapsed
    assert left.take(other.keys.lease, now=0.0) == ()  # and forgotten
