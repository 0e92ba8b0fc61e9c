"""The Celery app of the suite's real workers (``tests/tasks/test_celery.py``, ``benchmarks/``).

A worker runs ``celery -A tests.support.celery_app worker`` in a subprocess; its broker and
result backend are a private redis-server (``DJANGO_REDIS_LOCK_TEST_BROKER_URL``), its locks on
the suite's Redis (``DJANGO_REDIS_LOCK_TEST_REDIS_URL``, through ``tests.settings``). The tasks
say what they did on the locks' Redis (``tests/support/task_evidence.py``), and so do the
releases of locks: ``released:<lock name>`` / ``force-released:<lock name>``, each release by
its holder or by someone else (a worker's main process).
"""

from __future__ import annotations

import functools
import gc
import os
from collections.abc import Callable
from typing import Any

import django
from django.conf import settings

if not settings.configured:  # a worker process; the suite's own process is set up already
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    django.setup()

import celery
from celery import Celery, signals
from celery.backends.redis import ResultConsumer

from django_redis_lock import lock_force_released, lock_released, registry, single_instance
from django_redis_lock.celery import GuardedTask
from tests.support.task_evidence import evidence, run_celery_task
from tests.support.task_workers import redelivering


def _no_collection_inside(method: Callable[..., Any]) -> Callable[..., Any]:
    """Celery before 5.7 (celery/celery#10477): the cyclic garbage collector may run an
    ``AsyncResult.__del__`` in the middle of the result backend's SUBSCRIBE, and its UNSUBSCRIBE
    re-enters redis-py's ``PubSub`` lock on the same thread: ``apply_async()`` hangs for ever
    (seen in the suite's client with celery 5.4, the oldest admitted). The collector is held
    off for the length of those calls; celery 5.7 defers the re-entrant unsubscribe itself."""

    @functools.wraps(method)
    def without_collection(*args: Any, **kwargs: Any) -> Any:
        collecting = gc.isenabled()
        gc.disable()
        try:
            return method(*args, **kwargs)
        finally:
            if collecting:
                gc.enable()

    return without_collection


if celery.VERSION < (5, 7):
    for _name in ("_consume_from", "cancel_for", "_reconnect_pubsub"):
        setattr(ResultConsumer, _name, _no_collection_inside(getattr(ResultConsumer, _name)))


#: The lease of the guarded runs: short, so that a dead run frees its key soon.
LEASE = 2.0

app = Celery("tests.support.celery_app")
app.conf.update(
    broker_url=os.environ.get("DJANGO_REDIS_LOCK_TEST_BROKER_URL", "redis://127.0.0.1:1/0"),
    result_backend=os.environ.get("DJANGO_REDIS_LOCK_TEST_BROKER_URL", "redis://127.0.0.1:1/0"),
    broker_connection_retry_on_startup=True,
    # One message at a time per process: what a worker has not started stays in the queue.
    worker_prefetch_multiplier=1,
    result_expires=600,
)
if os.environ.get("DJANGO_REDIS_LOCK_TEST_VISIBILITY"):
    app.conf.broker_transport_options = redelivering(
        float(os.environ["DJANGO_REDIS_LOCK_TEST_VISIBILITY"])
    )


@app.task(base=GuardedTask, bind=True, guard_key="{key}", guard_timeout=LEASE)
def until_executed(self: Any, key: str, seconds: float = 0.0) -> str:
    return run_celery_task(self, key, seconds)


@app.task(base=GuardedTask, bind=True, guard="until_executing", guard_key="{key}")
def until_executing(self: Any, key: str, seconds: float = 0.0) -> str:
    return run_celery_task(self, key, seconds)


@app.task(
    base=GuardedTask, bind=True, guard="while_executing", guard_key="{key}", guard_timeout=LEASE,
    on_duplicate="reschedule",
)  # fmt: skip
def while_executing(self: Any, key: str, seconds: float = 0.0) -> str:
    return run_celery_task(self, key, seconds)


