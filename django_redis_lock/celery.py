"""Celery task guards: ``GuardedTask``, a task base class that keeps duplicates of a task out of
the queue and apart when they run (``pip install django-redis-lock[celery]``).

    from django_redis_lock.celery import GuardedTask

    @app.task(base=GuardedTask, guard="until_executed", guard_key="{customer_id}")
    def sync_customer(customer_id): ...

    sync_customer.delay(42)      # queued
    sync_customer.delay(42)      # the same AsyncResult (same id), nothing published

The options, as task options (``@app.task(...)``) or class attributes:

- ``guard``: ``"until_executed"`` (default), ``"until_executing"``, ``"while_executing"`` or
  ``"until_and_while_executing"`` (``task_guards/policy.py``);
- ``guard_key``: a template over the task's arguments (``"{customer_id}"``), a callable of them,
  or None: all of them, bound to the task's parameters (``f(42)`` is ``f(customer_id=42)``);
- ``on_duplicate``: ``"return_existing"`` (default: ``delay()`` returns the first call's
  ``AsyncResult``), ``"raise"`` (``DuplicateTask``), ``"skip"`` (``delay()`` returns None, with
  a WARNING and the ``task_duplicate_found`` signal), ``"reschedule"`` (a run that finds another
  running is put off until about a lease later);
- ``guard_timeout``: a run's lease (default ``DJANGO_REDIS_LOCK_TIMEOUT``), renewed while it
  runs: the longest a run that died blocks the key; ``guard_queued_timeout``: the longest a
  queued call keeps it (``DJANGO_REDIS_LOCK_TASK_QUEUED_TIMEOUT``); ``guard_using``: the cache
  alias (or quorum) of the locks.

The lock's owner token is the task id, known before the message is published: the worker's
main process frees exactly that task's keys when the task is revoked, expires, hits its hard
time limit or loses its worker process (signal receivers below), and nobody else's. A retry
(``self.retry()``, or Celery's own after a lost worker) keeps the key for the same task id.
"""

from __future__ import annotations

import datetime
import logging
import threading
from typing import Any

from billiard.exceptions import WorkerLostError
from celery import Task, signals
from celery.exceptions import Ignore, Reject, Retry, TimeLimitExceeded
from celery.utils import uuid

from . import task_guards as guards
from .conf import lock_settings
from .exceptions import LockBackendError
from .hints import check_names

__all__ = ["GuardedTask"]

logger = logging.getLogger("django_redis_lock")

# Task options other uniqueness libraries use (hints.FAMILIAR says what ours are), and ours.
_THEIRS = ("once", "unique_on", "lock_expiry", "raise_on_duplicate")
_OPTIONS = frozenset(
    ("guard", "guard_key", "on_duplicate", "guard_timeout", "guard_queued_timeout", "guard_using")
)


class _Runs(threading.local):
    """The guarded runs under way in this thread, by task id: a retry published from inside a
    run (``self.retry()``) hands the run's key back to the queue instead of releasing it."""

    def __init__(self) -> None:
        self.by_id: dict[str, guards.GuardedRun] = {}


_runs = _Runs()


