"""lock_many against a real redis-server: all or nothing, one order whatever order is given, one
deadline, nothing left held after a timeout, an error or a cancellation."""

from __future__ import annotations

import asyncio
import pickle
import random
import threading
import time

import pytest
import redis

from django_redis_lock import (
    Lock,
    LockBackendError,
    LockLost,
    LockNotAcquired,
    LockNotOwned,
    lock_many,
)
from django_redis_lock.backends import ServerBackend
from django_redis_lock.core.requests import Eval
from django_redis_lock.primitives.keys import hash_tag, lock_keys
from tests.support.helpers import keys_left, lease_token, run_async, wait_until
from tests.testapp.models import Account


def lease(name):
    return lock_keys(name, "default").lease


def nobody_waits(client, names) -> bool:
    return not any(client.llen(lock_keys(name, "default").queue) for name in names)


# -- the basics ------------------------------------------------------------------------------


def test_taken_in_canonical_order_and_released(redis_client):
    group = lock_many(["transfer:b", "transfer:a", "transfer:b"])
    assert group.names == ("transfer:a", "transfer:b")  # sorted, duplicates once
    with group as held:
        assert held is group
        assert group.held
        for lock in group.locks:
            assert lease_token(redis_client, lease(lock.name)) == lock.token
        assert group.owned()
    assert not group.held
    assert keys_left(redis_client) == []


def test_all_or_nothing(redis_client):
    other = Lock("many:b")
    assert other.acquire()
    group = lock_many(["many:c", "many:a", "many:b"], wait=0)
    claim = group.claim()
    assert not claim.acquired
    assert isinstance(claim.refusal, LockNotAcquired)
    assert claim.refusal.name == "many:b"  # the lock that was held
    assert not redis_client.exists(lease("many:a"), lease("many:c"))  # a was given back
    with pytest.raises(LockNotAcquired), group:
        pass
    other.release()
    assert group.acquire()
    group.release()


def test_waits_in_line_for_a_held_member_then_holds_all(redis_client):
    other = Lock("line:b")
    assert other.acquire()
    group = lock_many(["line:a", "line:b"], wait=30)
    seen = []

    def take_then_release():
        if group.acquire():
            seen.extend(lease_token(redis_client, lease(lock.name)) for lock in group.locks)
            seen.extend(lock.token for lock in group.locks)
            group.release()

    thread = threading.Thread(target=take_then_release)
    thread.start()
    queue = lock_keys("line:b", "default").queue
    wait_until(lambda: redis_client.llen(queue) == 1, 10, "the group in b's line")
    assert redis_client.exists(lease("line:a"))  # held while it waits: ordered locking
    with pytest.raises(LockNotOwned):
        group.release()  # the group is the other thread's
    other.release()
    thread.join(30)
    assert len(seen) == 4
    assert seen[:2] == seen[2:]
    assert None not in seen
    assert keys_left(redis_client) == []


def test_one_deadline_for_all(redis_client):
    """The wait is shared: a member taken late gets what is left of it."""
    other = Lock("deadline:b")
    assert other.acquire()
    group = lock_many(["deadline:a", "deadline:b"])
    times = iter([100.0, 104.9])  # start; then, after a was taken, 4.9 s of 5 gone
    group.clock = lambda: next(times)
    claim = group.claim(wait=5)
    assert not claim.acquired
    assert claim.refusal.waited == pytest.approx(0.1)
    assert not redis_client.exists(lease("deadline:a"))
    other.release()


def test_an_error_midway_gives_back_what_was_taken(redis_client, planted):
    key = lease("broken:b")
    redis_client.hset(key, "not", "a lock")  # someone else's key, of the wrong type
    planted.add(key)
    group = lock_many(["broken:a", "broken:b", "broken:c"], wait=0)
    with pytest.raises(LockBackendError):
        group.acquire()
    assert not redis_client.exists(lease("broken:a"), lease("broken:c"))
    assert redis_client.hgetall(key) == {b"not": b"a lock"}  # and theirs is untouched


