"""The locks' metrics in ``prometheus_client`` (the ``prometheus`` extra).

    redis_lock_wait_seconds{kind, group, outcome}   histogram: acquired / timed_out / error
    redis_lock_hold_seconds{kind, group}            histogram: from acquisition to release
    redis_lock_contended_total{kind, group}         acquisitions that had to wait
    redis_lock_timeouts_total{kind, group}          waits that ran out
    redis_lock_lost_total{kind, group, reason}      leases lost: expired / unreachable / ...

and, read from Redis when scraped (:class:`CensusCollector`, ``census.py``), the same in every
process, including those of a process that died:

    redis_lock_held{kind, group}       locks and permits held now
    redis_lock_waiting{kind, group}    waiters queued now
    redis_lock_census_complete         1, or 0 when the census was cut short or failed
    redis_lock_census_keys             keys of our namespace it looked at

In one process (:class:`PrometheusSink`), an event is an append on the lock's path, added up
when scraped (``buffer.py``). Under a multi-process server (gunicorn, uWSGI), set
``PROMETHEUS_MULTIPROC_DIR`` as ``prometheus_client`` documents: the exporter then uses its own
histograms and counters (:class:`MultiProcessPrometheusSink`), which its
``MultiProcessCollector`` sums over the processes; add a :class:`CensusCollector` to the
registry the scrape view serves (docs/metrics.md).
"""

from __future__ import annotations

import logging
from bisect import bisect_left
from collections.abc import Iterator
from itertools import accumulate
from typing import Any

from prometheus_client import REGISTRY, Counter, Histogram, values
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.utils import floatToGoString
from redis.exceptions import RedisError

from ..census import DEFAULT_MAX_KEYS, take_census
from .buffer import CONTENDED, LOST, TIMED_OUT, WAITED, BufferedSink

__all__ = [
    "HOLD_BUCKETS",
    "WAIT_BUCKETS",
    "CensusCollector",
    "HistogramTally",
    "MultiProcessPrometheusSink",
    "PrometheusSink",
    "default_sink",
]

logger = logging.getLogger("django_redis_lock")

# Seconds: a lock's wait is from a millisecond (a handoff) to its longest wait.
WAIT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
HOLD_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600)

# Each instrument's name, help and labels, for both sinks.
_LABELS = ("kind", "group")
WAIT = ("redis_lock_wait_seconds", "Time to acquire a lock, by outcome.", (*_LABELS, "outcome"))
HOLD = ("redis_lock_hold_seconds", "Time a lock was held, to its release.", _LABELS)
CONTENTION = ("redis_lock_contended", "Acquisitions that found the lock held and waited.", _LABELS)
TIMEOUTS = ("redis_lock_timeouts", "Waits for a lock that ran out.", _LABELS)
LOSSES = ("redis_lock_lost", "Leases lost while held, by reason.", (*_LABELS, "reason"))


class PrometheusSink(BufferedSink):
    """The instruments of one process, added up when scraped (``buffer.py``): a collector,
    registered in ``registry`` (by default ``prometheus_client``'s). For a server of one process
    per registry; under ``PROMETHEUS_MULTIPROC_DIR``, :class:`MultiProcessPrometheusSink`."""

    limit = 1_000  # adding up 1,000 events takes well under a millisecond

    def __init__(self, registry: Any = REGISTRY) -> None:
        if values.ValueClass is not values.MutexValue:
            raise ValueError(
                "prometheus_client is in multi-process mode (PROMETHEUS_MULTIPROC_DIR): a scrape "
                "reads its files, not this process; use MultiProcessPrometheusSink."
            )
        super().__init__()
        self.waits: dict[tuple[str, ...], HistogramTally] = {}  # by label values
        self.holds: dict[tuple[str, ...], HistogramTally] = {}
        if registry is not None:
            registry.register(self)

    def observe(self, what: str, labels: tuple[str, ...], seconds: float) -> None:
        if what == WAITED:
            HistogramTally.of(self.waits, labels, WAIT_BUCKETS).observe(seconds)
        else:
            HistogramTally.of(self.holds, labels, HOLD_BUCKETS).observe(seconds)

    def describe(self) -> Iterator[Metric]:
        return iter(self._families())

    def collect(self) -> Iterator[Metric]:
        wait, hold, contended, timeouts, lost = families = self._families()
        with self.settled():
            for family, tallies, bounds in (
                (wait, self.waits, WAIT_BUCKETS),
                (hold, self.holds, HOLD_BUCKETS),
            ):
                names = (*map(floatToGoString, bounds), "+Inf")
                for labels, tally in tallies.items():
                    cumulative = list(zip(names, accumulate(tally.counts), strict=True))
                    family.add_metric(labels, cumulative, tally.total)
            for family, what in ((contended, CONTENDED), (timeouts, TIMED_OUT), (lost, LOST)):
                for labels, count in self.counts[what].items():
                    family.add_metric(labels, count)
        return iter(families)

    def _families(self) -> tuple[Any, ...]:  # two HistogramMetricFamily, three Counter...
        def histogram(name: str, doc: str, labels: tuple[str, ...]) -> HistogramMetricFamily:
            return HistogramMetricFamily(name, doc, labels=labels)

        def counter(name: str, doc: str, labels: tuple[str, ...]) -> CounterMetricFamily:
            return CounterMetricFamily(name, doc, labels=labels)

        return (
            histogram(*WAIT), histogram(*HOLD),
            counter(*CONTENTION), counter(*TIMEOUTS), counter(*LOSSES),
        )  # fmt: skip


