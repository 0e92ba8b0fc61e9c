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
from typing import Any

from redis.exceptions import NoScriptError, RedisError

from ..backends import ClusterBackend, ServerBackend, backend_for
from ..backends.scripts import EXTEND, EXTEND_MANY
from ..backends.server import SCRIPTS
from ..backends.wire import execute, execute_many, node_client
from ..conf import lock_settings
from ..core.durations import readable
from ..core.schedule import RenewedLease, Schedule

__all__ = ["RenewedLease", "renewer"]

logger = logging.getLogger("django_redis_lock")

# Leases per extend_many.lua call: bounds how long one call keeps Redis busy (a few ms).
_BATCH = 1000
# With no lease to renew, the thread still looks this often for a while (up to _IDLE_LOOKS
# times), so that a process taking and releasing locks over and over (each released before its
# first renewal) does not wake it on every acquisition; then it sleeps until told.
_IDLE_LOOK = 1.0
_IDLE_LOOKS = 60


class _Renewer:
    """Runs the :class:`Schedule` on a daemon thread (its clock: ``clock``, monotonic), and
    each client's batch of renewals on a thread of its own."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        # After fork the thread is gone and the leases are the parent's, not ours.
        self._condition = threading.Condition()
        # An acquisition only adds its lease to the schedule and its release takes it out
        # (no lock taken, no thread woken), so most holds end before the watchdog ever looks
        # at them, and it only ever looks at the leases held now.
        self.schedule = Schedule()
        self._thread: threading.Thread | None = None
        # When the thread will next look (None: it is busy, or waits for a first lease).
        self._wakes_at: float | None = None
        self._idle_looks = 0

    def add(self, lease: RenewedLease) -> None:
        self.schedule.add(lease)
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
        self.schedule.remove(lease)

    def __contains__(self, lease: RenewedLease) -> bool:
        return lease.active

    def _run(self) -> None:
        schedule = self.schedule
        while True:
            with self._condition:
                while True:
                    now = self.clock()
                    added = schedule.added
                    found = schedule.look(now)
                    if found.ended or found.abandoned or found.batches:
                        self._wakes_at = None
                        break
                    self._wakes_at = schedule.next_look()
                    if self._wakes_at is None and self._idle_looks < _IDLE_LOOKS:
                        self._idle_looks += 1
                        self._wakes_at = now + _IDLE_LOOK
                    elif self._wakes_at is not None and schedule.leases:
                        self._idle_looks = 0
                    if schedule.added != added:
                        # Added meanwhile, without telling us (add() saw an earlier _wakes_at
                        # than the one just set): look at it before sleeping.
                        continue
                    self._condition.wait(None if self._wakes_at is None else self._wakes_at - now)
            for lease, reason in found.abandoned:
                logger.warning(
                    "%s was acquired and never released: %s. It is no longer renewed, so "
                    "it frees when its lease ends (%s at most).",
                    lease.name, reason, readable(lease.lease),
                )  # fmt: skip
            for lease in found.ended:
                lease.on_lost(lease.unrenewed())
            for client_id, leases in found.batches.items():
                threading.Thread(
                    target=self._renew_batch,
                    args=(client_id, leases),
                    name="django-redis-lock-renewal-batch",
                    daemon=True,
                ).start()

    def _renew_batch(self, client_id: int, leases: list[RenewedLease]) -> None:
        client = leases[0].client
        sent_at = self.clock()
        lengths = [lease.milliseconds(sent_at) for lease in leases]
        try:
            # Sentinel: renew where the primary is now. After a failover the old primary is
            # demoted only at Sentinel's next check (about 10 s); until then pooled
            # connections would renew the lease there while it runs out on the new one (one
            # query to a Sentinel per renewal round).
            backend = backend_for(client)
            backend.follow_primary()
            results = _extend_all(backend, leases, lengths)
        except Exception as exc:
            # Whatever it was, these leases were not renewed: retried until they would end,
            # then reported lost (never left due, which would spin the watchdog).
            results = [exc] * len(leases)
        lost: list[tuple[RenewedLease, str]] = []
        with self._condition:
            try:
                lost, retried = self.schedule.finished(
                    client_id, leases, results, lengths, sent_at, self.clock()
                )
            except Exception:  # the watchdog must never die
                self.schedule.busy.discard(client_id)
                logger.exception("django-redis-lock: renewal failed unexpectedly")
                retried = []
            self._condition.notify()
        for lease in retried:
            logger.warning(
                "django-redis-lock: could not renew %s (%s); retrying", lease.key, lease.failure
            )
        for lease, reason in lost:
            lease.on_lost(reason)


def _extend_all(
    backend: ServerBackend, leases: list[RenewedLease], lengths: list[int]
) -> list[Any]:
    """Each lease renewed the way its topology does it best (1, 0 or an error each)."""
    others = [index for index, lease in enumerate(leases) if lease.script != EXTEND.name]
    if others:
        # A semaphore's permits among them (rarely many per process): one script call each,
        # the locks' leases as below.
        results: list[Any] = [None] * len(leases)
        locks = [index for index in range(len(leases)) if leases[index].script == EXTEND.name]
        if locks:
            renewed = _extend_all(backend, [leases[i] for i in locks], [lengths[i] for i in locks])
            for index, result in zip(locks, renewed, strict=True):
                results[index] = result
        for index in others:
            results[index] = _extend_one(backend, leases[index], lengths[index])
        return results
    quorum = not backend.queues  # every server, as a majority: one lease at a time
    replicas = lock_settings.MIN_REPLICAS
    if replicas and not quorum:
        return [
            _extend_acknowledged(backend, lease, ms, replicas)
            for lease, ms in zip(leases, lengths, strict=True)
        ]
    if len(leases) == 1 or quorum:
        return [
            backend.run_script(EXTEND, [lease.key], [lease.token, ms])
            for lease, ms in zip(leases, lengths, strict=True)
        ]
    if isinstance(backend, ClusterBackend):
        return _extend_on_nodes(backend.client, leases, lengths)
    return _extend_many(backend.client, leases, lengths)


def _extend_one(backend: ServerBackend, lease: RenewedLease, ms: int) -> Any:
    replicas = lock_settings.MIN_REPLICAS
    if replicas:
        return _extend_acknowledged(backend, lease, ms, replicas)
    try:
        return backend.run_script(SCRIPTS[lease.script], lease.keys, [lease.token, ms])
    except RedisError as exc:
        return exc


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
        server = node_client(cluster, leases[indexes[0]].key)
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


def _extend_acknowledged(
    backend: ServerBackend, lease: RenewedLease, ms: int, replicas: int
) -> Any:
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
    if result == 1 and acknowledged < replicas:
        backend.drop_stale(lease.key)
        return ConnectionError(f"only {acknowledged} of {replicas} replicas confirmed the renewal")
    return result


renewer = _Renewer()
