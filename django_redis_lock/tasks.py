"""Task guards for Django's tasks framework (``django.tasks``; the ``django-tasks`` backport
before Django 6.0): ``pip install django-redis-lock[tasks]``. Without the framework this module
still imports (Celery imports every installed app's ``tasks``), and using it says what to
install.

``GuardedBackend`` wraps the backend that queues and runs the tasks, and ``@guarded(...)`` gives
a task its guard (the same options as Celery's ``GuardedTask``, ``docs/tasks.md``)::

    TASKS = {
        "default": {
            "BACKEND": "django_redis_lock.tasks.GuardedBackend",
            "OPTIONS": {"INNER": "db"},
        },
        "db": {"BACKEND": "django_tasks_db.DatabaseBackend"},
    }

    @guarded(guard="until_executed", guard_key="{customer_id}")
    @task
    def sync_customer(customer_id): ...

    sync_customer.enqueue(42)      # queued
    sync_customer.enqueue(42)      # the first one's TaskResult: nothing queued

``@guarded`` goes above ``@task``: it guards the task's runs wherever they happen (the task
receives its context to know its id, and still gets it only if it asked), and
``GuardedBackend.enqueue`` keeps duplicates out of the queue. A backend names a task only as it
queues it, so the key is reserved under a pending id first, renamed once the id is known; a run
that starts in between takes the pending reservation over.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from asgiref.sync import iscoroutinefunction, sync_to_async
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.utils import timezone

from . import registry
from . import task_guards as guards
from .conf import lock_settings
from .exceptions import LockBackendError
from .hints import hinted
from .task_guards import framework, reservations

# Django 6.0+ has django.tasks; before it, the django-tasks backport has the same API (typed
# here as Django's). Without either, stand-ins that refuse to be used (task_guards/framework.py).
if TYPE_CHECKING or framework.MODULE == "django.tasks":
    from django.tasks import task_backends
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import Task, TaskContext, TaskResult
    from django.tasks.exceptions import TaskResultDoesNotExist
elif framework.MODULE == "django_tasks":
    from django_tasks import task_backends
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.base import Task, TaskContext, TaskResult
    from django_tasks.exceptions import TaskResultDoesNotExist
else:
    from .task_guards.framework import (
        BaseTaskBackend,
        Task,
        TaskContext,
        TaskResult,
        TaskResultDoesNotExist,
        task_backends,
    )

__all__ = ["GuardedBackend", "guarded"]

logger = logging.getLogger("django_redis_lock")

T = TypeVar("T")

# A guarded task's function called with no argument at all (not even a context).
_NONE: Any = object()

# How long a duplicate waits for the first call's reservation to be renamed from its pending id
# (the round trip after the inner backend queued it), to answer with its TaskResult.
_RENAME_WAIT = 1.0


@hinted
def guarded(
    *,
    guard: str = guards.UNTIL_EXECUTED,
    guard_key: str | Callable[..., str] | None = None,
    on_duplicate: str = guards.RETURN_EXISTING,
    guard_timeout: float | None = None,
    guard_queued_timeout: float | None = None,
    guard_using: str | None = None,
) -> Callable[[Task[Any, T]], Task[Any, T]]:
    """Give a task a guard (see the module docstring; the options are ``GuardedTask``'s)."""
    if framework.MODULE is None:
        raise framework.missing("@guarded(...)")
    options: dict[str, Any] = {
        "guard": guard, "guard_key": guard_key, "on_duplicate": on_duplicate,
        "guard_timeout": guard_timeout, "guard_queued_timeout": guard_queued_timeout,
        "guard_using": guard_using,
    }  # fmt: skip
    # Fail at once rather than later (the key's template is checked with the task).
    guards.TaskGuard("validate-options", _any, label="", **{**options, "guard_key": None})

    def decorate(task: Task[Any, T]) -> Task[Any, T]:
        if not isinstance(task, Task):
            if type(task).__module__.startswith("django_tasks."):
                raise TypeError(
                    "@guarded(...) got a Task of the django-tasks backport: this Django has "
                    "django.tasks, which the guards use; define the task with "
                    "django.tasks.task."
                )
            raise TypeError(
                f"@guarded(...) guards a Task: put it above @task, not below it (it got "
                f"{type(task).__name__})."
            )
        policy = guards.TaskGuard(
            task.module_path, task.func, label="django task",
            skip_first_parameter=task.takes_context, **options,
        )  # fmt: skip
        backend = task.get_backend()
        if policy.reserves and not isinstance(backend, GuardedBackend):
            raise ImproperlyConfigured(
                f"{task.module_path}: guard={guard!r} keeps duplicates out of the queue, which "
                f"only a GuardedBackend can do, and its backend {task.backend!r} is a "
                f"{type(backend).__name__}. Use guard='while_executing', or a GuardedBackend."
            )
        if on_duplicate == guards.RESCHEDULE and not backend.supports_defer:
            raise ImproperlyConfigured(
                f"{task.module_path}: on_duplicate='reschedule' queues a run again for later, "
                f"and backend {task.backend!r} cannot defer tasks (supports_defer)."
            )
        func = _guarded_function(task.func, policy, task.takes_context)
        return dataclasses.replace(task, func=func, takes_context=True)

    return decorate


def _any(*args: Any, **kwargs: Any) -> None:
    """A function of any arguments (to check options before there is a task)."""


def guard_of(task: Task[Any, Any]) -> guards.TaskGuard | None:
    """The guard ``@guarded`` gave ``task`` (None: it has none)."""
    return getattr(task.func, "task_guard", None)


def _guarded_function(
    func: Callable[..., Any], policy: guards.TaskGuard, takes_context: bool
) -> Callable[..., Any]:
    """``func`` run under ``policy``, taking the context (for its task id) whether or not
    ``func`` does. Not ``functools.wraps``: the task framework checks that its first parameter
    is ``context``, through ``__wrapped__``. Called without a context (``task.call(42)``, as
    tests do), it runs as a direct call: guarded, with no task id."""

    def start(context: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        if context is _NONE:
            context = None
        elif not isinstance(context, TaskContext):  # a direct call's first argument
            args, context = (context, *args), None
        job_id = None if context is None else str(context.task_result.id)
        # A run put off is queued again as a new task: its reservation does not go with it.
        run = guards.GuardedRun(policy, policy.names(args, kwargs), job_id, requeued_as_is=False)
        call_args = (context, *args) if takes_context and context is not None else args
        return run, context, args, call_args

    if iscoroutinefunction(func):

        async def guarded_run(context: Any = _NONE, *args: Any, **kwargs: Any) -> Any:
            run, context, args, call_args = start(context, args, kwargs)
            if not lock_settings.ENABLED:
                return await func(*call_args, **kwargs)
            verdict = await run.aenter()
            if verdict is not guards.Verdict.RUN:
                later = _not_run(context, run, verdict)
                if later is not None:
                    await later.aenqueue(*args, **kwargs)
                return None
            try:
                return await func(*call_args, **kwargs)
            finally:
                await run.aexit()

        function: Callable[..., Any] = guarded_run
    else:

        def guarded_call(context: Any = _NONE, *args: Any, **kwargs: Any) -> Any:
            run, context, args, call_args = start(context, args, kwargs)
            if not lock_settings.ENABLED:
                return func(*call_args, **kwargs)
            verdict = run.enter()
            if verdict is not guards.Verdict.RUN:
                later = _not_run(context, run, verdict)
                if later is not None:
                    later.enqueue(*args, **kwargs)
                return None
            try:
                return func(*call_args, **kwargs)
            finally:
                run.exit()

        function = guarded_call
    for attribute in ("__module__", "__name__", "__qualname__", "__doc__"):
        setattr(function, attribute, getattr(func, attribute))
    function.task_guard = policy  # type: ignore[attr-defined]
    return function


def _not_run(
    context: TaskContext[Any, Any] | None, run: guards.GuardedRun, verdict: guards.Verdict
) -> Task[Any, Any] | None:
    """A run that does not run: it returns None (a duplicate that raises fails instead). The
    task to queue for later when it is put off (``reschedule``): straight to the backend that
    ran it, since a run put off is no new call to hold back."""
    action = run.refused(verdict, sender=GuardedBackend)
    if action != guards.RESCHEDULE or context is None:
        return None
    assert run.duplicate is not None
    delay = run.duplicate.reschedule_delay(run.guard)
    task: Task[Any, Any] = context.task_result.task.using(
        run_after=timezone.now() + datetime.timedelta(seconds=delay)
    )
    return task


class GuardedBackend(BaseTaskBackend):
    """A task backend that keeps duplicates of ``@guarded`` tasks out of the queue, and hands
    everything else to the backend ``OPTIONS["INNER"]`` names (which queues and runs them)."""

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        inner = self.options.get("INNER")
        if not isinstance(inner, str) or not inner or inner == alias:
            raise ImproperlyConfigured(
                f"TASKS[{alias!r}]: a GuardedBackend needs OPTIONS['INNER'], the alias of "
                f"another task backend that queues and runs the tasks, not {inner!r}."
            )
        self.inner_alias = inner

    @property
    def inner(self) -> BaseTaskBackend:
        """The backend that queues and runs the tasks."""
        return task_backends[self.inner_alias]

    # What the inner backend can do, this one can.
    supports_defer = property(lambda self: self.inner.supports_defer)
    supports_async_task = property(lambda self: self.inner.supports_async_task)
    supports_get_result = property(lambda self: self.inner.supports_get_result)
    supports_priority = property(lambda self: self.inner.supports_priority)

    def validate_task(self, task: Task[Any, Any]) -> None:
        self.inner.validate_task(task)

    def get_result(self, result_id: str) -> TaskResult[Any, Any]:
        return self.inner.get_result(result_id)

    async def aget_result(self, result_id: str) -> TaskResult[Any, Any]:
        return await self.inner.aget_result(result_id)

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        return list(self.inner.check(**kwargs))

    def enqueue(  # type: ignore[override]  # None: a duplicate skipped (on_duplicate="skip")
        self, task: Task[Any, T], args: Any, kwargs: Any
    ) -> TaskResult[Any, T] | None:
        """Queue the call unless a duplicate of it is queued or running (then as its
        ``on_duplicate`` says: its TaskResult, ``DuplicateTask``, None, or queued for later)."""
        policy = guard_of(task)
        if policy is None or not policy.reserves or not lock_settings.ENABLED:
            return self.inner.enqueue(task, args, kwargs)
        names = policy.names(args, kwargs)
        assert names.queue is not None
        pending = reservations.pending_job_id()
        ttl = policy.queued_ttl(_delay(task))
        try:
            duplicate = self._admit(policy, names.queue, pending, ttl)
        except LockBackendError as error:
            if not lock_settings.FAIL_OPEN:
                raise
            logger.warning("Task %s queued unguarded: %s", policy.task, error)
            return self.inner.enqueue(task, args, kwargs)
        if duplicate is not None:
            return self._duplicate(task, args, kwargs, policy, duplicate)
        try:
            result: TaskResult[Any, T] = self.inner.enqueue(task, args, kwargs)
        except BaseException:
            reservations.cancel(names.queue, pending, using=policy.using)
            raise
        try:  # the reservation takes the task's id (unless its run took it over already)
            reservations.rename(
                names.queue, pending, str(result.id), ttl=ttl, label=policy.label,
                guard=policy.mode, using=policy.using, group=policy.group,
            )  # fmt: skip
        except LockBackendError as error:
            logger.error("Task %s[%s]: its reservation keeps a pending id: %s",
                         policy.task, result.id, error)  # fmt: skip
        return result

    async def aenqueue(  # type: ignore[override]  # as enqueue()
        self, task: Task[Any, T], args: Any, kwargs: Any
    ) -> TaskResult[Any, T] | None:
        return await sync_to_async(self.enqueue, thread_sensitive=True)(task, args, kwargs)

    def _admit(
        self, policy: guards.TaskGuard, name: str, pending: str, ttl: float
    ) -> guards.Duplicate | None:
        """``task_guards.admit``, passing over a reservation for a task that does not exist: its
        queueing was rolled back with the database transaction it was made in (the inner
        backend's row goes with it; the Redis key does not), or its row was deleted."""
        names = guards.GuardNames(name, None)
        duplicate = guards.admit(policy, names, pending, ttl=ttl)
        if duplicate is None:
            return None
        task_id = duplicate.task_id
        if task_id and task_id.startswith(reservations.PENDING_JOB):
            return _renamed(duplicate, policy)
        if not (duplicate.queued and task_id and self.supports_get_result):
            return duplicate
        if self._exists(task_id):
            return duplicate
        logger.info("Task %s: %s kept %r for a task that does not exist; passed over",
                    policy.task, task_id, name)  # fmt: skip
        reservations.cancel(name, task_id, using=policy.using)
        return guards.admit(policy, names, pending, ttl=ttl)

    def _exists(self, result_id: str) -> bool:
        try:
            self.inner.get_result(result_id)
        except TaskResultDoesNotExist:
            return False
        return True

    def _duplicate(
        self, task: Task[Any, T], args: Any, kwargs: Any, policy: guards.TaskGuard,
        duplicate: guards.Duplicate,
    ) -> TaskResult[Any, T] | None:  # fmt: skip
        answerable = self.supports_get_result and not (duplicate.task_id or "").startswith(
            reservations.PENDING_JOB
        )
        action = guards.decide(policy, duplicate, sender=GuardedBackend, task_id=None,
                               phase="enqueue", answerable=answerable)  # fmt: skip
        if action == guards.RETURN_EXISTING:
            assert duplicate.task_id is not None
            return self.inner.get_result(duplicate.task_id)
        if action == guards.SKIP:
            return None
        if action == guards.RESCHEDULE:
            later = timezone.now() + datetime.timedelta(seconds=duplicate.reschedule_delay(policy))
            return self.inner.enqueue(task.using(run_after=later), args, kwargs)
        raise duplicate.error(policy)


def _renamed(duplicate: guards.Duplicate, policy: guards.TaskGuard) -> guards.Duplicate:
    """``duplicate``, once its reservation has its task's id (a pending id lasts a round trip:
    looked at a few times, for at most ``_RENAME_WAIT``)."""
    deadline = time.monotonic() + _RENAME_WAIT
    while time.monotonic() < deadline:
        time.sleep(0.01)
        holder = registry.get_lock(duplicate.name, using=policy.using)
        if holder is None or not (holder.job_id or "").startswith(reservations.PENDING_JOB):
            return guards.Duplicate.of_holder(duplicate.name, holder)
    return duplicate


def _delay(task: Task[Any, Any]) -> float:
    """Seconds until ``task`` may run (its ``run_after``)."""
    if task.run_after is None:
        return 0.0
    return max(0.0, (task.run_after - timezone.now()).total_seconds())
