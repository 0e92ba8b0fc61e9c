"""DJANGO_REDIS_LOCK_MIN_REPLICAS: an acquisition counts once replicas confirmed it."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis

from django_redis_lock import Lock, LockBackendError, aclose_async_redis_clients
from django_redis_lock.primitives.keys import lock_keys
from tests.conftest import django_redis_caches
from tests.locks.test_cancellation import nothing_of_ours_held, sweep


@pytest.fixture
def replicated(settings, redis_server_factory):
    # No 5 s wait for more replicas before the first sync (Redis 7's default).
    primary = redis_server_factory(args=["--repl-diskless-sync-delay", "0"])
    replica = redis_server_factory(args=["--replicaof", primary.host, str(primary.port)])
    primary_client = redis.Redis.from_url(primary.url)
    deadline = time.monotonic() + 20
    while primary_client.info("replication").get("slave0", {}).get("state") != "online":
        assert time.monotonic() < deadline, "the replica did not connect"
        time.sleep(0.05)
    # And a first write comes back acknowledged: the replica has loaded the sync.
    primary_client.set("replication-check", "1")
    assert primary_client.execute_command("WAIT", 1, 10_000) == 1
    settings.CACHES = django_redis_caches([primary.url, replica.url])
    settings.DJANGO_REDIS_LOCK_REPLICA_TIMEOUT = 5  # a loaded test machine is slow to ack
    return primary_client, redis.Redis.from_url(replica.url)


def test_confirmed_acquisition_is_on_the_replica(settings, replicated):
    _, replica = replicated
    settings.DJANGO_REDIS_LOCK_MIN_REPLICAS = 1
    with Lock("replicated", timeout=10):
        assert replica.exists(
            lock_keys("replicated", "default").lease
        )  # WAIT returned: it's there


def test_too_few_replicas_releases_and_fails(settings, replicated):
    primary, _ = replicated
    settings.DJANGO_REDIS_LOCK_MIN_REPLICAS = 2  # there is one
    settings.DJANGO_REDIS_LOCK_REPLICA_TIMEOUT = 0.1
    with pytest.raises(LockBackendError, match="only 1 of the 2 replicas"):
        Lock("unconfirmed", timeout=10).acquire()
    assert not primary.exists(lock_keys("unconfirmed", "default").lease)  # released again
    settings.DJANGO_REDIS_LOCK_MIN_REPLICAS = 1
    with Lock("unconfirmed", timeout=10):  # and can be taken normally
        pass


def test_a_detached_replica_makes_acquisitions_fail(settings, replicated):
    _, replica = replicated
    replica.replicaof("NO", "ONE")
    settings.DJANGO_REDIS_LOCK_MIN_REPLICAS = 1
    settings.DJANGO_REDIS_LOCK_REPLICA_TIMEOUT = 0.1
    with pytest.raises(LockBackendError, match="only 0 of the 1"):
        Lock("alone", timeout=10).acquire()


def test_async_acquisition_is_confirmed_too(settings, replicated):
    _, replica = replicated
    settings.DJANGO_REDIS_LOCK_MIN_REPLICAS = 1

    async def main():
        try:
            async with Lock("async-replicated", timeout=10):
                return replica.exists(lock_keys("async-replicated", "default").lease)
        finally:
            await aclose_async_redis_clients()

    assert asyncio.run(main()) == 1


def test_bad_values_are_refused(settings):
    from django.core.exceptions import ImproperlyConfigured

    settings.DJANGO_REDIS_LOCK_MIN_REPLICAS = -1
    with pytest.raises(ImproperlyConfigured):
        Lock("x").acquire()


def test_a_confirmed_aacquire_cancelled_anywhere_holds_or_leaves_nothing(settings, replicated):
    """The promise of docs/locks.md ("Cancellation") holds for grants replicas confirm too: a
    cancellation while the script and its ``WAIT`` are under way leaves no lease by nobody."""
    primary, _ = replicated
    settings.DJANGO_REDIS_LOCK_MIN_REPLICAS = 1
    name = "cancel:replicated"

    async def main():
        lock = Lock(name, timeout=30, wait=1)

        async def check(outcome):
            if not outcome.cancelled:
                assert outcome.result is True
                await lock.arelease()
            assert lock.token is None  # the object does not believe it holds
            nothing_of_ours_held(primary, name)

        try:
            return await sweep(lambda: lock.aacquire(), check)
        finally:
            await aclose_async_redis_clients()

    done = asyncio.run(main())
    # The script and its WAIT are one carried request (drivers.arun): one suspension, cancelled.
    assert done.cancelled >= 1, done
