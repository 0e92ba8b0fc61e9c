"""Find the redis-py client that the locks of a cache alias talk to.

Three sources, in this order:

1. ``DJANGO_REDIS_LOCK_CONNECTION_FACTORY``: the user's callable, given the alias, returns a
   redis-py client (``redis.Redis`` or ``redis.cluster.RedisCluster``). This is how clients
   that no Django cache backend offers (Redis Cluster) come in.
2. A django-redis cache: ``get_redis_connection(alias, write=True)``, which is the primary for
   replicated and Sentinel set-ups; locks must never be taken on a replica.
3. Django's own ``django.core.cache.backends.redis.RedisCache``: its write (first) server.
4. A django-valkey cache (``ValkeyCache``, ``ClusterValkeyCache``): the redis-py twin of its
   valkey-py client (``backends/valkey_caches.py``), the same server(s) and settings.

Anything else raises :class:`UnsupportedCache`, an ``ImproperlyConfigured`` that says what to
change; ``checks.py`` reports the same problems at start-up.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import threading
import weakref
from collections.abc import AsyncIterator
from typing import Any, cast

import redis.asyncio
from django.conf import settings
from django.core.cache import caches
from django.core.cache.backends.redis import RedisCache as DjangoRedisCache
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.utils.module_loading import import_string
from django_redis import get_redis_connection
from django_redis.cache import RedisCache as DjangoRedisRedisCache
from django_redis.client import ShardClient
from redis import Redis
from redis.cluster import RedisCluster

from ..conf import PREFIX, SETTINGS, lock_settings
from .quorum import AsyncQuorumClient, QuorumClient
from .twins import REDIS, REDIS_ASYNCIO, twin
from .valkey_caches import (
    ValkeyCacheKind,
    is_django_valkey,
    is_valkey_client,
    redis_twin_of_cache,
    redis_twin_of_valkey,
    valkey_cache_kind,
)

RedisClient = Redis | RedisCluster
AsyncClient = redis.asyncio.Redis | redis.asyncio.RedisCluster
# What a lock is taken on: a cache alias, a quorum's name, or a quorum as a tuple of aliases.
LockAlias = str | tuple[str, ...]

__all__ = [
    "CacheBackend",
    "RedisClient",
    "UnsupportedCache",
    "aclose_async_redis_clients",
    "async_lock_client",
    "cache_backend",
    "get_async_redis_client",
    "get_redis_client",
    "lock_client",
    "quorum_members",
]

_DJANGO_REDIS_BACKEND = "django_redis.cache.RedisCache"
_DJANGO_BACKEND = "django.core.cache.backends.redis.RedisCache"
_DEFAULT_CLIENT_CLASS = "django_redis.client.DefaultClient"
_DJANGO_VALKEY_BACKEND = "django_valkey.cache.ValkeyCache"
_SUPPORTED = (
    f"{_DJANGO_REDIS_BACKEND!r} (django-redis), {_DJANGO_BACKEND!r} (Django's own) or "
    f"{_DJANGO_VALKEY_BACKEND!r} (django-valkey)"
)


class CacheBackend(enum.Enum):
    """The Redis cache backends whose connection we know how to take."""

    DJANGO_REDIS = "django-redis"
    DJANGO = "django"
    DJANGO_VALKEY = "django-valkey"


class UnsupportedCache(ImproperlyConfigured):
    """The cache alias cannot give us a single redis-py client.

    ``check_id`` is the system check id that reports the same problem.
    """

    def __init__(self, message: str, *, check_id: str, hint: str) -> None:
        super().__init__(f"{message} {hint}")
        self.message = message
        self.hint = hint
        self.check_id = check_id


def _import_class(dotted_path: str, what: str, alias: str) -> type:
    try:
        imported = import_string(dotted_path)
    except ImportError as exc:
        raise UnsupportedCache(
            f"The {what} {dotted_path!r} of cache {alias!r} cannot be imported: {exc}",
            check_id="django_redis_lock.E002",
            hint="Fix the cache's configuration in settings.CACHES.",
        ) from exc
    if not isinstance(imported, type):
        raise UnsupportedCache(
            f"The {what} {dotted_path!r} of cache {alias!r} is not a class.",
            check_id="django_redis_lock.E002",
            hint="Fix the cache's configuration in settings.CACHES.",
        )
    return imported


def cache_backend(alias: str) -> CacheBackend:
    """Which supported Redis backend the cache ``alias`` uses, read from ``settings.CACHES``.

    Reads configuration only: no cache is instantiated and Redis is not contacted.
    """
    caches_setting = getattr(settings, "CACHES", {})
    if alias not in caches_setting:
        raise UnsupportedCache(
            f"The cache alias {alias!r} is not in settings.CACHES "
            f"(known aliases: {', '.join(map(repr, caches_setting)) or 'none'}).",
            check_id="django_redis_lock.E001",
            hint=f"Set {PREFIX}CACHE_ALIAS to a cache alias backed by Redis, or add the alias.",
        )
    config = caches_setting[alias]
    backend_path = config.get("BACKEND", "")
    backend = _import_class(backend_path, "BACKEND", alias)

    if issubclass(backend, DjangoRedisRedisCache):
        client_path = config.get("OPTIONS", {}).get("CLIENT_CLASS", _DEFAULT_CLIENT_CLASS)
        client_class = _import_class(client_path, "OPTIONS['CLIENT_CLASS']", alias)
        if issubclass(client_class, ShardClient):
            raise UnsupportedCache(
                f"The cache {alias!r} uses django-redis' ShardClient ({client_path!r}), which "
                "spreads keys over several servers by their own hash and cannot give one "
                "connection for a lock.",
                check_id="django_redis_lock.E003",
                hint=(
                    f"Point {PREFIX}CACHE_ALIAS at a cache with the default client, or for "
                    f"several servers use Redis Cluster through {PREFIX}CONNECTION_FACTORY."
                ),
            )
        return CacheBackend.DJANGO_REDIS
    if issubclass(backend, DjangoRedisCache):
        return CacheBackend.DJANGO
    valkey_kind = _valkey_kind(alias, backend, config)
    if valkey_kind is not None:
        return valkey_kind
    raise UnsupportedCache(
        f"The cache {alias!r} uses {backend_path!r}, which is not a Redis cache.",
        check_id="django_redis_lock.E002",
        hint=(
            f"Locks need Redis: use {_SUPPORTED} for this alias, point {PREFIX}CACHE_ALIAS at "
            f"one that does, or give a client through {PREFIX}CONNECTION_FACTORY."
        ),
    )


def _valkey_kind(alias: str, backend: type, config: dict[str, Any]) -> CacheBackend | None:
    if not is_django_valkey(backend):
        return None  # (its CLIENT_CLASS, if any, is not ours to import)
    client_path = config.get("OPTIONS", {}).get("CLIENT_CLASS")
    client_class = (
        _import_class(client_path, "OPTIONS['CLIENT_CLASS']", alias) if client_path else None
    )
    kind = valkey_cache_kind(backend, client_class)
    if kind is ValkeyCacheKind.SHARDED:
        raise UnsupportedCache(
            f"The cache {alias!r} uses django-valkey's ShardClient ({client_path!r}), which "
            "spreads keys over several servers by their own hash and cannot give one "
            "connection for a lock.",
            check_id="django_redis_lock.E003",
            hint=(
                f"Point {PREFIX}CACHE_ALIAS at a cache with the default client, or for several "
                "servers use django_valkey.cluster_cache.cache.ClusterValkeyCache."
            ),
        )
    if kind is ValkeyCacheKind.ASYNC:
        raise UnsupportedCache(
            f"The cache {alias!r} uses django-valkey's AsyncValkeyCache, whose client can only "
            "be reached from a coroutine; the locks need one they can reach from sync code "
            "too (the async lock API makes its asyncio client from it).",
            check_id="django_redis_lock.E002",
            hint=(
                f"Add an alias with {_DJANGO_VALKEY_BACKEND!r} and the same LOCATION and "
                f"OPTIONS, and set {PREFIX}CACHE_ALIAS to it."
            ),
        )
    return CacheBackend.DJANGO_VALKEY if kind is ValkeyCacheKind.USABLE else None


def _connect(alias: str) -> RedisClient:
    factory = lock_settings.CONNECTION_FACTORY
    if factory is not None:
        client = factory(alias)
        if is_valkey_client(client):
            where = f"{PREFIX}CONNECTION_FACTORY({alias!r})"
            return cast(RedisClient, redis_twin_of_valkey(client, where))
        if not isinstance(client, RedisClient):
            raise ImproperlyConfigured(
                f"{PREFIX}CONNECTION_FACTORY returned {type(client).__name__!r} for cache "
                f"alias {alias!r}; it must return a redis-py client (redis.Redis or "
                "redis.cluster.RedisCluster) or a valkey-py one (valkey.Valkey or "
                "valkey.cluster.ValkeyCluster)."
            )
        return client
    backend = cache_backend(alias)
    if backend is CacheBackend.DJANGO_REDIS:
        # write=True: the primary, never a replica (also for SentinelClient).
        return cast(RedisClient, get_redis_connection(alias, write=True))
    if backend is CacheBackend.DJANGO_VALKEY:
        return cast(RedisClient, redis_twin_of_cache(alias))
    # Django's backend has no public accessor for its client; its first server takes writes.
    django_cache: Any = caches[alias]
    return cast(RedisClient, django_cache._cache.get_client(write=True))


# One client per alias for the whole process: redis-py clients are thread-safe and
# pool their connections, and a user's factory may be expensive (a Cluster client reads the
# slot map when built). Cleared when the settings it was built from change.
_clients: dict[str, RedisClient] = {}
_clients_lock = threading.Lock()


def get_redis_client(alias: str | None = None) -> RedisClient:
    """The redis-py client for the cache ``alias`` (default ``DJANGO_REDIS_LOCK_CACHE_ALIAS``).

    Raises ``ImproperlyConfigured`` (:class:`UnsupportedCache` for a cache that is not Redis)
    with a message saying what to change. Does not contact Redis.
    """
    if alias is None:
        alias = lock_settings.CACHE_ALIAS
    elif not isinstance(alias, str):
        raise TypeError(f"alias must be a cache alias (str), not {type(alias).__name__}.")
    elif not alias:
        raise ValueError("alias must not be empty.")
    client = _clients.get(alias)
    if client is None and alias in lock_settings.QUORUMS:
        raise ImproperlyConfigured(
            f"{alias!r} names a quorum ({PREFIX}QUORUMS) of several Redis servers, not one: "
            f"ask for one of its cache aliases ({', '.join(lock_settings.QUORUMS[alias])})."
        )
    if client is None:
        with _clients_lock:
            client = _clients.get(alias)
            if client is None:
                client = _clients[alias] = _connect(alias)
    return client


def quorum_members(alias: LockAlias) -> tuple[str, ...] | None:
    """The cache aliases of the quorum ``alias`` names (None: it is one cache alias)."""
    if isinstance(alias, tuple):
        return alias
    return lock_settings.QUORUMS.get(alias)


_quorum_clients: dict[LockAlias, QuorumClient] = {}


def lock_client(alias: LockAlias) -> RedisClient | QuorumClient:
    """The client the locks of ``alias`` talk to: :func:`get_redis_client`, or for a quorum
    a :class:`~django_redis_lock.backends.quorum.QuorumClient` over its servers."""
    members = quorum_members(alias)
    if members is None:
        return get_redis_client(cast(str, alias))
    client = _quorum_clients.get(alias)
    if client is None:
        name = repr(alias) if isinstance(alias, str) else f"[{', '.join(alias)}]"
        built = QuorumClient(name, [(member, get_redis_client(member)) for member in members])
        with _clients_lock:
            client = _quorum_clients.setdefault(alias, built)
    return client


# The asyncio twin of each client, per event loop: asyncio connections belong to one loop.
_async_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, AsyncClient]] = (
    weakref.WeakKeyDictionary()
)


def _async_twin(client: RedisClient, alias: str) -> AsyncClient:
    """An asyncio client for the same server(s), with the same credentials and timeouts."""

    def refuse(what: str) -> ImproperlyConfigured:
        return ImproperlyConfigured(
            f"The async lock API cannot derive an asyncio client from the client of cache "
            f"alias {alias!r} ({what}); it supports plain TCP, TLS and unix-socket connection "
            "pools, Sentinel and Redis Cluster. Use the sync API, or async_to_sync."
        )

    # Each waiting task holds a connection of its own (its BLPOP): a pool of redis-py 8's
    # default size (100) would fail the 101st task waiting at once, so a size nobody chose is
    # no limit here; a size the cache was given is kept (docs/async.md).
    return cast(AsyncClient, twin(client, REDIS, REDIS_ASYNCIO, refuse, unbounded_by_default=True))


def get_async_redis_client(alias: str | None = None) -> AsyncClient:
    """The asyncio twin of :func:`get_redis_client` for the running event loop."""
    loop = asyncio.get_running_loop()
    if alias is None:
        alias = lock_settings.CACHE_ALIAS
    per_loop = _async_clients.get(loop)
    if per_loop is None:
        per_loop = _async_clients[loop] = {}
        if loop not in _closers:
            _close_at_shutdown(loop)
    client = per_loop.get(alias)
    if client is None:
        client = per_loop[alias] = _async_twin(get_redis_client(alias), alias)
    return client


# Each loop's closer (:func:`_close_at_shutdown`), kept as long as the loop is.
_closers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = weakref.WeakKeyDictionary()


def _close_at_shutdown(loop: asyncio.AbstractEventLoop) -> None:
    """Close ``loop``'s clients when the loop shuts down: an async generator, started and left
    waiting, which the loop's ``shutdown_asyncgens()`` closes (``asyncio.run``, asgiref's
    ``async_to_sync`` and pytest-asyncio call it before the loop closes), and whose clean-up
    closes the clients. So a short-lived loop leaves no connection open, whether or not its
    code called :func:`aclose_async_redis_clients`."""
    closer = _closing()
    started: Any = closer.__anext__()  # (the loop's hook takes note of it)
    with contextlib.suppress(StopIteration):
        started.send(None)  # to its ``yield``: nothing before it waits
    _closers[loop] = closer


async def _closing() -> AsyncIterator[None]:
    try:
        yield
    finally:
        await aclose_async_redis_clients()


def async_lock_client(alias: LockAlias) -> AsyncClient | AsyncQuorumClient:
    """:func:`lock_client` for asyncio."""
    client = lock_client(alias)
    if isinstance(client, QuorumClient):
        return AsyncQuorumClient(client)  # holds no connections of its own: nothing to cache
    return get_async_redis_client(cast(str, alias))


async def aclose_async_redis_clients() -> None:
    """Close the asyncio clients of the running event loop.

    A loop that shuts down as ``asyncio.run()`` and ``async_to_sync`` do (its async
    generators closed first) has them closed then anyway; a loop that lives as long as the
    process (an ASGI server's) needs nothing. Call it before a loop ends that is closed
    without that (``loop.run_until_complete()``, then ``loop.close()``).
    """
    for client in _async_clients.pop(asyncio.get_running_loop(), {}).values():
        await client.aclose()
        if isinstance(client, redis.asyncio.Redis):
            await client.connection_pool.disconnect()  # ours: aclose() leaves a given pool open
            # A Sentinel-backed client also holds connections to the Sentinels it asked.
            pool = client.connection_pool
            if isinstance(pool, redis.asyncio.sentinel.SentinelConnectionPool):
                for sentinel in pool.sentinel_manager.sentinels:
                    await sentinel.aclose()


@receiver(setting_changed)
def _forget_clients(*, setting: str, **kwargs: Any) -> None:
    if setting == "CACHES" or setting in {s.full_name for s in SETTINGS.values()}:
        with _clients_lock:
            _clients.clear()
            _quorum_clients.clear()
            _async_clients.clear()
