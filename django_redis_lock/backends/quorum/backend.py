"""Quorum mode (``quorum/``): :class:`QuorumBackend` and its async twin. Each request goes to
every server through the :class:`~django_redis_lock.backends.quorum.QuorumClient`, answered as the
majority does. No queue: a waiter looks again after a short random delay."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..server import AsyncServerBackend, ServerBackend, one_by_one

__all__ = ["AsyncQuorumBackend", "QuorumBackend"]


class QuorumBackend(ServerBackend):
    queues = False

    def one_script(self, keys: Sequence[str]) -> bool:
        """Each server of a quorum may grant a different part: one lock at a time."""
        return False

    def send(self, *args: Any, **options: Any) -> Any:
        # Each server's socket timeout applies; the QuorumClient decides when it has heard
        # enough (a majority).
        return self.client.execute_command(*args)

    def send_many(self, commands: Sequence[Sequence[Any]]) -> list[Any]:
        return one_by_one(self.send, commands)

    def drop_stale(self, key: str) -> None:
        """Independent servers, no failover to follow."""

    def follow_primary(self) -> None:
        """Independent servers, no failover to follow."""


class AsyncQuorumBackend(AsyncServerBackend):
    """:class:`QuorumBackend` for asyncio (each request runs in a worker thread)."""

    queues = False

    def one_script(self, keys: Sequence[str]) -> bool:
        """Each server of a quorum may grant a different part: one lock at a time."""
        return False

    async def send(self, *args: Any, **options: Any) -> Any:
        return await self.client.execute_command(*args)

    async def drop_stale(self, key: str) -> None:
        """Independent servers, no failover to follow."""
