"""A duplicate a task guard found, and how it is told: the error (``DuplicateTask``), the log
line and the ``task_duplicate_found`` signal, the same for Celery and django.tasks, when the
task is queued and when it runs."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from ..exceptions import DuplicateTask, LockNotAcquired
from ..registry.records import LockInfo
from ..signals import task_duplicate_found
from .policy import RAISE, RESCHEDULE, RETURN_EXISTING, SKIP, TaskGuard

__all__ = ["IGNORE", "Duplicate", "decide", "ignore_copy"]

logger = logging.getLogger("django_redis_lock")

# The action taken on a copy of a job that runs or ran already (same task id): it never runs.
IGNORE = "ignore"


@dataclass(frozen=True)
class Duplicate:
    """Who has the guard key ``name``: the task ``task_id`` (None: not a task guard), queued
    or running, its hold ending in ``ttl`` seconds (None: unknown)."""

    name: str
    task_id: str | None
    queued: bool
    ttl: float | None
    owner: dict[str, Any] | None = field(default=None, compare=False)

    @classmethod
    def of_holder(cls, name: str, holder: LockInfo | None) -> Duplicate:
        """From the record a reservation found (``reservations.reserve``)."""
        if holder is None:
            return cls(name, None, False, None)
        ttl = holder.ttl if holder.expires else None
        return cls(name, holder.job_id, holder.queued, ttl, holder.as_dict())

    @classmethod
    def of_refusal(cls, name: str, refusal: LockNotAcquired | None) -> Duplicate:
        """From a run's refused acquisition."""
        owner = refusal.owner if refusal is not None else None
        ttl = refusal.ttl if refusal is not None else None
        if not owner:
            return cls(name, None, False, ttl)
        return cls(name, owner.get("job_id"), bool(owner.get("queued")), ttl, owner)

    def error(self, guard: TaskGuard) -> DuplicateTask:
        return DuplicateTask(
            self.name, task=guard.task, task_id=self.task_id, queued=self.queued, ttl=self.ttl,
            owner=self.owner,
        )  # fmt: skip

    def reschedule_delay(self, guard: TaskGuard) -> float:
        """When to look again: the holder's lease left (a run renews it, so about a lease),
        at least a second, at most a lease."""
        return min(max(self.ttl or 0.0, 1.0), guard.lease)


def decide(
    guard: TaskGuard,
    duplicate: Duplicate,
    *,
    sender: type,
    task_id: str | None,
    phase: str,
    answerable: bool = True,
) -> str:
    """What to do with ``duplicate``, found when a call is queued (``phase`` "enqueue") or when
    its run starts ("run"), told to the world: the guard's ``on_duplicate``, except that
    ``return_existing`` skips a run (it has no result of another's to give), and refuses
    (``raise``) a call when there is no result to answer with (``answerable`` False, or
    something that is not a task holds the key)."""
    action = guard.on_duplicate
    if action == RETURN_EXISTING:
        if phase == "run":
            action = SKIP
        elif not answerable or duplicate.task_id is None:
            action = RAISE
    _report(guard, duplicate, sender=sender, task_id=task_id, phase=phase, action=action)
    return action


def ignore_copy(guard: TaskGuard, name: str, job_id: str | None, *, sender: type,
                finished: bool) -> None:  # fmt: skip
    """Tell the world that a run of the job ``job_id`` is not run again: another run of it
    ``finished``, or still runs elsewhere."""
    reason = (
        "another run of it finished already" if finished
        else "another run of it still runs elsewhere"
    )  # fmt: skip
    _report(guard, Duplicate(name, job_id, False, None), sender=sender, task_id=job_id,
            phase="run", action=IGNORE, reason=reason)  # fmt: skip


def _report(
    guard: TaskGuard,
    duplicate: Duplicate,
    *,
    sender: type,
    task_id: str | None,
    phase: str,
    action: str,
    reason: str | None = None,
) -> None:
    """Log and signal what was done with a duplicate: at WARNING when the call does not run
    and nobody is told by an exception or a result (``skip``, a copy ignored), else at INFO.
    ``reason``: why, when not that the duplicate holds the key."""
    level = logging.WARNING if action in (SKIP, IGNORE) else logging.INFO
    what = {
        SKIP: "skipped",
        IGNORE: "not run again",
        RESCHEDULE: "put off",
    }.get(action, f"answered with {action}")
    logger.log(
        level, "Task %s%s %s when %s: %s", guard.task, f"[{task_id}]" if task_id else "",
        what, "queued" if phase == "enqueue" else "it started",
        reason or duplicate.error(guard),
    )  # fmt: skip
    task_duplicate_found.send(
        sender=sender, name=duplicate.name, task=guard.task, task_id=task_id,
        duplicate_of=duplicate.task_id, queued=duplicate.queued, phase=phase, action=action,
    )  # fmt: skip
