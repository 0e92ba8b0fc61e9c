"""Quorum mode (``quorum/``): :class:`QuorumBackend` and its async twin. Each request goes to
every server through the :class:`~django_redis_lock.backends.quorum.QuorumClient`, answered as the
majority does. No queue: a waiter looks again after a short random delay."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

from redis.exceptions import RedisError

from ...core.renewal import RenewedLease
from ..base import aone_by_one, one_by_one
from ..inflight import carried
from ..scripts import EXTEND
from ..server import AsyncServerBackend, Server, ServerBackend
from .broadcast import GiveBack, giving_back
from .client import QuorumUnavailable

__all__ = ["AsyncQuorumBackend", "QuorumBackend"]


class QuorumBackend(ServerBackend):
    queues = False

    def one_script(self, keys: Sequence[str]) -> bool:
        """Each server of a quorum may grant a different part: one lock at a time."""
        return False

    def send(self, *args: Any, **options: Any) -> Any:
        """Each server's socket timeout applies; the QuorumClient decides when it has heard
        enough (a majority). An acquisition (``if_silent``: its give-back) interrupted on the
        way (``KeyboardInterrupt``, ``SystemExit``) gives back what it took on every server
        before the interrupt goes on: behind its requests on their connections when they are
        out (``broadcast.giving_back``), else behind the replies it read."""
        if_silent = options.get("if_silent")
        if if_silent is None:
            return self.client.execute_command(*args)
        with giving_back(GiveBack(if_silent)) as give_back:
            try:
                return self.client.execute_command(*args)
            except RedisError:
                raise
            except BaseException:
                if not give_back.sent:  # (interrupted between two rounds)
                    with contextlib.suppress(RedisError, OSError):
                        self.client.give_back(if_silent())
                raise

    def send_many(self, commands: Sequence[Sequence[Any]]) -> list[Any]:
        return one_by_one(self.send, commands)

    def drop_stale(self, key: str) -> None:
        """Independent servers, no failover to follow."""

    def follow_primary(self) -> None:
        """Independent servers, no failover to follow."""

    @property
    def majority(self) -> int | None:  # type: ignore[override]
        return int(self.client.majority)

    def servers(self) -> list[Server]:
        """Every server of the quorum, named by its cache alias."""
        return [
            Server(alias, member)
            for alias, member in zip(self.client.aliases, self.client.clients, strict=True)
        ]

    def server_of(self, key: str) -> Any:
        raise TypeError("In quorum mode a key is on every server: read it with read_first().")

    def read_first(self, key: str, read: Callable[[Any], Any]) -> Any:
        failures = []
        for name, member in self.servers():
            try:
                found = read(member)
            except RedisError as exc:
                failures.append(f"{name}: {exc}")
                continue
            if found is not None:
                return found
        answered = len(self.client.clients) - len(failures)
        if answered < self.client.majority:
            # Those that answered have nothing; those that did not may.
            raise QuorumUnavailable(
                f"only {answered} of the {len(self.client.clients)} servers of quorum "
                f"{self.client.name} answered, and {self.client.majority} are needed to tell "
                f"whether {key} is there: " + "; ".join(failures)
            )
        return None

    def copies(self) -> list[ServerBackend]:
        return [ServerBackend(member) for member in self.client.clients]

    def incomplete(self, unreachable: Sequence[str]) -> str | None:
        """With a majority read, each lock (held on a majority) is on one of them."""
        read = len(self.client.clients) - len(unreachable)
        if not unreachable or read >= self.client.majority:
            return None
        return (
            f"only {read} of the {len(self.client.clients)} servers of quorum {self.client.name} "
            f"could be read, and {self.client.majority} are needed to see every lock: "
            + "; ".join(unreachable)
        )

    def extend_leases(self, leases: list[RenewedLease], lengths: list[int]) -> list[Any]:
        """One lease at a time, on every server, as a majority."""
        return [
            self.run_script(EXTEND, [lease.key], [lease.token, ms])
            for lease, ms in zip(leases, lengths, strict=True)
        ]


class AsyncQuorumBackend(AsyncServerBackend):
    """:class:`QuorumBackend` for asyncio (each request runs in a worker thread)."""

    queues = False

    def one_script(self, keys: Sequence[str]) -> bool:
        """Each server of a quorum may grant a different part: one lock at a time."""
        return False

    async def send(self, *args: Any, **options: Any) -> Any:
        # Carried to its end (inflight.py): the worker thread runs on whatever happens to the
        # caller, so a cancellation waits for its answer and gives back what it took after.
        if_silent = options.get("if_silent")
        give_back = None if if_silent is None else (
            lambda: aone_by_one(self.client.execute_command, if_silent())
        )  # fmt: skip
        # No grace: a cut would not stop the thread, and a give-back could overtake it on a
        # slow member; each member's own timeout bounds it.
        return await carried(self.client.execute_command(*args), give_back=give_back, grace=None)

    async def drop_stale(self, key: str) -> None:
        """Independent servers, no failover to follow."""
