"""How the lock engine's commands reach Redis: each sent once, on a pooled connection.

Not redis-py's ``execute_command``, which retries after a timeout or a dropped connection (and
could run a lock script twice): a lock command is tried once, and the caller decides what a
failure means (:func:`request_sent` says whether a failed one may have run all the same). Also
here: several commands in one round trip, and what to do after a failover (ask Sentinel).
A Redis Cluster's way is ``cluster_wire.py``; a write confirmed by replicas (``WAIT``) is in
``replicas.py``; the waiters' blocking wait for a wake-up is in ``waits.py``; the Lua scripts
sent this way are in ``scripts.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any, cast

from redis.asyncio.sentinel import SentinelConnectionPool as AsyncSentinelConnectionPool
from redis.exceptions import (
    RedisError,
    ResponseError,
)
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.sentinel import SentinelConnectionPool

from .inflight import carried, no_reply

__all__ = [
    "aborrowed",
    "adrop_stale_connections",
    "aexecute",
    "aexecute_many",
    "borrowed",
    "drop_idle_connections",
    "drop_stale_connections",
    "execute",
    "execute_many",
    "execute_many_on",
    "follow_sentinel",
    "give_back_behind",
    "no_reply",
    "pack",
    "pack_all",
    "request_sent",
    "socket_timeout_of",
    "sooner",
]


def pack(args: Sequence[Any]) -> bytes:
    """One command in RESP. Ours are made of str, bytes and int only, and packing them here is
    several times cheaper than redis-py's general-purpose packer, on the hottest path we have."""
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        if isinstance(arg, str):
            arg = arg.encode("utf-8", "surrogatepass")
        elif isinstance(arg, int):
            arg = b"%d" % arg
        elif isinstance(arg, float):
            arg = repr(arg).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(arg), arg))
    return b"".join(parts)


def pack_all(commands: Sequence[Sequence[Any]]) -> bytes:
    """Several commands in RESP, one after the other (a give-back of several scripts)."""
    return b"".join(pack(command) for command in commands)


def request_sent(error: BaseException) -> bool:
    """Whether a request that failed with ``error`` may have run in Redis all the same: False
    for an error reply, and for a connection that could not be made (nothing was sent)."""
    return not isinstance(error, ResponseError) and getattr(error, "request_sent", True)


def _unsent(error: RedisError) -> None:
    error.request_sent = False  # type: ignore[attr-defined]


class borrowed:
    """A connection of ``client``'s pool for a few commands, given back afterwards.

    A class, not a ``contextlib.contextmanager``: this is on every request, and a context
    manager made of a generator cost more than the rest of an uncontended acquire and release
    together (measured: 25 µs per cycle on the benchmark VM)."""

    __slots__ = ("connection", "pool")

    def __init__(self, client: Any) -> None:
        self.pool = client.connection_pool

    def __enter__(self) -> Any:
        try:
            self.connection = self.pool.get_connection()
        except RedisError as error:
            _unsent(error)
            raise
        except BaseException:
            # Interrupted as redis-py made the connection (its handshake: HELLO, CLIENT
            # SETINFO), redis-py gives it back to the pool connected, with the handshake's
            # reply still to come, which the next command on it would read as its own.
            drop_idle_connections(self.pool)
            raise
        return self.connection

    def __exit__(self, kind: Any, error: Any, traceback: Any) -> None:
        # A complete error reply leaves the connection in step; anything else (a timeout, a
        # dropped connection, an interrupt in a blocking command) may leave a reply on its
        # way, so the connection must not be reused.
        if kind is not None and not issubclass(kind, ResponseError):
            self.connection.disconnect()
        self.pool.release(self.connection)


class aborrowed:
    """:class:`borrowed` for a ``redis.asyncio`` client. A class for the same reason: an
    ``asynccontextmanager`` costs an async generator per request, and its event loop hooks
    (measured: about 10 % of the client's CPU per acquisition with 200 tasks waiting)."""

    __slots__ = ("connection", "pool")

    def __init__(self, client: Any) -> None:
        self.pool = client.connection_pool

    async def __aenter__(self) -> Any:
        try:
            self.connection = await self.pool.get_connection()
        except RedisError as error:
            _unsent(error)
            raise
        return self.connection

    async def __aexit__(self, kind: Any, error: Any, traceback: Any) -> None:
        # As borrowed's: after anything but a complete error reply (a timeout, a dropped
        # connection, a cancellation mid-reply), a reply may still be on its way.
        try:
            if kind is not None and not issubclass(kind, ResponseError):
                await self.connection.disconnect()
        finally:
            await self.pool.release(self.connection)


