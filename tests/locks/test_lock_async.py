"""The async API: the same lock, never blocking the event loop, owned per task."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
import warnings
import weakref
from typing import Any

import pytest
from asgiref.sync import async_to_sync

from django_redis_lock import Lock, LockNotAcquired, LockNotOwned
from django_redis_lock.backends import async_backend_of
from django_redis_lock.primitives.keys import lock_keys
from tests.support.helpers import run_async as run
from tests.support.helpers import wait_until


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


def test_waiting_never_blocks_the_event_loop(redis_client):
    """While three tasks wait on a lock a thread holds, the loop runs on: all three get in line
    at once (a wait that held the loop would keep the others from even asking), the loop's
    other work goes on while they wait, and the thread releases only once it has."""
    held = threading.Event()
    release = threading.Event()

    def hold_in_a_thread():
        with Lock("loop-lag", timeout=10):
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold_in_a_thread)
    holder.start()
    assert held.wait(10)
    queue = lock_keys("loop-lag", "default").queue

    async def main():
        async def take_turn():
            async with Lock("loop-lag", wait=5, timeout=10):
                return True

        waiters = [asyncio.create_task(take_turn()) for _ in range(3)]
        deadline = time.monotonic() + 10
        while await asyncio.to_thread(redis_client.llen, queue) < 3:
            assert time.monotonic() < deadline, "the three waiters never all got in line"
            await asyncio.sleep(0.01)
        ticks = 0
        for _ in range(100):  # other work of the loop's, while all three wait
            await asyncio.sleep(0)
            ticks += not any(waiter.done() for waiter in waiters)
        release.set()  # the thread releases; the first waiter gets the lock
        results = await asyncio.wait_for(asyncio.gather(*waiters, return_exceptions=True), 10)
        return ticks, results

    ticks, results = run(main())
    holder.join()
    assert ticks == 100
    assert results == [True, True, True]


@pytest.mark.parametrize("topology", ["server", "quorum"])
def test_an_event_loops_client_and_backend_go_with_the_loop(request, topology):
    """Each event loop has its own asyncio client, and so its own backend: once the loop is
    gone (a script's ``asyncio.run``, an ``async_to_sync`` call), so are they. (A table of
    backends keyed weakly by their clients kept every one: a backend holds its client.) In
    quorum mode a backend is made for each request, and goes with it."""
    alias = "default"
    if topology == "quorum":
        request.getfixturevalue("quorum")
        alias = "redlock"
    seen: list[weakref.ref[Any]] = []

    async def use() -> None:
        lock = Lock(f"loop-bound-{topology}", using=alias)
        assert await lock.aacquire()
        await lock.arelease()
        seen.append(weakref.ref(async_backend_of(alias)))

    for _ in range(3):
        run(use())
    gc.collect()
    assert [ref() for ref in seen] == [None, None, None]


def test_a_short_lived_loop_leaves_no_connection_open(redis_client):
    """``asyncio.run()`` and ``async_to_sync`` shut a loop down by closing its async
    generators first: the loop's clients are closed then, whether or not the code called
    ``aclose_async_redis_clients()`` (which a script's author forgets, and which
    ``async_to_sync`` gives no place for)."""

    def connections() -> int:
        return len(redis_client.client_list())

    async def use() -> None:
        lock = Lock("short-lived-loop")
        assert await lock.aacquire()
        await lock.arelease()

    # (A first lock of the process opens connections of its sync pool that it keeps: the
    # eviction advice's, given once. Those are not the loops'.)
    asyncio.run(use())
    advice = "django-redis-lock-eviction-advice"
    wait_until(
        lambda: all(thread.name != advice for thread in threading.enumerate()), 10, "the advice"
    )
    before = connections()
    for _ in range(3):
        asyncio.run(use())  # (no aclose_async_redis_clients)
    async_to_sync(use)()
    wait_until(lambda: connections() == before, 10, "the loops' connections to be closed")
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResourceWarning)
        gc.collect()  # (an unclosed connection would warn as it goes)
