"""The async API: the same lock, never blocking the event loop, owned per task."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from django_redis_lock import Lock, LockNotAcquired, LockNotOwned
from django_redis_lock.primitives.keys import lock_keys
from tests.helpers import run_async as run


def test_async_with(redis_client):
    async def main():
        async with Lock("async", timeout=10) as held:
            assert redis_client.exists(lock_keys("async", "default").lease)
            assert held.token
        assert not redis_client.exists(lock_keys("async", "default").lease)

    run(main())


def test_concurrent_tasks_are_mutually_exclusive(redis_client):
    state = {"counter": 0, "inside": 0, "overlaps": 0}

    async def worker():
        for _ in range(20):
            async with Lock("tasks", timeout=10, wait=30):
                state["inside"] += 1
                state["overlaps"] += state["inside"] > 1
                value = state["counter"]
                await asyncio.sleep(0)  # let every other task run in the middle
                state["counter"] = value + 1
                state["inside"] -= 1

    async def main():
        await asyncio.gather(*(worker() for _ in range(10)))

    run(main())
    assert state == {"counter": 200, "inside": 0, "overlaps": 0}


def test_ownership_is_per_task():
    shared = Lock("per-task", timeout=10)

    async def main():
        assert await shared.aacquire()
        other_release = asyncio.create_task(shared.arelease())
        with pytest.raises(LockNotOwned):
            await other_release
        assert await asyncio.create_task(shared.aacquire(wait=0)) is False
        assert shared.token is not None  # still ours, in this task
        await shared.arelease()

    run(main())


def test_async_wait_times_out_with_holder_info():
    async def main():
        async with Lock("async-held", timeout=10, label="report"):
            with pytest.raises(LockNotAcquired) as info:
                await asyncio.create_task(Lock("async-held", wait=0.2).__aenter__())
            return info.value

    error = run(main())
    assert error.owner["label"] == "report"


def test_async_extend(redis_client):
    async def main():
        async with Lock("async-extend", timeout=2) as held:
            await held.aextend(30)
            return redis_client.pttl(lock_keys("async-extend", "default").lease)

    assert run(main()) > 29_000


def test_waiting_never_blocks_the_event_loop():
    """While one task waits on a lock a thread holds, the loop keeps ticking every 10 ms."""
    held = threading.Event()
    release = threading.Event()

    def hold_in_a_thread():
        with Lock("loop-lag", timeout=10):
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold_in_a_thread)
    holder.start()
    assert held.wait(10)

    async def main():
        lags = []

        async def ticker():
            while True:
                before = time.monotonic()
                await asyncio.sleep(0.01)
                lags.append(time.monotonic() - before - 0.01)

        ticking = asyncio.create_task(ticker())

        async def take_turn():
            async with Lock("loop-lag", wait=5, timeout=10):
                return True

        waiters = [asyncio.create_task(take_turn()) for _ in range(3)]
        await asyncio.sleep(0.6)
        release.set()  # the thread releases; the first waiter gets the lock
        results = await asyncio.wait_for(asyncio.gather(*waiters, return_exceptions=True), 10)
        ticking.cancel()
        return lags, results

    lags, results = run(main())
    holder.join()
    assert len(lags) > 30
    assert max(lags) < 0.1, max(lags)  # a blocking wait would stall it for ~0.6 s
    assert results == [True, True, True]