def sooner(reply_timeout: float | None, socket_timeout: float | None) -> bool:
    """Whether ``reply_timeout`` cuts a wait for a reply shorter than the socket timeout."""
    return reply_timeout is not None and (socket_timeout is None or reply_timeout < socket_timeout)


def socket_timeout_of(pool: Any) -> float | None:
    """The socket timeout a pool's connections get: configured, or their class's default."""
    kwargs = pool.connection_kwargs
    if "socket_timeout" in kwargs:
        return cast("float | None", kwargs["socket_timeout"])
    return _default_socket_timeout(pool.connection_class)


@functools.cache
def _default_socket_timeout(connection_class: type) -> float | None:
    # redis-py 8.1 gives connections a 5 s default; earlier versions none (None).
    for klass in connection_class.__mro__:
        init = klass.__dict__.get("__init__")
        parameter = inspect.signature(init).parameters.get("socket_timeout") if init else None
        if parameter is not None and parameter.default is not inspect.Parameter.empty:
            return cast("float | None", parameter.default)
    return None


def execute(
    client: Any,
    *args: Any,
    reply_timeout: float | None = None,
    if_silent: Callable[[], Sequence[Sequence[Any]]] | None = None,
) -> Any:
    """Send one command on a connection of ``client``'s pool (one server, directly or through
    Sentinel), once, and return the raw reply. (A Cluster: :func:`execute_on_cluster`.)

    Not ``client.execute_command``: that retries on timeouts and connection errors (redis-py 8
    by default ten times, with back-off), which would turn "Redis is unreachable" into a long
    hang, and could run a lock script twice (a re-entry counted twice). A lock operation is
    tried once; the caller decides what a failure means.

    ``reply_timeout``: raise ``TimeoutError`` (and drop the connection) when no reply came
    within that many seconds, if that is sooner than the socket timeout (one server or
    Sentinel; a Cluster client keeps its socket timeout). ``if_silent``: makes a command to send
    after the first on the same connection, without waiting for its reply, when no reply
    came in time: Redis runs it after the first, whenever it runs that one.
    """
    with borrowed(client) as connection:
        try:
            connection.send_packed_command([pack(args)])
            if (
                reply_timeout is not None
                and sooner(reply_timeout, connection.socket_timeout)
                and not connection.can_read(timeout=reply_timeout)
            ):
                raise no_reply(reply_timeout)
            if if_silent is None:
                return connection.read_response()
            # Left open on a timeout, for if_silent to follow on it (then dropped, by _borrowed).
            return connection.read_response(disconnect_on_error=False)
        except RedisTimeoutError:
            give_back_behind(connection, if_silent)  # (still open and in step: runs after it)
            raise
        except RedisError:
            raise
        except BaseException:
            # Interrupted (KeyboardInterrupt from a signal handler, SystemExit...) anywhere
            # from the send to the reply handed back: the request may have run, and what it
            # took goes back, on the same connection if still open, before the interrupt goes
            # on. Not waited for: Redis runs it right after the request.
            give_back_behind(connection, if_silent)
            raise


def give_back_behind(
    connection: Any, if_silent: Callable[[], Sequence[Sequence[Any]]] | None
) -> None:
    """Send ``if_silent()`` (a request's give-back, if it has one) on ``connection``, behind
    the request whose reply did not come, without waiting: Redis runs it right after that
    request, whenever it runs that one. A connection that broke meanwhile takes it with it."""
    if if_silent is not None:
        with contextlib.suppress(RedisError, OSError):
            connection.send_packed_command([pack_all(if_silent())], check_health=False)


def follow_sentinel(pool: Any) -> bool:
    """For a Sentinel pool (False for any other): ask Sentinel where the primary is now. If it
    moved, redis-py drops the pool's idle connections to the old one, and closes the others
    when they come back."""
    if not isinstance(pool, SentinelConnectionPool):
        return False
    with contextlib.suppress(RedisError):
        cast(Any, pool).get_master_address()  # untyped in redis-py
    return True


