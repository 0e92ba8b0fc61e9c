"""A ``SCAN`` that reads what each batch of keys needs as it goes: for the census
(``registry/census.py``), which must not wait on the server and decode in turns.

Built on ``wire.py``'s connection handling: each command sent once, on a pooled connection
(``borrowed``) that is dropped if the loop stops with a reply still on its way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .wire import borrowed, execute_many_on, pack

__all__ = ["scan_reading"]


def scan_reading(
    client: Any, pattern: str, *, count: int, max_keys: int,
    commands_for: Callable[[list[Any]], Sequence[Sequence[Any]]],
    take: Callable[[list[Any], list[Any]], None],
) -> tuple[int, bool]:  # fmt: skip
    """``SCAN`` the keys of ``client`` (one server) that match ``pattern``, ``count`` at a
    time, and read what each batch of keys needs: ``commands_for(keys)``, in one round trip.
    Then the next ``SCAN`` is sent, and ``take(keys, replies)`` (replies as
    ``wire.execute_many`` gives them) runs while the server runs it. (Not in the same round
    trip as the reads: Redis sends a pipeline's replies together, when it has run them all.)
    Stops after ``max_keys`` keys; returns the keys scanned, and whether the ``SCAN`` went all
    the way."""
    scanned = 0
    with borrowed(client) as connection:
        connection.send_packed_command([pack(("SCAN", 0, "MATCH", pattern, "COUNT", count))])
        cursor, keys = connection.read_response()
        while True:
            scanned += len(keys)
            commands = commands_for(keys)
            replies = execute_many_on(connection, commands) if commands else []
            more = int(cursor) != 0 and scanned < max_keys
            if more:
                connection.send_packed_command(
                    [pack(("SCAN", cursor, "MATCH", pattern, "COUNT", count))]
                )
            take(keys, replies)
            if not more:
                return scanned, int(cursor) == 0
            cursor, keys = connection.read_response()
