"""``Lock(fair=False)``: a release leaves the lock free for whoever asks first and wakes the
first waiter to compete for it, until that waiter has starved for STARVATION_BOUND_MS; then it
is handed the lock. The scripts' steps forced one by one against a real server, then real
threads."""

from __future__ import annotations

import threading
from typing import Any

from django_redis_lock import Lock
from django_redis_lock.backends.scripts import JOIN, RELEASE, Script
from django_redis_lock.core import flows
from django_redis_lock.core.lease import OwnerRecord
from django_redis_lock.core.uncontended import (
    LOST_RACE_RETRY_MS,
    STARVATION_BOUND_MS,
    release_request,
)
from django_redis_lock.primitives.keys import lock_keys
from tests.support.helpers import keys_without_ttl, wait_until

RECORD = OwnerRecord(10, 42, "host", "MainThread").encode()


def _hold(client: Any, keys: Any, token: str) -> None:
    assert client.set(keys.lease, f"{token}|0|0|{RECORD}", nx=True, px=10_000)


def _queue(client: Any, keys: Any, token: str, flags: str = "u", join: Script = JOIN) -> Any:
    return join(
        client,
        (keys.lease, keys.queue, keys.waiters, keys.wake(token), keys.result),
        (token, 10_000, RECORD, flows.QUEUE, flags, 3000),
    )


def _release(
    client: Any, keys: Any, token: str, expected: str, unfair_ms: int, release: Script = RELEASE
) -> Any:
    request = release_request(keys, token, expected, unfair_ms=unfair_ms)
    return release(client, request.keys, request.args)


def test_an_unfair_release_leaves_the_lock_free_and_wakes_the_first_waiter(redis_client):
    keys = lock_keys("unfair-free", "default")
    _hold(redis_client, keys, "holder")
    assert _queue(redis_client, keys, "waiter")[0] == 0
    assert _release(redis_client, keys, "holder", "waiter", STARVATION_BOUND_MS) == [1, b"waiter"]
    assert redis_client.get(keys.lease) is None  # free: the releaser or a newcomer may take it
    assert redis_client.lrange(keys.wake("waiter"), 0, -1) == [b""]  # woken, with nothing
    assert redis_client.lrange(keys.queue, 0, -1) == [b"waiter"]  # still first in line
    assert keys_without_ttl(redis_client) == []
    # A newcomer takes the free lock ahead of it...
    _hold(redis_client, keys, "newcomer")
    # ...and the waiter, asking again, keeps its place and when it first queued.
    first = redis_client.hget(keys.waiters, "waiter")
    assert _queue(redis_client, keys, "waiter")[0] == 0
    again = redis_client.hget(keys.waiters, "waiter")
    assert first.split(b"@")[1].split(b"|")[0] == again.split(b"@")[1].split(b"|")[0]
    # Released by someone who did not expect it: the caller is told whom to wake.
    assert _release(redis_client, keys, "newcomer", "", STARVATION_BOUND_MS) == [
        2, b"waiter", b""
    ]  # fmt: skip


def test_a_waiter_that_starved_is_handed_the_lock(redis_client):
    keys = lock_keys("unfair-starved", "default")
    _hold(redis_client, keys, "holder")
    assert _queue(redis_client, keys, "waiter")[0] == 0
    # It queued 5 s ago, by the server's clock (the entry's '@'): past any bound.
    entry = redis_client.hget(keys.waiters, "waiter").decode()
    deadline, rest = entry.split("|", 1)
    flags, record = rest.split("|", 1)
    since = int(flags.split("@")[1]) - 5000
    redis_client.hset(keys.waiters, "waiter", f"{deadline}|u@{since}|{record}")
    reply = _release(redis_client, keys, "holder", "waiter", STARVATION_BOUND_MS)
    assert reply == [1, b"waiter"]
    assert redis_client.get(keys.lease).startswith(b"waiter|")  # handed, as a fair release does
    assert redis_client.llen(keys.queue) == 0


def test_a_waiter_that_did_not_ask_for_unfairness_is_always_handed_the_lock(redis_client):
    """A waiter queued without the 'u' flag (a fair Lock's) keeps no '@': any unfair release
    counts it starved, and hands it the lock."""
    keys = lock_keys("unfair-mixed", "default")
    _hold(redis_client, keys, "holder")
    assert _queue(redis_client, keys, "waiter", flags="")[0] == 0
    assert _release(redis_client, keys, "holder", "waiter", STARVATION_BOUND_MS) == [1, b"waiter"]
    assert redis_client.get(keys.lease).startswith(b"waiter|")


def test_threads_of_an_unfair_lock_never_overlap_and_every_waiter_gets_it(redis_client):
    inside: list[int] = []
    overlaps = 0
    got = dict.fromkeys(range(4), 0)
    stop = threading.Event()
    guard = threading.Lock()

    def worker(index: int) -> None:
        nonlocal overlaps
        lock = Lock("unfair-threads", fair=False, timeout=10, wait=10)
        while not stop.is_set():
            with lock:
                with guard:
                    inside.append(index)
                    overlaps += len(inside) > 1
                got[index] += 1
                with guard:
                    inside.remove(index)

    keys = lock_keys("unfair-threads", "default")
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    wait_until(lambda: min(got.values()) >= 5, 30, "every thread to get the lock 5 times")
    stop.set()
    for thread in threads:
        thread.join(30)
    assert overlaps == 0
    assert redis_client.get(keys.lease) is None


def _retry(
    client: Any, keys: Any, token: str, liveness_ms: int = 2000, join: Script = JOIN
) -> Any:
    return join(
        client,
        (keys.lease, keys.queue, keys.waiters, keys.wake(token), keys.result),
        (token, 10_000, RECORD, flows.RETRY, "ub", liveness_ms),
    )


