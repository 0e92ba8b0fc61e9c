"""Find the redis-py client that the locks of a cache alias talk to.

Three sources, in this order:

1. ``DJANGO_REDIS_LOCK_CONNECTION_FACTORY``: the user's callable, given the alias, returns a
   redis-py client (``redis.Redis`` or ``redis.cluster.RedisCluster``). This is how clients
   that no Django cache backend offers (Redis Cluster) come in.
2. A django-redis cache: ``get_redis_connection(alias, write=True)``, which is the primary for
   replicated and Sentinel set-ups; locks must never be taken on a replica.
3. Django's own ``django.core.cache.backends.redis.RedisCache``: its write (first) server.

Anything else raises :class:`UnsupportedCache`, an ``ImproperlyConfigured`` that says what to
change; ``checks.py`` reports the same problems at start-up.
"""

from __future__ import annotations

import enum
import threading
from typing import Any, cast

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

from .conf import PREFIX, SETTINGS, lock_settings

RedisClient = Redis | RedisCluster

__all__ = [
    "CacheBackend",
    "RedisClient",
    "UnsupportedCache",
    "cache_backend",
    "get_redis_client",
]

_DJANGO_REDIS_BACKEND = "django_redis.cache.RedisCache"
_DJANGO_BACKEND = "django.core.cache.backends.redis.RedisCache"
_DEFAULT_CLIENT_CLASS = "django_redis.client.DefaultClient"
_SUPPORTED = f"{_DJANGO_REDIS_BACKEND!r} (django-redis) or {_DJANGO_BACKEND!r} (Django's own)"


class CacheBackend(enum.Enum):
    """The Redis cache backends whose connection we know how to take."""

    DJANGO_REDIS = "django-redis"
    DJANGO = "django"


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
    raise UnsupportedCache(
        f"The cache {alias!r} uses {backend_path!r}, which is not a Redis cache.",
        check_id="django_redis_lock.E002",
        hint=(
            f"Locks need Redis: use {_SUPPORTED} for this alias, point {PREFIX}CACHE_ALIAS at "
            f"one that does, or give a client through {PREFIX}CONNECTION_FACTORY."
        ),
    )


def _connect(alias: str) -> RedisClient:
    factory = lock_settings.CONNECTION_FACTORY
    if factory is not None:
        client = factory(alias)
        if not isinstance(client, RedisClient):
            raise ImproperlyConfigured(
                f"{PREFIX}CONNECTION_FACTORY returned {type(client).__name__!r} for cache "
                f"alias {alias!r}; it must return a redis-py client (redis.Redis or "
                "redis.cluster.RedisCluster)."
            )
        return client
    if cache_backend(alias) is CacheBackend.DJANGO_REDIS:
        # write=True: the primary, never a replica (also for SentinelClient).
        return cast(RedisClient, get_redis_connection(alias, write=True))
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
    if client is None:
        with _clients_lock:
            client = _clients.get(alias)
            if client is None:
                client = _clients[alias] = _connect(alias)
    return client


@receiver(setting_changed)
def _forget_clients(*, setting: str, **kwargs: Any) -> None:
    if setting == "CACHES" or setting in {s.full_name for s in SETTINGS.values()}:
        with _clients_lock:
            _clients.clear()