def test_losing_one_member_loses_the_group(redis_client, settings):
    settings.DJANGO_REDIS_LOCK_TIMEOUT = 0.3
    group = lock_many(["lost:a", "lost:b"])
    with pytest.raises(LockLost), group:
        redis_client.delete(lease("lost:b"))  # force-released behind its back
        wait_until(lambda: group.lost, 10, "renewal to notice")
        with pytest.raises(LockLost):
            group.ensure_held()
    assert not redis_client.exists(lease("lost:a"))  # the other member was released


def test_reentrant_members_are_entered_again(redis_client):
    outer = Lock("re:a", reentrant=True)
    with outer:
        with lock_many(["re:b", "re:a"], reentrant=True) as group:
            assert group.locks[0].token == outer.token  # the same hold, a level more
        assert lease_token(redis_client, lease("re:a")) == outer.token  # still the outer's
    assert not redis_client.exists(lease("re:a"))


def test_acquired_twice_is_an_error():
    group = lock_many(["twice:a", "twice:b"])
    with group:
        with pytest.raises(Exception, match="already held"):
            group.acquire()
        assert group.owned()  # the failed second try gave back nothing of the first


def test_pickled_copy_is_unheld():
    group = lock_many(["pickle:a", "pickle:b"], wait=3, label="transfer")
    with group:
        copy = pickle.loads(pickle.dumps(group))
        assert copy.names == group.names
        assert not copy.held
        assert copy.locks[0].label == "transfer"


@pytest.mark.parametrize(
    ("names", "options", "error"),
    [
        ("account:1", {}, TypeError),
        ([], {}, ValueError),
        ([1, 2], {}, TypeError),
        (["a", ""], {}, ValueError),
        (["a", "b"], {"wait": -1}, ValueError),
        (["a", "b"], {"timeout": 0}, ValueError),
        (["a", "b"], {"label": 5}, TypeError),
    ],
)
def test_bad_input_is_a_typed_error(names, options, error):
    with pytest.raises(error):
        lock_many(names, **options)


def test_names_with_one_hash_tag_share_a_slot():
    assert hash_tag("account:{bank-1}:42") == "bank-1"
    assert hash_tag("account:{}:42") is None
    assert hash_tag("plain") is None
    first, second = lease("account:{bank-1}:1"), lease("account:{bank-1}:2")
    assert first != second
    assert redis.crc.key_slot(first.encode()) == redis.crc.key_slot(second.encode())


def test_tagged_names_are_listed_and_matched(redis_client):
    from django_redis_lock.registry.locks import iter_locks

    with lock_many(["account:{bank-1}:1", "account:{bank-1}:2", "plain:bank-1"]):
        assert sorted(info.name for info in iter_locks()) == [
            "account:{bank-1}:1", "account:{bank-1}:2", "plain:bank-1",
        ]  # fmt: skip
        assert sorted(info.name for info in iter_locks(match="bank-1")) == [
            "account:{bank-1}:1", "account:{bank-1}:2", "plain:bank-1",
        ]  # fmt: skip


# -- asyncio and cancellation ----------------------------------------------------------------


def test_async_api(redis_client):
    async def main():
        async with lock_many(["async:b", "async:a"]) as group:
            assert group.held
            await group.aextend(5)
            assert 4 < redis_client.pttl(lease("async:a")) / 1000 <= 5
        return group

    group = run_async(main())
    assert not group.held
    assert keys_left(redis_client) == []


@pytest.mark.parametrize("busy", [0, 1, 2])
def test_cancelled_while_waiting_at_each_member_leaves_nothing_held(redis_client, busy):
    names = ["cancel:a", "cancel:b", "cancel:c"]
    other = Lock(names[busy])
    assert other.acquire()
    group = lock_many(names, wait=60)
    queue = lock_keys(names[busy], "default").queue

    async def main():
        task = asyncio.create_task(group.aacquire())
        while not redis_client.llen(queue):  # bounded by wait_for(main(), 30) below
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    run_async(asyncio.wait_for(main(), 30))
    assert not group.held
    wait_until(lambda: nobody_waits(redis_client, names), 10, "our place in line given up")
    for name in names[:busy] + names[busy + 1 :]:
        assert not redis_client.exists(lease(name))
    assert lease_token(redis_client, lease(names[busy])) == other.token
    other.release()


