"""The lock's promises, once per topology (``topology``: one server, a Redis Cluster, a
quorum). What only one topology promises, or how it fails, is in its own file
(``test_cluster.py``, ``test_quorum.py``, ``test_sentinel.py``)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from django_redis_lock import Lock, LockLost, registry, signals
from tests.helpers import wait_until
from tests.test_async_scaleout import take_and_release


def test_acquire_release_fencing_reentry(topology):
    names = [f"contract:{index}" for index in range(30)]  # on a Cluster: over every primary
    fences = []
    for name in names:
        with Lock(name, timeout=10, fencing=True, reentrant=True) as held:
            leases = topology.leases(name)
            assert topology.tokens(name) == [held.token] * len(topology.clients)  # on each
            assert held.owned()
            assert 9 < held.ttl() <= 10
            with Lock(name, reentrant=True, timeout=10) as again:
                assert again.token == held.token
                assert topology.leases(name) == leases  # a level counted here: no round trip
            assert not Lock(name, wait=0).acquire()  # another holder must wait
            fences.append(held.fencing_token)
    assert all(fences)
    assert not any(any(topology.leases(name)) for name in names)
    assert not any(Lock(name).locked() for name in names)


def test_a_waiter_gets_the_lock_after_the_release(topology):
    holder = Lock("contract:wait", timeout=10)
    holder.acquire()
    contended, got_it = threading.Event(), threading.Event()

    def on_contended(sender, **kwargs):
        contended.set()

    def wait_for_it():
        waiting = Lock("contract:wait", wait=10)
        if waiting.acquire():
            got_it.set()
            waiting.release()

    signals.lock_contended.connect(on_contended)
    try:
        waiter = threading.Thread(target=wait_for_it)
        waiter.start()
        assert contended.wait(5)
        assert not got_it.is_set()
        holder.release()
        assert got_it.wait(5)
        waiter.join()
    finally:
        signals.lock_contended.disconnect(on_contended)


def test_threads_never_overlap_and_lose_no_update(topology):
    inside, counter, overlaps = [0], [0], []
    state = threading.Lock()

    def work():
        for _ in range(25):
            with Lock("contract:counter", timeout=10, wait=30):
                with state:
                    inside[0] += 1
                    if inside[0] != 1:
                        overlaps.append(inside[0])
                value = counter[0]
                threading.Event().wait(0)  # let another thread run here, if the lock let it in
                counter[0] = value + 1
                with state:
                    inside[0] -= 1

    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert overlaps == []
    assert counter[0] == 8 * 25


def test_renewed_while_held_and_a_loss_is_told(topology, settings):
    settings.DJANGO_REDIS_LOCK_TIMEOUT = 0.3
    with pytest.raises(LockLost), Lock("contract:renew") as held:
        first = topology.leases("contract:renew")
        renewal = held._book.hold().renewal
        first_end = renewal.expires_at
        # Renewed past two more leases' worth: still ours, the same lease lengthened.
        wait_until(lambda: renewal.expires_at > first_end + 0.6, 10, "three renewals")
        assert held.owned()
        assert topology.leases("contract:renew") == first
        topology.delete_lease("contract:renew")
        wait_until(lambda: held.lost, 5, "the renewal to find the lease gone")


def test_the_async_api_waits_without_blocking_the_loop(topology):
    async def main():
        lock = Lock("contract:async", wait=10)
        async with lock:
            assert lock.owned()
            waiter = asyncio.create_task(take_and_release(Lock("contract:async", wait=10)))
            await asyncio.sleep(0.05)  # the waiter waits; the loop is not blocked
            assert not waiter.done()
        assert await waiter

    asyncio.run(main())


def test_the_registry_lists_and_force_releases_every_lock(topology):
    names = [f"listed:{index}" for index in range(20)]
    locks = [Lock(name, timeout=30) for name in names]
    for lock in locks:
        assert lock.acquire()
    assert sorted(info.name for info in registry.iter_locks()) == sorted(names)
    seen, cursor = [], "0"
    while cursor is not None:
        items, cursor = registry.page(cursor, 7)
        seen += [info.name for info in items]
    assert sorted(seen) == sorted(names)  # each once, across pages and servers
    info = registry.get_lock("listed:3")
    assert info.token == locks[3].token
    assert registry.force_release("listed:3", locks[3].token)
    assert not locks[3].locked()
    assert registry.get_lock("listed:3") is None
    for lock in locks[:3] + locks[4:]:
        lock.release()
