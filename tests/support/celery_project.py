"""A Celery app set up as Celery's "First steps with Django" does it: configured from Django's
settings (``CELERY_*``, ``tests/settings_celery_only.py``), and every installed app's ``tasks``
module found by ``app.autodiscover_tasks()``, ``django_redis_lock.tasks`` among them. Its one
task is guarded, to see the ``celery`` extra's guard work in a worker of such a project
(``tests/tasks/test_without_tasks_extra.py``)."""

from __future__ import annotations

import os
from typing import Any

from celery import Celery

from django_redis_lock import registry
from django_redis_lock.celery import GuardedTask

# Celery's Django fixup runs django.setup() before it imports the tasks modules.
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings_celery_only")
app = Celery("tests.support.celery_project")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@app.task(base=GuardedTask, bind=True, guard_key="{key}")
def holder_of_its_guard(self: Any, key: str) -> str | None:
    """The task id the run's guard is held for (its own, when the guard ran here)."""
    info = registry.get_lock(f"task:{self.name}:{key}")
    return info.job_id if info else None
