"""Semaphore with real processes: never more than ``limit`` inside, and a killed holder's
permit back within one lease."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading

from django_redis_lock import Semaphore
from django_redis_lock.primitives.keys import permit_keys
from tests.support import semaphore_workers
from tests.support.helpers import keys_left, start_queued, wait_until

SPAWN = multiprocessing.get_context("spawn")


def test_twelve_processes_never_more_than_three_inside(redis_url, redis_client):
    processes = 12
    with SPAWN.Manager() as manager:
        start = manager.Event()
        with SPAWN.Pool(processes) as pool:
            pending = [
                pool.apply_async(
                    semaphore_workers.count_inside, (redis_url, "renders", 3, 10.0, start)
                )
                for _ in range(processes)
            ]
            start.set()
            results = [result.get(timeout=300) for result in pending]
    assert sum(over for _, over in results) == 0  # never a fourth holder, at any instant
    assert all(entries > 0 for entries, _ in results), results  # nobody starved
    assert int(redis_client.get("inside")) == 0
    assert keys_left(redis_client, "lock:*") == []  # idle: nothing left


def test_killed_holders_permits_return_and_waiters_enter_in_queue_order(redis_url, redis_client):
    keys = permit_keys("killed", "default")
    holders = []
    for _ in range(3):
        ready = SPAWN.Event()
        process = SPAWN.Process(
            target=semaphore_workers.hold_until_killed,
            args=(redis_url, "killed", 3, ready),
            daemon=True,
        )
        process.start()
        assert ready.wait(60)
        holders.append(process)
    entered: list[int] = []
    results: dict[int, bool] = {}
    let_go = threading.Event()

    def waiter(index: int) -> None:
        # A lease of 1 s, renewed every third of it: a killed holder's permit is back within
        # 1 + 1/3 s; the wait allows that and a loaded machine's slack.
        semaphore = Semaphore("killed", limit=3, timeout=30)
        results[index] = semaphore.acquire(wait=1 + 1 / 3 + 3)
        if results[index]:
            entered.append(index)
            # Held until the test has looked: the order in which threads append is the
            # scheduler's, so the grants are told apart by who is inside, not by who wrote first.
            let_go.wait(30)
            semaphore.release()

    waiters = start_queued(4, waiter, redis_client, keys.queue)
    for process in holders[:2]:
        os.kill(process.pid, signal.SIGKILL)
    try:
        wait_until(lambda: len(entered) == 2, 30, "two waiters inside")
        # The two permits freed went to the first two in line; the third holder is alive, so
        # the last two can enter only through a release of the first two.
        assert sorted(entered) == [0, 1]
        assert 2 not in results
        assert 3 not in results
    finally:
        let_go.set()
        for thread in waiters:
            thread.join(30)
        holders[2].kill()
        holders[2].join()
    assert results == {0: True, 1: True, 2: True, 3: True}
    assert sorted(entered[2:]) == [2, 3]
