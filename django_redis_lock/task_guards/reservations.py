"""Reservations: a lock held for a job while it waits in a queue.

A task guard takes the job's lock in the process that queues the job, and the process that
runs it takes the lock over when the run starts (``Lock(name, job_id=...)`` does, as if the
lock were free). In between no process holds it, so nobody renews it: a reservation has a fixed
lease, as long as a job may wait in its queue, after which it ends by itself (a job lost with
its queue does not keep the key for ever).

Its token is ``<job id>~queued`` (``core/lease.py``), the same in every process that
knows the job's id: the worker that runs the job, and the worker's supervisor, which cancels it
when the job is revoked or expires before it runs.

    reservation = reserve("task:sync:42", task_id, ttl=3600, label="sync_customer")
    if not reservation.reserved:
        reservation.holder.job_id       # the job that has it (queued or running)
    cancel("task:sync:42", task_id)     # it left the queue without running

A reservation made for a job that already has the key (queued, or running: a retry of the job
published from inside its run, or by its supervisor after the run's process died) takes it over
(``again=True``): the key is the job's until its next run takes it, with no gap for a
duplicate.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from redis.exceptions import RedisError

from ..backends import Backend, async_backend_of, backend_of
from ..backends.clients import quorum_members
from ..backends.drivers import arun, run
from ..conf import lock_settings
from ..core import durations, flows
from ..core.lease import JOB_SEPARATOR, PENDING_JOB, job_id_checked, reservation_token
from ..exceptions import LockBackendError
from ..primitives import errors, owners
from ..primitives.keys import lock_keys, readable_tag
from ..primitives.owners import current_owner
from ..registry.records import LockInfo, lock_info

__all__ = [
    "PENDING_JOB",
    "Reservation",
    "acancel",
    "cancel",
    "pending_job_id",
    "rename",
    "reserve",
]

# Tries of a reservation that finds the key taken, and then free when it reads who has it.
_ATTEMPTS = 3


@dataclass(frozen=True)
class Reservation:
    """What :func:`reserve` got: the key (``reserved``), or who has it (``holder``: the
    record of their lease, None if it ended meanwhile)."""

    reserved: bool
    holder: LockInfo | None = None


def pending_job_id() -> str:
    """A job id to reserve under before the job's own id is known: :func:`rename` gives the
    reservation the job's id once it is; a run that starts before takes it over."""
    return f"{PENDING_JOB}{owners.new_token().replace('-', '_')}"


def reserve(
    name: str,
    job_id: str,
    *,
    ttl: float,
    label: str | None = None,
    guard: str | None = None,
    group: str | None = None,
    using: str | None = None,
    again: bool = False,
) -> Reservation:
    """Take the lock ``name`` for the queued job ``job_id`` for ``ttl`` seconds, unless
    another job has it; never waits. ``again``: the job is queued again (a retry, from its run
    or after it died): a lease of its own (reservation or hold) is taken over. A new job's
    reservation is a bare ``SET NX`` (one round trip; a duplicate costs a second, to read who
    has the key); one that takes over is one script. Raises ``LockBackendError`` when Redis
    cannot be reached."""
    job_id = job_id_checked(job_id)
    alias = using or lock_settings.CACHE_ALIAS
    keys = lock_keys(name, alias)
    takeover = (f"{job_id}{JOB_SEPARATOR}",) if again else ()
    plan = _plan(name, keys, alias, job_id, ttl, label, guard, takeover, group=group)
    for _ in range(_ATTEMPTS):
        outcome = _run(name, "reserve", plan, alias)
        if isinstance(outcome, flows.Acquired):
            return Reservation(True)
        if outcome.holder is not None:
            return Reservation(False, lock_info(keys.lease, outcome.holder, outcome.pttl))
        # Taken when we tried, and free when we looked who had it: its lease had just ended.
    return Reservation(False)


