"""Waiting to be woken: a blocking pop on a waiter's own wake-up list (``BLPOP``), alone or
sent right after a queue join in the same round trip, timed to the millisecond when the time
matters. Sent as ``wire.py`` sends everything: once, on a borrowed pooled connection."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from typing import Any, cast

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .cluster_wire import aexecute_on_cluster, redirected
from .wire import (
    aborrowed,
    borrowed,
    give_back_behind,
    no_reply,
    pack,
    pack_all,
    socket_timeout_of,
    sooner,
)

__all__ = [
    "arun_then_wait",
    "await_wake",
    "await_wake_on_cluster",
    "run_then_wait",
    "wait_for_wake",
]


# BLPOP's own timeout is only checked when the server's event loop wakes (every 100 ms on an
# idle server with the default hz 10), so it can overshoot by that much. When the time matters
# (the wait ends, or the holder's lease does) the server is given longer and the client cuts the
# wait itself, to the millisecond, at the price of a new connection next time. Otherwise the
# server's timeout is used and the client allows it this much lateness; a short block less (a
# fair=False waiter that lost the race asks again within a few ms: on an idle server it cuts
# the wait itself; a busy server, the usual case, answers in time), but never under
# _LEAST_LATENESS, which a loaded machine's scheduling alone can take.
_SERVER_LATENESS = 0.5
_LEAST_LATENESS = 0.02


def _blpop_timeouts(seconds: float, exact: bool) -> tuple[float, float]:
    """(timeout sent to the server, time the client waits for the reply)."""
    if exact:
        return seconds + 1.0, seconds
    return seconds, seconds + min(max(seconds, _LEAST_LATENESS), _SERVER_LATENESS)


def _interrupted(error: RedisError) -> bool:
    """A blocked wait that ended because the server went away or changed role: a failover
    (Redis Cluster answers ``-UNBLOCKED`` to clients blocked on a primary that became a
    replica, or ``MOVED``; Sentinel's demotion closes the connection), not a bad request."""
    if isinstance(error, RedisConnectionError | RedisTimeoutError) or redirected(error):
        return True
    return isinstance(error, ResponseError) and str(error).startswith("UNBLOCKED")


def _popped(reply: Any) -> Any:
    """What ``BLPOP`` popped (its reply is ``[key, value]``), or None when it timed out."""
    return None if reply is None else reply[1]


def wait_for_wake(
    client: Any,
    key: str,
    seconds: float,
    *,
    exact: bool = True,
    on_interrupted: Callable[[], None] | None = None,
) -> Any:
    """Block until something is pushed on ``key`` (returns it) or ``seconds`` pass (None), on
    one server's client (on a Cluster: the key's node's, ``cluster_wire.node_client``).

    A wait interrupted by a failover also returns None, after calling ``on_interrupted`` (a
    Cluster reads its slot map again): the caller asks the lock again, which fails at once if
    no primary answers, or goes on waiting on the new one.
    """
    server_timeout, client_timeout = _blpop_timeouts(seconds, exact)
    try:
        with borrowed(client) as connection:
            connection.send_packed_command([pack(("BLPOP", key, server_timeout))])
            if connection.can_read(timeout=client_timeout):
                return _popped(connection.read_response())
            # Still blocked server-side: drop the connection rather than wait for the reply. A
            # wake-up popped just now is not lost: it is a lease handed to us, which the
            # caller finds its own when it asks the lock again, and the script that tells it
            # so says again what the message said (join.lua: the work done, the next waiter).
            connection.disconnect()
            return None
    except RedisError as error:
        if not _interrupted(error):
            raise
        if on_interrupted is not None:
            on_interrupted()
        return None


def run_then_wait(
    client: Any,
    command: Sequence[Any],
    key: str,
    seconds: float,
    *,
    exact: bool = True,
    reply_timeout: float | None = None,
    if_silent: Callable[[], Sequence[Sequence[Any]]] | None = None,
    after_first: Callable[[Any], float] | None = None,
) -> tuple[Any, Any]:
    """``command``, then :func:`wait_for_wake` on ``key``, in one round trip, on one server's
    client (not a Cluster's): returns ``(command's reply, what was popped or None)``.
    ``after_first(reply)``: called with the command's reply as soon as it is read, before the
    wait goes on: how long the wait may last, given that reply (cut short here).

    The waiting only makes sense when ``command`` left nothing to wait for otherwise (a queue
    join that took the lock pushes on ``key`` itself). An error of ``command`` is raised, and
    the connection, with its wait still pending in Redis, dropped; a wait interrupted by a
    failover gives None, as in :func:`wait_for_wake`. ``reply_timeout`` and ``if_silent``
    are :func:`execute`'s, for ``command``'s reply (``if_silent`` then runs after the wait,
    which a command that did not queue us ends at once).
    """
    server_timeout, client_timeout = _blpop_timeouts(seconds, exact)
    with borrowed(client) as connection:
        connection.send_packed_command([pack(command) + pack(("BLPOP", key, server_timeout))])
        try:
            if (
                reply_timeout is not None
                and sooner(reply_timeout, connection.socket_timeout)
                and not connection.can_read(timeout=reply_timeout)
            ):
                raise no_reply(reply_timeout)
            # (Left open on a timeout, for if_silent to follow on it: then dropped.)
            reply = connection.read_response(disconnect_on_error=if_silent is None)
        except ResponseError:
            connection.disconnect()  # the BLPOP behind it is still pending
            raise
        except RedisError as error:
            # No reply within the reply budget or the socket timeout (a request held up on
            # its way arrives after the caller gave up: then what it took goes back, behind
            # it); a broken connection takes the request's fate with it.
            if isinstance(error, RedisTimeoutError):
                give_back_behind(connection, if_silent)
            raise
        except BaseException:  # interrupted (KeyboardInterrupt, SystemExit): as execute does
            give_back_behind(connection, if_silent)
            raise
        if after_first is not None:
            client_timeout = min(client_timeout, after_first(reply))
        try:
            if connection.can_read(timeout=client_timeout):
                return reply, _popped(connection.read_response())
        except RedisError as error:
            if not _interrupted(error):
                raise
            connection.disconnect()
            return reply, None
        connection.disconnect()  # still blocked server-side: see wait_for_wake
        return reply, None


async def arun_then_wait(
    client: Any,
    command: Sequence[Any],
    key: str,
    seconds: float,
    *,
    exact: bool = True,
    reply_timeout: float | None = None,
    if_silent: Callable[[], Sequence[Sequence[Any]]] | None = None,
    after_first: Callable[[Any], float] | None = None,
) -> tuple[Any, Any]:
    """:func:`run_then_wait` for a ``redis.asyncio`` client (not a Cluster's); ``if_silent`` is
    also sent when the task is cancelled while it waits for ``command``'s reply."""
    server_timeout, client_timeout = _blpop_timeouts(seconds, exact)
    if not sooner(reply_timeout, socket_timeout_of(client.connection_pool)):
        reply_timeout = None
    async with aborrowed(client) as connection:
        packed = pack(command) + pack(("BLPOP", key, server_timeout))
        await connection.send_packed_command([packed])
        try:
            reply = await asyncio.wait_for(
                connection.read_response(disconnect_on_error=False), reply_timeout
            )
        except ResponseError:
            await connection.disconnect()
            raise
        except (asyncio.CancelledError, asyncio.TimeoutError, RedisTimeoutError) as error:
            if if_silent is not None:
                with contextlib.suppress(RedisError, OSError, asyncio.CancelledError):
                    await connection.send_packed_command(
                        [pack_all(if_silent())], check_health=False
                    )
            if isinstance(error, asyncio.TimeoutError):
                raise no_reply(cast(float, reply_timeout)) from None
            raise
        if after_first is not None:
            client_timeout = min(client_timeout, after_first(reply))
        try:
            popped = await asyncio.wait_for(connection.read_response(), client_timeout)
        except asyncio.TimeoutError:
            await connection.disconnect()
            return reply, None
        except RedisError as error:
            if not _interrupted(error):
                raise
            await connection.disconnect()
            return reply, None
        return reply, _popped(popped)


async def await_wake(client: Any, key: str, seconds: float, *, exact: bool = True) -> Any:
    """:func:`wait_for_wake` for a ``redis.asyncio`` client of one server."""
    server_timeout, client_timeout = _blpop_timeouts(seconds, exact)
    try:
        async with aborrowed(client) as connection:
            await connection.send_packed_command([pack(("BLPOP", key, server_timeout))])
            try:
                reply = await asyncio.wait_for(connection.read_response(), client_timeout)
            except asyncio.TimeoutError:
                await connection.disconnect()
                return None
            return _popped(reply)
    except RedisError as error:
        if not _interrupted(error):
            raise
        return None


async def await_wake_on_cluster(cluster: Any, key: str, seconds: float) -> Any:
    """:func:`await_wake` on ``redis.asyncio``'s Cluster client (through its own routing)."""
    try:
        return _popped(await aexecute_on_cluster(cluster, "BLPOP", key, seconds))
    except RedisError as error:
        if not _interrupted(error):
            raise
        return None
