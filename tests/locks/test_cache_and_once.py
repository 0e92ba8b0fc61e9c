"""Cache stampede protection and run-once de-duplication, under real concurrency."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.core.cache import cache

from django_redis_lock import (
    LockNotAcquired,
    aclose_async_redis_clients,
    get_or_set_locked,
    run_once,
)
from django_redis_lock.core.durations import clock_allowance
from tests.support import workers
from tests.support.helpers import wait_until

SPAWN = multiprocessing.get_context("spawn")


# -- get_or_set_locked -----------------------------------------------------------------------


def test_twenty_concurrent_callers_compute_once():
    calls = []
    start = threading.Barrier(20)

    def expensive():
        calls.append(1)
        time.sleep(0.2)  # the slow query the stampede would repeat
        return {"rows": 42}

    def caller():
        start.wait()
        return get_or_set_locked("report", expensive, timeout=60)

    with ThreadPoolExecutor(20) as pool:
        results = list(pool.map(lambda _: caller(), range(20)))
    assert len(calls) == 1
    assert results == [{"rows": 42}] * 20
    assert cache.get("report") == {"rows": 42}


def test_a_cached_value_is_returned_without_locking(redis_client):
    cache.set("warm", "value")
    before = redis_client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)
    assert get_or_set_locked("warm", lambda: pytest.fail("must not compute")) == "value"
    after = redis_client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)
    assert after == before


def test_a_dead_computing_process_is_taken_over(redis_url):
    # Another process started computing "dead" and was killed while holding the lock.
    name = f"cache:default:{cache.make_key('dead')}"
    ready = SPAWN.Event()
    holder = SPAWN.Process(target=workers.hold_until_killed, args=(redis_url, name, ready))
    holder.start()
    assert ready.wait(30)
    os.kill(holder.pid, signal.SIGKILL)
    holder.join()
    # Its lease (1 s) ends; the waiting caller takes over and computes.
    assert get_or_set_locked("dead", lambda: "recomputed", wait=5) == "recomputed"


def test_bounded_wait_falls_back_to_computing(redis_url):
    name = f"cache:default:{cache.make_key('slow')}"
    ready = SPAWN.Event()
    holder = SPAWN.Process(target=workers.hold_until_killed, args=(redis_url, name, ready))
    holder.start()
    try:
        assert ready.wait(30)
        assert get_or_set_locked("slow", lambda: "mine", wait=0.1) == "mine"
    finally:
        holder.kill()
        holder.join()


def test_default_must_be_callable():
    with pytest.raises(TypeError):
        get_or_set_locked("x", "not callable")


# -- run_once --------------------------------------------------------------------------------


def test_concurrent_duplicates_are_processed_once():
    processed = []
    start = threading.Barrier(10)

    @run_once("message:{message_id}", ttl=60)
    def handle(message_id):
        processed.append(message_id)
        time.sleep(0.1)
        return "handled"

    def deliver():
        start.wait()
        return handle(7)

    with ThreadPoolExecutor(10) as pool:
        results = list(pool.map(lambda _: deliver(), range(10)))
    assert processed == [7]
    assert results.count("handled") == 1
    assert results.count(None) == 9
    assert handle(8) == "handled"  # another message
    assert handle(7) is None  # a late redelivery within the ttl


def test_a_failed_attempt_is_not_marked_done():
    attempts = []

    @run_once("job:{0}", ttl=60)
    def job(number):
        attempts.append(number)
        if len(attempts) == 1:
            raise RuntimeError("the first attempt fails")
        return "ok"

    with pytest.raises(RuntimeError):
        job(1)
    assert job(1) == "ok"  # redelivered: processed, not skipped
    assert job(1) is None
    assert attempts == [1, 1]


def test_context_manager_form():
    seen = []
    for _ in range(3):
        with run_once("webhook:abc", ttl=60) as first:
            if first:
                seen.append("processed")
    assert seen == ["processed"]


def test_the_mark_expires_after_the_ttl():
    runs = []

    # (2 s: the second call below comes well within it, however loaded the machine.)
    @run_once("short", ttl=2)
    def job():
        runs.append(time.monotonic())

    started = time.monotonic()  # (before the mark is written)
    job()
    job()
    assert len(runs) == 1  # a duplicate within the window
    # The window itself is what is tested: the job runs again once the mark has expired...
    wait_until(lambda: (job(), len(runs) == 2)[1], 10, "the mark to expire")
    # ...and not before (by a Redis clock that may run up to 1 % fast).
    assert runs[1] - started >= 2 - clock_allowance(2)


def test_a_duplicate_that_cannot_wait_long_enough_is_told():
    release = threading.Event()
    entered = threading.Event()

    @run_once("long", ttl=60)
    def long_job():
        entered.set()
        release.wait(10)

    thread = threading.Thread(target=long_job)
    thread.start()
    assert entered.wait(10)
    try:
        with pytest.raises(LockNotAcquired), run_once("long", ttl=60, wait=0.1):
            pass
    finally:
        release.set()
        thread.join()


def test_async_function():
    runs = []

    @run_once("async:{0}", ttl=60)
    async def job(number):
        runs.append(number)
        await asyncio.sleep(0.05)
        return number

    async def main():
        try:
            return await asyncio.gather(*(job(1) for _ in range(5)))
        finally:
            await aclose_async_redis_clients()

    results = asyncio.run(main())
    assert runs == [1]
    assert sorted(results, key=str) == [1, None, None, None, None]


def test_bad_arguments():
    with pytest.raises(ValueError, match="ttl"):
        run_once("x", ttl=0)
    with pytest.raises(TypeError):
        run_once("", ttl=1)


def test_async_context_manager_form():
    async def main():
        seen = []
        try:
            for _ in range(3):
                async with run_once("async-webhook", ttl=60) as first:
                    if first:
                        seen.append("processed")
        finally:
            await aclose_async_redis_clients()
        return seen

    assert asyncio.run(main()) == ["processed"]
