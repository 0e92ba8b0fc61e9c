"""The locks' metrics, read back through prometheus_client's registry and the OpenTelemetry
SDK's in-memory reader: counts equal what happened, labels stay few."""

from __future__ import annotations

import threading

import pytest
from django.core.checks import run_checks
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client import REGISTRY

from django_redis_lock import Lock, LockBackendError, Semaphore, lock_contended
from django_redis_lock.core.labels import group_of, reason_kind
from django_redis_lock.metrics.opentelemetry import OpenTelemetrySink
from django_redis_lock.primitives import reports
from django_redis_lock.primitives.keys import lock_keys
from tests.support.helpers import wait_until


def sample(name, **labels):
    return REGISTRY.get_sample_value(name, labels) or 0.0


@pytest.fixture
def prometheus(settings):
    settings.DJANGO_REDIS_LOCK_METRICS = ["prometheus"]
    yield
    settings.DJANGO_REDIS_LOCK_METRICS = []


@pytest.fixture
def otel_reader():
    reader = InMemoryMetricReader()
    sink = OpenTelemetrySink(MeterProvider(metric_readers=[reader]))
    reports.add_sink(sink)
    yield reader
    reports.remove_sink(sink)


def otel_points(reader, name):
    data = reader.get_metrics_data()
    return [
        point
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == name
        for point in metric.data.data_points
    ]


def contended_run(client, name: str, count: int) -> int:
    """``count`` acquisitions of lock ``name``: one holder, and ``count - 1`` threads queued
    behind it before it releases; returns how many were told to wait (lock_contended)."""
    waited = []

    def on_contended(sender, **kwargs):
        if kwargs["name"] == name:
            waited.append(1)

    def take() -> None:
        with Lock(name, wait=30):
            pass

    lock_contended.connect(on_contended)
    holder = Lock(name)
    holder.acquire()
    threads = [threading.Thread(target=take) for _ in range(count - 1)]
    try:
        for thread in threads:
            thread.start()
        queue = lock_keys(name, "default").queue
        wait_until(lambda: client.llen(queue) == count - 1, 10, "every thread in line")
        holder.release()
        for thread in threads:
            thread.join(60)
        assert not any(thread.is_alive() for thread in threads)
    finally:
        lock_contended.disconnect(on_contended)
    return len(waited)


def test_a_contended_run_is_counted(prometheus, redis_client):
    labels = {"kind": "lock", "group": "orders:export"}
    before = sample("redis_lock_wait_seconds_count", outcome="acquired", **labels)
    contended_before = sample("redis_lock_contended_total", **labels)
    held_before = sample("redis_lock_hold_seconds_count", **labels)
    waited = contended_run(redis_client, "orders:export", 8)
    assert waited == 7
    assert sample("redis_lock_wait_seconds_count", outcome="acquired", **labels) - before == 8
    assert sample("redis_lock_contended_total", **labels) - contended_before == waited
    assert sample("redis_lock_hold_seconds_count", **labels) - held_before == 8


def test_timeouts_and_errors_are_outcomes(prometheus, settings, redis_client, planted):
    labels = {"kind": "lock", "group": "busy"}
    holder = Lock("busy")
    holder.acquire()
    assert not Lock("busy", wait=0.05).acquire()
    holder.release()
    assert sample("redis_lock_wait_seconds_count", outcome="timed_out", **labels) >= 1
    assert sample("redis_lock_timeouts_total", **labels) >= 1
    key = lock_keys("broken", "default").lease
    redis_client.hset(key, "not", "a lock")
    planted.add(key)
    errors_before = sample("redis_lock_wait_seconds_count", kind="lock", group="broken",
                           outcome="error")  # fmt: skip
    with pytest.raises(LockBackendError):
        Lock("broken", wait=0, fencing=True).acquire()
    after = sample("redis_lock_wait_seconds_count", kind="lock", group="broken", outcome="error")
    assert after - errors_before == 1


def test_a_forced_expiry_adds_one_loss_with_its_reason(prometheus, settings, redis_client):
    settings.DJANGO_REDIS_LOCK_TIMEOUT = 0.3
    labels = {"kind": "lock", "group": "nightly", "reason": "expired"}
    before = sample("redis_lock_lost_total", **labels)
    lock = Lock("nightly")
    lock.acquire()
    redis_client.delete(lock_keys("nightly", "default").lease)
    # (Counted after ``lost`` turns True, on the watchdog's thread: waited for.)
    wait_until(
        lambda: sample("redis_lock_lost_total", **labels) - before >= 1, 10,
        "the loss noticed by renewal, and counted",
    )  # fmt: skip
    assert lock.lost
    assert sample("redis_lock_lost_total", **labels) - before == 1


