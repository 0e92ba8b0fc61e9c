"""Semaphore code that runs in child processes (spawned: each a fresh interpreter)."""

from __future__ import annotations

import time
from typing import Any

from tests.support.workers import setup_django


def count_inside(
    redis_url: str, name: str, limit: int, seconds: float, start: Any
) -> tuple[int, int]:
    """Hold a permit as often as possible for ``seconds``, counting holders on the server on
    entry (``INCR``) and exit (``DECR``). Returns (entries, entries that found more than
    ``limit`` inside)."""
    setup_django(redis_url)
    import redis

    from django_redis_lock import Semaphore

    client = redis.Redis.from_url(redis_url)
    entries = over = 0
    start.wait()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with Semaphore(name, limit=limit, wait=60):
            if client.incr("inside") > limit:
                over += 1
            entries += 1
            busy_until = time.monotonic() + 0.001  # a 1 ms critical section
            while time.monotonic() < busy_until:
                pass
            client.decr("inside")
    return entries, over


def hold_until_killed(redis_url: str, name: str, limit: int, ready: Any) -> None:
    """Hold a permit with a 1 s lease, renewed, until killed."""
    setup_django(redis_url, DJANGO_REDIS_LOCK_TIMEOUT=1)
    from django_redis_lock import Semaphore

    # Kept in a name: a Semaphore object that is collected stops being renewed, and its permit
    # would come back after one lease without the kill this process waits for.
    semaphore = Semaphore(name, limit=limit)
    assert semaphore.acquire(wait=0)
    ready.set()
    time.sleep(3600)
    semaphore.release()
