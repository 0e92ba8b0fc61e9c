"""Jobs for a real RQ worker (``tests/tasks/test_single.py``): ``@single_instance`` in an RQ
job takes the job's id as the start of its lock's token. The worker imports this module with
``tests.settings``; the suite's own process has Django set up already."""

from __future__ import annotations

import os

import django
from django.conf import settings

if not settings.configured:  # an RQ worker's process
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    django.setup()

from django_redis_lock import registry, single_instance
from tests.support.task_evidence import evidence


@single_instance("rq-single:{key}")
def record_my_lock(key: str) -> str | None:
    """What this run's lock says its job is, also left in ``rq-single:<key>``."""
    info = registry.get_lock(f"rq-single:{key}")
    job_id = info.job_id if info else None
    evidence().rpush(f"rq-single:{key}", job_id or "")
    return job_id
