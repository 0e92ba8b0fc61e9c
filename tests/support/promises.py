"""Promises a lock keeps wherever it runs, each a function of the lock's name and of how to
reach its lease: called by ``test_contract.py`` once per topology and by ``test_tls.py`` over
TLS, so that each is written once."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from django_redis_lock import Lock, LockLost, signals
from tests.support.helpers import RENEWED_LEASE, renewed_after, wait_until


async def take_and_release(lock: Lock) -> bool:
    """A waiter's task: whether it got the lock (then given back, by the task that holds it)."""
    acquired = await lock.aacquire()
    if acquired:
        await lock.arelease()
    return acquired


def a_waiter_gets_the_lock_after_the_release(
    name: str, in_line: Callable[[], bool] | None = None
) -> None:
    """A waiter blocks while the lock is held and gets it once it is released. ``in_line``:
    whether the waiter is in the queue (where there is one), waited for before the release."""
    holder = Lock(name, timeout=10)
    holder.acquire()
    contended, got_it = threading.Event(), threading.Event()

    def on_contended(sender: Any, **kwargs: Any) -> None:
        contended.set()

    def wait_for_it() -> None:
        waiting = Lock(name, wait=10)
        if waiting.acquire():
            got_it.set()
            waiting.release()

    signals.lock_contended.connect(on_contended)
    try:
        waiter = threading.Thread(target=wait_for_it)
        waiter.start()
        assert contended.wait(5)
        if in_line is not None:
            wait_until(in_line, 5, "the waiter blocked in line")
        assert not got_it.is_set()
        holder.release()
        assert got_it.wait(5)
        waiter.join()
    finally:
        signals.lock_contended.disconnect(on_contended)


def renewed_while_held_and_a_loss_is_told(
    name: str, settings: Any, leases: Callable[[], Any], delete_lease: Callable[[], None]
) -> None:
    """Past the end of the lease it was taken with, the lock stays ours, the same lease
    lengthened; once the lease is deleted behind it, the renewal finds it gone and the holder
    is told (``LockLost``)."""
    settings.DJANGO_REDIS_LOCK_TIMEOUT = RENEWED_LEASE
    with pytest.raises(LockLost), Lock(name) as held:
        first_ends = time.monotonic() + RENEWED_LEASE  # (or sooner)
        first = leases()
        renewed_after(held, first_ends)
        assert held.owned()
        assert leases() == first
        delete_lease()
        wait_until(lambda: held.lost, 10, "the renewal to find the lease gone")


def the_async_api_waits_without_blocking_the_loop(name: str) -> None:
    async def main() -> None:
        lock = Lock(name, wait=10)
        async with lock:
            assert lock.owned()
            waiter = asyncio.create_task(take_and_release(Lock(name, wait=10)))
            await asyncio.sleep(0.05)  # the waiter waits; the loop is not blocked
            assert not waiter.done()
        assert await waiter

    asyncio.run(main())
