"""A client for the same server(s) as another client, built from that client's configuration.

Two uses, one rule:

- the **asyncio twin** of a redis-py client: the async lock API talks through it, since asyncio
  connections belong to one event loop and a cache's client is a sync one;
- the **redis-py twin** of a valkey-py client (django-valkey's caches, or a connection factory
  that returns one): the engine speaks redis-py, whose replies, exceptions and scripts it knows,
  so a valkey-py client is not used directly but read for where and how to connect.

The rule: the twin connects to the same server(s), as the same user, with the same database,
TLS settings and timeouts; what cannot be carried over (a custom pool or connection class, a
client of another library) is an :class:`~django.core.exceptions.ImproperlyConfigured` that
says so, never a twin that connects somewhere else. Each library is a :class:`ClientFamily`;
a twin is made from one family's client into another's.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.sentinel
import redis.cluster
import redis.sentinel
from django.core.exceptions import ImproperlyConfigured

__all__ = ["REDIS", "REDIS_ASYNCIO", "ClientFamily", "copyable", "twin"]


@dataclass(frozen=True)
class ClientFamily:
    """The classes of one client library (redis-py, its asyncio API, valkey-py) that a twin
    is read from or built with."""

    module: str  # where its own classes live: a subclass from elsewhere is a user's own
    client: type[Any]
    pool: type[Any]
    # Most specific first (a TLS connection is a TCP one): TLS, unix socket, TCP.
    connections: tuple[type[Any], type[Any], type[Any]]
    sentinel: type[Any]
    sentinel_pool: type[Any]
    cluster: type[Any]
    cluster_node: type[Any]
    # What a cluster client's constructor passes on to its connections, beside its own
    # parameters: the sync clients take connection options as **kwargs.
    cluster_connection: type[Any] | None = None


REDIS = ClientFamily(
    module="redis.",
    client=redis.Redis,
    pool=redis.ConnectionPool,
    connections=(redis.SSLConnection, redis.UnixDomainSocketConnection, redis.Connection),
    sentinel=redis.sentinel.Sentinel,
    sentinel_pool=redis.sentinel.SentinelConnectionPool,
    cluster=redis.cluster.RedisCluster,
    cluster_node=redis.cluster.ClusterNode,
    cluster_connection=redis.SSLConnection,
)
REDIS_ASYNCIO = ClientFamily(
    module="redis.",
    client=redis.asyncio.Redis,
    pool=redis.asyncio.ConnectionPool,
    connections=(
        redis.asyncio.SSLConnection,
        redis.asyncio.UnixDomainSocketConnection,
        redis.asyncio.Connection,
    ),
    sentinel=redis.asyncio.sentinel.Sentinel,
    sentinel_pool=redis.asyncio.sentinel.SentinelConnectionPool,
    cluster=redis.asyncio.cluster.RedisCluster,
    cluster_node=redis.asyncio.cluster.ClusterNode,
)

# Parts of a connection's configuration that are objects of the source library (or of its sync
# API) and have defaults in the target: copying them would mix the two.
_NOT_COPIED = {
    "retry",
    "parser_class",
    "connection_class",
    "redis_connect_func",
    "valkey_connect_func",
    "event_dispatcher",
}


def _accepted_parameters(*classes: type) -> set[str]:
    names: set[str] = set()
    for cls in classes:
        for klass in cls.__mro__:
            init = klass.__dict__.get("__init__")
            if init is not None:
                names.update(
                    name
                    for name, parameter in inspect.signature(init).parameters.items()
                    if parameter.kind is not inspect.Parameter.VAR_KEYWORD
                )
    return names - {"self"}


def copyable(
    kwargs: dict[str, Any], *targets: type, dropped: frozenset[str] = frozenset()
) -> dict[str, Any]:
    """The parts of a client's configuration ``kwargs`` that the ``targets``' constructors take."""
    accepted = _accepted_parameters(*targets)
    return {
        name: value
        for name, value in kwargs.items()
        if name in accepted and name not in _NOT_COPIED and name not in dropped
    }


def _cluster_twin(client: Any, target: ClientFamily, dropped: frozenset[str]) -> Any:
    manager = client.nodes_manager
    nodes = [target.cluster_node(node.host, node.port) for node in manager.startup_nodes.values()]
    accepts = [target.cluster] + ([target.cluster_connection] if target.cluster_connection else [])
    # A cluster has database 0 only; valkey-py keeps db=0 in the options, redis-py refuses it.
    dropped |= {"db"}
    return target.cluster(
        startup_nodes=nodes, **copyable(manager.connection_kwargs, *accepts, dropped=dropped)
    )


#: A pool that never refuses a connection (redis-py 8 reads a size of None as 100).
UNBOUNDED = 2**31


_default_sizes: dict[type[Any], int] = {}


def _default_size(pool_class: type[Any]) -> int:
    """How many connections a pool of ``pool_class`` allows when nobody said (redis-py 8:
    100; earlier versions: 2**31). Read from a pool made for it: it connects nowhere."""
    if pool_class not in _default_sizes:
        _default_sizes[pool_class] = int(pool_class().max_connections)
    return _default_sizes[pool_class]


def pool_size(pool: Any, source: ClientFamily, unbounded_by_default: bool) -> int | None:
    """The size of a twin's pool: the size ``pool``'s user chose, or, when ``pool`` has its
    library's default and ``unbounded_by_default``, no limit. (None: ``pool`` says none.)"""
    size = getattr(pool, "max_connections", None)
    if unbounded_by_default and size == _default_size(source.pool):
        return UNBOUNDED
    return cast("int | None", size)