def test_ten_thousand_primary_keys_give_a_handful_of_groups(prometheus):
    seen = set()
    for pk in range(10_000):
        lock = Lock(f"import:{pk}", wait=0, timeout=5)
        assert lock.acquire()
        lock.release()
        seen.add(lock.group)
    semaphore = Semaphore("renders:7", limit=2)
    with semaphore:
        pass
    assert seen == {"import"}
    groups = {
        sample.labels["group"]
        for metric in REGISTRY.collect()
        if metric.name == "redis_lock_wait_seconds"
        for sample in metric.samples
    }
    assert {"import", "renders"} <= groups
    assert len(groups) < 20  # this whole suite's groups, not one per key


def test_opentelemetry_instruments(otel_reader, redis_client):
    waited = contended_run(redis_client, "otel:sync", 4)
    assert waited == 3
    points = otel_points(otel_reader, "redis_lock.wait.duration")
    [acquired] = [p for p in points if dict(p.attributes) == {
        "kind": "lock", "group": "otel:sync", "outcome": "acquired"}]  # fmt: skip
    assert acquired.count == 4
    [contended] = [
        p
        for p in otel_points(otel_reader, "redis_lock.contended")
        if p.attributes["group"] == "otel:sync"
    ]
    assert contended.value == waited


def test_groups_and_reasons():
    assert group_of("import:42") == "import"
    assert group_of("testapp.account:17:statement") == "testapp.account"
    assert group_of("reports:nightly") == "reports:nightly"
    assert group_of("5b0c6e1a-7d2f") == "other"
    assert group_of("account:{bank-1}:42") == "account"
    assert Lock("import:1", group="import:{feed_id}").group == "import:{feed_id}"
    assert reason_kind("its lease was gone when checked") == "expired"
    assert reason_kind("Redis could not be reached to renew it") == "unreachable"
    with pytest.raises(TypeError):
        Lock("x", group="")


@pytest.mark.django_db
def test_row_locks_are_grouped_by_model():
    from tests.testapp.models import Account

    account = Account.objects.create()
    assert account.lock().group == "model:testapp.account"
    assert account.lock("statement").group == "model:testapp.account:statement"
    assert Account.lock_many([account]).locks[0].group == "model:testapp.account"


@pytest.mark.parametrize(
    ("value", "check_id"),
    [
        ("prometheus", "django_redis_lock.E004"),
        (["statsd"], "django_redis_lock.E005"),
    ],
)
def test_bad_metrics_settings_are_reported(settings, value, check_id):
    settings.DJANGO_REDIS_LOCK_METRICS = value
    try:
        assert check_id in {message.id for message in run_checks()}
        assert reports.sinks == []  # none turned on, no crash
    finally:
        settings.DJANGO_REDIS_LOCK_METRICS = []


def test_off_by_default():
    assert reports.sinks == []


def test_two_processes_in_multiprocess_mode_give_summed_counters(redis_url, tmp_path, monkeypatch):
    """prometheus_client's multi-process mode, as under gunicorn: each process writes its own
    files, and the scrape sums them."""
    # Inherited by the spawned processes, and read there when prometheus_client is imported.
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    import multiprocessing

    from prometheus_client import CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector

    from tests.support import workers

    spawn = multiprocessing.get_context("spawn")
    pool = spawn.Pool(2)
    try:
        done = pool.starmap(
            workers.metered_locks,
            [(redis_url, str(tmp_path), "mp:job", 5), (redis_url, str(tmp_path), "mp:job", 7)],
        )
    except BaseException:
        pool.terminate()
        raise
    finally:
        # Exited as a server's workers do, not killed: each writes what its timer had not.
        pool.close()
        pool.join()
    assert done == [5, 7]
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(tmp_path))
    labels = {"kind": "lock", "group": "mp:job"}

    def value(name, **more):
        return registry.get_sample_value(name, {**labels, **more})

    # 5 + 7 rounds, and in each process the holder of the timed-out wait: 14.
    assert value("redis_lock_wait_seconds_count", outcome="acquired") == 14
    assert value("redis_lock_wait_seconds_count", outcome="timed_out") == 2
    assert value("redis_lock_timeouts_total") == 2
    assert value("redis_lock_hold_seconds_count") == 14
    assert len(list(tmp_path.glob("*.db"))) >= 2  # one file per process and kind
