"""Sentinel: locks are taken on the primary that django-redis' SentinelClient finds.

(What a failover does to held locks is not pinned down by a test yet: see issue #7.)
"""

from __future__ import annotations

import time

import pytest
import redis

from django_redis_lock import Lock
from django_redis_lock.keys import lock_keys

MASTER = "mymaster"


def wait_until(predicate, timeout=30, what="condition"):
    deadline = time.monotonic() + timeout
    while not predicate():  # Sentinel's gossip has no event to wait on: a bounded probe
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture
def sentinel_setup(settings, redis_server_factory):
    primary = redis_server_factory(args=["--repl-diskless-sync-delay", "0"])
    replica = redis_server_factory(args=["--replicaof", primary.host, str(primary.port)])
    primary_client = redis.Redis.from_url(primary.url)
    wait_until(
        lambda: primary_client.info("replication").get("slave0", {}).get("state") == "online",
        what="the replica",
    )
    sentinels = [
        redis_server_factory(
            sentinel=[
                f"sentinel monitor {MASTER} {primary.host} {primary.port} 2",
                f"sentinel down-after-milliseconds {MASTER} 1000",
                f"sentinel failover-timeout {MASTER} 10000",
            ]
        )
        for _ in range(3)
    ]
    sentinel_client = redis.Redis.from_url(sentinels[0].url)
    wait_until(
        lambda: sentinel_client.sentinel_master(MASTER).get("num-slaves", 0) >= 1,
        what="Sentinel to see the replica",
    )
    settings.DJANGO_REDIS_CONNECTION_FACTORY = "django_redis.pool.SentinelConnectionFactory"
    settings.CACHES = {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": f"redis://{MASTER}/0",
            "OPTIONS": {
                "CLIENT_CLASS": "django_redis.client.SentinelClient",
                "SENTINELS": [(s.host, s.port) for s in sentinels],
                "CONNECTION_POOL_CLASS": "redis.sentinel.SentinelConnectionPool",
            },
        }
    }
    return primary, replica, sentinel_client


def test_locks_are_taken_on_the_primary(sentinel_setup):
    primary, _, _ = sentinel_setup
    with Lock("via-sentinel", timeout=30):
        assert redis.Redis.from_url(primary.url).exists(lock_keys("via-sentinel", "default").lease)
