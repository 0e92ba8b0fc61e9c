"""What a real 3-primary Redis Cluster adds (through DJANGO_REDIS_LOCK_CONNECTION_FACTORY):
one slot per lock, every primary scanned, replicas asked on the slot's primary, lock_many
across slots. The promises every topology keeps are in ``test_contract.py``."""

from __future__ import annotations

import threading
import time

import pytest
import redis

from dev.embedded_redis import EmbeddedRedis, start_cluster
from django_redis_lock import Lock, LockBackendError, registry
from django_redis_lock.primitives.background import process_records
from django_redis_lock.primitives.keys import lock_keys
from tests.support import factories
from tests.support.helpers import RENEWED_LEASE, renewed_after


def test_lock_keys_share_one_slot(on_cluster):
    keys = lock_keys("orders:42", "default")
    slots = {
        on_cluster.keyslot(key)
        for key in (keys.lease, keys.queue, keys.waiters, keys.result, keys.wake("t"))
    }
    assert len(slots) == 1


def test_registry_scans_every_primary(on_cluster):
    names = [f"listed:{index}" for index in range(40)]
    locks = [Lock(name, timeout=30) for name in names]
    for lock in locks:
        lock.acquire()
    nodes = {on_cluster.get_node_from_key(lock_keys(name, "default").lease).name for name in names}
    assert len(nodes) == 3  # the locks really are spread out
    assert sorted(info.name for info in registry.iter_locks()) == sorted(names)
    seen, cursor = [], "0"
    while cursor is not None:
        items, cursor = registry.page(cursor, 7)
        seen += [info.name for info in items]
    assert sorted(seen) == sorted(names)
    assert registry.force_release("listed:3", locks[3].token)
    assert not locks[3].locked()


def test_replica_confirmation_goes_to_the_primary_of_the_slot(on_cluster, settings):
    # The test cluster has no replicas: every acquisition goes unconfirmed, on whichever
    # primary holds its slot, and is given back.
    settings.DJANGO_REDIS_LOCK_MIN_REPLICAS = 1
    settings.DJANGO_REDIS_LOCK_REPLICA_TIMEOUT = 0.05
    names = [f"cluster:confirmed:{index}" for index in range(6)]  # spread over the primaries
    assert len({on_cluster.keyslot(lock_keys(name, "default").lease) for name in names}) > 1
    for name in names:
        with pytest.raises(LockBackendError, match="only 0 of the 1 replicas"):
            Lock(name, timeout=10).acquire()
        assert not on_cluster.exists(lock_keys(name, "default").lease)  # given back


def test_semaphore_on_a_cluster(on_cluster, settings):
    from django_redis_lock import Semaphore
    from django_redis_lock.primitives.keys import permit_keys

    keys = permit_keys("cluster:renders", "default")
    slots = {
        on_cluster.keyslot(key)
        for key in (keys.holders, keys.owners, keys.queue, keys.waiters, keys.wake("t"))
    }
    assert len(slots) == 1
    settings.DJANGO_REDIS_LOCK_TIMEOUT = RENEWED_LEASE  # renewed: a lease passes while held
    first, second = Semaphore("cluster:renders", limit=2), Semaphore("cluster:renders", limit=2)
    assert first.acquire()
    assert second.acquire()
    got_it = threading.Event()
    waiter = threading.Thread(
        target=lambda: Semaphore("cluster:renders", limit=2, wait=30).acquire() and got_it.set()
    )
    waiter.start()
    while not on_cluster.exists(keys.queue):
        got_it.wait(0.01)
    # Both permits renewed past a lease after the waiter queued: still full.
    queued_at = time.monotonic()
    renewed_after(first, queued_at + RENEWED_LEASE)
    renewed_after(second, queued_at + RENEWED_LEASE)
    assert not got_it.is_set()
    first.release()
    assert got_it.wait(5)  # handed over by the release
    waiter.join()
    second.release()


def _calls(redis_cluster, command: str) -> int:
    total = 0
    for server in redis_cluster.servers:
        client = redis.Redis.from_url(server.url)
        total += client.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0)
        client.close()
    return total


def _reset_stats(redis_cluster) -> None:
    for server in redis_cluster.servers:
        client = redis.Redis.from_url(server.url)
        client.config_resetstat()
        client.close()


def test_lock_many_with_one_hash_tag_is_one_script(on_cluster, redis_cluster):
    from django_redis_lock import lock_many

    names = [f"account:{{bank-1}}:{index}" for index in range(5)]
    group = lock_many(names, wait=0)
    assert group.acquire()  # connections made, script loaded
    group.release()
    _reset_stats(redis_cluster)
    assert group.acquire()
    # Every member in one script (the SETs it runs count too, so they are five).
    assert _calls(redis_cluster, "evalsha") == 1
    assert _calls(redis_cluster, "set") == len(names)
    group.release()
    assert not any(on_cluster.exists(lock_keys(name, "default").lease) for name in names)


def test_lock_many_across_slots_takes_each_on_its_node(on_cluster):
    from django_redis_lock import lock_many

    names = [f"cluster:many:{index}" for index in range(12)]  # spread over the primaries
    other = Lock(names[7])
    assert other.acquire()
    assert not lock_many(names, wait=0).acquire()  # all or nothing, across nodes too
    assert not any(on_cluster.exists(lock_keys(name, "default").lease) for name in names[:7])
    other.release()
    with lock_many(reversed(names)) as group:
        assert all(on_cluster.exists(lock_keys(name, "default").lease) for name in names)
    assert not group.held


def test_a_cluster_that_cannot_be_reached_is_a_lock_backend_error(settings, tmp_path):
    """Every node of a (private) cluster gone: redis-py reads the slot map again, finds no
    node, and (before redis-py 8) raises its ``RedisClusterException``, which is no
    ``RedisError``; the lock says ``LockBackendError``, as for one server."""
    servers: list[EmbeddedRedis] = []

    def start(**kwargs):
        server = EmbeddedRedis(directory=tmp_path / f"node{len(servers)}", **kwargs).start()
        servers.append(server)
        return server

    try:
        start_cluster(3, start=start)
        factories.cluster_url[:] = [servers[0].url]
        settings.DJANGO_REDIS_LOCK_CONNECTION_FACTORY = "tests.support.factories.cluster_client"
        with Lock("cluster-gone", timeout=5, wait=0):
            pass
    finally:
        for server in servers:
            server.stop()
    process_records.recorded.clear()  # (its record due again: first, whatever it loads)
    with pytest.raises(LockBackendError):
        Lock("cluster-gone", timeout=5, wait=0).acquire()
