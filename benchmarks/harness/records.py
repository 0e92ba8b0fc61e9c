"""What the measurements count and how they sum it up: the requests a process sends (per
bucket), the server's CPU and command counts, a percentile and Jain's fairness index.

Requests (round trips) are counted on the client side, by wrapping redis-py's
``AbstractConnection.send_packed_command`` (and its asyncio twin): one call is one request
sent, whether it carries one command or a whole pipeline.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import redis
from redis.asyncio.connection import AbstractConnection as AsyncAbstractConnection
from redis.connection import AbstractConnection, Connection


class WorkConnection(Connection):
    """Connections of the critical section's own client: their requests are counted apart."""

    bench_bucket = "work"


class RequestCounter:
    """Counts requests sent by every redis-py connection of this process, synchronous or asyncio
    (redis-fifo-lock's), per bucket ("lock": anything a lock library sends; "work": the critical
    section's client). A pipeline is one ``send_packed_command`` call, so it counts as one round
    trip."""

    def __init__(self) -> None:
        self.counts = {"lock": 0, "work": 0}
        self._originals: tuple[Callable[..., Any], Callable[..., Any]] | None = None

    def install(self) -> RequestCounter:
        original = AbstractConnection.send_packed_command
        original_async = AsyncAbstractConnection.send_packed_command
        counts = self.counts

        @functools.wraps(original)
        def counted(conn: AbstractConnection, command: Any, check_health: bool = True) -> Any:
            counts[getattr(conn, "bench_bucket", "lock")] += 1
            return original(conn, command, check_health)

        @functools.wraps(original_async)
        async def counted_async(
            conn: AsyncAbstractConnection, command: Any, check_health: bool = True
        ) -> None:
            counts[getattr(conn, "bench_bucket", "lock")] += 1
            await original_async(conn, command, check_health)

        self._originals = (original, original_async)
        AbstractConnection.send_packed_command = counted  # type: ignore[method-assign]
        AsyncAbstractConnection.send_packed_command = counted_async  # type: ignore[method-assign, assignment]
        return self

    def uninstall(self) -> None:
        if self._originals is not None:
            original, original_async = self._originals
            AbstractConnection.send_packed_command = original  # type: ignore[method-assign]
            AsyncAbstractConnection.send_packed_command = original_async  # type: ignore[method-assign]
            self._originals = None

    def reset(self) -> None:
        for bucket in self.counts:
            self.counts[bucket] = 0


def percentile(values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile (``fraction`` in 0..1) of a non-empty sequence."""
    ordered = sorted(values)
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1]


def jain(counts: Sequence[int]) -> float:
    """Jain's fairness index: 1.0 when every worker got the same share, 1/n when one got all."""
    total = sum(counts)
    squares = sum(count * count for count in counts)
    return total * total / (len(counts) * squares) if squares else 0.0


def server_cpu(client: redis.Redis) -> float:
    """redis-server's CPU time so far (user + sys), in seconds."""
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def command_calls(client: redis.Redis) -> dict[str, int]:
    """Commands the server has run so far, by name (``INFO commandstats`` ``calls=``; e.g.
    ``{"get": 12, "evalsha": 3, "client|setinfo": 1}``). Redis 7 counts a script's own
    ``redis.call``s as well as the ``EVAL``/``EVALSHA`` itself. This very ``INFO`` is not in
    its own reply: the server counts a command once it has run; the next read includes it."""
    return {
        name.removeprefix("cmdstat_"): int(stats["calls"])
        for name, stats in client.info("commandstats").items()
    }


def commands_between(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """What ran between two ``command_calls`` reads, by name (the first read's INFO included)."""
    return {
        name: calls - before.get(name, 0)
        for name, calls in after.items()
        if calls != before.get(name, 0)
    }
