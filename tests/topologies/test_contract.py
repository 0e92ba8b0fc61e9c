"""The lock's promises, once per topology (``topology``: one server, a Redis Cluster, a
quorum). What only one topology promises, or how it fails, is in its own file
(``test_cluster.py``, ``test_quorum.py``, ``test_sentinel.py``)."""

from __future__ import annotations

import threading

from django_redis_lock import Lock, registry
from tests.support import promises
from tests.support.helpers import wait_until


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
    promises.a_waiter_gets_the_lock_after_the_release("contract:wait")


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
    promises.renewed_while_held_and_a_loss_is_told(
        "contract:renew", settings, lambda: topology.leases("contract:renew"),
        lambda: topology.delete_lease("contract:renew"),
    )  # fmt: skip


def test_the_async_api_waits_without_blocking_the_loop(topology):
    promises.the_async_api_waits_without_blocking_the_loop("contract:async")


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
    # (Quorum mode: the release counts once a majority confirmed it, and the registry shows a
    # lock from the first server that has it; the last server's release may still be on its
    # way, under load.)
    wait_until(lambda: registry.get_lock("listed:3") is None, what="the lock gone everywhere")
    for lock in locks[:3] + locks[4:]:
        lock.release()
