"""Task guards without a worker: their options, keys and errors, and Celery's eager mode (the
task runs in the calling process), on the suite's real Redis. The real workers are in
``test_celery.py`` and ``test_tasks.py``."""

from __future__ import annotations

import datetime
import logging
import warnings

import pytest
from celery import Celery, shared_task
from django.test import override_settings

from django_redis_lock import LockBackendError, registry
from django_redis_lock.celery import GuardedTask
from django_redis_lock.task_guards import TaskGuard
from tests.support.helpers import keys_left

app = Celery("eager", set_as_current=False)
app.conf.update(task_always_eager=True, task_eager_propagates=True)
app.finalize()  # tasks are made (and their options checked) when defined
seen = []


@app.task(base=GuardedTask, bind=True, guard_key="{customer_id}")
def sync_customer(self, customer_id, inner=False):
    seen.append((self.request.id, registry.get_lock(key_of(customer_id))))
    if inner:
        return self.request.id
    # Called again while it runs: the same key is held by this run.
    return sync_customer.delay(customer_id, inner=True).id


def key_of(customer_id):
    return f"task:{sync_customer.name}:{customer_id}"


@app.task(base=GuardedTask, guard="while_executing", guard_key="{customer_id}")
def while_running(customer_id, inner=False):
    if inner:
        return "ran"
    # Eager: runs now, finds this run. (Its result, read without .get(), which Celery forbids
    # inside a task.)
    return while_running.delay(customer_id, inner=True).result


@app.task(base=GuardedTask)
def echo(value):
    return value


# The form Django projects use (docs/tasks.md): no app named, every app gets it.
@shared_task(base=GuardedTask, bind=True, guard_key="{customer_id}")
def shared_sync(self, customer_id, inner=False):
    seen.append((self.request.id, registry.get_lock(f"task:{self.name}:{customer_id}")))
    if inner:
        return self.request.id
    return self.delay(customer_id, inner=True).id


@app.task(base=GuardedTask, bind=True, guard="while_executing", max_retries=3)
def retried_while(self, key):
    seen.append(self.request.retries)
    if self.request.retries < 2:
        raise self.retry(countdown=0)
    return "done"


@app.task(base=GuardedTask, bind=True, max_retries=3)
def retried_until(self, key):
    seen.append(self.request.retries)
    if self.request.retries < 2:
        raise self.retry(countdown=0)
    return "done"


def test_the_default_key_is_every_argument_however_passed():
    guard = TaskGuard("t", lambda customer_id, full=False: None, label="")
    names = {
        guard.names((42,), {}).queue,
        guard.names((), {"customer_id": 42}).queue,
        guard.names((42, False), {}).queue,
        guard.names((42,), {"full": False}).queue,
    }
    assert names == {"task:t:customer_id=42,full=false"}
    assert guard.names((43,), {}).queue != names.pop()
    stamp = datetime.date(2026, 11, 24)
    assert guard.names((stamp,), {}).queue == 'task:t:customer_id="2026-11-24",full=false'
    with pytest.raises(TypeError, match=r"argument 'customer_id'.*guard_key"):
        guard.names((object(),), {})


def test_templates_and_callables_make_the_key():
    def func(customer_id, full=False):
        return None

    assert TaskGuard("t", func, label="", guard_key="{customer_id}").names((7,), {}).queue == (
        "task:t:7"
    )
    by_callable = TaskGuard("t", func, label="", guard_key=lambda customer_id, **_: "c")
    assert by_callable.names((7,), {}).queue == "task:t:c"
    assert TaskGuard("t", func, label="", guard_key="").names((7,), {}).queue == "task:t"
    names = TaskGuard("t", func, label="", guard="until_and_while_executing").names((7,), {})
    assert names.run == names.queue + ":running"


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"guard": "until_done"}, ValueError, "guard must be one of"),
        ({"on_duplicate": "ignore"}, ValueError, "on_duplicate must be one of"),
        ({"guard": "until_executing", "on_duplicate": "reschedule"}, ValueError, "guards no run"),
        ({"guard_key": 5}, TypeError, "guard_key must be a template"),
        ({"guard_key": "{custmer_id}"}, ValueError, "names 'custmer_id'.*customer_id, full"),
        ({"guard_key": "{2}"}, ValueError, "names '2'"),
        ({"guard_timeout": 0}, ValueError, "guard_timeout"),
        ({"guard_queued_timeout": "1h"}, TypeError, "guard_queued_timeout"),
        ({"guard_using": ""}, TypeError, "guard_using"),
        ({"once": {"graceful": True}}, TypeError, "on_duplicate='skip' for graceful"),
        ({"unique_on": ["customer_id"]}, TypeError, "use guard_key="),
    ],
)
def test_bad_options_fail_when_the_task_is_defined(options, error, match):
    with pytest.raises(error, match=match):

        @app.task(base=GuardedTask, name=f"bad-{len(seen)}", shared=False, **options)
        def bad(customer_id, full=False): ...


