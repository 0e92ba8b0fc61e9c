"""The watchdog: one daemon thread per process that keeps held leases alive.

A lock taken without an explicit ``timeout`` gets a short lease (``DJANGO_REDIS_LOCK_TIMEOUT``)
that is renewed here at about a third of its length, so a holder that dies frees the lock within
one lease while a long job keeps it (Redisson's watchdog). Leases are renewed in batches: when
one falls due, every lease due within a sixth of its length joins it, so leases renewed together
stay together (a lease whose renewal failed is retried on its own schedule). A batch is one
round trip per Redis client (per node of a Redis Cluster): on one server, one script call per
thousand leases (``extend_many.lua``).

Nothing is lost silently: a renewal that finds the lease gone (expired, deleted, force-released)
calls the lease's ``on_lost``; so does a renewal that could not reach Redis before the lease
would have ended. The lock turns that into ``lock.lost``, ``LockLost``, an ERROR log and the
``lock_lost`` signal.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from redis.cluster import RedisCluster
from redis.exceptions import NoScriptError, RedisError

from .commands import drop_stale_connections, execute, execute_many, follow_sentinel, server_of
from .conf import lock_settings
from .durations import clock_allowance
from .quorum import QuorumClient
from .scripts import EXTEND, EXTEND_MANY

__all__ = ["RenewedLease", "renewer"]

logger = logging.getLogger("django_redis_lock")

# While Redis cannot be reached, retry at most this often (and more often near the end).
_RETRY_INTERVAL = 0.5
# Leases per extend_many.lua call: bounds how long one call keeps Redis busy (a few ms).
_BATCH = 1000
# With no lease to renew, the thread still looks this often for a while (up to _IDLE_LOOKS
# times), so that a process taking and releasing locks over and over (each released before its
# first renewal) does not wake it on every acquisition; then it sleeps until told.
_IDLE_LOOK = 1.0
_IDLE_LOOKS = 60


@dataclass(eq=False, slots=True)
class RenewedLease:
    """One held lease to keep alive. ``expires_at`` is monotonic: when the lease ends unless
    renewed (as far as this process knows). ``name`` is the lock's readable name, for logs;
    ``abandoned()`` says why nobody can release the lease any more (None: someone may).
    ``until``: a lease of fixed length that was handed over short (``release.lua``): lengthened
    once, to end then (monotonic), and not renewed after that."""

    client: Any
    key: str
    token: str
    lease: float
    on_lost: Callable[[str], None]
    name: str = ""
    abandoned: Callable[[], str | None] = field(default=lambda: None, repr=False)
    until: float | None = None
    active: bool = True  # False once removed (released, lost or abandoned)
    length: float = 0.0  # seconds: what the latest confirmation gave it (a handed lease: less)
    expires_at: float = 0.0
    due: float = field(default=0.0, repr=False)
    failure: str = ""  # why the latest renewal did not happen, while it is retried

    def confirmed(self, at: float, seconds: float | None = None) -> None:
        """Redis confirmed at ``at`` (monotonic) that the lease runs ``seconds`` from then."""
        length = self.lease if seconds is None else seconds
        self.length = min(length, self.lease)
        self.expires_at = at + length
        self.due = at + self.length / 3
        self.failure = ""

    def milliseconds(self, now: float) -> int:
        """The length to renew it with, from ``now``."""
        seconds = self.lease if self.until is None else self.until - now
        return max(1, int(seconds * 1000))

    def unrenewed(self) -> str:
        """Why the lease ended unrenewed, when Redis never said it was gone."""
        if self.failure:
            return f"Redis could not be reached to renew it ({self.failure})"
        return "Redis did not answer its renewal before the lease ended (stalled or unreachable)"


class _Renewer:
    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        # After fork the thread is gone and the leases are the parent's, not ours.
        self._condition = threading.Condition()
        # The held leases, by id. An acquisition only adds its lease here and its release
        # takes it out (each one dict operation, atomic under the GIL: no lock taken, no thread
        # woken), so most holds end before the watchdog ever looks at them, and it only ever
        # looks at the leases held now. Added to: _added counts on, so that the thread knows.
        self._leases: dict[int, RenewedLease] = {}
        self._added = 0
        self._thread: threading.Thread | None = None
        # When the thread will next look (None: it is busy, or waits for a first lease).
        self._wakes_at: float | None = None
        self._idle_looks = 0
        # Clients whose renewals are under way, each in a thread of its own: a Redis that is
        # slow or gone (a Sentinel set-up asked for a primary it no longer has, with redis-py's
        # retries) holds up its own leases, not those on other servers.
        self._busy: set[int] = set()

    def add(self, lease: RenewedLease) -> None:
        lease.active = True
        self._leases[id(lease)] = lease
        self._added += 1
        # Waking the thread costs more than the whole acquire; only do it when this lease
        # falls due before the thread would look anyway (or there is no thread yet).
        wakes_at = self._wakes_at
        if wakes_at is None or lease.due < wakes_at or self._thread is None:
            with self._condition:
                if self._thread is None or not self._thread.is_alive():
                    self._thread = threading.Thread(
                        target=self._run, name="django-redis-lock-renewal", daemon=True
                    )
                    self._thread.start()
                self._condition.notify()

    def remove(self, lease: RenewedLease) -> None:
        lease.active = False
        self._leases.pop(id(lease), None)

    def __contains__(self, lease: RenewedLease) -> bool:
        return lease.active

    def _run(self) -> None:
        while True:
            with self._condition:
                while True:
                    now = time.monotonic()
                    added = self._added
                    ended, abandoned, due = self._sort_out(now)
                    if ended or abandoned or due:
                        self._wakes_at = None
                        break
                    self._wakes_at = self._next_look()
                    if self._wakes_at is None and self._idle_looks < _IDLE_LOOKS:
                        self._idle_looks += 1
                        self._wakes_at = now + _IDLE_LOOK
                    elif self._wakes_at is not None and self._leases:
                        self._idle_looks = 0
                    if self._added != added:
                        # Added meanwhile, without telling us (add() saw an earlier _wakes_at
                        # than the one just set): look at it before sleeping.
                        continue
                    self._condition.wait(None if self._wakes_at is None else self._wakes_at - now)
                by_client: dict[int, list[RenewedLease]] = {}
                for lease in due:
                    by_client.setdefault(id(lease.client), []).append(lease)
                self._busy.update(by_client)
            for lease, reason in abandoned:
                logger.warning(
                    "Lock %r was acquired and never released: %s. It is no longer renewed, so "
                    "it frees when its lease ends (%ss at most).",
                    lease.name, reason, lease.lease,
                )  # fmt: skip
            for lease in ended:
                lease.on_lost(lease.unrenewed())
            for client_id, leases in by_client.items():
                threading.Thread(
                    target=self._renew_batch,
                    args=(client_id, leases),
                    name="django-redis-lock-renewal-batch",
                    daemon=True,
                ).start()

    def _sort_out(
        self, now: float
    ) -> tuple[list[RenewedLease], list[tuple[RenewedLease, str]], list[RenewedLease]]:
        """(leases whose renewal is still under way when they end: lost now, by our clock;
        leases nobody can release any more; leases due for renewal). The first two leave."""
        ended, abandoned, due = [], [], []
        for lease in list(self._leases.values()):  # a copy: others add and remove meanwhile
            if not lease.active:
                continue
            if id(lease.client) in self._busy:
                if self._ends_at(lease) <= now:
                    ended.append(lease)
            elif lease.due <= now + (0 if lease.failure else lease.length / 6):
                try:
                    reason = lease.abandoned()
                except Exception:  # the watchdog must never die: renew, as before
                    logger.exception("django-redis-lock: could not tell who holds %s", lease.key)
                    reason = None
                if reason is None:
                    due.append(lease)
                else:
                    abandoned.append((lease, reason))
        for lease in ended:
            self._discard(lease)
        for lease, _ in abandoned:
            self._discard(lease)
        return ended, abandoned, due

    def _discard(self, lease: RenewedLease) -> None:
        lease.active = False
        self._leases.pop(id(lease), None)

    def _next_look(self) -> float | None:
        """When a lease next falls due, or one under renewal ends (None: no lease)."""
        return min(
            (
                self._ends_at(lease) if id(lease.client) in self._busy else lease.due
                for lease in list(self._leases.values())
            ),
            default=None,
        )

    @staticmethod
    def _ends_at(lease: RenewedLease) -> float:
        """When the lease may have ended in Redis already (its clock may run a little fast)."""
        return lease.expires_at - clock_allowance(lease.lease)

    def _renew_batch(self, client_id: int, leases: list[RenewedLease]) -> None:
        try:
            self._renew(leases)
        except Exception:  # the watchdog must never die
            logger.exception("django-redis-lock: renewal failed unexpectedly")
        finally:
            with self._condition:
                self._busy.discard(client_id)
                self._condition.notify()

    def _renew(self, leases: list[RenewedLease]) -> None:
        client = leases[0].client
        started = time.monotonic()
        # Sentinel: renew where the primary is now. After a failover the old primary is
        # demoted only at Sentinel's next check (about 10 s); until then pooled connections
        # would renew the lease there while it runs out on the new one (one query to a
        # Sentinel per renewal round).
        follow_sentinel(getattr(client, "connection_pool", None))
        lengths = [lease.milliseconds(started) for lease in leases]
        try:
            results = self._extend_all(client, leases, lengths)
        except Exception as exc:
            # Whatever it was, these leases were not renewed: retried until they would end,
            # then reported lost (never left due, which would spin this thread).
            results = [exc] * len(leases)
        lost: list[tuple[RenewedLease, str]] = []
        with self._condition:
            for lease, result, ms in zip(leases, results, lengths, strict=True):
                if not lease.active:
                    continue  # released meanwhile
                if result == 1:
                    lease.confirmed(started, ms / 1000)
                    if lease.until is not None:  # lengthened as asked: done with it
                        self._discard(lease)
                elif isinstance(result, Exception):
                    now = time.monotonic()
                    lease.failure = str(result)
                    if now >= lease.expires_at:
                        self._discard(lease)
                        lost.append((lease, lease.unrenewed()))
                    else:
                        logger.warning(
                            "django-redis-lock: could not renew %s (%s); retrying",
                            lease.key,
                            result,
                        )
                        lease.due = now + min(_RETRY_INTERVAL, (lease.expires_at - now) / 4)
                else:
                    self._discard(lease)
                    lost.append((lease, "its lease was gone when renewing (expired or deleted)"))
        for lease, reason in lost:
            lease.on_lost(reason)

    @staticmethod
    def _extend_all(client: Any, leases: list[RenewedLease], lengths: list[int]) -> list[Any]:
        replicas = lock_settings.MIN_REPLICAS
        if replicas and not isinstance(client, QuorumClient):
            return [
                _extend_acknowledged(client, lease, ms, replicas)
                for lease, ms in zip(leases, lengths, strict=True)
            ]
        if len(leases) == 1 or isinstance(client, QuorumClient):
            return [
                EXTEND(client, [lease.key], [lease.token, ms])
                for lease, ms in zip(leases, lengths, strict=True)
            ]
        if isinstance(client, RedisCluster):
            return _extend_on_nodes(client, leases, lengths)
        return _extend_many(client, leases, lengths)


def _pipelined(server: Any, script: Any, commands: list[tuple[Any, ...]]) -> list[Any]:
    """``commands`` (calls of ``script``) in one round trip; loaded first if it must be."""
    results = execute_many(server, commands)
    if any(isinstance(result, NoScriptError) for result in results):
        execute(server, "SCRIPT", "LOAD", script.source)
        results = execute_many(server, commands)
    return results


def _extend_many(client: Any, leases: list[RenewedLease], lengths: list[int]) -> list[Any]:
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
        range(0, len(leases), _BATCH), _pipelined(client, EXTEND_MANY, commands), strict=True
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


def _extend_on_nodes(cluster: Any, leases: list[RenewedLease], lengths: list[int]) -> list[Any]:
    """Redis Cluster: the leases of each node in one round trip to it (one extend.lua call each:
    a script may only touch keys of one slot)."""
    by_node: dict[str, list[int]] = {}
    for index, lease in enumerate(leases):
        by_node.setdefault(cluster.get_node_from_key(lease.key).name, []).append(index)
    results: list[Any] = [None] * len(leases)
    for indexes in by_node.values():
        server = server_of(cluster, leases[indexes[0]].key)
        commands = [
            ("EVALSHA", EXTEND.sha, 1, leases[i].key, leases[i].token, lengths[i]) for i in indexes
        ]
        try:
            replies = _pipelined(server, EXTEND, commands)
        except RedisError as exc:
            replies = [exc] * len(indexes)
        for index, reply in zip(indexes, replies, strict=True):
            results[index] = reply
    return results


def _extend_acknowledged(client: Any, lease: RenewedLease, ms: int, replicas: int) -> Any:
    """A renewal that counts only once ``replicas`` confirmed it, like an acquisition.

    A primary that no replica confirms may have been replaced by a failover that has not
    demoted it yet (Sentinel looks every 10 s): its pooled connections are dropped, so that the
    retry asks Sentinel where the primary is now, instead of renewing on a stale one.
    """
    timeout_ms = max(1, int(lock_settings.REPLICA_TIMEOUT * 1000))
    try:
        result, acknowledged = EXTEND.call_acknowledged(
            client, [lease.key], [lease.token, ms], replicas, timeout_ms,
            wanted=lambda reply: reply == 1,
        )  # fmt: skip
    except RedisError as exc:
        return exc
    if result == 1 and acknowledged < replicas:
        drop_stale_connections(client, lease.key)
        return ConnectionError(f"only {acknowledged} of {replicas} replicas confirmed the renewal")
    return result


renewer = _Renewer()
