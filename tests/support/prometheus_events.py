"""The events the Prometheus exporters' tests feed, and ``prometheus_client``'s own instruments
to compare the exporters with. Imported in the test process and in spawned workers (there,
after ``PROMETHEUS_MULTIPROC_DIR`` is set, so that ``prometheus_client`` writes files)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.multiprocess import MultiProcessCollector

from django_redis_lock.metrics.histograms import CONTENTION, HOLD, LOSSES, TIMEOUTS, WAIT
from django_redis_lock.metrics.prometheus import HOLD_BUCKETS, WAIT_BUCKETS

# Bounds themselves (a value equal to a bucket's bound falls in it), values between them, past
# the last, and zero.
WAITS = [(bound, "acquired") for bound in WAIT_BUCKETS]
WAITS += [(bound * 1.5, "acquired") for bound in WAIT_BUCKETS] + [(0.0, "acquired")]
WAITS += [(600.0, "timed_out"), (0.2, "error")]
HOLDS = [*HOLD_BUCKETS, 0.0, 0.003, 7200.0]


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


def read_files(directory) -> dict[tuple, float]:
    """What a scrape of a multi-process server reads from the files in ``directory``."""
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(directory))
    return samples(registry)


HOLD_COUNT = ("redis_lock_hold_seconds_count", (("group", "import"), ("kind", "lock")))
