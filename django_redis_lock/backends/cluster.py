"""Redis Cluster: :class:`ClusterBackend` and its async twin. Each command goes to the node of
its key (all keys of one lock share a hash tag, so one node), sent once, MOVED and ASK followed
by redis-py's Cluster client; what must stay on one connection (a ``WAIT`` after a write, a
blocking wait timed here) goes to the node's own client."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from redis.crc import key_slot
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from ..core.renewal import RenewedLease
from ..core.requests import Block, Eval
from .acl import CLUSTER_CLIENT_COMMANDS
from .base import aone_by_one, one_by_one, shortened
from .cluster_wire import (
    aexecute_on_cluster,
    execute_on_cluster,
    node_client,
    redirected,
    reread_slot_map,
)
from .inflight import carried
from .renewal import extend_on_nodes
from .scripts import Script
from .server import AsyncServerBackend, Server, ServerBackend
from .waits import await_wake_on_cluster, wait_for_wake
from .wire import drop_stale_connections

__all__ = ["AsyncClusterBackend", "ClusterBackend", "one_slot"]


def one_slot(keys: Sequence[str]) -> bool:
    """Whether ``keys`` are all in one hash slot, so that one script may touch them all (names
    sharing a hash tag of their own, primitives/keys.py)."""
    return len({key_slot(key.encode("utf-8", "surrogatepass")) for key in keys}) <= 1


class ClusterBackend(ServerBackend):
    """Redis Cluster (``redis.cluster.RedisCluster``)."""

    client_commands = tuple(CLUSTER_CLIENT_COMMANDS)

    def one_script(self, keys: Sequence[str]) -> bool:
        return one_slot(keys)

    def send(self, *args: Any, **options: Any) -> Any:
        # The socket timeout applies, not a reply budget; a give-back (if_silent) follows its
        # request on the node's connection: see cluster_wire.execute_on_cluster.
        return execute_on_cluster(self.client, *args, if_silent=options.get("if_silent"))

    def send_many(self, commands: Sequence[Sequence[Any]]) -> list[Any]:
        # One by one, each sent as send() sends it (MOVED and ASK, a slot being moved, followed
        # by the Cluster client): a pipeline on one node's connection could not. Failure paths
        # only.
        return one_by_one(self.send, commands)

    def acknowledged(
        self, script: Script, keys: Sequence[str], args: Sequence[Any], replicas: int,
        timeout_ms: int, wanted: Callable[[Any], bool],
    ) -> tuple[Any, int]:  # fmt: skip
        def call(server: Any) -> tuple[Any, int]:
            return script.call_acknowledged(server, keys, args, replicas, timeout_ms, wanted)

        try:
            return call(node_client(self.client, keys[0]))
        except (ResponseError, RedisConnectionError) as exc:
            if not (isinstance(exc, RedisConnectionError) or redirected(exc)):
                raise
            # This call (MOVED: the script did not run) or the next goes to the right primary.
            reread_slot_map(self.client)
            if isinstance(exc, RedisConnectionError):
                raise
            return call(node_client(self.client, keys[0]))

    def wait(self, key: str, seconds: float, exact: bool) -> Any:
        # Timed here, on the node's own pool.
        return wait_for_wake(
            node_client(self.client, key), key, seconds, exact=exact,
            on_interrupted=functools.partial(reread_slot_map, self.client),
        )  # fmt: skip

    def drop_stale(self, key: str) -> None:
        drop_stale_connections(node_client(self.client, key))
        reread_slot_map(self.client)

    def follow_primary(self) -> None:
        """The Cluster client follows failovers itself (MOVED, and its slot map)."""

    def servers(self) -> list[Server]:
        """Every primary: each holds the keys of its slots."""
        primaries = self.client.get_primaries()
        return [Server(node.name, self.client.get_redis_connection(node)) for node in primaries]

    def server_of(self, key: str) -> Any:
        return node_client(self.client, key)

    def extend_leases(self, leases: list[RenewedLease], lengths: list[int]) -> list[Any]:
        """One round trip per node (a script may only touch the keys of one slot)."""
        return extend_on_nodes(self.client, leases, lengths)

    def run_then_wait(self, request: Block, first: Eval) -> tuple[Any, Any]:
        # In two round trips: the script as send() sends it (MOVED and ASK, a slot being moved,
        # followed by the Cluster client), then the wait on the node's own connection.
        reply = self.perform(first)
        seconds, exact = shortened(request, reply)
        return reply, self.wait(request.key, seconds, exact)


class AsyncClusterBackend(AsyncServerBackend):
    """:class:`ClusterBackend` for ``redis.asyncio.cluster.RedisCluster``."""

    def one_script(self, keys: Sequence[str]) -> bool:
        return one_slot(keys)

    async def send(self, *args: Any, **options: Any) -> Any:
        # Carried to its end (inflight.py): a cancellation waits for the reply, and gives back
        # what the request took (if_silent) before it goes on.
        if_silent = options.get("if_silent")
        give_back = None if if_silent is None else (
            lambda: aone_by_one(functools.partial(aexecute_on_cluster, self.client), if_silent())
        )  # fmt: skip
        return await carried(aexecute_on_cluster(self.client, *args), give_back=give_back)

    async def send_many(self, commands: Sequence[Sequence[Any]]) -> list[Any]:
        replies: list[Any] = []
        for command in commands:
            try:
                replies.append(await self.send(*command))
            except ResponseError as error:
                replies.append(error)
        return replies

    async def wait(self, key: str, seconds: float, exact: bool) -> Any:
        return await await_wake_on_cluster(self.client, key, seconds)

    async def run_then_wait(self, request: Block, first: Eval) -> tuple[Any, Any]:
        reply = await self.perform(first)
        seconds, exact = shortened(request, reply)
        return reply, await self.wait(request.key, seconds, exact)

    async def acknowledged(self, *args: Any, **options: Any) -> tuple[Any, int]:
        raise ImproperlyConfigured(
            "DJANGO_REDIS_LOCK_MIN_REPLICAS is not supported by the async API on a Redis "
            "Cluster yet: use the sync API (or sync_to_async) for these locks."
        )