class HistogramTally:
    """One label set's histogram: how many fell in each bucket (not cumulative; ``+Inf``
    last), and their sum."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0

    @classmethod
    def of(
        cls, tallies: dict[tuple[str, ...], HistogramTally], labels: tuple[str, ...],
        bounds: tuple[float, ...],
    ) -> HistogramTally:  # fmt: skip
        tally = tallies.get(labels)
        if tally is None:
            tally = tallies[labels] = cls(bounds)
        return tally

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(self.bounds, seconds)] += 1  # the first bound >= seconds
        self.total += seconds


class MultiProcessPrometheusSink:
    """The instruments as ``prometheus_client``'s own ``Histogram`` and ``Counter``, which, under
    ``PROMETHEUS_MULTIPROC_DIR``, write to the files its ``MultiProcessCollector`` sums. Each
    event costs their locks (about 1.2 µs an observation) on the lock's path."""

    def __init__(self, registry: Any = REGISTRY) -> None:
        self.wait = Histogram(*WAIT, buckets=WAIT_BUCKETS, registry=registry)
        self.hold = Histogram(*HOLD, buckets=HOLD_BUCKETS, registry=registry)
        self.contention = Counter(*CONTENTION, registry=registry)
        self.timeouts = Counter(*TIMEOUTS, registry=registry)
        self.losses = Counter(*LOSSES, registry=registry)

        # Each label set's child, found once: labels() checks and locks on every call.
        self._children: dict[tuple[Any, ...], Any] = {}

    def _child(self, metric: Any, *labels: str) -> Any:
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def waited(self, kind: str, group: str, outcome: str, seconds: float) -> None:
        self._child(self.wait, kind, group, outcome).observe(seconds)
        if outcome == TIMED_OUT:
            self._child(self.timeouts, kind, group).inc()

    def held(self, kind: str, group: str, seconds: float) -> None:
        self._child(self.hold, kind, group).observe(seconds)

    def contended(self, kind: str, group: str) -> None:
        self._child(self.contention, kind, group).inc()

    def lost(self, kind: str, group: str, reason: str) -> None:
        self._child(self.losses, kind, group, reason).inc()


class CensusCollector:
    """The held and waiting gauges, from a census of Redis at each scrape (``census.py``):
    one ``SCAN`` of the lock namespace of cache ``using``, at most ``max_keys`` keys. Registered
    in ``registry`` (None: not registered). A Redis that cannot be read gives
    ``redis_lock_census_complete 0`` and a WARNING, not a failed scrape."""

    def __init__(
        self, *, using: str | None = None, max_keys: int = DEFAULT_MAX_KEYS,
        registry: Any = REGISTRY,
    ) -> None:  # fmt: skip
        self.using, self.max_keys = using, max_keys
        if registry is not None:
            registry.register(self)

    def _families(self) -> tuple[GaugeMetricFamily, ...]:
        labels = ("kind", "group")
        return (
            GaugeMetricFamily("redis_lock_held", "Locks and permits held now.", labels=labels),
            GaugeMetricFamily("redis_lock_waiting", "Waiters queued now.", labels=labels),
            GaugeMetricFamily(
                "redis_lock_census_complete",
                "1 when the held and waiting gauges counted every key of the lock namespace.",
            ),
            GaugeMetricFamily(
                "redis_lock_census_keys", "Keys of the lock namespace the census looked at."
            ),
        )

    def describe(self) -> Iterator[GaugeMetricFamily]:
        # Given, so that registering takes no census (the registry would collect to learn
        # the names otherwise).
        return iter(self._families())

    def collect(self) -> Iterator[GaugeMetricFamily]:
        held, waiting, complete, scanned = self._families()
        try:
            census = take_census(using=self.using, max_keys=self.max_keys)
        except RedisError as exc:
            logger.warning("Lock gauges: cannot read Redis: %s", exc)
            complete.add_metric([], 0)
            yield complete
            return
        for (kind, group), figures in census.groups().items():
            held.add_metric([kind, group], figures.held)
            waiting.add_metric([kind, group], figures.waiting)
        complete.add_metric([], 1 if census.complete else 0)
        scanned.add_metric([], census.keys_scanned)
        yield from (held, waiting, complete, scanned)


_default: PrometheusSink | MultiProcessPrometheusSink | None = None


def default_sink() -> PrometheusSink | MultiProcessPrometheusSink:
    """The sink in ``prometheus_client``'s default registry, with a :class:`CensusCollector`
    (made once: a registry takes each name once). Which sink is chosen as
    ``prometheus_client`` chose its values: by ``PROMETHEUS_MULTIPROC_DIR``."""
    global _default
    if _default is None:
        if values.ValueClass is values.MutexValue:
            _default = PrometheusSink()
        else:
            _default = MultiProcessPrometheusSink()
        CensusCollector()
    return _default