def test_a_retry_keeps_the_waiters_place_takes_a_free_lock_and_requeues_a_lost_entry(
    redis_client,
):
    """join.lua's RETRY (a waiter woken to compete for a free lock, fair=False): while the
    lock is held, the waiter keeps its place and its entry (but for the mark saying it lost the
    race, see the test below); once the entry is gone
    (counted dead), it queues again as a join does; and a free lock is taken, the waiter
    leaving the line, and its block ended at once."""
    keys = lock_keys("unfair-retry", "default")
    _hold(redis_client, keys, "holder")
    assert _queue(redis_client, keys, "first")[0] == 0
    assert _queue(redis_client, keys, "waiter")[0] == 0
    entry = redis_client.hget(keys.waiters, "waiter")
    reply = _retry(redis_client, keys, "waiter")
    assert reply[0] == 0
    assert reply[3] == 0  # (says nothing of the waiter ahead)
    assert int(reply[4]) > 0  # when, by the server's clock: a message handed before is stale
    deadline, flags, record = redis_client.hget(keys.waiters, "waiter").split(b"|", 2)
    assert (deadline, flags.split(b"~")[0] + b"@" + flags.split(b"@")[1], record) == tuple(
        entry.split(b"|", 2)
    )  # the same but for the mark  # fmt: skip
    assert redis_client.lrange(keys.queue, 0, -1) == [b"first", b"waiter"]
    redis_client.hdel(keys.waiters, "waiter")
    redis_client.lrem(keys.queue, 1, "waiter")
    assert _retry(redis_client, keys, "waiter")[0] == 0
    assert redis_client.lrange(keys.queue, 0, -1) == [b"first", b"waiter"]  # queued again
    assert redis_client.pttl(keys.waiters) > 0
    redis_client.delete(keys.lease)
    assert _retry(redis_client, keys, "waiter")[0] == 1  # free: taken
    assert redis_client.get(keys.lease).startswith(b"waiter|")
    assert redis_client.lrange(keys.queue, 0, -1) == [b"first"]
    assert redis_client.lrange(keys.wake("waiter"), 0, -1) == [b""]  # its block ends at once
    assert keys_without_ttl(redis_client) == []


def test_a_waiter_that_lost_the_race_is_left_to_ask_again_on_its_own(redis_client, server_clock):
    """A RETRY that finds the lock taken (the releaser came back first) marks the waiter's
    entry: it asks again on its own by LOST_RACE_RETRY_MS from now (its block is that short,
    flows.py). A release until then leaves the lock free without waking it again, nor anyone
    behind it; once the mark has passed, a release wakes it as before; a starved waiter is
    handed the lock whatever its mark says. On the driven server clock: the mark is 5 ms
    ahead, and a loaded machine takes longer than that between two commands."""
    join, release = server_clock.script("join"), server_clock.script("release")
    keys = lock_keys("unfair-lost-race", "default")
    queued_at = server_clock.now_ms
    _hold(redis_client, keys, "holder")
    assert _queue(redis_client, keys, "waiter", join=join)[0] == 0
    assert _queue(redis_client, keys, "behind", join=join)[0] == 0
    assert _retry(redis_client, keys, "waiter", join=join)[0] == 0  # lost: the holder has it
    flags = redis_client.hget(keys.waiters, "waiter").split(b"|")[1]
    mark = int(flags.split(b"~")[1].split(b"@")[0])
    assert mark == queued_at + LOST_RACE_RETRY_MS
    server_clock.advance(LOST_RACE_RETRY_MS - 1)  # the last moment before its mark
    assert _release(redis_client, keys, "holder", "waiter", STARVATION_BOUND_MS, release) == [
        1, b"waiter"
    ]  # fmt: skip
    assert redis_client.get(keys.lease) is None  # free for whoever asks first
    assert redis_client.exists(keys.wake("waiter"), keys.wake("behind")) == 0  # nobody woken
    assert redis_client.lrange(keys.queue, 0, -1) == [b"waiter", b"behind"]
    # Told whom to expect even when it was not the one expected: nobody to wake either.
    _hold(redis_client, keys, "holder")
    assert _release(redis_client, keys, "holder", "", STARVATION_BOUND_MS, release) == [
        1, b"waiter"
    ]  # fmt: skip
    assert redis_client.exists(keys.wake("waiter")) == 0
    # Its mark reached (it asks again, or is counted dead by its own deadline): woken again.
    assert server_clock.advance(1) == mark
    _hold(redis_client, keys, "holder")
    assert _release(redis_client, keys, "holder", "waiter", STARVATION_BOUND_MS, release) == [
        1, b"waiter"
    ]  # fmt: skip
    assert redis_client.lrange(keys.wake("waiter"), 0, -1) == [b""]
    redis_client.delete(keys.wake("waiter"))
    # A starved waiter is handed the lock, mark or not: it loses the race once more just
    # before it has waited STARVATION_BOUND_MS, and is handed the lock once it has.
    server_clock.advance(queued_at + STARVATION_BOUND_MS - 1 - server_clock.now_ms)
    _hold(redis_client, keys, "holder")
    assert _retry(redis_client, keys, "waiter", join=join)[0] == 0  # lost again: marked again
    entry = redis_client.hget(keys.waiters, "waiter")
    assert b"~%d@%d|" % (server_clock.now_ms + LOST_RACE_RETRY_MS, queued_at) in entry
    server_clock.advance(1)  # starved now, its mark still ahead
    assert _release(redis_client, keys, "holder", "waiter", STARVATION_BOUND_MS, release) == [
        1, b"waiter"
    ]  # fmt: skip
    assert redis_client.get(keys.lease).startswith(b"waiter|")
    assert keys_without_ttl(redis_client) == []
