"""Sentinel: locks are taken on the primary that django-redis' SentinelClient finds, and
with replica confirmation a failover is never silent."""

from __future__ import annotations

import threading
import time

import pytest
import redis

from django_redis_lock import Lock, lock_lost
from django_redis_lock.keys import lock_keys

# django-redis keeps connection pools per URL for the whole process: each test's Sentinel
# setup gets a service name of its own, so that no test reuses an earlier test's pool.
_setups = iter(range(1_000_000))


def wait_until(predicate, timeout=30, what="condition"):
    deadline = time.monotonic() + timeout
    while not predicate():  # Sentinel's gossip has no event to wait on: a bounded probe
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture
def sentinel_setup(settings, redis_server_factory):
    master = f"mymaster{next(_setups)}"
    primary = redis_server_factory(args=["--repl-diskless-sync-delay", "0"])
    replica = redis_server_factory(args=["--replicaof", primary.host, str(primary.port)])
    primary_client = redis.Redis.from_url(primary.url)
    wait_until(
        lambda: primary_client.info("replication").get("slave0", {}).get("state") == "online",
        what="the replica",
    )
    primary_client.set("replication-check", "1")
    assert primary_client.execute_command("WAIT", 1, 10_000) == 1
    sentinels = [
        redis_server_factory(
            sentinel=[
                f"sentinel monitor {master} {primary.host} {primary.port} 2",
                f"sentinel down-after-milliseconds {master} 1000",
                f"sentinel failover-timeout {master} 10000",
            ]
        )
        for _ in range(3)
    ]
    sentinel_client = redis.Redis.from_url(sentinels[0].url)
    wait_until(
        lambda: sentinel_client.sentinel_master(master).get("num-slaves", 0) >= 1,
        what="Sentinel to see the replica",
    )
    settings.DJANGO_REDIS_CONNECTION_FACTORY = "django_redis.pool.SentinelConnectionFactory"
    settings.CACHES = {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": f"redis://{master}/0",
            "OPTIONS": {
                "CLIENT_CLASS": "django_redis.client.SentinelClient",
                "SENTINELS": [(s.host, s.port) for s in sentinels],
                "CONNECTION_POOL_CLASS": "redis.sentinel.SentinelConnectionPool",
            },
        }
    }
    return primary, replica, sentinel_client, master


def test_locks_are_taken_on_the_primary(sentinel_setup):
    primary, _, _, _ = sentinel_setup
    with Lock("via-sentinel", timeout=30):
        assert redis.Redis.from_url(primary.url).exists(lock_keys("via-sentinel", "default").lease)


def test_with_replica_confirmation_a_failover_is_never_silent(settings, sentinel_setup):
    """Without confirmation, a holder keeps renewing on the replaced primary (which Sentinel
    demotes only at its next check, every 10 s) while the new primary's copy of its lease runs
    out: two holders, silently. With MIN_REPLICAS, renewals must be confirmed too: the stale
    primary (no replica any more) and the new one (none yet) cannot, so the holder keeps
    retrying until its lease would end and then reports the loss. A lease longer than the
    failover (the default 30 s) rides it out once the old primary rejoins as a replica."""
    _, replica, sentinel_client, master = sentinel_setup
    settings.DJANGO_REDIS_LOCK_TIMEOUT = 4  # shorter than the demotion: it cannot ride it out
    settings.DJANGO_REDIS_LOCK_MIN_REPLICAS = 1
    settings.DJANGO_REDIS_LOCK_REPLICA_TIMEOUT = 0.3
    lost = threading.Event()
    lock_lost.connect(lambda **kwargs: lost.set(), weak=False, dispatch_uid="failover")
    try:
        holder = Lock("across-failover")
        holder.acquire()
        sentinel_client.execute_command("SENTINEL", "FAILOVER", master)
        wait_until(
            lambda: int(sentinel_client.execute_command(
                "SENTINEL", "GET-MASTER-ADDR-BY-NAME", master)[1]) == replica.port,
            what="the failover",
        )  # fmt: skip
        assert lost.wait(15), "a holder whose renewals were not confirmed did not report it"
        assert holder.lost
    finally:
        lock_lost.disconnect(dispatch_uid="failover")