def test_cancelled_during_the_script_leaves_nothing_held(redis_client):
    """The script is sent while the server holds writes back (CLIENT PAUSE): cancelled before
    its reply, the acquisition gives back whatever the script took."""
    names = ["paused:a", "paused:b"]
    group = lock_many(names, wait=60)

    async def main():
        redis_client.execute_command("CLIENT", "PAUSE", 500, "WRITE")
        task = asyncio.create_task(group.aacquire())
        await asyncio.sleep(0.1)  # the script is held back by the pause, not by this sleep
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    run_async(asyncio.wait_for(main(), 30))
    wait_until(lambda: not redis_client.exists(*(lease(name) for name in names)), 10, "given back")
    assert not group.held


# -- many threads, random subsets in random orders ----------------------------------------------


def test_eight_threads_random_subsets_never_deadlock_nor_overlap(redis_url, redis_client):
    names = [f"{{bank}}:{index}" for index in range(5)] + [f"plain:{index}" for index in range(5)]
    deadline = time.monotonic() + 10
    overlaps, refused, entries = [], [], []
    counters = redis.Redis.from_url(redis_url)

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        while time.monotonic() < deadline:
            chosen = rng.sample(names, 5)  # a random subset, in a random order
            group = lock_many(chosen, wait=30)
            if not group.acquire():
                refused.append(chosen)  # would be a deadlock: 30 s for microseconds of work
                continue
            try:
                for name in chosen:
                    if counters.incr(f"inside:{names.index(name)}") != 1:
                        overlaps.append(name)
                entries.append(1)
                for name in chosen:
                    counters.decr(f"inside:{names.index(name)}")
            finally:
                group.release()

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not any(thread.is_alive() for thread in threads)
    assert overlaps == []
    assert refused == []
    assert len(entries) > 8
    assert keys_left(redis_client, "lock:*") == []  # idle: nothing left


# -- rows ------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_rows_locked_together_whatever_their_order(redis_client):
    first, second = Account.objects.create(), Account.objects.create()
    group = Account.lock_many([second, first])
    assert group.names == tuple(sorted([first.lock().name, second.lock().name]))
    with group:
        with first.lock():  # re-entrant, as a row's lock is
            pass
        assert all(redis_client.exists(lease(name)) for name in group.names)
    with pytest.raises(TypeError):
        Account.lock_many(first)
    with pytest.raises(TypeError):
        Account.lock_many([object()])


@pytest.mark.django_db
def test_rows_with_a_hash_tag_share_a_slot(monkeypatch):
    monkeypatch.setattr(Account, "get_lock_hash_tag", lambda row: "bank-1")
    first, second = Account.objects.create(), Account.objects.create()
    assert first.lock().name == f"testapp.account:{{bank-1}}:{first.pk}"
    slots = {redis.crc.key_slot(lease(row.lock().name).encode()) for row in (first, second)}
    assert len(slots) == 1