def drop_stale_connections(client: Any) -> None:
    """After a write no replica confirmed: the server may be a primary that a failover has
    replaced. Find out where the primary is now and drop the idle connections to the old one.
    (``client``: one server's; on a Cluster, :func:`node_client`'s, then
    :func:`reread_slot_map`.)

    Idle ones only: another thread may be blocked on one of the others (a waiter); a Sentinel
    pool closes those when they come back, once it knows the new primary's address.
    """
    pool = client.connection_pool
    if not follow_sentinel(pool):
        drop_idle_connections(pool)


def drop_idle_connections(pool: Any) -> None:
    """Close the connections of ``pool`` that nobody uses now (made again when next lent).
    redis-py 5's ``BlockingConnectionPool`` can only close them all: the others' fail
    their request with a connection error, which a lock operation is ready for."""
    try:
        pool.disconnect(inuse_connections=False)
    except TypeError:
        pool.disconnect()


async def adrop_stale_connections(client: Any) -> None:
    """:func:`drop_stale_connections` for a ``redis.asyncio`` client (not a Cluster)."""
    pool = client.connection_pool
    if isinstance(pool, AsyncSentinelConnectionPool):
        with contextlib.suppress(RedisError):
            await cast(Any, pool).get_master_address()
    else:
        await pool.disconnect(inuse_connections=False)


def execute_many(client: Any, commands: Sequence[Sequence[Any]]) -> list[Any]:
    """Send several commands in one round trip (a pipeline without MULTI), each once.

    Error replies are returned in place, as exception instances, not raised.
    """
    with borrowed(client) as connection:
        return execute_many_on(connection, commands)


def execute_many_on(connection: Any, commands: Sequence[Sequence[Any]]) -> list[Any]:
    """:func:`execute_many` on a connection already borrowed (:class:`borrowed`), for a caller
    that sends more on it afterwards."""
    connection.send_packed_command([b"".join(pack(command) for command in commands)])
    replies = []
    for _ in commands:
        try:
            replies.append(connection.read_response())
        except ResponseError as error:  # a complete error reply: still in step
            replies.append(error)
    return replies


async def aexecute_many(client: Any, commands: Sequence[Sequence[Any]]) -> list[Any]:
    """:func:`execute_many` for a ``redis.asyncio`` client of one server."""
    replies = []
    async with aborrowed(client) as connection:
        await connection.send_packed_command([b"".join(pack(command) for command in commands)])
        for _ in commands:
            try:
                replies.append(await connection.read_response())
            except ResponseError as error:
                replies.append(error)
    return replies


async def aexecute(
    client: Any,
    *args: Any,
    reply_timeout: float | None = None,
    if_silent: Callable[[], Sequence[Sequence[Any]]] | None = None,
) -> Any:
    """:func:`execute` for a ``redis.asyncio`` client of one server. A cancellation of the
    caller waits for the reply (``inflight.py``) and, for a request with a give-back
    (``if_silent``), sends it and waits for its reply too before it goes on: what the request
    took goes back at once. Past ``CANCEL_GRACE``, ``if_silent`` follows the request on its
    connection instead, without waiting, as it does when ``reply_timeout`` runs out."""
    if not sooner(reply_timeout, socket_timeout_of(client.connection_pool)):
        reply_timeout = None
    give_back = None if if_silent is None else (lambda: aexecute_many(client, if_silent()))
    return await carried(
        _aexecute_once(client, args, if_silent), reply_timeout=reply_timeout,
        give_back=give_back, gives_back_when_cut=True,
    )  # fmt: skip


async def _aexecute_once(
    client: Any,
    args: Sequence[Any],
    if_silent: Callable[[], Sequence[Sequence[Any]]] | None = None,
) -> Any:
    async with aborrowed(client) as connection:
        await connection.send_packed_command([pack(args)])
        if if_silent is None:
            return await connection.read_response()
        try:
            # Left open when cancelled or timed out, for if_silent to follow on it.
            return await connection.read_response(disconnect_on_error=False)
        except (asyncio.CancelledError, RedisTimeoutError):
            with contextlib.suppress(RedisError, OSError, asyncio.CancelledError):
                await connection.send_packed_command([pack_all(if_silent())], check_health=False)
            raise
