"""django.tasks task guards (``django_redis_lock.tasks``) with a real worker: django-tasks-db's
``db_worker`` in a subprocess, on the suite's SQLite test database, running the tasks of
``tests/testapp/tasks.py`` (``GuardedBackend`` over the database backend, ``tests/settings.py``).

django.tasks has no revoke, retry or time limit, and ``db_worker`` runs one task at a time in
one process and never delivers a task twice: what is left to prove is that duplicates stay out
of the queue, that a run that died frees its key within a lease, and the ``on_duplicate`` modes.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import signal
import sys
import threading
import uuid

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connection, connections
from django.utils import timezone

from django_redis_lock import DuplicateTask, registry

pytest.importorskip("django_tasks_db", reason="django-tasks-db is not installed")

from tests.support.helpers import wait_until
from tests.support.task_workers import WorkerProcess
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
def module_workers(django_db_setup, django_db_blocker, redis_url, tmp_path_factory):
    directory = tmp_path_factory.mktemp("db-workers")
    started = [db_worker(directory, redis_url, name).start() for name in ("one", "two")]
    yield started
    for process in started:
        process.stop()


@pytest.fixture
def workers(module_workers):
    """Two db_worker processes: two tasks may run at once. A test leaves no task of theirs
    running when it ends: the database is emptied after each test, and a db_worker whose task
    row is gone when it finishes exits."""
    for worker in module_workers:
        assert worker.process.poll() is None, f"a db_worker has exited:\n{worker.log}"
    return module_workers


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
    again = tasks.until_executed.enqueue(key)
    assert str(again.id) != ids[0]
    finished(again)


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
        redis_client.rpush(f"go:{key}:{first.id}", "go")  # the first one finishes, late
        redis_client.rpush(f"go:{key}:{second.id}", "go")
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
    assert finished(put_off).return_value is None, "\n".join(w.log for w in workers)  # put off
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


@pytest.mark.parametrize("task", [tasks.immediately, tasks.immediately_until_executing])
def test_a_task_run_before_its_queueing_ends_leaves_no_key(task, redis_client, key):
    """The immediate backend runs the task inside enqueue(): its run finds the reservation
    still pending, takes it over (or ends it), and the rename finds nothing to rename."""
    first = task.enqueue(key)
    assert first.status == TaskResultStatus.SUCCESSFUL
    assert registry.get_lock(guard_name(task, key)) is None
    again = task.enqueue(key)  # not refused by a reservation left behind
    assert again.status == TaskResultStatus.SUCCESSFUL
    assert again.id != first.id
    assert int(redis_client.get(f"runs:{key}")) == 2


def test_a_reservation_whose_queueing_rolled_back_is_passed_over(workers, redis_client, key):
    from django.db import transaction

    with pytest.raises(RuntimeError), transaction.atomic():
        tasks.until_executed.enqueue(key)  # its row is written in this transaction...
        raise RuntimeError("...which rolls back")
    assert registry.get_lock(guard_name(tasks.until_executed, key)).queued  # the key stays
    later = timezone.now() + datetime.timedelta(seconds=1)
    second = tasks.until_executed.using(run_after=later).enqueue(key)  # passed over
    info = registry.get_lock(guard_name(tasks.until_executed, key))
    assert info.job_id == str(second.id)
    assert finished(second).status == TaskResultStatus.SUCCESSFUL
