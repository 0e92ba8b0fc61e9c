"""The readers of live state: the locks and semaphores held and waited for now, read from
Redis with ``SCAN`` (the admin's pages, ``manage.py redis_locks``, the metrics' gauges).

``from django_redis_lock import registry`` is the public entry: the functions below.
"""

from .locks import (
    LockInfo,
    eviction_warnings,
    force_release,
    get_lock,
    glob_escape,
    iter_locks,
    page,
    release_job,
    waiting,
)
from .semaphores import SemaphoreInfo, force_release_permit, get_semaphore, iter_semaphores

__all__ = [
    "LockInfo",
    "SemaphoreInfo",
    "eviction_warnings",
    "force_release",
    "force_release_permit",
    "get_lock",
    "get_semaphore",
    "glob_escape",
    "iter_locks",
    "iter_semaphores",
    "page",
    "release_job",
    "waiting",
]
