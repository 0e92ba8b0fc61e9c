"""django-valkey's caches (and valkey-py clients) as the source of the locks' connection.

django-valkey's ``ValkeyCache`` and ``ClusterValkeyCache`` give valkey-py clients. The engine
speaks redis-py (its replies, exceptions and script objects), so a valkey-py client is read for
where and how to connect, and the locks talk through its redis-py twin
(:func:`~django_redis_lock.backends.twins.twin`): the same server(s), user, database, TLS
settings and timeouts, in a connection pool of the locks' own. Valkey speaks the same protocol
and runs the same scripts, so nothing else differs.

valkey-py and django-valkey are optional: without them no cache can be one of theirs, and this
module still imports.
"""

from __future__ import annotations

import enum
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from .twins import REDIS, ClientFamily, twin

try:
    import valkey
    import valkey.cluster
    import valkey.sentinel
except ImportError:  # the optional extra is not installed
    valkey = None  # type: ignore[assignment]
try:
    import django_valkey
except ImportError:  # valkey-py without django-valkey: only a connection factory gives one
    django_valkey = None

VALKEY = (
    None
    if valkey is None
    else ClientFamily(
        module="valkey.",
        client=valkey.Valkey,
        pool=valkey.ConnectionPool,
        connections=(valkey.SSLConnection, valkey.UnixDomainSocketConnection, valkey.Connection),
        sentinel=valkey.sentinel.Sentinel,
        sentinel_pool=valkey.sentinel.SentinelConnectionPool,
        cluster=valkey.cluster.ValkeyCluster,
        cluster_node=valkey.cluster.ClusterNode,
    )
)

__all__ = [
    "ValkeyCacheKind",
    "is_django_valkey",
    "is_valkey_client",
    "redis_twin_of_cache",
    "redis_twin_of_valkey",
    "valkey_cache_kind",
]

# valkey-py names itself to the server (CLIENT SETINFO); the twin is redis-py and says so.
_DROPPED = frozenset({"lib_name", "lib_version"})


class ValkeyCacheKind(enum.Enum):
    """What a django-valkey cache backend class is, for the locks."""

    USABLE = "usable"  # ValkeyCache (default, herd or sentinel client), ClusterValkeyCache
    SHARDED = "sharded"  # ShardClient: keys spread over servers by its own hash
    ASYNC = "async"  # AsyncValkeyCache: its client is reached only from a coroutine


def is_django_valkey(backend: type) -> bool:
    """Whether the cache ``backend`` class is django-valkey's (checked by its module, so that
    django-valkey need not be importable to tell)."""
    return backend.__module__.startswith("django_valkey.")


def valkey_cache_kind(backend: type, client_class: type | None) -> ValkeyCacheKind | None:
    """What the cache ``backend`` class (with its ``OPTIONS['CLIENT_CLASS']``) is, or None when it
    is not one of django-valkey's. Reads classes only: nothing is connected."""
    if not is_django_valkey(backend):
        return None
    names = {klass.__name__ for klass in backend.__mro__}
    if "AsyncValkeyCache" in names:
        return ValkeyCacheKind.ASYNC
    if not names & {"ValkeyCache", "ClusterValkeyCache"}:
        return None
    if client_class is not None and any(
        klass.__name__ == "ShardClient" for klass in client_class.__mro__
    ):
        return ValkeyCacheKind.SHARDED
    return ValkeyCacheKind.USABLE


def is_valkey_client(client: object) -> bool:
    """Whether ``client`` is a valkey-py client (single server, Sentinel or Cluster)."""
    return VALKEY is not None and isinstance(client, (VALKEY.client, VALKEY.cluster))


def redis_twin_of_valkey(client: Any, where: str) -> Any:
    """The redis-py client for the server(s) the valkey-py ``client`` talks to.

    ``where`` says where the client came from, for the error when it cannot be carried over.
    """
    if VALKEY is None or not is_valkey_client(client):
        raise ImproperlyConfigured(f"{where} is not a valkey-py client.")

    def refuse(what: str) -> ImproperlyConfigured:
        return ImproperlyConfigured(
            f"The locks cannot connect like the valkey-py client of {where} ({what}): they "
            "carry over valkey-py's own TCP, TLS and unix-socket connection pools, Sentinel "
            "and Cluster. Give the locks a client through DJANGO_REDIS_LOCK_CONNECTION_FACTORY."
        )

    return twin(client, VALKEY, REDIS, refuse, dropped=_DROPPED)


def redis_twin_of_cache(alias: str) -> Any:
    """The redis-py twin of the django-valkey cache ``alias``'s client for writes: the primary,
    never a replica (also with django-valkey's Sentinel client)."""
    if django_valkey is None:
        raise ImproperlyConfigured(f"The cache {alias!r} needs django-valkey, which is missing.")
    client = django_valkey.get_valkey_connection(alias, write=True)
    return redis_twin_of_valkey(client, f"the cache {alias!r}")
