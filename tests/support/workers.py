"""Code that runs in child processes (spawned, so each has its own fresh interpreter)."""

from __future__ import annotations

import os
import time
from typing import Any


def setup_django(redis_url: str, database: str | None = None, **settings: Any) -> None:
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    os.environ["DJANGO_REDIS_LOCK_TEST_REDIS_URL"] = redis_url
    if database:
        os.environ["DJANGO_REDIS_LOCK_TEST_DB"] = database
    import django
    from django.test import override_settings

    django.setup()
    if settings:
        override_settings(**settings).enable()


def count_under_lock(redis_url: str, name: str, rounds: int, start: Any) -> tuple[int, int]:
    """``rounds`` non-atomic increments of ``counter`` under the lock; returns
    (overlaps seen, acquisitions)."""
    setup_django(redis_url)
    return _count_under_lock(redis_url, name, rounds, start)


def count_under_quorum_lock(
    redis_url: str, caches: dict[str, Any], name: str, rounds: int, start: Any
) -> tuple[int, int]:
    """:func:`count_under_lock` with the lock on the quorum of the cache aliases ``q*``."""
    members = sorted(alias for alias in caches if alias.startswith("q"))
    setup_django(redis_url, CACHES=caches, DJANGO_REDIS_LOCK_QUORUMS={"redlock": members})
    return _count_under_lock(redis_url, name, rounds, start, using="redlock")


def _count_under_lock(
    redis_url: str, name: str, rounds: int, start: Any, using: str | None = None
) -> tuple[int, int]:
    import redis

    from django_redis_lock import Lock

    client = redis.Redis.from_url(redis_url)
    overlaps = 0
    start.wait()
    for _ in range(rounds):
        with Lock(name, timeout=10, wait=60, using=using):
            if client.incr("inside") != 1:
                overlaps += 1
            value = int(client.get("counter") or 0)
            client.set("counter", value + 1)
            client.decr("inside")
    return overlaps, rounds


def acquire_for(redis_url: str, name: str, seconds: float, start: Any) -> int:
    """Take and release the lock as often as possible for ``seconds``; returns the count."""
    setup_django(redis_url)
    from django_redis_lock import Lock

    start.wait()
    count = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with Lock(name, timeout=10, wait=30):
            count += 1
            busy_until = time.monotonic() + 0.0005  # a 0.5 ms critical section
            while time.monotonic() < busy_until:
                pass
    return count


def hold_until_killed(redis_url: str, name: str, ready: Any, **lock_options: Any) -> None:
    setup_django(redis_url, DJANGO_REDIS_LOCK_TIMEOUT=1)
    from django_redis_lock import Lock

    lock = Lock(name, **lock_options)
    assert lock.acquire(wait=0)
    ready.set()
    time.sleep(3600)


def hold_and_report_losses(redis_url: str, name: str, ready: Any, losses: Any) -> None:
    """Hold the lock (a 1 s lease, renewed) and put the reason of any loss on ``losses``."""
    setup_django(redis_url, DJANGO_REDIS_LOCK_TIMEOUT=1)
    from django_redis_lock import Lock, lock_lost

    def lost(**kwargs: Any) -> None:
        losses.put(kwargs["reason"])

    lock_lost.connect(lost, weak=False)
    lock = Lock(name)
    assert lock.acquire(wait=0)
    ready.set()
    time.sleep(3600)


def wait_in_line(redis_url: str, name: str) -> None:
    """Queue for the lock, for a minute (the test kills this process while it waits)."""
    setup_django(redis_url)
    from django_redis_lock import Lock

    Lock(name, wait=60).acquire()
    time.sleep(3600)


def deposit_under_lock(redis_url: str, database: str, pk: int, rounds: int, start: Any) -> int:
    """``rounds`` deposits of 1 through a @locked_method doing a plain read-modify-write."""
    setup_django(redis_url, database)
    from tests.testapp.models import Account

    account = Account.objects.get(pk=pk)
    start.wait()
    for _ in range(rounds):
        account.deposit(1)
    return rounds


