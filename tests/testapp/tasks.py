"""django.tasks tasks for the suite (``tests/tasks/test_tasks.py``), guarded by
``django_redis_lock.tasks`` and run by a real ``db_worker``; they say what they did as the
Celery ones do (``tests/support/task_evidence.py``)."""

from __future__ import annotations

from typing import Any

from django_redis_lock.tasks import guarded
from tests.support.task_evidence import run

try:
    from django.tasks import task
except ImportError:  # before Django 6.0: the django-tasks backport
    from django_tasks import task  # type: ignore[no-redef]


@guarded(guard_key="{key}", guard_timeout=2)
@task(takes_context=True)
def until_executed(context: Any, key: str, seconds: float = 0.0) -> str:
    return run(key, seconds, str(context.task_result.id), context.attempt)


# A longer lease than the others': a test relies on a run holding it throughout.
@guarded(guard="while_executing", guard_key="{key}", guard_timeout=5, on_duplicate="reschedule")
@task
def while_executing(key: str, seconds: float = 0.0) -> str:
    return run(key, seconds, "", 0)


@guarded(guard_key="{key}", on_duplicate="raise")
@task
def refusing(key: str, seconds: float = 0.0) -> str:
    return run(key, seconds, "", 0)


@guarded(guard_key="{key}", guard_timeout=2)
@task
async def asynchronous(key: str) -> str:
    return run(key, 0, "", 0)


@guarded(guard_key="{key}")
@task(backend="immediate")
def immediately(key: str) -> str:
    """Run as it is queued (the immediate backend): before its queueing learnt its id."""
    return run(key, 0, "", 0)


@guarded(guard="until_executing", guard_key="{key}")
@task(backend="immediate")
def immediately_until_executing(key: str) -> str:
    return run(key, 0, "", 0)
