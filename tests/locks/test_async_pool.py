"""Many asyncio tasks waiting at once: each holds a connection of the asyncio client's pool for
its wait (a BLPOP on its own wake-up list). That pool has the size the cache was given; when
nobody gave one, it has none (redis-py 8 would make it 100, and fail the 101st waiting task
with ``MaxConnectionsError``, as it fails its own asyncio ``Lock``)."""

from __future__ import annotations

import asyncio

import redis
import redis.asyncio
import redis.sentinel
from django.core.exceptions import ImproperlyConfigured

from django_redis_lock import Lock, aclose_async_redis_clients, get_async_redis_client
from django_redis_lock.backends.twins import REDIS, REDIS_ASYNCIO, UNBOUNDED, twin

TASKS = 150  # more than redis-py 8's default pool of 100


def test_more_tasks_than_a_default_pool_holds_all_wait_their_turn(redis_client):
    inside = 0
    most = 0
    acquired = 0

    async def one() -> None:
        nonlocal inside, most, acquired
        async with Lock("many-waiters", wait=60):
            inside += 1
            most = max(most, inside)
            await asyncio.sleep(0)  # the others queue meanwhile, each blocked on its own
            inside -= 1
            acquired += 1

    async def main() -> int:
        try:
            await asyncio.gather(*(one() for _ in range(TASKS)))
            return get_async_redis_client().connection_pool.max_connections
        finally:
            await aclose_async_redis_clients()

    size = asyncio.run(main())
    assert acquired == TASKS
    assert most == 1
    if redis.ConnectionPool().max_connections < TASKS:  # redis-py 8: a default of 100
        assert size == UNBOUNDED


def refuse(what: str) -> ImproperlyConfigured:
    return ImproperlyConfigured(what)


def test_a_size_the_cache_was_given_is_kept_and_a_default_one_is_none():
    chosen = redis.Redis(max_connections=20)
    default = redis.Redis()
    for unbounded in (True, False):
        kept = twin(chosen, REDIS, REDIS_ASYNCIO, refuse, unbounded_by_default=unbounded)
        assert kept.connection_pool.max_connections == 20
    made = twin(default, REDIS, REDIS_ASYNCIO, refuse, unbounded_by_default=True)
    assert made.connection_pool.max_connections == UNBOUNDED
    # (the sync twins, valkey-py's into redis-py's, keep whatever size they are given)
    same = twin(default, REDIS, REDIS_ASYNCIO, refuse)
    assert same.connection_pool.max_connections == default.connection_pool.max_connections


def test_through_sentinel_too():
    sentinel = redis.sentinel.Sentinel([("127.0.0.1", 1)])  # (nothing is connected)
    chosen = sentinel.master_for("svc", max_connections=20)
    default = sentinel.master_for("svc")
    assert (
        twin(
            chosen, REDIS, REDIS_ASYNCIO, refuse, unbounded_by_default=True
        ).connection_pool.max_connections
        == 20
    )
    assert (
        twin(
            default, REDIS, REDIS_ASYNCIO, refuse, unbounded_by_default=True
        ).connection_pool.max_connections
        == UNBOUNDED
    )