class GuardedTask(Task):  # type: ignore[misc]  # celery is untyped
    """A Celery task whose duplicates (by ``guard_key``) are kept out of the queue and apart
    when they run; see the module docstring."""

    guard: str = guards.UNTIL_EXECUTED
    guard_key: Any = None
    on_duplicate: str = guards.RETURN_EXISTING
    guard_timeout: float | None = None
    guard_queued_timeout: float | None = None
    guard_using: str | None = None

    def __init__(self) -> None:
        # Bad options fail when the task is defined, not when it is first queued.
        if type(self).run is not Task.run:
            self.task_guard  # noqa: B018

    @property
    def task_guard(self) -> guards.TaskGuard:
        """This task's guard (its options, checked)."""
        guard = self.__dict__.get("_task_guard")
        if guard is None:
            # Left from celery-once or celery-singleton: say which of ours it is.
            check_names([name for name in _THEIRS if hasattr(self, name)],
                        f"GuardedTask {self.name}", takes=_OPTIONS)  # fmt: skip
            guard = self.__dict__["_task_guard"] = guards.TaskGuard(
                self.name, self.run, label="Celery task", guard=self.guard,
                guard_key=self.guard_key, on_duplicate=self.on_duplicate,
                guard_timeout=self.guard_timeout, guard_queued_timeout=self.guard_queued_timeout,
                guard_using=self.guard_using,
            )  # fmt: skip
        return guard

    # -- queueing ------------------------------------------------------------------------------

    def apply_async(
        self,
        args: Any = None,
        kwargs: Any = None,
        task_id: str | None = None,
        *rest: Any,
        **options: Any,
    ) -> Any:
        """Publish the call unless a duplicate of it is queued or running (then as
        ``on_duplicate`` says). Reserving its key costs one round trip to Redis."""
        guard = self.task_guard
        if not lock_settings.ENABLED or not guard.reserves:
            return super().apply_async(args, kwargs, task_id, *rest, **options)
        task_id = task_id or uuid()
        names = guard.names(args or (), kwargs or {})
        ttl = guard.queued_ttl(_delay(options), _expires_in(options))
        run = _runs.by_id.get(task_id)
        republished = run is not None or (options.get("retries") or 0) > 0
        if run is not None and names.queue is not None:  # a retry from inside the run
            run.hand_back(names.queue)  # the key stays the task's, queued again
        try:
            duplicate = guards.admit(guard, names, task_id, ttl=ttl, again=republished)
        except LockBackendError as error:
            if not (republished or lock_settings.FAIL_OPEN):
                raise
            logger.warning("Task %s[%s] queued unguarded: %s", self.name, task_id, error)
            duplicate = None
        if duplicate is None or republished:
            if duplicate is not None:
                logger.info(
                    "Task %s[%s] queued again while %s holds its key", self.name, task_id,
                    duplicate.task_id,
                )  # fmt: skip
            return self._publish(names, task_id, args, kwargs, rest, options)
        return self._duplicate(duplicate, args, kwargs, rest, options)

    def _publish(
        self, names: guards.GuardNames, task_id: str, args: Any, kwargs: Any,
        rest: tuple[Any, ...], options: dict[str, Any],
    ) -> Any:  # fmt: skip
        try:
            return super().apply_async(args, kwargs, task_id, *rest, **options)
        except BaseException:
            # Not queued: the key must not wait a whole queued timeout for a task that never
            # comes (nor for a retry that was not queued either).
            if names.queue is not None:
                guards.release_after(self.task_guard, names, task_id, "it could not be queued")
            raise

    def _duplicate(
        self, duplicate: guards.Duplicate, args: Any, kwargs: Any, rest: tuple[Any, ...],
        options: dict[str, Any],
    ) -> Any:  # fmt: skip
        guard = self.task_guard
        action = guards.decide(guard, duplicate, sender=GuardedTask, task_id=None,
                               phase="enqueue")  # fmt: skip
        if action == guards.RETURN_EXISTING:
            return self.AsyncResult(duplicate.task_id)
        if action == guards.SKIP:
            return None
        if action == guards.RESCHEDULE:
            # Published to start after the one that has the key; it takes the key (or is put
            # off again) when it runs.
            options = {**options, "countdown": duplicate.reschedule_delay(guard)}
            options.pop("eta", None)
            return super().apply_async(args, kwargs, None, *rest, **options)
        raise duplicate.error(guard)

    # -- running -------------------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        guard = self.task_guard
        if not lock_settings.ENABLED:
            return self._body(*args, **kwargs)
        request = self.request
        job_id = None if request.called_directly else request.id
        run = guards.GuardedRun(guard, guard.names(args, kwargs), job_id, self._copy_wait())
        verdict = run.enter()
        if verdict is not guards.Verdict.RUN:
            return self._not_run(run, verdict, job_id)
        if job_id is not None:
            _runs.by_id[job_id] = run
        done = True
        try:
            return self._body(*args, **kwargs)
        except (Retry, Reject) as going_back:
            # Back to its queue, same id (a retry; a requeue): not done, or its next run
            # would take itself for a copy of a run that finished.
            done = isinstance(going_back, Reject) and not going_back.requeue
            raise
        finally:
            if job_id is not None:
                _runs.by_id.pop(job_id, None)
            run.exit(done=done)

    def _copy_wait(self) -> float | None:
        """A copy of a running task waits for its original less long than its time limits: a
        copy stopped by one would have its worker free the original's key."""
        limits: list[float] = [
            float(limit) for limit in (*(self.request.timelimit or ()), self.time_limit,
                                       self.soft_time_limit) if limit
        ]  # fmt: skip
        if not limits:
            return None
        return max(0.0, min(self.task_guard.copy_wait(), min(limits) - 1.0))

    def _body(self, *args: Any, **kwargs: Any) -> Any:
        """The task's own body. A worker (and eager mode) has pushed the task's request
        already: ``Task.__call__`` would push another, without its id, on Celery versions that
        do not guard against it (5.4, in eager mode); called directly, it pushes one."""
        if self.request.called_directly:
            return super().__call__(*args, **kwargs)
        return self.run(*args, **kwargs)

    def _not_run(self, run: guards.GuardedRun, verdict: guards.Verdict, job_id: str | None) -> Any:
        action = run.refused(verdict, sender=GuardedTask)
        if action == guards.IGNORE:
            # A copy of this very task (same id), delivered again: it ran, or runs elsewhere.
            # Ignore: its message is acknowledged and the state the run stores is left alone.
            raise Ignore()
        if action == guards.RESCHEDULE and job_id is not None:
            assert run.duplicate is not None
            _runs.by_id[job_id] = run  # the republish below is this task's own
            try:
                self.signature_from_request(
                    countdown=run.duplicate.reschedule_delay(self.task_guard)
                ).apply_async()
            finally:
                _runs.by_id.pop(job_id, None)
            raise Ignore()
        return None

    # -- after a run that did not end by itself ------------------------------------------------

    def release_guard(
        self, task_id: str, args: Any, kwargs: Any, why: str, *, ran: str = "here"
    ) -> None:
        """Free what the task ``task_id`` (called with ``args`` and ``kwargs``) had, and
        nobody else's (``ran``: see ``task_guards.release_after``). Called in the worker's main
        process when the task was revoked or expired, hit its hard time limit, or lost its
        worker process."""
        if not lock_settings.ENABLED or not task_id:
            return
        guard = self.task_guard
        try:
            names = guard.names(args or (), kwargs or {})
        except (TypeError, ValueError) as exc:
            logger.error(
                "Task %s[%s]: no guard key for its arguments: %s", self.name, task_id, exc
            )
            return
        guards.release_after(guard, names, task_id, f"Celery: task {task_id} {why}", ran=ran)