@app.task(
    base=GuardedTask, bind=True, guard="until_and_while_executing", guard_key="{key}",
    guard_timeout=LEASE, on_duplicate="skip",
)  # fmt: skip
def until_and_while(self: Any, key: str, seconds: float = 0.0) -> str:
    return run_celery_task(self, key, seconds)


@app.task(
    base=GuardedTask, bind=True, guard_key="{key}", guard_timeout=LEASE, on_duplicate="reschedule"
)  # fmt: skip
def rescheduling(self: Any, key: str, seconds: float = 0.0) -> str:
    return run_celery_task(self, key, seconds)


@app.task(base=GuardedTask, bind=True, guard_key="{key}", on_duplicate="raise")
def refusing(self: Any, key: str, seconds: float = 0.0) -> str:
    return run_celery_task(self, key, seconds)


@app.task(base=GuardedTask, bind=True, guard_key="{key}", on_duplicate="skip")
def skipping(self: Any, key: str, seconds: float = 0.0) -> str:
    return run_celery_task(self, key, seconds)


# Leases far longer than the tests: if the key is free soon after the run died, the worker's
# main process freed it, not the lease's end.
@app.task(base=GuardedTask, bind=True, guard_key="{key}", guard_timeout=300)
def long_lease(self: Any, key: str, seconds: float = 0.0) -> str:
    return run_celery_task(self, key, seconds)


@app.task(base=GuardedTask, bind=True, guard_key="{key}", guard_timeout=300, time_limit=1)
def over_time(self: Any, key: str, seconds: float = 30.0) -> str:
    return run_celery_task(self, key, seconds)


@app.task(base=GuardedTask, bind=True, guard_key="{key}", guard_timeout=LEASE, max_retries=5)
def flaky(self: Any, key: str, failures: int = 2, seconds: float = 0.0) -> str:
    """Fails ``failures`` times (a retry a second later each time), then runs as the others."""
    if self.request.retries < failures:
        run_celery_task(self, key, 0)
        raise self.retry(countdown=1)
    run_celery_task(self, key, seconds)
    return "done"


@app.task(
    base=GuardedTask, bind=True, guard="while_executing", guard_key="{key}", guard_timeout=LEASE,
    max_retries=5,
)  # fmt: skip
def flaky_while(self: Any, key: str, failures: int = 2) -> str:
    """``flaky``, guarded while it runs only."""
    run_celery_task(self, key, 0)
    if self.request.retries < failures:
        raise self.retry(countdown=1)
    return "done"


@app.task(base=GuardedTask, bind=True, guard_key="{key}", guard_timeout=LEASE, acks_late=True)
def acked_late(self: Any, key: str, seconds: float = 0.0) -> str:
    return run_celery_task(self, key, seconds)


@app.task(
    base=GuardedTask, bind=True, guard_key="{key}", guard_timeout=LEASE, acks_late=True,
    reject_on_worker_lost=True,
)  # fmt: skip
def requeued_if_lost(self: Any, key: str, seconds: float = 0.0) -> str:
    return run_celery_task(self, key, seconds)


def _record_release(sender: Any, name: str, **kwargs: Any) -> None:
    evidence().rpush(f"released:{name}", os.getpid())


def _record_force_release(sender: Any, name: str, by: str | None = None, **kwargs: Any) -> None:
    evidence().rpush(f"force-released:{name}", by or "")


@signals.worker_init.connect
def _record_releases_in_workers(**kwargs: Any) -> None:
    """In a worker (its pool's processes are forked from it): not in the suite's own process,
    whose tests count the keys they leave."""
    lock_released.connect(_record_release)
    lock_force_released.connect(_record_force_release)


@app.task(bind=True)
@single_instance("single:{key}")
def single(self: Any, key: str, seconds: float = 0.0) -> str:
    """A plain Celery task (no GuardedTask) guarded by @single_instance: its lock's token
    starts with the task's id, which it records as ``single:<key>``."""
    info = registry.get_lock(f"single:{key}")
    evidence().rpush(f"single:{key}", info.job_id if info else "")
    return run_celery_task(self, key, seconds)
