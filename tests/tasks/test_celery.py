"""Celery task guards (``django_redis_lock.celery.GuardedTask``) with real workers: a prefork
worker of two processes in a subprocess, Redis as its broker and result backend, the tasks of
``tests/support/celery_app.py``. Each test uses keys of its own, so that what an earlier test
left in the broker cannot interfere."""

from __future__ import annotations

import gc
import io
import json
import logging
import os
import signal
import threading
import time
import uuid

import pytest
from celery import signals as celery_signals
from django.core.management import call_command

from django_redis_lock import DuplicateTask, registry, task_duplicate_found
from tests.support import celery_app as tasks
from tests.support.helpers import process_alive, wait_until
from tests.support.task_workers import celery_worker

pytestmark = pytest.mark.workers

# A run that died frees its key within a lease and a renewal interval; allow the machine much
# more than that to see it, and far less than the queued timeout (an hour) that would also.
SOON = 30


@pytest.fixture(scope="module")
def configured(broker_url):
    tasks.app.conf.broker_url = broker_url
    tasks.app.conf.result_backend = broker_url
    yield tasks.app
    # The module's results go while their broker is still up: an AsyncResult unsubscribes
    # from it when collected (Celery 5.4 raises if it is gone, at the session's end).
    gc.collect()


@pytest.fixture(scope="module")
def worker(configured, broker_url, redis_url, tmp_path_factory):
    process = celery_worker(
        tmp_path_factory.mktemp("celery") / "worker.log", broker_url, redis_url
    )
    process.start()
    yield process
    process.stop()


@pytest.fixture
def key():
    return uuid.uuid4().hex[:12]


def events(client, key, kind=None):
    records = [json.loads(item) for item in client.lrange(f"events:{key}", 0, -1)]
    return [record for record in records if kind is None or record["event"] == kind]


def started(client, key, count=1):
    """The records of the first ``count`` starts of ``key`` (waited for)."""
    wait_until(lambda: len(events(client, key, "start")) >= count, timeout=SOON,
               what=f"{count} run(s) of {key} to start")  # fmt: skip
    return events(client, key, "start")


def finish(client, key):
    client.rpush(f"go:{key}", "go")


def guard_name(task, key, suffix=""):
    return f"task:{task.name}:{key}{suffix}"


def released_by(client, name):
    """Who force-released ``name`` (the worker's main process says so right after it did)."""
    return wait_until(lambda: client.lrange(f"force-released:{name}", 0, -1), timeout=SOON,
                      what=f"the release of {name} to be recorded")  # fmt: skip


def runs(client, key):
    return int(client.get(f"runs:{key}") or 0)


