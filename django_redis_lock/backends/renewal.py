"""Renewing many leases at once, each topology its best way: on one server, ``extend_many.lua``
a thousand leases per call, all calls in one round trip; on a Redis Cluster, one round trip per
node; in quorum mode, one lease at a time on every server. :func:`renew` is what the renewal
watchdog asks of a backend (``ServerBackend.renew``); the topology's part is its
``extend_leases``.
"""

from __future__ import annotations

from typing import Any, Protocol

from redis.exceptions import NoScriptError, RedisError

from ..conf import lock_settings
from ..core.release import WaitRefused
from ..core.renewal import RenewedLease
from .base import SCRIPTS
from .cluster_wire import node_client
from .scripts import EXTEND, EXTEND_MANY, Script
from .wire import execute, execute_many

__all__ = ["Renewing", "extend_many", "extend_on_nodes", "pipelined", "renew"]

# Leases per extend_many.lua call: bounds how long one call keeps Redis busy (a few ms).
_BATCH = 1000


class Renewing(Protocol):
    """What :func:`renew` asks of a backend."""

    queues: bool

    def run_script(
        self, script: Script, keys: Any, args: Any, **options: Any
    ) -> Any: ...  # fmt: skip

    def acknowledged(self, *args: Any, **options: Any) -> tuple[Any, int]: ...

    def drop_stale(self, key: str) -> None: ...

    def extend_leases(self, leases: list[RenewedLease], lengths: list[int]) -> list[Any]: ...


def renew(backend: Renewing, leases: list[RenewedLease], lengths: list[int]) -> list[Any]:
    """Each lease renewed the way its topology does it best (1, 0 or an error each)."""
    others = [index for index, lease in enumerate(leases) if lease.script != EXTEND.name]
    if others:
        # A semaphore's permits among them (rarely many per process): one script call each,
        # the locks' leases as below.
        results: list[Any] = [None] * len(leases)
        locks = [index for index in range(len(leases)) if leases[index].script == EXTEND.name]
        if locks:
            renewed = renew(backend, [leases[i] for i in locks], [lengths[i] for i in locks])
            for index, result in zip(locks, renewed, strict=True):
                results[index] = result
        for index in others:
            results[index] = _extend_one(backend, leases[index], lengths[index])
        return results
    replicas = lock_settings.MIN_REPLICAS
    if replicas and backend.queues:  # (quorum mode, which has no queue, has no replicas either)
        return [
            _extend_acknowledged(backend, lease, ms, replicas)
            for lease, ms in zip(leases, lengths, strict=True)
        ]
    if len(leases) == 1:
        return [backend.run_script(EXTEND, [leases[0].key], [leases[0].token, lengths[0]])]
    return backend.extend_leases(leases, lengths)


def _extend_one(backend: Renewing, lease: RenewedLease, ms: int) -> Any:
    replicas = lock_settings.MIN_REPLICAS
    if replicas:
        return _extend_acknowledged(backend, lease, ms, replicas)
    try:
        return backend.run_script(SCRIPTS[lease.script], lease.keys, [lease.token, ms])
    except RedisError as exc:
        return exc


def pipelined(server: Any, script: Any, commands: list[tuple[Any, ...]]) -> list[Any]:
    """``commands`` (calls of ``script``) in one round trip; loaded first if it must be."""
    results = execute_many(server, commands)
    if any(isinstance(result, NoScriptError) for result in results):
        execute(server, "SCRIPT", "LOAD", script.source)
        results = execute_many(server, commands)
    return results


def extend_many(client: Any, leases: list[RenewedLease], lengths: list[int]) -> list[Any]:
    """One server: extend_many.lua, a thousand leases per call, all calls in one round trip.
    Returns 1 or 0 (lost) per lease, or the error of its call."""
    commands = []
    for start in range(0, len(leases), _BATCH):
        chunk = range(start, min(start + _BATCH, len(leases)))
        args: list[Any] = []
        for index in chunk:
            args += (leases[index].token, lengths[index])
        commands.append(
            ("EVALSHA", EXTEND_MANY.sha, len(chunk), *(leases[i].key for i in chunk), *args)
        )
    results: list[Any] = []
    for start, reply in zip(
        range(0, len(leases), _BATCH), pipelined(client, EXTEND_MANY, commands), strict=True
    ):
        size = min(_BATCH, len(leases) - start)
        if isinstance(reply, Exception):
            results += [reply] * size
            continue
        outcome = [1] * size
        for position in reply:
            outcome[int(position) - 1] = 0
        results += outcome
    return results


def extend_on_nodes(cluster: Any, leases: list[RenewedLease], lengths: list[int]) -> list[Any]:
    """Redis Cluster: the leases of each node in one round trip to it (one extend.lua call each:
    a script may only touch keys of one slot)."""
    by_node: dict[str, list[int]] = {}
    for index, lease in enumerate(leases):
        by_node.setdefault(cluster.get_node_from_key(lease.key).name, []).append(index)
    results: list[Any] = [None] * len(leases)
    for indexes in by_node.values():
        server = node_client(cluster, leases[indexes[0]].key)
        commands = [
            ("EVALSHA", EXTEND.sha, 1, leases[i].key, leases[i].token, lengths[i]) for i in indexes
        ]
        try:
            replies = pipelined(server, EXTEND, commands)
        except RedisError as exc:
            replies = [exc] * len(indexes)
        for index, reply in zip(indexes, replies, strict=True):
            results[index] = reply
    return results


def _extend_acknowledged(backend: Renewing, lease: RenewedLease, ms: int, replicas: int) -> Any:
    """A renewal that counts only once ``replicas`` confirmed it, like an acquisition.

    A primary that no replica confirms may have been replaced by a failover that has not
    demoted it yet (Sentinel looks every 10 s): its pooled connections are dropped, so that the
    retry asks Sentinel where the primary is now, instead of renewing on a stale one.
    """
    timeout_ms = max(1, int(lock_settings.REPLICA_TIMEOUT * 1000))
    try:
        result, acknowledged = backend.acknowledged(
            SCRIPTS[lease.script], lease.keys or [lease.key], [lease.token, ms], replicas,
            timeout_ms,
            wanted=lambda reply: reply == 1,
        )  # fmt: skip
    except RedisError as exc:
        return exc
    if result == 1 and isinstance(acknowledged, WaitRefused):
        return ConnectionError(f"the server refused WAIT ({acknowledged.reason})")
    if result == 1 and acknowledged < replicas:
        backend.drop_stale(lease.key)
        return ConnectionError(f"only {acknowledged} of {replicas} replicas confirmed the renewal")
    return result
