"""Task guards: one of a kind of task queued or running at a time, for any task queue.

The plain core the Celery (``django_redis_lock.celery``) and django.tasks
(``django_redis_lock.tasks``) integrations share, so that both keep their promises the same way:

- ``policy.py``: a task's guard (mode, key, ``on_duplicate``) and the names of its locks;
- ``queueing.py``: reserving a call's key when it is queued, and freeing a call's keys after it
  ended without its run's release (for the worker's supervisor);
- ``runs.py``: a run: what it takes when it starts, finds, and leaves when it ends;
- ``duplicates.py``: a duplicate, and how it is told (``DuplicateTask``, log, signal).

Built on the public API of the lock engine: ``Lock`` (``job_id``, ``detach``), ``jobs`` (job
reservations) and ``registry.release_job``.
"""

from .duplicates import IGNORE, Duplicate, decide, ignore_copy
from .policy import (
    MODES,
    ON_DUPLICATE,
    RAISE,
    RESCHEDULE,
    RETURN_EXISTING,
    SKIP,
    UNTIL_AND_WHILE_EXECUTING,
    UNTIL_EXECUTED,
    UNTIL_EXECUTING,
    WHILE_EXECUTING,
    GuardNames,
    TaskGuard,
)
from .queueing import admit, release_after
from .runs import GuardedRun, Verdict

__all__ = [
    "IGNORE",
    "MODES",
    "ON_DUPLICATE",
    "RAISE",
    "RESCHEDULE",
    "RETURN_EXISTING",
    "SKIP",
    "UNTIL_AND_WHILE_EXECUTING",
    "UNTIL_EXECUTED",
    "UNTIL_EXECUTING",
    "WHILE_EXECUTING",
    "Duplicate",
    "GuardNames",
    "GuardedRun",
    "TaskGuard",
    "Verdict",
    "admit",
    "decide",
    "ignore_copy",
    "release_after",
]