def _sentinel_twin(
    pool: Any, target: ClientFamily, dropped: frozenset[str], size: int | None
) -> Any:
    manager = pool.sentinel_manager
    sentinels = [
        (sentinel.connection_pool.connection_kwargs["host"],
         sentinel.connection_pool.connection_kwargs["port"])
        for sentinel in manager.sentinels
    ]  # fmt: skip
    connection = target.connections[-1]
    target_manager = target.sentinel(
        sentinels,
        min_other_sentinels=manager.min_other_sentinels,
        sentinel_kwargs=copyable(manager.sentinel_kwargs, connection, dropped=dropped),
        **copyable(pool.connection_kwargs, connection, dropped=dropped),
    )
    return target_manager.master_for(
        pool.service_name, **({} if size is None else {"max_connections": size})
    )


def twin(
    client: Any,
    source: ClientFamily,
    target: ClientFamily,
    refuse: Callable[[str], ImproperlyConfigured],
    *,
    dropped: frozenset[str] = frozenset(),
    unbounded_by_default: bool = False,
) -> Any:
    """A ``target`` client for the server(s) of ``client``, a ``source`` client.

    ``refuse(what)`` makes the error for a client whose configuration cannot be carried over
    (``what`` describes it); ``dropped`` names options not to carry over. Its pool has the
    size of ``client``'s, unless that is its library's default and ``unbounded_by_default``
    (:func:`pool_size`).
    """
    if isinstance(client, source.cluster):
        return _cluster_twin(client, target, dropped)
    pool: Any = getattr(client, "connection_pool", None)
    if isinstance(pool, source.sentinel_pool):
        return _sentinel_twin(pool, target, dropped, pool_size(pool, source, unbounded_by_default))
    connection_class = getattr(pool, "connection_class", None)
    target_connection = next(
        (
            target_class
            for source_class, target_class in zip(
                source.connections, target.connections, strict=True
            )
            if connection_class is not None
            and issubclass(connection_class, source_class)
            and connection_class.__module__.startswith(source.module)
        ),
        None,
    )
    if pool is None or target_connection is None or type(pool) is not source.pool:
        raise refuse(
            f"{type(client).__name__} with {getattr(connection_class, '__name__', 'no')} "
            "connections"
        )
    target_pool = target.pool(
        connection_class=target_connection,
        max_connections=pool_size(pool, source, unbounded_by_default),
        **copyable(pool.connection_kwargs, target_connection, dropped=dropped),
    )
    return target.client(connection_pool=target_pool)
