"""How the lock engine's commands reach a Redis Cluster (``redis.cluster.RedisCluster`` and its
asyncio twin): each to the node of its key, sent once on the node's own connection (dropped
when interrupted, and followed there by an acquisition's give-back), MOVED and ASK followed by
the Cluster client; the slot map read again after a failover. One server's (and Sentinel's)
way is ``wire.py``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from redis.exceptions import (
    AskError,
    ClusterDownError,
    MovedError,
    RedisClusterException,
    RedisError,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .wire import drop_idle_connections, execute

__all__ = [
    "aexecute_on_cluster",
    "execute_on_cluster",
    "node_client",
    "redirected",
    "reread_slot_map",
]


@contextlib.contextmanager
def _unreachable_as_connection_errors() -> Iterator[None]:
    """redis-py's ``RedisClusterException`` ("cannot be connected": no node answered as it
    read the slot map again) is no ``RedisError``: raised as the connection error it is, so
    that a lock operation says ``LockBackendError``, as for any Redis that cannot be reached."""
    try:
        yield
    except RedisClusterException as error:
        raise RedisConnectionError(str(error)) from error


@contextlib.contextmanager
def _unread_replies_dropped(cluster: Any) -> Iterator[None]:
    """Around a call into redis-py's Cluster client (a command it redirects, the slot map it
    reads again): that client gives a connection back to its pool however a command ended.
    Interrupted (``KeyboardInterrupt``, ``SoftTimeLimitExceeded``) between a send and the
    read of its reply, it lends that connection again with the reply still to come, and the
    next command on it reads that reply as its own. Which connection it was is not known
    here: every idle connection to the Cluster's nodes is dropped (in use ones are another
    thread's, in step)."""
    try:
        yield
    except (RedisError, RedisClusterException):
        raise
    except BaseException:
        for node in cluster.get_nodes():
            if node.redis_connection is not None:
                drop_idle_connections(node.redis_connection.connection_pool)
        raise


def execute_on_cluster(
    cluster: Any,
    *args: Any,
    if_silent: Callable[[], Sequence[Sequence[Any]]] | None = None,
    **ignored: Any,
) -> Any:
    """:func:`execute` on a Redis Cluster: on the connection of the node of the command's key,
    sent once (not retried after a timeout or a dropped connection, when it may have run).
    ``SCRIPT LOAD`` goes to every primary; another command with no key (``TIME``) to one.
    ``reply_timeout`` is not applied: the socket timeout is.

    On the node's own pool, not through the Cluster client: that one gives a connection back
    to its pool whatever ended the command, so an interrupt (``KeyboardInterrupt``, a
    ``SoftTimeLimitExceeded``) between its send and its read left the reply unread, and the
    next caller on that connection read it as its own. :func:`execute` drops such a
    connection. With ``if_silent`` (an acquisition's give-back), the give-back follows the
    command on the same connection (the node runs it right after the command, as one server
    does).

    A MOVED, ASK, TRYAGAIN or CLUSTERDOWN (the command did not run) is left to the Cluster
    client, which follows or waits them out; a connection that failed has the slot map read
    again, so that the next call goes to the slot's primary now (as the Cluster client does)."""
    key = _routing_key(args)
    with _unreachable_as_connection_errors():
        if key is None:
            primaries = [cluster.get_redis_connection(node) for node in cluster.get_primaries()]
            if _is_script_load(args):
                return [execute(primary, *args) for primary in primaries][-1]
            return execute(primaries[0], *args)
        try:
            return execute(node_client(cluster, key), *args, if_silent=if_silent)
        except ResponseError as error:
            if not (redirected(error) or _not_now(error)):
                raise
        except (RedisConnectionError, RedisTimeoutError):
            reread_slot_map(cluster)
            raise
        with _unread_replies_dropped(cluster):
            return cluster.execute_command(*args, target_nodes=cluster.get_node_from_key(key))


def _is_script_load(args: Sequence[Any]) -> bool:
    return str(args[0]).upper() == "SCRIPT" and str(args[1]).upper() == "LOAD"


def _not_now(error: ResponseError) -> bool:
    """``TRYAGAIN`` (a script's keys split by a slot being moved) or ``CLUSTERDOWN``: not run,
    to be sent again later (redis-py before 6 raises them as plain ``ResponseError``)."""
    return isinstance(error, TryAgainError | ClusterDownError) or str(error).startswith(
        ("TRYAGAIN", "CLUSTERDOWN")
    )


def _routing_key(args: Sequence[Any]) -> Any:
    """The key a command of ours is routed by on a Redis Cluster (None: no key)."""
    name = str(args[0]).upper()
    if name in ("EVALSHA", "EVAL"):
        return args[3] if int(args[2]) else None
    return args[1] if name != "SCRIPT" and len(args) > 1 else None


def node_client(cluster: Any, key: str) -> Any:
    """The plain client of the current primary of ``key``'s slot on a Redis Cluster (``WAIT``
    must follow the write on the same connection, which the cluster client's own routing does
    not promise; a blocking wait is timed on the node's own pool)."""
    return cluster.get_redis_connection(cluster.get_node_from_key(key))


def reread_slot_map(cluster: Any) -> None:
    """A Redis Cluster client whose slot moved or whose primary failed: read the slot map
    again, so that the next call goes to the slot's owner now."""
    with contextlib.suppress(RedisError, RedisClusterException), _unread_replies_dropped(cluster):
        cluster.nodes_manager.initialize()


def redirected(error: RedisError) -> bool:
    """``MOVED`` or ``ASK``: redis-py before 6 raises them as plain ``ResponseError`` outside
    its Cluster client."""
    return isinstance(error, MovedError | AskError) or (
        isinstance(error, ResponseError) and str(error).startswith(("MOVED ", "ASK "))
    )


async def aexecute_on_cluster(cluster: Any, *args: Any, **ignored: Any) -> Any:
    """:func:`execute_on_cluster` for ``redis.asyncio``'s Cluster client."""
    key = _routing_key(args)
    with _unreachable_as_connection_errors():
        if key is None:
            if _is_script_load(args):
                return await cluster.script_load(args[2])  # on every primary
            return await cluster.execute_command(*args)
        # The asyncio client reads the slot map on first use, not when built.
        await cluster.initialize()
        return await cluster.execute_command(*args, target_nodes=cluster.get_node_from_key(key))