def test_fifty_concurrent_calls_publish_one_message_and_run_once(worker, redis_client, key):
    published = []

    def count(sender=None, **kwargs):
        published.append(kwargs["headers"]["id"])

    celery_signals.before_task_publish.connect(count, weak=False)
    ids = []
    barrier = threading.Barrier(10)

    def call():
        barrier.wait()
        ids.extend(tasks.until_executed.delay(key, 30).id for _ in range(5))

    try:
        threads = [threading.Thread(target=call) for _ in range(10)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
    finally:
        celery_signals.before_task_publish.disconnect(count)
    assert len(ids) == 50
    assert len(set(ids)) == 1
    assert published == ids[:1]
    [run] = started(redis_client, key)
    assert run["id"] == ids[0]
    finish(redis_client, key)
    assert tasks.until_executed.AsyncResult(ids[0]).get(timeout=SOON) == key
    assert runs(redis_client, key) == 1
    assert not redis_client.get(f"overlaps:{key}")
    # Done: the key is free, and the same call runs again.
    assert registry.get_lock(guard_name(tasks.until_executed, key)) is None
    again = tasks.until_executed.delay(key)
    assert again.id != ids[0]
    assert again.get(timeout=SOON) == key


def test_sigkill_of_the_running_process_frees_the_key(worker, redis_client, key):
    first = tasks.long_lease.delay(key, 60)
    [run] = started(redis_client, key)
    assert tasks.long_lease.delay(key, 60).id == first.id
    os.kill(run["pid"], signal.SIGKILL)
    # The worker's main process sees the child die and frees the task's key (and nobody
    # else's): its lease is 300 s, its queued timeout an hour.
    name = guard_name(tasks.long_lease, key)
    wait_until(lambda: registry.get_lock(name) is None, timeout=SOON, what="the key to be free")
    assert released_by(redis_client, name) == [
        f"Celery: task {first.id} lost its worker process".encode()
    ]
    second = tasks.long_lease.delay(key)
    assert second.id != first.id
    assert second.get(timeout=SOON) == key


def test_sigkill_of_a_renewed_run_frees_the_key_within_a_lease(worker, redis_client, key):
    """However late the main process notices (prefork looks every few seconds), a run that
    died stops renewing its lease of 2 s: the next call runs."""
    first = tasks.until_executed.delay(key, 60)
    [run] = started(redis_client, key)
    os.kill(run["pid"], signal.SIGKILL)
    second = wait_until(
        lambda: (result := tasks.until_executed.delay(key)).id != first.id and result,
        timeout=SOON, what="the key to be free again",
    )  # fmt: skip
    assert second.get(timeout=SOON) == key


def test_a_requeued_task_runs_again_once_the_dead_run_is_gone(worker, redis_client, key):
    """acks_late + reject_on_worker_lost: Celery puts the message back (same task id) and
    frees nothing; its next run waits until the dead run's lease is over: at once, since the
    dead run's process was on this machine (the watch for dead holders ends its lease), or at
    the end of the lease elsewhere. (This test said "most of a lease after the kill" from before
    the watch; it failed whenever the next run came to a worker that knew the dead one.)"""
    first = tasks.requeued_if_lost.delay(key, 60)
    [run] = started(redis_client, key)
    killed_at = time.time()  # (the same machine's clock as the runs' records)
    os.kill(run["pid"], signal.SIGKILL)
    starts = started(redis_client, key, 2)
    assert [start["id"] for start in starts] == [first.id, first.id]
    assert starts[1]["pid"] != run["pid"]
    # Never while the first could still run: only once it was killed.
    assert starts[1]["at"] > killed_at
    finish(redis_client, key)
    assert first.get(timeout=SOON) == key
    assert runs(redis_client, key) == 2
    assert not redis_client.get(f"overlaps:{key}")


def test_a_hard_time_limit_frees_the_key_right_after_it(worker, redis_client, key):
    result = tasks.over_time.delay(key)
    started(redis_client, key)
    worker.wait_for_log(f"Hard time limit (1s) exceeded for {tasks.over_time.name}[{result.id}]")
    name = guard_name(tasks.over_time, key)
    # Its lease is 300 s: only the worker's main process can have freed it this soon.
    wait_until(lambda: registry.get_lock(name) is None, timeout=SOON, what="the key to be free")
    assert released_by(redis_client, name) == [
        f"Celery: task {result.id} hit its hard time limit".encode()
    ]


def test_a_task_revoked_before_it_runs_frees_its_key(worker, redis_client, key):
    result = tasks.until_executed.apply_async((key,), countdown=2)
    name = guard_name(tasks.until_executed, key)
    info = registry.get_lock(name)
    assert info.job_id == result.id
    assert info.queued
    assert info.guard == "until_executed"
    tasks.app.control.revoke(result.id)
    wait_until(lambda: registry.get_lock(name) is None, timeout=SOON, what="the key to be free")
    assert runs(redis_client, key) == 0
    assert tasks.until_executed.delay(key).get(timeout=SOON) == key


def test_a_task_revoked_and_terminated_while_it_runs_frees_its_key(worker, redis_client, key):
    result = tasks.until_executed.delay(key, 60)
    started(redis_client, key)
    name = guard_name(tasks.until_executed, key)
    assert not registry.get_lock(name).queued  # held by its run now
    tasks.app.control.revoke(result.id, terminate=True)
    wait_until(lambda: registry.get_lock(name) is None, timeout=SOON, what="the key to be free")
    again = tasks.until_executed.delay(key)
    assert again.id != result.id
    assert again.get(timeout=SOON) == key


def test_retries_keep_the_key_and_release_it_once(worker, redis_client, key):
    result = tasks.flaky.delay(key, 2, 30)
    name = guard_name(tasks.flaky, key)
    seen = set()

    def meanwhile():  # until the last run started, every duplicate gets the same task
        last_started = len(events(redis_client, key, "start")) == 3
        assert tasks.flaky.delay(key).id == result.id
        info = registry.get_lock(name)
        assert info.job_id == result.id
        seen.add(info.queued)
        return last_started

    wait_until(meanwhile, timeout=SOON, what="the last retry to start")
    assert seen == {True, False}  # queued between the runs, held by each run
    finish(redis_client, key)
    assert result.get(timeout=SOON) == "done"
    assert [start["retries"] for start in events(redis_client, key, "start")] == [0, 1, 2]
    assert redis_client.llen(f"released:{name}") == 1
    assert redis_client.llen(f"force-released:{name}") == 0


def test_while_executing_retries_run_again(worker, redis_client, key):
    """The run that retries leaves no 'finished' mark: its retry (same id) runs."""
    result = tasks.flaky_while.delay(key)
    assert result.get(timeout=SOON) == "done"
    assert [start["retries"] for start in events(redis_client, key, "start")] == [0, 1, 2]


def test_a_redelivered_copy_never_runs_beside_its_original(
    configured, broker_url, redis_url, redis_client, tmp_path, key
):
    """A Redis broker delivers an unacknowledged message again after visibility_timeout,
    with the same task id, while the first delivery still runs (Celery #7918)."""
    import kombu

    if tuple(int(part) for part in kombu.__version__.split(".")[:2]) < (5, 7):
        pytest.skip(
            f"kombu {kombu.__version__} looks for unacknowledged messages about every 100 s "
            "(5.7 made that a setting): too slow to wait for here"
        )
    worker = celery_worker(
        tmp_path / "worker.log", broker_url, redis_url, name="redelivery", queue="redelivery",
        DJANGO_REDIS_LOCK_TEST_VISIBILITY="1",
    )  # fmt: skip
    worker.start()
    try:
        result = tasks.acked_late.apply_async((key, 6), queue="redelivery")
        started(redis_client, key)
        worker.wait_for_log("another run of it still runs elsewhere", timeout=SOON)
        finish(redis_client, key)
        assert result.get(timeout=SOON) == key
        wait_until(lambda: not redis_client.scard(f"inside:{key}"), what="the run to end")
    finally:
        worker.stop()
    assert runs(redis_client, key) == 1
    assert not redis_client.get(f"overlaps:{key}")


def test_a_whole_worker_killed_frees_the_key_within_a_lease(
    configured, broker_url, redis_url, redis_client, tmp_path, key
):
    first_worker = celery_worker(
        tmp_path / "first.log", broker_url, redis_url, name="first", queue="whole"
    )
    first_worker.start()
    first = tasks.until_executed.apply_async((key, 60), queue="whole")
    [run] = started(redis_client, key)
    first_worker.kill()  # SIGKILL to all its processes: nobody is left to free anything
    wait_until(lambda: not process_alive(run["pid"]), timeout=SOON,
               what="the pool's process to end")  # fmt: skip
    second_worker = celery_worker(
        tmp_path / "second.log", broker_url, redis_url, name="second", queue="whole"
    )
    second_worker.start()
    try:
        # Until the dead run's lease ends, the call is the first task's; then it runs again.
        second = wait_until(
            lambda: (result := tasks.until_executed.apply_async((key,), queue="whole")).id
            != first.id and result,
            timeout=SOON, what="the key to be free again",
        )  # fmt: skip
        assert second.get(timeout=SOON) == key
    finally:
        second_worker.stop()
        first_worker.stop()
    assert runs(redis_client, key) == 2
    assert not redis_client.get(f"overlaps:{key}")


def test_a_late_finisher_never_deletes_its_successors_lock(worker, redis_client, key):
    first = tasks.until_executed.delay(key, 60)
    [run] = started(redis_client, key)
    name = guard_name(tasks.until_executed, key)
    os.kill(run["pid"], signal.SIGSTOP)  # frozen: it renews nothing, its lease ends
    try:
        second = wait_until(
            lambda: (result := tasks.until_executed.delay(key, 60)).id != first.id and result,
            timeout=SOON, what="the frozen run's lease to end",
        )  # fmt: skip
        started(redis_client, key, 2)
        assert registry.get_lock(name).job_id == second.id
    finally:
        os.kill(run["pid"], signal.SIGCONT)
    redis_client.rpush(f"go:{key}:{first.id}", "go")  # the first one finishes, late
    wait_until(lambda: len(events(redis_client, key, "end")) == 1, what="the late finisher")
    worker.wait_for_log(f"Lost lock {name!r}", timeout=SOON)
    info = registry.get_lock(name)
    assert info is not None
    assert info.job_id == second.id
    finish(redis_client, key)
    assert second.get(timeout=SOON) == key


def test_on_duplicate_raise_names_the_task_in_the_way(worker, redis_client, key):
    first = tasks.refusing.apply_async((key, 30), countdown=1)  # queued for a second
    with pytest.raises(DuplicateTask) as raised:
        tasks.refusing.delay(key)
    error = raised.value
    assert error.task_id == first.id
    assert error.task == tasks.refusing.name
    assert error.ttl is not None
    assert error.ttl > 3000
    assert first.id in str(error)
    started(redis_client, key)
    with pytest.raises(DuplicateTask) as raised:
        tasks.refusing.delay(key)
    assert not raised.value.queued  # running now
    finish(redis_client, key)
    assert first.get(timeout=SOON) == key


def test_on_duplicate_skip_is_loud(worker, redis_client, key, caplog):
    found = []

    def on_duplicate(sender, **kwargs):
        found.append(kwargs)

    task_duplicate_found.connect(on_duplicate)
    try:
        first = tasks.skipping.apply_async((key, 30), countdown=1)  # queued for a second
        with caplog.at_level(logging.WARNING, logger="django_redis_lock"):
            assert tasks.skipping.delay(key) is None
    finally:
        task_duplicate_found.disconnect(on_duplicate)
    assert [record.levelno for record in caplog.records] == [logging.WARNING]
    assert "skipped" in caplog.records[0].getMessage()
    assert found == [{
        "signal": task_duplicate_found, "name": guard_name(tasks.skipping, key),
        "task": tasks.skipping.name, "task_id": None, "duplicate_of": first.id, "queued": True,
        "phase": "enqueue", "action": "skip",
    }]  # fmt: skip
    started(redis_client, key)
    finish(redis_client, key)
    assert first.get(timeout=SOON) == key


def test_while_executing_reschedules_a_run_that_finds_another(worker, redis_client, key):
    first = tasks.while_executing.delay(key, 30)
    started(redis_client, key)
    second = tasks.while_executing.delay(key, 0)  # not held back when queued: this mode
    assert second.id != first.id
    worker.wait_for_log(f"{tasks.while_executing.name}[{second.id}] put off", timeout=SOON)
    assert runs(redis_client, key) == 1
    finish(redis_client, key)
    assert second.get(timeout=SOON) == key
    assert runs(redis_client, key) == 2
    assert not redis_client.get(f"overlaps:{key}")
    starts = events(redis_client, key, "start")
    ends = events(redis_client, key, "end")
    assert starts[1]["id"] == second.id
    assert starts[1]["at"] >= ends[0]["at"]


def test_until_executed_reschedules_a_duplicate_until_the_first_is_done(worker, redis_client, key):
    first = tasks.rescheduling.delay(key, 30)
    started(redis_client, key)
    second = tasks.rescheduling.delay(key, 0)  # published for about a lease later
    assert second.id != first.id
    worker.wait_for_log(f"{tasks.rescheduling.name}[{second.id}] put off", timeout=SOON)
    assert runs(redis_client, key) == 1  # the first still runs: put off again
    finish(redis_client, key)
    assert second.get(timeout=SOON) == key
    starts, ends = events(redis_client, key, "start"), events(redis_client, key, "end")
    assert [start["id"] for start in starts] == [first.id, second.id]
    assert starts[1]["at"] >= ends[0]["at"]


def test_until_executing_frees_the_key_when_the_run_starts(worker, redis_client, key):
    first = tasks.until_executing.apply_async((key, 30), countdown=1)  # queued for a second
    assert tasks.until_executing.delay(key).id == first.id  # queued: the same
    started(redis_client, key)
    name = guard_name(tasks.until_executing, key)
    wait_until(lambda: registry.get_lock(name) is None, what="the reservation to end")
    second = tasks.until_executing.delay(key, 0)  # running is not queued: accepted
    assert second.id != first.id
    assert second.get(timeout=SOON) == key  # ran meanwhile: this mode keeps no run apart
    finish(redis_client, key)
    assert first.get(timeout=SOON) == key


def test_until_and_while_executing_queues_one_and_runs_one(worker, redis_client, key):
    """(This task skips its duplicates.)"""
    first = tasks.until_and_while.apply_async((key, 30), countdown=1)  # queued for a second
    assert tasks.until_and_while.delay(key) is None  # one in the queue
    started(redis_client, key)
    name = guard_name(tasks.until_and_while, key)
    wait_until(lambda: registry.get_lock(name) is None, what="the reservation to end")
    running = registry.get_lock(f"{name}:running")
    assert running.job_id == first.id
    assert running.guard == "until_and_while_executing"
    second = tasks.until_and_while.delay(key, 0)  # a second may wait in the queue now...
    assert second is not None
    assert second.id != first.id
    assert second.get(timeout=SOON) is None  # ...but may not run beside the first: skipped
    finish(redis_client, key)
    assert first.get(timeout=SOON) == key
    assert runs(redis_client, key) == 1


def test_the_cli_shows_the_task_and_its_guard(worker, redis_client, key):
    first = tasks.until_executed.apply_async((key,), countdown=30)
    out = io.StringIO()
    call_command("redis_locks", "list", "--json", "--match", key, stdout=out)
    [record] = json.loads(out.getvalue())
    assert record["job_id"] == first.id
    assert record["queued"] is True
    assert record["guard"] == "until_executed"
    assert record["label"] == "Celery task"
    tasks.app.control.revoke(first.id)


def test_single_instance_in_a_celery_task_holds_its_lock_for_the_task_id(
    worker, redis_client, key
):
    first = tasks.single.delay(key, 30)
    started(redis_client, key)
    assert redis_client.lrange(f"single:{key}", 0, -1) == [first.id.encode()]
    assert tasks.single.delay(key, 0).get(timeout=SOON) is None  # the other process: skipped
    worker.wait_for_log(f"Skipped {tasks.single.name}", timeout=SOON)
    finish(redis_client, key)
    assert first.get(timeout=SOON) == key
