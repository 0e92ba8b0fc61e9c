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
from prometheus_client import CollectorRegistry, Counter, Histogram, values
from prometheus_client.multiprocess import MultiProcessCollector

from django_redis_lock import Lock
from django_redis_lock.metrics import hub
from django_redis_lock.metrics.buffer import BufferedSink
from django_redis_lock.metrics.histograms import CONTENTION, HOLD, LOSSES, TIMEOUTS, WAIT
from django_redis_lock.metrics.opentelemetry import OpenTelemetrySink
from django_redis_lock.metrics.prometheus import (
    HOLD_BUCKETS,
    WAIT_BUCKETS,
    MultiProcessPrometheusSink,
    PrometheusSink,
)
from tests import workers
from tests.helpers import wait_until


class Counting(BufferedSink):
    def __init__(self, limit: int = 10_000) -> None:
        super().__init__()
        self.limit = limit
        self.taken: list = []
        self.batches = 0

    def take(self, events):
        self.batches += 1
        self.taken.extend(events)


class Theirs:
    """prometheus_client's own instruments, one per event: what the sinks must equal."""

    def __init__(self, registry) -> None:
        self.wait = Histogram(*WAIT, buckets=WAIT_BUCKETS, registry=registry)
        self.hold = Histogram(*HOLD, buckets=HOLD_BUCKETS, registry=registry)
        self.counters = [Counter(*spec, registry=registry) for spec in (CONTENTION, TIMEOUTS)]
        self.losses = Counter(*LOSSES, registry=registry)

    def waited(self, kind, group, outcome, seconds):
        self.wait.labels(kind, group, outcome).observe(seconds)
        if outcome == "timed_out":
            self.counters[1].labels(kind, group).inc()

    def held(self, kind, group, seconds):
        self.hold.labels(kind, group).observe(seconds)

    def contended(self, kind, group):
        self.counters[0].labels(kind, group).inc()

    def lost(self, kind, group, reason):
        self.losses.labels(kind, group, reason).inc()


def feed(sink, waits, holds) -> None:
    for seconds, outcome in waits:
        sink.waited("lock", "import", outcome, seconds)
    for seconds in holds:
        sink.held("lock", "import", seconds)
    sink.contended("lock", "import")
    sink.lost("semaphore", "renders", "expired")


def samples(registry) -> dict[tuple, float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for metric in registry.collect()
        for sample in metric.samples
        if not sample.name.endswith("_created")
    }


# Bounds themselves (a value equal to a bucket's bound falls in it), values between them, past
# the last, and zero.
WAITS = [(bound, "acquired") for bound in WAIT_BUCKETS]
WAITS += [(bound * 1.5, "acquired") for bound in WAIT_BUCKETS] + [(0.0, "acquired")]
WAITS += [(600.0, "timed_out"), (0.2, "error")]
HOLDS = [*HOLD_BUCKETS, 0.0, 0.003, 7200.0]


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
    hub.add(sink)
    try:
        # Its wait, then its hold: the second append settles, and take() fails.
        with caplog.at_level(logging.ERROR, logger="django_redis_lock"), Lock("metrics:broken"):
            pass
    finally:
        hub.remove(sink)
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


def read_files(directory) -> dict[tuple, float]:
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(directory))
    return samples(registry)


def multi_process_mode(monkeypatch, directory) -> None:
    """prometheus_client as it is when PROMETHEUS_MULTIPROC_DIR=directory at its import (each
    call a new set of files)."""
    directory.mkdir()
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(directory))
    monkeypatch.setattr(values, "ValueClass", values.MultiProcessValue())


def test_in_multi_process_mode_the_files_read_as_prometheus_clients_own(monkeypatch, tmp_path):
    """The sink writes counts per bucket, not an observation per event: what
    MultiProcessCollector reads back equals what prometheus_client's Histogram and Counter
    write, sample for sample."""
    multi_process_mode(monkeypatch, tmp_path / "ours")
    sink = MultiProcessPrometheusSink(every=3600)
    try:
        feed(sink, WAITS, HOLDS)
        sink.settle()
        feed(sink, WAITS[:3], HOLDS[:2])  # a second write adds to the first
    finally:
        sink.close()  # and writes what is pending
    multi_process_mode(monkeypatch, tmp_path / "theirs")
    theirs = Theirs(registry=None)
    feed(theirs, WAITS, HOLDS)
    feed(theirs, WAITS[:3], HOLDS[:2])
    expected = read_files(tmp_path / "theirs")
    # Sums added in another order may differ in their last bit; the rest exactly.
    assert read_files(tmp_path / "ours") == pytest.approx(expected, rel=1e-12, abs=0)
    labels = (("group", "import"), ("kind", "lock"), ("outcome", "acquired"))
    assert expected[("redis_lock_wait_seconds_count", labels)] == len(WAITS) - 2 + 3
    assert expected[("redis_lock_contended_total", (("group", "import"), ("kind", "lock")))] == 2


def test_in_multi_process_mode_a_timer_writes_the_events_with_no_read(monkeypatch, tmp_path):
    multi_process_mode(monkeypatch, tmp_path / "files")
    sink = MultiProcessPrometheusSink(every=0.05)
    key = ("redis_lock_hold_seconds_count", (("group", "import"), ("kind", "lock")))
    try:
        for _ in range(10):
            sink.held("lock", "import", 0.1)
        wait_until(lambda: read_files(tmp_path / "files").get(key) == 10, 10, "the timer's write")
    finally:
        sink.close()
    with pytest.raises(ValueError, match="positive"):
        sink.start_settling(0)


def test_in_multi_process_mode_a_forked_child_counts_its_own_events_once(tmp_path, monkeypatch):
    """A sink made before a fork (a server's preloaded app): the child writes its events, not
    its parent's pending ones again; the parent writes its own."""
    directory = tmp_path / "files"
    directory.mkdir()
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(directory))  # read at import, there
    spawn = multiprocessing.get_context("spawn")
    with spawn.Pool(1) as pool:
        child_exit = pool.apply(workers.forked_metrics, (str(directory),))
    assert child_exit == 0
    figures = read_files(directory)
    holds = ("redis_lock_hold_seconds_count", (("group", "import"), ("kind", "lock")))
    assert figures[holds] == 5 + 3  # the parent's 5, the child's 3
    waits = ("redis_lock_wait_seconds_count", (("group", "import"), ("kind", "lock")))
    assert figures[(waits[0], (*waits[1], ("outcome", "acquired")))] == 2  # the child's 2
