"""Writes confirmed by replicas: a command, then ``WAIT`` on the same connection, for the
grants that ``DJANGO_REDIS_LOCK_MIN_REPLICAS`` wants confirmed (``core/replicas.py`` decides
what a count of replicas means)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from redis.exceptions import ResponseError

from ..core.release import WaitRefused
from .wire import aborrowed, borrowed, pack

__all__ = ["aexecute_acknowledged", "execute_acknowledged"]


def execute_acknowledged(
    client: Any,
    command: Sequence[Any],
    replicas: int,
    timeout_ms: int,
    wanted: Callable[[Any], bool],
) -> tuple[Any, int]:
    """:func:`execute`, then, if ``wanted(reply)``, ``WAIT replicas timeout_ms`` on the same
    connection (``WAIT`` counts the replicas that have this connection's writes). Returns the
    reply and the number of replicas that acknowledged (-1 when not asked; a
    :class:`~django_redis_lock.core.release.WaitRefused` when the server refused ``WAIT``)."""
    with borrowed(client) as connection:
        connection.send_packed_command([pack(command)])
        reply = connection.read_response()
        acknowledged = -1
        if wanted(reply):
            connection.send_packed_command([pack(("WAIT", replicas, timeout_ms))])
            try:
                acknowledged = int(connection.read_response())
            except ResponseError as refused:  # a complete error reply: still in step
                acknowledged = WaitRefused(str(refused))
        return reply, acknowledged


async def aexecute_acknowledged(
    client: Any,
    command: Sequence[Any],
    replicas: int,
    timeout_ms: int,
    wanted: Callable[[Any], bool],
) -> tuple[Any, int]:
    """:func:`execute_acknowledged` for a ``redis.asyncio`` client."""
    async with aborrowed(client) as connection:
        await connection.send_packed_command([pack(command)])
        reply = await connection.read_response()
        acknowledged = -1
        if wanted(reply):
            await connection.send_packed_command([pack(("WAIT", replicas, timeout_ms))])
            try:
                acknowledged = int(await connection.read_response())
            except ResponseError as refused:  # a complete error reply: still in step
                acknowledged = WaitRefused(str(refused))
        return reply, acknowledged
