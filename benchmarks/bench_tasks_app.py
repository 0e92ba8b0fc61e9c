"""The Celery app of ``bench_tasks.py``: the same task guarded by each library compared, run
by a real worker (``celery -A benchmarks.bench_tasks_app worker``, from the repository's root).

Its broker, result backend and locks are private redis-servers named by the environment
(``BENCH_BROKER_URL``, ``BENCH_REDIS_URL``); what each run did is written to the locks' Redis
(``tests/support/task_evidence.py``). ``BENCH_VISIBILITY`` makes the broker deliver an
unacknowledged message again after that many seconds.
"""

from __future__ import annotations

import os
from typing import Any

import django
from django.conf import settings

if not settings.configured:
    settings.configure(
        INSTALLED_APPS=["django_redis_lock"],
        CACHES={
            "default": {
                "BACKEND": "django_redis.cache.RedisCache",
                "LOCATION": os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:1/0"),
            }
        },
    )
    django.setup()

from celery import Celery, Task

from django_redis_lock.celery import GuardedTask
from tests.support.task_evidence import run_celery_task
from tests.support.task_workers import redelivering

#: The run's lease for ours: a run that died frees its key within it.
LEASE = 2.0

BROKER = os.environ.get("BENCH_BROKER_URL", "redis://127.0.0.1:1/0")
LOCKS = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:1/0")

app = Celery("bench_tasks_app")
app.conf.update(
    broker_url=BROKER,
    result_backend=BROKER,
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    # celery-once and celery-singleton: their locks on the same Redis as ours.
    ONCE={"backend": "celery_once.backends.Redis", "settings": {"url": LOCKS}},
    singleton_backend_url=LOCKS,
)
if os.environ.get("BENCH_VISIBILITY"):
    app.conf.broker_transport_options = redelivering(float(os.environ["BENCH_VISIBILITY"]))


@app.task(bind=True)
def plain(self: Any, key: str, seconds: float = 0.0) -> str:
    return run_celery_task(self, key, seconds)


@app.task(base=GuardedTask, bind=True, guard_key="{key}", guard_timeout=LEASE)
def ours(self: Any, key: str, seconds: float = 0.0) -> str:
    return run_celery_task(self, key, seconds)


@app.task(base=GuardedTask, bind=True, guard_key="{key}", guard_timeout=LEASE, acks_late=True)
def ours_acks_late(self: Any, key: str, seconds: float = 0.0) -> str:
    return run_celery_task(self, key, seconds)


# The other libraries, where installed (make bench installs them; a missing one is n/a).
try:
    from celery_once import QueueOnce
except ImportError:  # pragma: no cover
    QueueOnce = None
try:
    from celery_singleton import Singleton
except ImportError:  # pragma: no cover
    Singleton = None

if QueueOnce is not None:

    @app.task(base=QueueOnce, bind=True, once={"graceful": True, "keys": ["key"]})
    def celery_once(self: Any, key: str, seconds: float = 0.0) -> str:
        return run_celery_task(self, key, seconds)

    @app.task(base=QueueOnce, bind=True, once={"graceful": True, "keys": ["key"]}, acks_late=True)
    def celery_once_acks_late(self: Any, key: str, seconds: float = 0.0) -> str:
        return run_celery_task(self, key, seconds)


if Singleton is not None:

    @app.task(base=Singleton, bind=True, unique_on=["key"])
    def celery_singleton(self: Any, key: str, seconds: float = 0.0) -> str:
        return run_celery_task(self, key, seconds)

    @app.task(base=Singleton, bind=True, unique_on=["key"], acks_late=True)
    def celery_singleton_acks_late(self: Any, key: str, seconds: float = 0.0) -> str:
        return run_celery_task(self, key, seconds)


def task_named(name: str) -> Task | None:
    """The task ``name`` of this app (None: its library is not installed)."""
    return app.tasks.get(f"{__name__}.{name}")