def test_a_release_interrupted_midway_releases_the_others_first(redis_client, monkeypatch):
    """A cancellation (or KeyboardInterrupt) during one member's release does not leave the
    members after it held and renewed: they are released, then the interruption gets through."""
    group = lock_many(["stop:a", "stop:b", "stop:c"])
    assert group.acquire()
    interrupted = group.locks[1]  # released second (last first: c, b, a)

    def release_then_interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(interrupted, "release", release_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        group.release()
    assert not redis_client.exists(lease("stop:a"), lease("stop:c"))
    monkeypatch.undo()
    interrupted.release()


def _group_waited_past_a_lease(redis_client, prefix):
    """``lock_many([a, b], timeout=0.3)`` waiting in b's line (b held by another) until a's
    lease has run out; returns b's holder, the group and the list its claim will be put in."""
    other = Lock(f"{prefix}:b")
    assert other.acquire()
    group = lock_many([f"{prefix}:a", f"{prefix}:b"], timeout=0.3, wait=30)
    outcome = []
    thread = threading.Thread(target=lambda: outcome.append(group.claim()), daemon=True)
    thread.start()
    queue = lock_keys(f"{prefix}:b", "default").queue
    wait_until(lambda: redis_client.llen(queue) == 1, 10, "the group in b's line")
    wait_until(lambda: not redis_client.exists(lease(f"{prefix}:a")), 10, "a's lease to end")
    return other, group, outcome, thread


def test_a_member_that_lapsed_while_a_later_one_was_waited_for_is_not_held(redis_client):
    """Found by the simulation of the library's own code (tests/simulation/runtime/): a member
    taken first, with a fixed lease shorter than the wait for a later one, ran out and was
    another's; the group still said it held both. Now a member taken early gets its lease
    again when the group completes, and the group is not held when it cannot."""
    other, group, outcome, thread = _group_waited_past_a_lease(redis_client, "lapse")
    third = Lock("lapse:a")
    assert third.acquire(wait=0)
    other.release()  # the group takes b, and finds a gone
    thread.join(30)
    assert len(outcome) == 1
    assert not outcome[0].acquired
    assert outcome[0].refusal.name == "lapse:a"
    assert not group.held
    assert lease_token(redis_client, lease("lapse:a")) == third.token  # untouched
    assert not redis_client.exists(lease("lapse:b"))  # given back
    third.release()
    wait_until(lambda: keys_left(redis_client) == [], 10, "nothing left")


def test_a_member_that_ran_out_unclaimed_is_not_held_either(redis_client):
    """The same with nobody taking the member that ran out: its lease is gone from Redis, so
    the extension finds it gone (a lease that ended is no one's to lengthen): not held, and
    nothing left behind."""
    other, group, outcome, thread = _group_waited_past_a_lease(redis_client, "again")
    other.release()
    thread.join(30)
    assert [claim.acquired for claim in outcome] == [False]
    assert not group.held
    assert not redis_client.exists(lease("again:a"), lease("again:b"))
    # (the wake-up b's release pushed ends with its 1 s expiry)
    wait_until(lambda: keys_left(redis_client) == [], 10, "nothing left")


def test_a_refresh_learnt_of_after_its_lease_ended_does_not_hold_the_group(
    redis_client, monkeypatch
):
    """Found by the runtime simulation on a Cluster: the group refreshes a member taken early
    (a fixed lease, half of it gone while b was waited for), and that extension's reply comes
    only after the lease it gave had ended by the group's own clock (here: held back at the
    backend past it). The group said it held a member whose lease it could not count on; now
    it is not held, and gives back what it took."""
    extend = ServerBackend.perform

    def slow_extensions(self, request):
        reply = extend(self, request)
        if isinstance(request, Eval) and request.script == "extend":
            time.sleep(0.5)  # its reply past the 0.3 s it gave, counted from before it
        return reply

    other = Lock("late-refresh:b")
    assert other.acquire()
    group = lock_many(["late-refresh:a", "late-refresh:b"], timeout=0.3, wait=30, auto_renew=False)
    outcome = []

    def claim():
        held = group.claim()
        outcome.append((held, [m.held_until for m in group.locks]))

    thread = threading.Thread(target=claim, daemon=True)
    thread.start()
    queue = lock_keys("late-refresh:b", "default").queue
    wait_until(lambda: redis_client.llen(queue) == 1, 10, "the group in b's line")
    wait_until(lambda: 0 < redis_client.pttl(lease("late-refresh:a")) < 120, 10, "a half gone")
    monkeypatch.setattr(ServerBackend, "perform", slow_extensions)
    other.release()  # the group takes b, refreshes a, and learns of it too late
    thread.join(30)
    ((held, untils),) = outcome
    assert not held.acquired
    assert not group.held
    assert untils == [None, None]  # (given back)
    assert held.refusal.name in group.names  # (one whose lease it cannot count on)
    wait_until(lambda: keys_left(redis_client) == [], 10, "nothing left")
