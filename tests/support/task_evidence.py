"""What the tasks of the real-worker tests did, written where the tests read it: the suite's
Redis (``tests.settings``' cache, in the worker processes too).

- ``events:<key>``: a list of JSON records, ``start`` and ``end`` of each run, with the task id,
  the process, the retry count and the time;
- ``runs:<key>``: how many runs started; ``inside:<key>``: the processes running one now;
- ``overlaps:<key>``: runs that found another live process inside.

A run lasts until ``seconds`` pass or the test pushes to ``go:<key>`` (any run of the key), or
``go:<key>:<task id>`` (that run), whichever is first.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import redis
from django.conf import settings

from tests.support.helpers import process_alive

__all__ = ["evidence", "run", "run_celery_task"]

_evidence: redis.Redis | None = None


def evidence() -> redis.Redis:
    """A client of the suite's Redis, where the tasks say what they did."""
    global _evidence
    if _evidence is None:
        _evidence = redis.Redis.from_url(settings.CACHES["default"]["LOCATION"])
    return _evidence


def run(key: str, seconds: float, task_id: str, retries: int = 0) -> str:
    """One run of the task ``task_id`` under ``key``; returns ``key``."""
    client = evidence()
    record = {"id": task_id, "pid": os.getpid(), "retries": retries}
    # One transaction: a test that kills the process once it sees "start" finds the run
    # counted too (two commands in turn could be cut between them).
    start = json.dumps({"event": "start", "at": time.time(), **record})
    client.pipeline().rpush(f"events:{key}", start).incr(f"runs:{key}").execute()
    # Who else is inside: added and read in one transaction, so that of two runs starting at
    # once, the second sees the first. A process killed inside stays listed, but is not alive.
    _, inside = (
        client.pipeline().sadd(f"inside:{key}", os.getpid()).smembers(f"inside:{key}").execute()
    )
    if any(int(pid) != os.getpid() and process_alive(int(pid)) for pid in inside):
        client.incr(f"overlaps:{key}")
    try:
        # In slices: redis-py gives up on a reply after its socket timeout (5 s by default).
        deadline = time.monotonic() + seconds
        go = [f"go:{key}:{task_id}", f"go:{key}"] if task_id else [f"go:{key}"]
        while seconds and time.monotonic() < deadline:
            slice_ = min(1.0, max(deadline - time.monotonic(), 0.01))
            if client.blpop(go, timeout=slice_):
                break
    finally:
        client.srem(f"inside:{key}", os.getpid())
        client.rpush(f"events:{key}", json.dumps({"event": "end", "at": time.time(), **record}))
    return key


def run_celery_task(task: Any, key: str, seconds: float) -> str:
    """:func:`run` for the Celery task ``task`` (bound: its request says who it is)."""
    return run(key, seconds, task.request.id, task.request.retries)
