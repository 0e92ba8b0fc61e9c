"""A view that takes a lock of each outcome, for the Debug Toolbar panel's tests
(``tests/django/test_debug_toolbar.py``)."""

import contextlib

from django.http import HttpResponse

from django_redis_lock import Lock, LockNotOwned, Semaphore, get_redis_client, lock_many
from django_redis_lock.primitives.keys import lock_keys


def locks(request):
    """Waits for ``toolbar:contended`` (a test holds it), times out on ``toolbar:held``, gets
    the kept result of ``toolbar:done``, loses ``toolbar:lost``, and takes a semaphore permit
    and two locks at once."""
    with Lock("toolbar:contended", wait=30, label="the contended one"):
        pass
    Lock("toolbar:held", wait=0.05).acquire()
    Lock("toolbar:done").claim(want_result=True)
    lost = Lock("toolbar:lost", timeout=30)
    lost.acquire()
    get_redis_client().delete(lock_keys("toolbar:lost", "default").lease)  # as if it expired
    with contextlib.suppress(LockNotOwned):
        lost.release()
    with Semaphore("toolbar:pool", limit=2):
        pass
    with lock_many(["toolbar:a", "toolbar:b"]):
        pass
    return HttpResponse("<html><body><p>locks taken</p></body></html>")


async def async_locks(request):
    """An async view: one lock taken and released through the asyncio API."""
    async with Lock("toolbar:async", label="async"):
        pass
    return HttpResponse("<html><body><p>async lock taken</p></body></html>")