def fork_inside_the_lock(redis_url: str, name: str, reentrant: bool) -> dict[str, Any]:
    """Hold ``name``, fork, and let the child try everything a copy of the holder could do:
    release, re-acquire, and leave the ``with`` block. Returns what the child saw, and whether
    the parent still held the lock afterwards (a fresh Lock could not take it)."""
    import json

    setup_django(redis_url, DJANGO_REDIS_LOCK_TIMEOUT=1)  # a renewed lease of 1 s
    from django_redis_lock import Lock, LockNotOwned

    lock = Lock(name, reentrant=reentrant)
    read_end, write_end = os.pipe()
    seen: dict[str, Any] = {}
    pid = -1
    try:
        with lock:
            pid = os.fork()
            if pid == 0:
                try:
                    lock.release()
                    seen["release"] = "released"
                except LockNotOwned:
                    seen["release"] = "LockNotOwned"
                seen["acquire"] = lock.acquire(wait=0)
                seen["other_acquire"] = Lock(name, reentrant=reentrant).acquire(wait=0)
            else:
                os.waitpid(pid, 0)
                seen["child"] = json.loads(os.read(read_end, 65536))
                time.sleep(1.5)  # more than the lease: the parent renews it, the child must not
                seen["parent_still_owns"] = lock.owned()
                seen["third_party_acquired"] = Lock(name, timeout=5).acquire(wait=0)
    except BaseException as exc:  # the child reports whatever happened
        seen["exit"] = repr(exc)
    if pid == 0:
        seen.setdefault("exit", "quiet")
        os.write(write_end, json.dumps(seen).encode())
        os._exit(0)
    return seen


def metered_locks(redis_url: str, multiproc_dir: str, name: str, rounds: int) -> int:
    """With the Prometheus exporter on in multi-process mode (files in ``multiproc_dir``):
    ``rounds`` acquisitions of lock ``name``, then one wait for it that times out."""
    assert os.environ["PROMETHEUS_MULTIPROC_DIR"] == multiproc_dir  # inherited from the test
    setup_django(redis_url, DJANGO_REDIS_LOCK_METRICS=["prometheus"])
    from django_redis_lock import Lock

    for _ in range(rounds):
        with Lock(name):
            pass
    with Lock(name):
        assert not Lock(name).acquire(wait=0)
    return rounds


def forked_metrics(multiproc_dir: str) -> int:
    """In multi-process mode (files in ``multiproc_dir``): a sink with 5 holds pending forks; the
    child reports 2 waits and 3 holds, and writes them. Returns the child's exit code."""
    assert os.environ["PROMETHEUS_MULTIPROC_DIR"] == multiproc_dir  # inherited from the test
    from django_redis_lock.metrics.prometheus_files import MultiProcessPrometheusSink

    sink = MultiProcessPrometheusSink(every=3600)  # its timer does not write in this test
    for _ in range(5):
        sink.held("lock", "import", 0.1)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            for _ in range(2):
                sink.waited("lock", "import", "acquired", 0.01)
            for _ in range(3):
                sink.held("lock", "import", 0.1)
            sink.close()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    sink.close()
    return os.waitstatus_to_exitcode(status)


def multi_process_files(multiproc_dir: str, whose: str) -> None:
    """In multi-process mode: the events of ``tests.support.prometheus_events`` (all, then a few
    again) into the files, through our sink (``whose="ours"``) or prometheus_client's own
    instruments (``"theirs"``)."""
    assert os.environ["PROMETHEUS_MULTIPROC_DIR"] == multiproc_dir  # inherited from the test
    from django_redis_lock.metrics.prometheus_files import MultiProcessPrometheusSink
    from tests.support.prometheus_events import HOLDS, WAITS, Theirs, feed

    if whose == "theirs":
        theirs = Theirs(registry=None)
        feed(theirs, WAITS, HOLDS)
        feed(theirs, WAITS[:3], HOLDS[:2])
        return
    sink = MultiProcessPrometheusSink(every=3600)  # its timer does not write in this test
    feed(sink, WAITS, HOLDS)
    sink.settle()
    feed(sink, WAITS[:3], HOLDS[:2])  # a second write adds to the first
    sink.close()  # and writes what is pending


