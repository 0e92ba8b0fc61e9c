"""The async API on Redis Cluster and through Sentinel: asyncio twins of the sync clients."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis
import redis.asyncio
from django.core.exceptions import ImproperlyConfigured

from django_redis_lock import Lock, aclose_async_redis_clients, get_async_redis_client
from django_redis_lock.primitives.keys import lock_keys
from tests.support.promises import take_and_release

# django-redis keeps connection pools per URL for the whole process: a service name per test.
_services = iter(range(1_000_000))


def test_async_locks_on_a_cluster(on_cluster, settings):
    names = [f"async-cluster:{index}" for index in range(6)]  # spread over the primaries

    async def main():
        assert isinstance(get_async_redis_client(), redis.asyncio.RedisCluster)
        for name in names:
            async with Lock(name, timeout=10, fencing=True, reentrant=True) as held:
                assert held.fencing_token
                assert on_cluster.exists(lock_keys(name, "default").lease)
                waiter = asyncio.create_task(take_and_release(Lock(name, wait=5)))
                # The waiter queues on the cluster (its own wake-up list, in the lock's slot).
                queue = lock_keys(name, "default").queue
                while not on_cluster.exists(queue):
                    await asyncio.sleep(0.005)
            assert await waiter  # woken by the release
        await aclose_async_redis_clients()

    asyncio.run(main())


def test_async_replica_confirmation_on_a_cluster_is_refused_clearly(on_cluster, settings):
    settings.DJANGO_REDIS_LOCK_MIN_REPLICAS = 1

    async def main():
        try:
            with pytest.raises(ImproperlyConfigured, match="async API on a Redis Cluster"):
                await Lock("async-cluster:replicas").aacquire()
        finally:
            await aclose_async_redis_clients()

    asyncio.run(main())


def wait_until(predicate, timeout=30):
    deadline = time.monotonic() + timeout
    while not predicate():  # Sentinel's gossip has no event to wait on: a bounded probe
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_async_locks_through_sentinel(settings, redis_server_factory):
    service = f"async-primary{next(_services)}"
    primary = redis_server_factory()
    sentinel = redis_server_factory(
        sentinel=[f"sentinel monitor {service} {primary.host} {primary.port} 1"]
    )
    sentinel_client = redis.Redis.from_url(sentinel.url)
    wait_until(lambda: sentinel_client.sentinel_master(service).get("ip"))
    settings.DJANGO_REDIS_CONNECTION_FACTORY = "django_redis.pool.SentinelConnectionFactory"
    settings.CACHES = {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": f"redis://{service}/0",
            "OPTIONS": {
                "CLIENT_CLASS": "django_redis.client.SentinelClient",
                "SENTINELS": [(sentinel.host, sentinel.port)],
                "CONNECTION_POOL_CLASS": "redis.sentinel.SentinelConnectionPool",
            },
        }
    }
    primary_client = redis.Redis.from_url(primary.url)

    async def main():
        async with Lock("async-sentinel", timeout=10) as held:
            lease = primary_client.get(lock_keys("async-sentinel", "default").lease)
            assert lease.decode().split("|", 1)[0] == held.token
            waiter = asyncio.create_task(take_and_release(Lock("async-sentinel", wait=5)))
            while not primary_client.exists(lock_keys("async-sentinel", "default").queue):
                await asyncio.sleep(0.005)
        assert await waiter
        await aclose_async_redis_clients()

    asyncio.run(main())
    primary_client.close()
    sentinel_client.close()
