"""The exporters' events, appended on the lock's path and added up when read
(``metrics/buffer.py``): nothing lost to a race or a full buffer, the same figures as
``prometheus_client``'s own instruments, a buffer that stays short when nobody reads it."""

from __future__ import annotations

import logging
import multiprocessing
import threading

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client import CollectorRegistry, values

from django_redis_lock import Lock
from django_redis_lock.metrics.buffer import BufferedSink
from django_redis_lock.metrics.opentelemetry import OpenTelemetrySink
from django_redis_lock.metrics.prometheus import WAIT_BUCKETS, PrometheusSink
from django_redis_lock.primitives import reports
from tests.support import workers
from tests.support.helpers import wait_until
from tests.support.prometheus_events import (
    HOLD_COUNT,
    HOLDS,
    WAITS,
    Theirs,
    feed,
    read_files,
    samples,
)


class Counting(BufferedSink):
    def __init__(self, limit: int = 10_000) -> None:
        super().__init__()
        self.limit = limit
        self.taken: list = []
        self.batches = 0

    def take(self, events):
        self.batches += 1
        self.taken.extend(events)


def test_prometheus_sink_gives_what_prometheus_clients_instruments_give():
    """The same buckets, counts and sums, sample for sample."""
    waits, holds = WAITS, HOLDS
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    feed(PrometheusSink(registry=ours), waits, holds)
    feed(Theirs(theirs), waits, holds)
    expected = samples(theirs)
    assert samples(ours) == expected
    assert expected[("redis_lock_timeouts_total", (("group", "import"), ("kind", "lock")))] == 1
    labels = (("group", "import"), ("kind", "lock"), ("le", "+Inf"), ("outcome", "acquired"))
    assert expected[("redis_lock_wait_seconds_bucket", labels)] == 2 * len(WAIT_BUCKETS) + 1


def test_appends_racing_a_settle_are_all_taken():
    sink = Counting()
    threads_count, each = 4, 5_000
    stop = threading.Event()

    def settle_often():
        while not stop.is_set():
            sink.settle()

    def report(index):
        for n in range(each):
            sink.held("lock", f"g{index}", float(n))

    settler = threading.Thread(target=settle_often)
    settler.start()
    reporters = [threading.Thread(target=report, args=(index,)) for index in range(threads_count)]
    for thread in reporters:
        thread.start()
    for thread in reporters:
        thread.join(60)
    stop.set()
    settler.join(60)
    sink.settle()
    assert len(sink.taken) == threads_count * each
    for index in range(threads_count):  # each thread's events, once each, in its order
        mine = [event[2] for event in sink.taken if event[1] == ("lock", f"g{index}")]
        assert mine == [float(n) for n in range(each)]


def test_a_sink_nobody_reads_keeps_at_most_its_limit():
    sink = Counting(limit=100)
    for n in range(1_000):
        sink.held("lock", "import", 0.1)
        assert (n + 1) - len(sink.taken) <= 100  # never more than `limit` waiting
    assert sink.batches == 9  # at the 101st append, the 202nd...
    sink.settle()
    assert len(sink.taken) == 1_000


def test_an_exporter_slow_to_add_up_does_it_in_a_thread_of_its_own():
    sink = Counting(limit=100)
    sink.settle_in_thread = True
    takers: set[int] = set()
    take = sink.take

    def noting_taker(events):
        takers.add(threading.get_ident())
        take(events)

    sink.take = noting_taker
    for _ in range(1_000):
        sink.held("lock", "import", 0.1)
    wait_until(lambda: len(sink.taken) >= 1_000 - 101, 10, "the appended events added up")
    assert takers
    assert threading.get_ident() not in takers  # none on the lock's path
    sink.settle()
    assert len(sink.taken) == 1_000


def test_a_failing_exporter_drops_its_batch_but_not_the_lock(caplog):
    class Broken(BufferedSink):
        limit = 1

        def take(self, events):
            raise RuntimeError("exporter is broken")

    sink = Broken()
    reports.add_sink(sink)
    try:
        # Its wait, then its hold: the second append settles, and take() fails.
        with caplog.at_level(logging.ERROR, logger="django_redis_lock"), Lock("metrics:broken"):
            pass
    finally:
        reports.remove_sink(sink)
    assert "Lock metrics: 2 events dropped" in caplog.text
    again = Lock("metrics:broken", wait=0)
    assert again.acquire()  # released all the same
    again.release()