def test_the_queued_key_lasts_the_queued_timeout_plus_any_delay_and_no_more_than_expiry():
    guard = TaskGuard("t", lambda: None, label="", guard_queued_timeout=100)
    assert guard.queued_ttl() == 100
    assert guard.queued_ttl(delay=30) == 130
    assert guard.queued_ttl(delay=30, expires_in=10) == 11


def test_eager_calls_are_guarded_like_queued_ones():
    seen.clear()
    result = sync_customer.delay(42)
    [(task_id, held)] = seen
    assert result.id == task_id
    assert result.get() == task_id  # called again inside: the running one's id
    assert held.job_id == task_id
    assert not held.queued  # its run took the reservation over
    assert held.guard == "until_executed"
    assert registry.get_lock(key_of(42)) is None
    assert sync_customer.delay(42).id != result.id  # done: the next call runs


def test_a_shared_task_is_guarded_as_an_apps_task():
    seen.clear()
    # A project's app, finalized after the task was defined (autodiscover_tasks' order): it
    # gets every shared task. (Not this module's app, whose tasks the tests above made with
    # bad options on purpose.)
    project = Celery("project", set_as_current=False)
    project.conf.update(task_always_eager=True, task_eager_propagates=True)
    with warnings.catch_warnings():
        # (It gets the shared tasks of every module the worker ran before, the docs' snippets
        # among them, whose names may repeat: not this test's business.)
        warnings.filterwarnings("ignore", message="Task name .* is already registered")
        project.finalize()
    task = project.tasks[shared_sync.name]
    assert isinstance(task, GuardedTask)
    result = task.delay(7)
    [(task_id, held)] = seen
    assert result.get() == task_id  # called again inside: the running one's id
    assert held.job_id == task_id
    assert task.delay(7).id != result.id  # done: the next call runs


def test_a_run_finding_another_is_skipped_loudly(caplog):
    with caplog.at_level(logging.WARNING, logger="django_redis_lock"):
        assert while_running.delay(5).get() is None
    assert any("skipped when it started" in record.getMessage() for record in caplog.records)


def test_disabled_guards_touch_nothing(redis_client):
    with override_settings(DJANGO_REDIS_LOCK_ENABLED=False):
        seen.clear()
        result = sync_customer.delay(1)
        assert result.get() == seen[1][0]  # not held: the inner call ran too
        assert seen[1][0] != result.id
    assert keys_left(redis_client) == []


def test_redis_out_of_reach_refuses_unless_fail_open(settings, caplog):
    from tests.conftest import django_redis_caches
    from tests.settings import UNREACHABLE_REDIS_URL

    settings.CACHES = django_redis_caches(UNREACHABLE_REDIS_URL)
    with pytest.raises(LockBackendError, match="reserve"):
        echo.delay(3)
    settings.DJANGO_REDIS_LOCK_FAIL_OPEN = True
    with caplog.at_level(logging.WARNING, logger="django_redis_lock"):
        assert echo.delay(4).get() == 4
    messages = [record.getMessage() for record in caplog.records]
    assert any("queued unguarded" in message for message in messages)
    assert any("runs unguarded" in message for message in messages)


