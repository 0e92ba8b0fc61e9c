"""What a task guard does around a run rather than in it: reserve a call's key when the call is
queued (or say who has it), and free what a call held when it ended without its run's own
release (a revoke, a hard time limit, a lost worker), as the worker's supervisor sees it."""

from __future__ import annotations

import logging

from redis.exceptions import RedisError

from .. import registry
from ..exceptions import LockBackendError
from ..primitives import owners
from . import reservations
from .duplicates import Duplicate
from .policy import GuardNames, TaskGuard

__all__ = ["admit", "release_after"]

logger = logging.getLogger("django_redis_lock")


def admit(
    guard: TaskGuard, names: GuardNames, job_id: str, *, ttl: float, again: bool = False
) -> Duplicate | None:
    """Reserve ``names.queue`` for the call ``job_id``; the duplicate it found otherwise.
    ``again``: the job is queued again (a retry): a lease of its own is taken over. One round
    trip (a duplicate of a new call: two)."""
    assert names.queue is not None
    reservation = reservations.reserve(
        names.queue, job_id, ttl=ttl, label=guard.label, guard=guard.mode, using=guard.using,
        again=again, group=guard.group,
    )  # fmt: skip
    if reservation.reserved:
        return None
    return Duplicate.of_holder(names.queue, reservation.holder)


def release_after(
    guard: TaskGuard, names: GuardNames, job_id: str, why: str, *, ran: str = "here"
) -> None:
    """The call ``job_id`` ended without its run releasing what it had (``why``): free what
    it had, and nobody else's. Another run of the same job (a copy the broker delivered again)
    may hold its key elsewhere, so ``ran`` says which of the job's leases are this call's:

    - ``"nowhere"``: it never ran (a message discarded: revoked, expired): its reservation;
    - ``"dead here"``: its process on this machine died (and was reaped): its reservation,
      and a hold of a process of this machine that is no longer alive;
    - ``"here"``: it was stopped (a hard time limit, a revoke that terminated every run of
      it): its reservation and its holds.

    Errors are logged: the leases end by themselves."""
    for name in dict.fromkeys(name for name in (names.queue, names.run) if name):
        try:
            released = _release(guard, name, job_id, why, ran)
        except (RedisError, LockBackendError, ValueError) as exc:
            logger.error(
                "Could not release %r of task %s[%s] (%s): %s; it is free when its lease "
                "ends.", name, guard.task, job_id, why, exc,
            )  # fmt: skip
            continue
        if released:
            logger.info("Released %r of task %s[%s]: %s", name, guard.task, job_id, why)


def _release(guard: TaskGuard, name: str, job_id: str, why: str, ran: str) -> bool:
    if ran == "nowhere":
        return reservations.cancel(name, job_id, using=guard.using)
    if ran == "here":
        return registry.release_job(name, job_id, using=guard.using, by=why)
    info = registry.get_lock(name, using=guard.using)
    if info is None or info.job_id != job_id:
        return False
    if not info.queued and (info.host != owners.HOST or owners.process_alive(info.pid)):
        return False  # another run of the job, elsewhere or alive
    return registry.force_release(name, info.token, using=guard.using, by=why)
