"""django.tasks task guards (``django_redis_lock.tasks``) with a real worker: django-tasks-db's
``db_worker`` in a subprocess, on the suite's SQLite test database, running the tasks of
``tests/testapp/tasks.py`` (``GuardedBackend`` over the database backend, ``tests/settings.py``).

django.tasks has no revoke, retry or time limit, and ``db_worker`` runs one task at a time in
one process and never delivers a task twice: what is left to prove is that duplicates stay out
of the queue, that a run that died frees its key within a lease, and the ``on_duplicate`` modes.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import threading
import uuid

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connection, connections

from django_redis_lock import DuplicateTask, registry

pytest.importorskip("django_tasks_db", reason="django-tasks-db is not installed")

from tests.helpers import wait_until
from tests.task_workers import WorkerProcess
from tests.testapp import tasks

pytestmark = [pytest.mark.workers, pytest.mark.django_db(transaction=True)]

SOON = 30

try:
    from django.tasks import TaskResultStatus
    from django.tasks import task as make_task
except ImportError:  # the backport
    from django_tasks import TaskResultStatus  # type: ignore[no-redef]
    from django_tasks import task as make_task  # type: ignore[no-redef]


def db_worker(tmp_path, redis_url, name="worker", queue="default"):
    command = [
        sys.executable, "-m", "django", "db_worker", "--backend", "db", "--interval", "0.05",
        "--no-startup-delay", "--worker-id", name, "--verbosity", "2", "--queue-name", queue,
    ]  # fmt: skip
    env = {
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DJANGO_REDIS_LOCK_TEST_REDIS_URL": redis_url,
        "DJANGO_REDIS_LOCK_TEST_DB": connection.settings_dict["NAME"],
    }
    return WorkerProcess(command, env, tmp_path / f"{name}.log", ready="Starting worker")


@pytest.fixture(scope="module")
def workers(django_db_setup, django_db_blocker, redis_url, tmp_path_factory):
    """Two db_worker processes: two tasks may run at once."""
    directory = tmp_path_factory.mktemp("db-workers")
    started = [db_worker(directory, redis_url, name).start() for name in ("one", "two")]
    yield started
    for process in started:
        process.stop()


@pytest.fixture
def key():
    return uuid.uuid4().hex[:12]


def events(client, key, kind):
    records = [json.loads(item) for item in client.lrange(f"events:{key}", 0, -1)]
    return [record for record in records if record["event"] == kind]


def started(client, key, count=1):
    wait_until(lambda: len(events(client, key, "start")) >= count, timeout=SOON,
               what=f"{count} run(s) of {key} to start")  # fmt: skip
    return events(client, key, "start")


def finished(result):
    def done():
        result.refresh()
        return result.is_finished

    wait_until(done, timeout=SOON, what=f"task {result.id} to finish")
    return result


def guard_name(task, key):
    return f"task:{task.module_path}:{key}"


def test_fifty_concurrent_enqueues_queue_one_task_and_run_it_once(workers, redis_client, key):
    from django_tasks_db.models import DBTaskResult

    ids = []
    barrier = threading.Barrier(10)

    def call():
        barrier.wait()
        try:
            ids.extend(str(tasks.until_executed.enqueue(key, 30).id) for _ in range(5))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=call) for _ in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(ids) == 50
    assert len(set(ids)) == 1
    assert DBTaskResult.objects.count() == 1
    [run] = started(redis_client, key)
    assert run["id"] == ids[0]
    info = registry.get_lock(guard_name(tasks.until_executed, key))
    assert info.job_id == ids[0]
    assert not info.queued  # the run took the reservation over
    redis_client.rpush(f"go:{key}", "go")
    result = finished(tasks.until_executed.get_result(ids[0]))
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == key
    assert int(redis_client.get(f"runs:{key}")) == 1
    assert not redis_client.get(f"overlaps:{key}")
    # Done: the same call is queued again.
    assert str(tasks.until_executed.enqueue(key).id) != ids[0]


# The workers of these tests take the queue "solo", which the module's workers leave alone.
solo = tasks.until_executed.using(queue_name="solo")


def test_a_killed_worker_frees_the_key_within_a_lease(tmp_path, redis_url, redis_client, key):
    first_worker = db_worker(tmp_path, redis_url, "first", "solo").start()
    first = solo.enqueue(key, 60)
    [run] = started(redis_client, key)
    os.kill(run["pid"], signal.SIGKILL)  # db_worker runs the task in its only process
    first_worker.process.wait(10)
    second = wait_until(
        lambda: (result := solo.enqueue(key)).id != first.id and result,
        timeout=SOON, what="the dead run's lease to end",
    )  # fmt: skip
    second_worker = db_worker(tmp_path, redis_url, "second", "solo").start()
    try:
        assert finished(second).return_value == key
    finally:
        second_worker.stop()
    assert int(redis_client.get(f"runs:{key}")) == 2


def test_a_late_finisher_never_deletes_its_successors_lock(tmp_path, redis_url, redis_client, key):
    first_worker = db_worker(tmp_path, redis_url, "first", "solo").start()
    second_worker = None
    try:
        first = solo.enqueue(key, 60)
        [run] = started(redis_client, key)
        os.kill(run["pid"], signal.SIGSTOP)
        try:
            second = wait_until(
                lambda: (result := solo.enqueue(key, 60)).id != first.id and result,
                timeout=SOON, what="the frozen run's lease to end",
            )  # fmt: skip
            second_worker = db_worker(tmp_path, redis_url, "second", "solo").start()
            started(redis_client, key, 2)
        finally:
            os.kill(run["pid"], signal.SIGCONT)
        redis_client.rpush(f"go:{key}", "go")  # wakes one of them: the first, or the second
        redis_client.rpush(f"go:{key}", "go")
        finished(tasks.until_executed.get_result(first.id))
        finished(tasks.until_executed.get_result(second.id))
        first_worker.wait_for_log("Lost lock", timeout=SOON)
    finally:
        first_worker.stop()
        if second_worker is not None:
            second_worker.stop()
    # The first one's release found the key the second's and left it alone: the second's own
    # release was the only one.
    assert redis_client.llen(f"force-released:{guard_name(tasks.until_executed, key)}") == 0


def test_on_duplicate_raise_and_reschedule(workers, redis_client, key):
    first = tasks.refusing.enqueue(key, 30)
    with pytest.raises(DuplicateTask) as raised:
        tasks.refusing.enqueue(key)
    assert raised.value.task_id == str(first.id)
    redis_client.rpush(f"go:{key}", "go")
    finished(first)
    # while_executing: both are queued; the second, finding the first running, is put off.
    other = f"{key}-w"
    running = tasks.while_executing.enqueue(other, 30)
    started(redis_client, other)
    put_off = tasks.while_executing.enqueue(other, 0)
    assert finished(put_off).return_value is None  # this run did not run: it was put off
    redis_client.rpush(f"go:{other}", "go")
    finished(running)
    started(redis_client, other, 2)  # the rescheduled run, after the first
    starts, ends = events(redis_client, other, "start"), events(redis_client, other, "end")
    assert starts[1]["at"] >= ends[0]["at"]
    assert not redis_client.get(f"overlaps:{other}")


def test_async_tasks_are_guarded_too(workers, redis_client, key):
    result = asyncio.run(tasks.asynchronous.aenqueue(key))
    assert finished(result).return_value == key
    assert registry.get_lock(guard_name(tasks.asynchronous, key)) is None


def plain(key):
    return key


def test_guarded_goes_above_task_and_needs_a_guarded_backend():
    from django_redis_lock.tasks import guarded

    with pytest.raises(TypeError, match="above @task"):
        guarded()(plain)
    with pytest.raises(ImproperlyConfigured, match="GuardedBackend"):
        guarded()(make_task(backend="db")(plain))
    # Called directly (as tests do), a guarded task runs guarded, with no task id.
    direct = guarded(guard="while_executing")(make_task(backend="db")(plain))
    assert direct.call("x") == "x"
    assert direct.call(key="x") == "x"
    with pytest.raises(ValueError, match="guard must be one of"):
        guarded(guard="until_done")