def rename(
    name: str,
    pending: str,
    job_id: str,
    *,
    ttl: float,
    label: str | None = None,
    guard: str | None = None,
    group: str | None = None,
    using: str | None = None,
) -> bool:
    """Make the pending reservation ``pending`` of ``name`` the job ``job_id``'s (for
    ``ttl`` seconds from now). False, writing nothing, when it is not there any more: the
    job's run took it over (and may have ended since), or it ended. One round trip."""
    job_id = job_id_checked(job_id)
    alias = using or lock_settings.CACHE_ALIAS
    keys = lock_keys(name, alias)
    takeover = (f"{job_id_checked(pending)}{JOB_SEPARATOR}",)
    plan = _plan(
        name, keys, alias, job_id, ttl, label, guard, takeover, only_takeover=True, group=group
    )
    return isinstance(_run(name, "rename the reservation of", plan, alias), flows.Acquired)


def cancel(name: str, job_id: str, *, using: str | None = None) -> bool:
    """End ``job_id``'s reservation of ``name`` (the job left its queue: it started a run
    that does not hold this key, or it was revoked), or a pending one not renamed yet (its
    job's run starts before the queueing process learnt its id); False when there is none (any
    more). A waiter, if any, is handed the lock. One round trip when it is ``job_id``'s."""
    keys, alias = _reservation_keys(name, using)
    try:
        code: int = run(flows.end_reservation(keys, job_id_checked(job_id)), backend_of(alias))
    except RedisError as exc:
        raise _backend_error(name, "cancel the reservation of", exc) from exc
    return code == 0


async def acancel(name: str, job_id: str, *, using: str | None = None) -> bool:
    """:func:`cancel` for asyncio."""
    keys, alias = _reservation_keys(name, using)
    backend = async_backend_of(alias)
    try:
        flow = flows.end_reservation(keys, job_id_checked(job_id))
        code: int = await arun(flow, backend)
    except RedisError as exc:
        raise _backend_error(name, "cancel the reservation of", exc) from exc
    return code == 0


def _plan(
    name: str, keys: flows.LockKeys, alias: str, job_id: str, ttl: float, label: str | None,
    guard: str | None, takeover: tuple[str, ...], *, only_takeover: bool = False,
    group: str | None = None,
) -> flows.AcquirePlan:  # fmt: skip
    """The acquisition of a reservation: never waits, never queues."""
    lease = durations.seconds(ttl, "ttl")
    record = owners.owner_record(
        current_owner(), lease, label=label, guard=guard, group=group,
        name=None if readable_tag(name) else name,
    ).encode()  # fmt: skip
    quorum = quorum_members(alias) is not None
    # join.lua when replicas must confirm (take.lua has no WAIT); it never queues us with no
    # time left to wait. Else a bare SET, or take.lua when it takes a lease over (a rename
    # always: join.lua would take a free key too).
    replicas = 0 if quorum or only_takeover else int(lock_settings.MIN_REPLICAS)
    return flows.AcquirePlan(
        keys=keys,
        token=reservation_token(job_id),
        lease_ms=durations.milliseconds(lease),
        record=record,
        max_wait=0,
        clock=time.monotonic,
        first="join" if replicas else "set",
        queues=not quorum,
        takeover=takeover,
        only_takeover=only_takeover,
        retry_soon=Backend.retry_soon,
        unreachable=Backend.unreachable,
        replicas=replicas,
        replica_timeout_ms=max(1, int(lock_settings.REPLICA_TIMEOUT * 1000)),
        started=time.monotonic(),
    )


def _run(
    name: str, action: str, plan: flows.AcquirePlan, alias: str
) -> flows.Acquired | flows.NotAcquired:
    try:
        outcome = run(flows.acquire(plan), backend_of(alias))
    except (RedisError, flows.Unconfirmed) as exc:
        raise _backend_error(name, action, exc) from exc
    assert isinstance(outcome, flows.Acquired | flows.NotAcquired)
    return outcome


def _reservation_keys(name: str, using: str | None) -> tuple[flows.LockKeys, str]:
    alias = using or lock_settings.CACHE_ALIAS
    return lock_keys(name, alias), alias


def _backend_error(name: str, action: str, exc: BaseException) -> LockBackendError:
    return errors.backend_error(name, action, exc, lock_settings.REPLICA_TIMEOUT)