def _delay(options: dict[str, Any]) -> float:
    """Seconds until a message may run (its ``countdown`` or ``eta``)."""
    countdown = options.get("countdown")
    if countdown is not None:
        return float(countdown)
    eta = options.get("eta")
    if eta is None:
        return 0.0
    if isinstance(eta, str):
        eta = datetime.datetime.fromisoformat(eta)
    return _seconds_until(eta)


def _expires_in(options: dict[str, Any]) -> float | None:
    expires = options.get("expires")
    if expires is None:
        return None
    if isinstance(expires, int | float):
        return float(expires)
    if isinstance(expires, str):
        expires = datetime.datetime.fromisoformat(expires)
    return _seconds_until(expires)


def _seconds_until(moment: datetime.datetime) -> float:
    now = datetime.datetime.now(moment.tzinfo or datetime.timezone.utc)
    if moment.tzinfo is None:
        now = now.replace(tzinfo=None)
    return (moment - now).total_seconds()


# -- the worker's main process: calls that ended without their run's own release -------------


@signals.task_failure.connect(weak=False, dispatch_uid="django_redis_lock.celery.failure")  # type: ignore[untyped-decorator]
def _after_failure(
    sender: Any = None, task_id: str | None = None, exception: Any = None, args: Any = None,
    kwargs: Any = None, **ignored: Any,
) -> None:  # fmt: skip
    # Sent in the main process for a hard time limit and a lost worker process (whose run could
    # not release); in the child for any other failure, after the run released its key itself.
    if (
        isinstance(sender, GuardedTask)
        and task_id
        and isinstance(exception, TimeLimitExceeded | WorkerLostError)
    ):
        if isinstance(exception, TimeLimitExceeded):
            sender.release_guard(task_id, args, kwargs, "hit its hard time limit")
        else:  # only its own run's hold: a copy of it may run elsewhere
            sender.release_guard(task_id, args, kwargs, "lost its worker process", ran="dead here")


@signals.task_revoked.connect(weak=False, dispatch_uid="django_redis_lock.celery.revoked")  # type: ignore[untyped-decorator]
def _after_revoke(
    sender: Any = None, request: Any = None, terminated: bool = False, expired: bool = False,
    **ignored: Any,
) -> None:  # fmt: skip
    if isinstance(sender, GuardedTask) and request is not None:
        if terminated:  # every run of it, on every worker, was stopped
            sender.release_guard(request.id, request.args, request.kwargs, "was terminated")
        else:  # this message was dropped before it ran: its reservation, not a copy's hold
            why = "expired" if expired else "was revoked"
            sender.release_guard(request.id, request.args, request.kwargs, why, ran="nowhere")
