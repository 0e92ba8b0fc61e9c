"""What a task guard does around a run rather than in it: reserve a call's key when the call is
queued (or say who has it), and free what a call held when it ended without its run's own
release (a revoke, a hard time limit, a lost worker), as the worker's supervisor sees it."""

from __future__ import annotations

import logging

from redis.exceptions import RedisError

from .. import jobs, registry
from ..exceptions import LockBackendError
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
    reservation = jobs.reserve(
        names.queue, job_id, ttl=ttl, label=guard.label, guard=guard.mode, using=guard.using,
        takeover_from=job_id if again else None,
    )  # fmt: skip
    if reservation.reserved:
        return None
    return Duplicate.of_holder(names.queue, reservation.holder)


def release_after(guard: TaskGuard, names: GuardNames, job_id: str, why: str) -> None:
    """The call ``job_id`` ended without its run releasing what it had (``why``): free its
    reservation and its run's hold, and nobody else's. Errors are logged: the leases end by
    themselves."""
    for name in dict.fromkeys(name for name in (names.queue, names.run) if name):
        try:
            if registry.release_job(name, job_id, using=guard.using, by=why):
                logger.info("Released %r of task %s[%s]: %s", name, guard.task, job_id, why)
        except (RedisError, LockBackendError, ValueError) as exc:
            logger.error(
                "Could not release %r of task %s[%s] (%s): %s; it is free when its lease "
                "ends.", name, guard.task, job_id, why, exc,
            )  # fmt: skip
