"""django-valkey's caches (valkey-py clients) as the locks' connection: ``ValkeyCache`` (plain,
with a password and a database, and with django-valkey's Sentinel client), ``ClusterValkeyCache``,
and a connection factory that returns a valkey-py client. The locks talk through the redis-py
twin of the cache's client (``backends/valkey_caches.py``), to the same server as the cache.

The servers are the suite's (``make test SERVER=valkey`` runs them all on valkey-server); the
one test below that asks for Valkey itself starts a valkey-server whatever the suite runs on.
"""

from __future__ import annotations

import asyncio
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import valkey
from django.core.cache import cache
from django.core.exceptions import ImproperlyConfigured
from redis.cluster import RedisCluster

from dev.embedded_redis import EmbeddedRedis, find_valkey_server
from django_redis_lock import Lock, UnsupportedCache, get_redis_client
from django_redis_lock.checks import check_cache, check_socket_timeout
from django_redis_lock.primitives.keys import lock_keys
from tests.support import factories, promises
from tests.support.helpers import lease_token, wait_until
from tests.tasks.test_without_tasks_extra import output_of

VALKEY_CACHE = "django_valkey.cache.ValkeyCache"


def _valkey_url(server_url: str, *, db: int = 0) -> str:
    """The server of ``server_url`` (with its password, if any), as django-valkey spells it."""
    parts = urllib.parse.urlsplit(server_url)
    return parts._replace(scheme="valkey", path=f"/{db}").geturl()


def _valkey_caches(location: str, **options: Any) -> dict[str, Any]:
    return {
        "default": {
            "BACKEND": VALKEY_CACHE,
            "LOCATION": location,
            "OPTIONS": {"SOCKET_TIMEOUT": 2, **options},
        }
    }


@pytest.fixture
def password_server(redis_server_factory: Any) -> Iterator[EmbeddedRedis]:
    return redis_server_factory(password="s3cret")


@pytest.fixture
def through_django_valkey(settings: Any, password_server: EmbeddedRedis) -> redis.Redis:
    """The default cache (and so the locks) is a ValkeyCache on a server that wants a password,
    database 3; returns a plain client of that database."""
    settings.CACHES = _valkey_caches(_valkey_url(password_server.url, db=3))
    return redis.Redis(
        host=password_server.host, port=password_server.port, password="s3cret", db=3
    )


def test_the_locks_talk_to_the_caches_server_as_its_user(through_django_valkey):
    client = get_redis_client()
    assert isinstance(client, redis.Redis)  # the redis-py twin of the cache's valkey-py client
    kwargs = client.connection_pool.connection_kwargs
    port = through_django_valkey.connection_pool.connection_kwargs["port"]
    assert (kwargs["port"], kwargs["db"], kwargs["password"], kwargs["socket_timeout"]) == (
        port, 3, "s3cret", 2
    )  # fmt: skip
    with Lock("valkey:basic", timeout=10, fencing=True) as held:
        lease = lock_keys("valkey:basic", "default").lease
        assert lease_token(through_django_valkey, lease) == held.token
        assert held.fencing_token
        assert not Lock("valkey:basic", wait=0).acquire()
    assert not through_django_valkey.exists(lock_keys("valkey:basic", "default").lease)
    # The cache itself still works beside the locks, on the same database.
    cache.set("beside", 1)
    assert through_django_valkey.exists(":1:beside")


def test_a_waiter_is_handed_the_lock(through_django_valkey):
    queue = lock_keys("valkey:wait", "default").queue
    promises.a_waiter_gets_the_lock_after_the_release(
        "valkey:wait", in_line=lambda: through_django_valkey.llen(queue) == 1
    )


def test_renewed_and_a_loss_is_told(through_django_valkey, settings):
    key = lock_keys("valkey:renew", "default").lease
    promises.renewed_while_held_and_a_loss_is_told(
        "valkey:renew", settings, lambda: through_django_valkey.get(key),
        lambda: through_django_valkey.delete(key),
    )  # fmt: skip


def test_the_async_api(through_django_valkey):
    promises.the_async_api_waits_without_blocking_the_loop("valkey:async")


def test_cluster_valkey_cache(settings, redis_cluster):
    settings.CACHES = {
        "default": {
            "BACKEND": "django_valkey.cluster_cache.cache.ClusterValkeyCache",
            "LOCATION": _valkey_url(redis_cluster.startup_url),
            "OPTIONS": {"SOCKET_TIMEOUT": 2},
        }
    }
    assert isinstance(get_redis_client(), RedisCluster)
    cluster = redis_cluster.client()
    names = [f"valkey:cluster:{n}" for n in range(6)]  # over several slots, so several nodes
    for name in names:
        with Lock(name, timeout=10) as held:
            assert lease_token(cluster, lock_keys(name, "default").lease) == held.token

    async def main() -> None:
        async with Lock("valkey:cluster:async", timeout=10) as held:
            lease = lock_keys("valkey:cluster:async", "default").lease
            assert lease_token(cluster, lease) == held.token

    asyncio.run(main())
    cluster.close()