def test_opentelemetry_records_pending_events_at_each_collection():
    reader = InMemoryMetricReader()
    sink = OpenTelemetrySink(MeterProvider(metric_readers=[reader]))
    feed(sink, [(0.01, "acquired"), (0.5, "timed_out")], [0.2, 0.3])
    first = collected(reader)
    assert first["redis_lock.wait.duration"] == 2
    assert first["redis_lock.hold.duration"] == 2
    assert first["redis_lock.timeouts"] == 1
    assert first["redis_lock.lost"] == 1
    sink.held("lock", "import", 0.4)
    assert collected(reader)["redis_lock.hold.duration"] == 3  # cumulative


def collected(reader) -> dict[str, float]:
    """Each metric's total: a histogram's count, a counter's value."""
    totals: dict[str, float] = {}
    for resource in reader.get_metrics_data().resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    value = getattr(point, "count", None)
                    if value is None:
                        value = point.value
                    totals[metric.name] = totals.get(metric.name, 0) + value
    return totals


def test_the_sink_for_prometheus_multi_process_mode_is_chosen_as_prometheus_client_chose(
    monkeypatch,
):
    # prometheus_client decides once, at import, from PROMETHEUS_MULTIPROC_DIR: set its choice.
    monkeypatch.setattr(values, "ValueClass", values.MultiProcessValue())
    with pytest.raises(ValueError, match="MultiProcessPrometheusSink"):
        PrometheusSink(registry=None)


def in_multi_process_mode(monkeypatch, directory, worker, *args):
    """``worker(str(directory), *args)`` in a spawned process where prometheus_client is in
    multi-process mode, writing its files in ``directory``."""
    directory.mkdir()
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(directory))  # read at import, there
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(worker, (str(directory), *args))


def test_in_multi_process_mode_the_files_read_as_prometheus_clients_own(monkeypatch, tmp_path):
    """The sink writes counts per bucket, not an observation per event: what
    MultiProcessCollector reads back equals what prometheus_client's Histogram and Counter
    write, sample for sample."""
    in_multi_process_mode(monkeypatch, tmp_path / "ours", workers.multi_process_files, "ours")
    in_multi_process_mode(monkeypatch, tmp_path / "theirs", workers.multi_process_files, "theirs")
    expected = read_files(tmp_path / "theirs")
    # Sums added in another order may differ in their last bit; the rest exactly.
    assert read_files(tmp_path / "ours") == pytest.approx(expected, rel=1e-12, abs=0)
    labels = (("group", "import"), ("kind", "lock"), ("outcome", "acquired"))
    assert expected[("redis_lock_wait_seconds_count", labels)] == len(WAITS) - 2 + 3
    assert expected[("redis_lock_contended_total", (("group", "import"), ("kind", "lock")))] == 2


def test_in_multi_process_mode_a_timer_writes_the_events_with_no_read(monkeypatch, tmp_path):
    assert in_multi_process_mode(monkeypatch, tmp_path / "files", workers.timer_writes) == 10


def timer_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == "lock-metrics-timer"]


def test_a_timer_starts_with_the_first_event_and_stops_at_close():
    """No thread in a process that reports nothing (a server's master, before it forks)."""
    before = len(timer_threads())
    sink = Counting()
    with pytest.raises(ValueError, match="positive"):
        sink.start_settling(0)
    sink.start_settling(0.02)
    assert len(timer_threads()) == before
    sink.held("lock", "import", 0.1)
    assert len(timer_threads()) == before + 1
    wait_until(lambda: len(sink.taken) == 1, 10, "the timer's settle")  # with no read
    for _ in range(20):
        sink.held("lock", "import", 0.1)
    assert len(timer_threads()) == before + 1  # one timer, whatever the events
    sink.close()
    assert len(sink.taken) == 21
    wait_until(lambda: len(timer_threads()) == before, 10, "the timer's end")
    sink.held("lock", "import", 0.1)  # closed: added up when read, no timer
    assert len(timer_threads()) == before


def test_in_multi_process_mode_a_forked_child_counts_its_own_events_once(tmp_path, monkeypatch):
    """A sink made before a fork (a server's preloaded app): the child writes its events, not
    its parent's pending ones again; the parent writes its own."""
    directory = tmp_path / "files"
    assert in_multi_process_mode(monkeypatch, directory, workers.forked_metrics) == 0  # child's
    figures = read_files(directory)
    assert figures[HOLD_COUNT] == 5 + 3  # the parent's 5, the child's 3
    waits = ("redis_lock_wait_seconds_count", (("group", "import"), ("kind", "lock")))
    assert figures[(waits[0], (*waits[1], ("outcome", "acquired")))] == 2  # the child's 2
