"""``@single_instance``: at most one run at a time of a job, in any worker (RQ, Celery, cron, a
thread). The run holds a renewed lock, so a worker that dies frees it within one lease, and
the lock's owner token carries the job's id where one is known, so that a supervisor can
release exactly that run's hold (``registry.release_job``).

    @single_instance("sync-customer:{customer_id}")
    def sync_customer(customer_id): ...

A run that finds another one running is skipped (``on_busy="skip"``: it returns None, says so
in a WARNING and sends ``run_skipped``, never silently) or refused (``on_busy="raise"``:
``LockNotAcquired``, naming the running one).
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, TypeVar, overload

from asgiref.sync import iscoroutinefunction

from ..exceptions import LockNotAcquired
from ..hints import hinted
from ..primitives.lock import Lock
from ..signals import run_skipped
from .decorators import name_maker, template_group

__all__ = ["SingleInstance", "current_job_id", "single_instance"]

P = ParamSpec("P")
R = TypeVar("R")

logger = logging.getLogger("django_redis_lock")

_ON_BUSY = ("skip", "raise")


def current_job_id() -> str | None:
    """The id of the Celery task or RQ job this code runs in, else None. Neither library is
    imported here: only one the process already uses is asked."""
    celery = sys.modules.get("celery")
    if celery is not None:
        task = getattr(celery, "current_task", None)
        job_id = getattr(getattr(task, "request", None), "id", None) if task else None
        if job_id:
            return str(job_id)
    rq = sys.modules.get("rq")
    if rq is not None:
        job = rq.get_current_job()
        if job is not None:
            return str(job.id)
    return None


@hinted
def single_instance(
    name: str | Callable[..., str],
    *,
    wait: float = 0,
    timeout: float | None = None,
    on_busy: str = "skip",
    label: str | None = None,
    using: str | None = None,
) -> SingleInstance:
    """Run each call of the decorated function while holding the lock ``name`` (a template
    over its arguments, as ``@lock``), its owner token made from the current job's id
    (:func:`current_job_id`). ``wait``: how long a run waits for the running one (default 0).
    ``timeout``: the lease (default: ``DJANGO_REDIS_LOCK_TIMEOUT``, renewed while it runs)."""
    if on_busy not in _ON_BUSY:
        choices = ", ".join(map(repr, _ON_BUSY))
        raise ValueError(f"on_busy must be one of {choices}, not {on_busy!r}.")
    Lock("validate-options", wait=wait, timeout=timeout, label=label, using=using)
    return SingleInstance(name, wait, timeout, on_busy, label, using)


class SingleInstance:
    """The decorator :func:`single_instance` makes. A skipped run returns None, so the
    decorated function's result type becomes ``R | None``."""

    def __init__(
        self, name: str | Callable[..., str], wait: float, timeout: float | None,
        on_busy: str, label: str | None, using: str | None,
    ) -> None:  # fmt: skip
        self.name, self.wait, self.timeout = name, wait, timeout
        self.on_busy, self.label, self.using = on_busy, label, using

    @overload
    def __call__(
        self, func: Callable[P, Coroutine[Any, Any, R]]
    ) -> Callable[P, Coroutine[Any, Any, R | None]]: ...

    @overload
    def __call__(self, func: Callable[P, R]) -> Callable[P, R | None]: ...

    def __call__(self, func: Callable[P, Any]) -> Callable[P, Any]:
        make_name = name_maker(self.name, func)
        where = f"{func.__module__}.{func.__qualname__}"

        group = template_group(self.name)

        def lock_for(*args: Any, **kwargs: Any) -> Lock:
            return Lock(
                make_name(*args, **kwargs), wait=self.wait, timeout=self.timeout,
                using=self.using, label=self.label or f"single instance: {where}",
                job_id=current_job_id(), group=group,
            )  # fmt: skip

        def busy(lock: Lock, refusal: LockNotAcquired | None) -> None:
            assert refusal is not None
            if self.on_busy == "raise":
                raise refusal
            logger.warning("Skipped %s: %s", where, refusal)
            run_skipped.send(sender=single_instance, name=lock.name, owner=refusal.owner)

        if iscoroutinefunction(func):

            @functools.wraps(func)
            async def async_guarded(*args: P.args, **kwargs: P.kwargs) -> Any:
                lock = lock_for(*args, **kwargs)
                claim = await lock.aclaim()
                if not claim.acquired:
                    return busy(lock, claim.refusal)
                try:
                    return await func(*args, **kwargs)
                finally:
                    await lock.arelease()

            return async_guarded

        @functools.wraps(func)
        def guarded(*args: P.args, **kwargs: P.kwargs) -> Any:
            lock = lock_for(*args, **kwargs)
            claim = lock.claim()
            if not claim.acquired:
                return busy(lock, claim.refusal)
            try:
                return func(*args, **kwargs)
            finally:
                lock.release()

        return guarded