def test_django_valkeys_sentinel_client_takes_locks_on_the_primary(settings, redis_server_factory):
    primary = redis_server_factory()
    sentinel = redis_server_factory(
        sentinel=[f"sentinel monitor valkeyprimary {primary.host} {primary.port} 1"]
    )
    settings.DJANGO_VALKEY_CONNECTION_FACTORY = "django_valkey.pool.SentinelConnectionFactory"
    settings.CACHES = _valkey_caches(
        "valkey://valkeyprimary/0",
        CLIENT_CLASS="django_valkey.client.SentinelClient",
        SENTINELS=[(sentinel.host, sentinel.port)],
        CONNECTION_POOL_CLASS="valkey.sentinel.SentinelConnectionPool",
    )
    sentinel_client = redis.Redis.from_url(sentinel.url)
    wait_until(
        lambda: sentinel_client.sentinel_master("valkeyprimary").get("flags") == "master",
        10,
        "Sentinel to know the primary",
    )
    with Lock("valkey:sentinel", timeout=10) as held:
        lease = lock_keys("valkey:sentinel", "default").lease
        assert lease_token(redis.Redis.from_url(primary.url), lease) == held.token
    sentinel_client.close()


def test_a_connection_factory_may_return_a_valkey_client(settings, redis_url):
    settings.DJANGO_REDIS_LOCK_CONNECTION_FACTORY = "tests.support.factories.valkey_client"
    factories.valkey_location[:] = [_valkey_url(redis_url)]
    assert isinstance(get_redis_client(), redis.Redis)
    with Lock("valkey:factory", timeout=10) as held:
        lease = lock_keys("valkey:factory", "default").lease
        assert lease_token(redis.Redis.from_url(redis_url), lease) == held.token


def test_a_valkey_client_that_cannot_be_carried_over_is_a_clear_error(settings, redis_url):
    class OwnPool(valkey.ConnectionPool):
        pass

    pool = OwnPool.from_url(_valkey_url(redis_url))
    settings.DJANGO_REDIS_LOCK_CONNECTION_FACTORY = lambda alias: valkey.Valkey(
        connection_pool=pool
    )
    with pytest.raises(ImproperlyConfigured, match="cannot connect like the valkey-py client"):
        get_redis_client()


@pytest.mark.parametrize(
    ("backend", "client_class", "check_id", "says"),
    [
        ("django_valkey.async_cache.cache.AsyncValkeyCache", None, "django_redis_lock.E002",
         "only be reached from a coroutine"),
        (VALKEY_CACHE, "django_valkey.client.ShardClient", "django_redis_lock.E003",
         "ShardClient"),
    ],
)  # fmt: skip
def test_what_cannot_be_the_connection_is_refused_and_checked(
    settings, redis_url, backend, client_class, check_id, says
):
    options = {"SOCKET_TIMEOUT": 2, **({"CLIENT_CLASS": client_class} if client_class else {})}
    settings.CACHES = {
        "default": {"BACKEND": backend, "LOCATION": _valkey_url(redis_url), "OPTIONS": options}
    }
    with pytest.raises(UnsupportedCache, match=says):
        get_redis_client()
    # Our check alone: Django's own cache checks would instantiate the async cache, which then
    # can only be closed from a coroutine.
    assert [message.id for message in check_cache()] == [check_id]


def test_a_socket_timeout_is_asked_for_under_django_valkeys_name(settings, redis_url):
    settings.CACHES = {
        "default": {"BACKEND": VALKEY_CACHE, "LOCATION": _valkey_url(redis_url), "OPTIONS": {}}
    }
    warnings = check_socket_timeout()
    assert [m.id for m in warnings] == ["django_redis_lock.W002"]
    assert "SOCKET_TIMEOUT" in warnings[0].msg
    settings.CACHES = _valkey_caches(_valkey_url(redis_url))
    assert check_socket_timeout() == []


def test_on_a_valkey_server(settings, tmp_path):
    """Whatever server the suite runs on, the lock once on valkey-server itself, through
    django-valkey: Valkey answers our scripts as Redis does."""
    with EmbeddedRedis(binary=find_valkey_server(), directory=tmp_path) as server:
        plain = redis.Redis.from_url(server.url)
        assert "valkey_version" in plain.info("server")
        settings.CACHES = _valkey_caches(_valkey_url(server.url))
        with Lock("valkey:itself", timeout=10, fencing=True) as held:
            assert lease_token(plain, lock_keys("valkey:itself", "default").lease) == held.token
            assert not Lock("valkey:itself", wait=0).acquire()
        promises.a_waiter_gets_the_lock_after_the_release("valkey:itself")
        plain.close()


def test_without_valkey_installed_everything_imports():
    """valkey-py and django-valkey are optional: without them our modules import, and a
    valkey-py client is just not one."""
    printed = output_of(
        "valkey,django_valkey",
        """if True:
        import json
        import django
        django.setup()
        from django_redis_lock.backends import clients, valkey_caches
        import django_redis_lock
        print(json.dumps({
            "family": valkey_caches.VALKEY is None,
            "client": valkey_caches.is_valkey_client(object()),
        }))
        """,
    )
    assert printed == {"family": True, "client": False}
