"""``get_or_set_locked``: cache stampede protection.

    report = get_or_set_locked("report:today", build_report, timeout=300)

When the entry is missing, one caller computes it while the others wait for it: they queue on
a lock (woken by its release, no polling of the cache or the database) and read the value the
first one stored. The wait is bounded (``wait``); when it runs out, or when the computing
process died (its lease ends, the next waiter takes over), a caller computes the value itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from django.core.cache import DEFAULT_CACHE_ALIAS, caches
from django.core.cache.backends.base import DEFAULT_TIMEOUT

from ..exceptions import LockNotAcquired
from ..hints import hinted
from ..primitives.lock import Lock

__all__ = ["get_or_set_locked"]

_MISSING: Any = object()
T = TypeVar("T")


@hinted
def get_or_set_locked(
    key: str,
    default: Callable[[], T],
    timeout: Any = DEFAULT_TIMEOUT,
    *,
    version: int | None = None,
    cache_alias: str = DEFAULT_CACHE_ALIAS,
    wait: float | None = None,
    lock_timeout: float | None = None,
) -> T:
    """``cache.get_or_set(key, default, timeout)``, with ``default()`` run by one caller at a time.

    ``default`` must be a callable. ``timeout`` and ``version`` are the cache's. ``wait`` is how
    long to wait for another caller's computation (default ``DJANGO_REDIS_LOCK_WAIT``);
    ``lock_timeout`` the computing caller's lease (default: renewed while it computes).
    """
    if not callable(default):
        raise TypeError("default must be a callable that computes the value.")
    cache = caches[cache_alias]
    # What the cache holds under ``key`` is what an earlier default() computed: a T.
    value: T = cache.get(key, _MISSING, version=version)
    if value is not _MISSING:
        return value
    lock = Lock(
        f"cache:{cache_alias}:{cache.make_key(key, version=version)}",
        wait=wait,
        timeout=lock_timeout,
        label=f"computing cache entry {key}",
    )
    try:
        with lock:
            # Whoever held the lock before us may have stored it meanwhile.
            value = cache.get(key, _MISSING, version=version)
            if value is _MISSING:
                value = default()
                cache.set(key, value, timeout, version=version)
            return value
    except LockNotAcquired:
        # Waited long enough: compute it here rather than fail the caller.
        value = default()
        cache.add(key, value, timeout, version=version)
        return value