def timer_writes(multiproc_dir: str) -> float:
    """In multi-process mode: 10 holds, and no read; the count of holds in the files, once
    they show 10 (10 s at most), before the sink is closed."""
    assert os.environ["PROMETHEUS_MULTIPROC_DIR"] == multiproc_dir
    from django_redis_lock.metrics.prometheus_files import MultiProcessPrometheusSink
    from tests.support.helpers import wait_until
    from tests.support.prometheus_events import HOLD_COUNT, read_files

    sink = MultiProcessPrometheusSink(every=0.05)
    for _ in range(10):
        sink.held("lock", "import", 0.1)
    try:
        wait_until(lambda: read_files(multiproc_dir).get(HOLD_COUNT) == 10, 10, "a timer write")
        return read_files(multiproc_dir)[HOLD_COUNT]
    finally:
        sink.close()


def scraped_metrics_view(redis_url: str, multiproc_dir: str, token: str) -> tuple[int, str]:
    """In multi-process mode (files in ``multiproc_dir``): the metrics view's status and body,
    asked by a scraper with ``token``, in a process that took no lock itself."""
    assert os.environ["PROMETHEUS_MULTIPROC_DIR"] == multiproc_dir  # inherited from the test
    setup_django(
        redis_url, DJANGO_REDIS_LOCK_METRICS=["prometheus"], DJANGO_REDIS_LOCK_METRICS_TOKEN=token
    )
    from django.test import Client

    response = Client().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {token}")
    return response.status_code, response.content.decode()


def run_paused_between_key_and_reservation(redis_url: str, results: Any) -> None:
    """A ``GuardedRun`` (``until_and_while_executing``, a run key of 0.2 s, renewed) whose
    process stops itself (SIGSTOP: its renewals too) as soon as it took the run key, before
    the job's reservation is ended; the parent continues it later. Puts (the verdict, whether
    the key held is still within its lease, how many times the key was taken) on ``results``."""
    import signal

    setup_django(redis_url)
    from django_redis_lock import lock_acquired
    from django_redis_lock.task_guards import GuardedRun, TaskGuard, admit

    guard = TaskGuard(
        "paused", lambda key: None, label="", guard="until_and_while_executing", guard_timeout=0.2
    )
    names = guard.names(("k",), {})
    assert admit(guard, names, "job-1", ttl=60) is None
    taken: list[str] = []

    def stop(sender: Any, lock: Any, **kwargs: Any) -> None:
        taken.append(lock.name)
        if len(taken) == 1:
            os.kill(os.getpid(), signal.SIGSTOP)

    lock_acquired.connect(stop, weak=False)
    run = GuardedRun(guard, names, "job-1")
    verdict = run.enter()
    until = run.lock.held_until if run.lock is not None else None
    in_lease = until is not None and until > time.monotonic()
    run.exit()
    results.put((verdict.value, in_lease, len(taken)))


def hold_group_until_killed(redis_url: str, names: list[str], ready: Any) -> None:
    """Hold ``lock_many(names)`` (taken in one script) until killed."""
    setup_django(redis_url)
    from django_redis_lock import lock_many

    group = lock_many(names)
    assert group.acquire(wait=0)
    ready.set()
    time.sleep(3600)
    group.release()


def hold_lock_until_killed(redis_url: str, name: str, ready: Any) -> None:
    """Hold lock ``name`` with the default lease (30 s, renewed) until killed."""
    setup_django(redis_url)
    from django_redis_lock import Lock

    lock = Lock(name)  # (kept in a name: a collected Lock is no longer renewed)
    assert lock.acquire(wait=0)
    ready.set()
    time.sleep(3600)
    lock.release()
