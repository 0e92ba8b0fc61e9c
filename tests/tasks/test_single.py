"""Job-owned locks (``Lock(..., job_id=...)``, ``registry.release_job``) and
``@single_instance``, on the suite's real Redis."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from django_redis_lock import (
    Lock,
    LockNotAcquired,
    LockNotOwned,
    registry,
    run_skipped,
    single_instance,
)
from tests.support.helpers import wait_until


def test_a_jobs_tokens_carry_its_id_and_its_supervisor_can_release_exactly_that_hold():
    held = Lock("job:sync", timeout=30, job_id="task-1")
    assert held.acquire()
    assert held.token.startswith("task-1~")
    info = registry.get_lock("job:sync")
    assert info.job_id == "task-1"
    assert info.as_dict()["job_id"] == "task-1"
    assert not registry.release_job("job:sync", "task-2")  # somebody else's job: untouched
    assert held.owned()
    waiter = Lock("job:sync", wait=10)
    got = []
    thread = threading.Thread(target=lambda: got.append(waiter.acquire()))
    thread.start()
    wait_until(lambda: registry.waiting("job:sync") == 1, what="the waiter to queue")
    assert registry.release_job("job:sync", "task-1")  # the job died: its supervisor frees it
    thread.join(10)
    assert got == [True]  # handed to the next in line at once
    with pytest.raises(LockNotOwned):
        held.release()
    assert not registry.release_job("job:sync", "task-1")  # not that job's any more
    assert registry.get_lock("job:sync").job_id is None


def test_another_run_of_the_same_job_is_not_the_same_holder():
    """A redelivered copy of a task has the same id: it must wait like anyone else."""
    first = Lock("job:once", timeout=30, job_id="task-7")
    assert first.acquire()
    assert not Lock("job:once", wait=0, job_id="task-7").acquire()
    first.release()


@pytest.mark.parametrize(
    ("job_id", "error"),
    [(7, TypeError), ("", ValueError), ("a b", ValueError), ("a|b", ValueError)],
)
def test_bad_job_ids_are_refused(job_id, error):
    with pytest.raises(error, match="job_id"):
        Lock("x", job_id=job_id)


def test_single_instance_skips_a_second_run_loudly(caplog):
    finish = threading.Event()
    runs, skipped = [], []

    @single_instance("sync:{customer}")
    def sync(customer):
        runs.append(customer)
        finish.wait(10)
        return "synced"

    def on_skip(sender, name, owner, **kwargs):
        skipped.append((name, owner["pid"] if owner else None))

    run_skipped.connect(on_skip)
    try:
        results = []
        threads = [threading.Thread(target=lambda c=c: results.append(sync(c))) for c in (42, 43)]
        threads[0].start()
        wait_until(lambda: runs == [42], what="the first run to start")
        with caplog.at_level(logging.WARNING, logger="django_redis_lock"):
            assert sync(42) is None  # skipped at once
        threads[1].start()  # another customer is another lock: it runs meanwhile
        wait_until(lambda: runs == [42, 43], what="the other customer's run to start")
    finally:
        finish.set()
        for thread in threads:
            thread.join(10)
        run_skipped.disconnect(on_skip)
    assert results == ["synced", "synced"]
    assert len(skipped) == 1
    assert skipped[0][0] == "sync:42"
    assert any("Skipped" in record.getMessage() for record in caplog.records)
    assert sync(42) == "synced"  # free again


def test_single_instance_can_refuse_instead():
    @single_instance("report", on_busy="raise")
    def report():
        return "done"

    with Lock("report", timeout=30), pytest.raises(LockNotAcquired, match="report"):
        report()
    assert report() == "done"


def test_single_instance_on_coroutines():
    gate = asyncio.Event

    @single_instance("async-job")
    async def job(release):
        await release.wait()
        return "ran"

    async def main():
        release = gate()
        first = asyncio.create_task(job(release))
        await asyncio.sleep(0)
        while not Lock("async-job").locked():
            await asyncio.sleep(0.01)
        second = await job(release)  # skipped at once: the first holds it
        release.set()
        return await first, second

    assert asyncio.run(main()) == ("ran", None)


def test_single_instance_options_are_checked():
    with pytest.raises(ValueError, match="on_busy"):
        single_instance("x", on_busy="queue")
    with pytest.raises(TypeError, match="use wait="):
        single_instance("x", blocking_timeout=3)


@pytest.mark.workers
def test_an_rq_jobs_lock_token_starts_with_the_jobs_id(broker_url, redis_url, redis_client):
    """A real RQ worker runs a job guarded by @single_instance: the lock it holds names it."""
    rq = pytest.importorskip("rq")
    import redis

    from tests.support import rq_jobs

    connection = redis.Redis.from_url(broker_url)
    queue = rq.Queue("single-instance", connection=connection)
    job = queue.enqueue(rq_jobs.record_my_lock, "k1")
    worker = subprocess.run(
        [str(Path(sys.executable).with_name("rq")), "worker", "--burst", "--url", broker_url,
         "single-instance"],
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings",
             "DJANGO_REDIS_LOCK_TEST_REDIS_URL": redis_url},
        capture_output=True, text=True, timeout=60, cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    assert worker.returncode == 0, worker.stderr
    job.refresh()
    assert job.return_value() == job.id
    assert redis_client.lrange("rq-single:k1", 0, -1) == [job.id.encode()]
    assert registry.get_lock("rq-single:k1") is None  # released when it ended