@pytest.mark.parametrize("task", [retried_while, retried_until])
def test_a_retry_runs_again(task):
    """A retry has the task's id: its run must not take itself for a finished one's copy.
    (Eager mode runs a retry only when it does not propagate exceptions.)"""
    seen.clear()
    app.conf.task_eager_propagates = False
    try:
        assert task.delay("k").get() == "done"
    finally:
        app.conf.task_eager_propagates = True
    assert seen == [0, 1, 2]


def test_a_supervisor_frees_only_what_the_call_it_saw_end_had(redis_client):
    """A copy of a job (same id) may run elsewhere: a message dropped before it ran frees its
    reservation only, and a lost process only a hold of a dead process of this machine."""
    from django_redis_lock import Lock
    from django_redis_lock.core.lease import OwnerRecord, encode_lease
    from django_redis_lock.primitives.keys import lock_keys
    from django_redis_lock.primitives.owners import HOST
    from django_redis_lock.task_guards import GuardNames, release_after, reservations

    guard = TaskGuard("t", lambda: None, label="")
    names = GuardNames("task:t", "task:t")
    running = Lock("task:t", timeout=30, job_id="job-a")  # a run of job-a, alive here
    assert running.acquire(wait=0)
    release_after(guard, names, "job-a", "revoked", ran="nowhere")
    release_after(guard, names, "job-a", "lost", ran="dead here")
    assert running.owned()
    running.release()
    assert reservations.reserve("task:t", "job-a", ttl=60).reserved
    release_after(guard, names, "job-a", "revoked", ran="nowhere")
    assert registry.get_lock("task:t") is None
    # A hold of a process of this machine that is gone: freed.
    key = lock_keys("task:t", "default").lease
    dead = 2**22 + 12345  # above Linux's largest pid_max: nobody's pid
    value = encode_lease("job-a~r4nd0m", 1, 0, OwnerRecord(30, dead, HOST, "MainThread").encode())
    redis_client.set(key, value, px=30000)
    release_after(guard, names, "job-a", "lost", ran="dead here")
    assert registry.get_lock("task:t") is None
    # ...but not one of another machine: it may be a copy that runs there.
    elsewhere = OwnerRecord(30, dead, "another-host", "MainThread").encode()
    redis_client.set(key, encode_lease("job-a~r4nd0m", 1, 0, elsewhere), px=30000)
    release_after(guard, names, "job-a", "lost", ran="dead here")
    assert registry.get_lock("task:t").job_id == "job-a"


@app.task(base=GuardedTask, time_limit=3)
def time_limited(key):
    return key


def test_a_copy_waits_for_its_original_less_than_its_time_limits():
    """A copy stopped by a hard time limit would have its worker free the original's key."""
    assert echo._copy_wait() is None  # no limit: a lease and a second
    assert time_limited._copy_wait() == 2.0


def test_a_run_key_that_ran_out_while_the_reservation_ended_is_taken_again(redis_url):
    """``RUN`` means what an acquisition means: a lease not over yet. A run takes its key,
    then ends its job's reservation (``until_and_while_executing``: two keys); a worker
    stopped between the two past the key's lease (its renewals with it) finds the key over
    when it goes on, and takes it again before it says ``RUN`` (found by the runtime
    simulation)."""
    import multiprocessing
    import os
    import signal
    import time

    from tests.support import workers
    from tests.support.helpers import wait_until

    spawn = multiprocessing.get_context("spawn")
    results = spawn.Queue()
    worker = spawn.Process(
        target=workers.run_paused_between_key_and_reservation, args=(redis_url, results)
    )
    worker.start()
    try:
        wait_until(lambda: _stopped(worker.pid), 60, "the worker to stop itself")
        time.sleep(0.5)  # (the stop itself: longer than the key's lease of 0.2 s)
        os.kill(worker.pid, signal.SIGCONT)
        verdict, in_lease, taken = results.get(timeout=60)
    finally:
        worker.join(10)
        worker.kill()
    assert (verdict, in_lease, taken) == ("run", True, 2)  # taken, and taken again


def _stopped(pid):
    with open(f"/proc/{pid}/status") as status:
        return "\nState:\tT" in status.read()
