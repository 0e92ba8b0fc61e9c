"""The locks' metrics in ``prometheus_client`` (the ``prometheus`` extra).

    redis_lock_wait_seconds{kind, group, outcome}   histogram: acquired / timed_out / error
    redis_lock_hold_seconds{kind, group}            histogram: from acquisition to release
    redis_lock_contended_total{kind, group}         acquisitions that had to wait
    redis_lock_timeouts_total{kind, group}          waits that ran out
    redis_lock_lost_total{kind, group, reason}      leases lost: expired / unreachable / ...

and, read from Redis when scraped (:class:`CensusCollector`, ``registry/census.py``), the same
in every process, including those of a process that died:

    redis_lock_held{kind, group}       locks and permits held now
    redis_lock_waiting{kind, group}    waiters queued now
    redis_lock_census_complete         1, or 0 when the census was cut short or failed
    redis_lock_census_keys             keys of our namespace it looked at

In one process (:class:`PrometheusSink`), an event is an append on the lock's path, added up
when scraped (``buffer.py``). Under a multi-process server (gunicorn, uWSGI), set
``PROMETHEUS_MULTIPROC_DIR`` as ``prometheus_client`` documents: the exporter then writes to
its files each second (:class:`MultiProcessPrometheusSink`, ``prometheus_files.py``), which its
``MultiProcessCollector`` sums over the processes; add a :class:`CensusCollector` to the
registry the scrape view serves (docs/metrics.md).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from itertools import accumulate
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    generate_latest,
    values,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.utils import floatToGoString
from redis.exceptions import RedisError

from ..registry.census import DEFAULT_MAX_KEYS, take_census
from .buffer import CONTENDED, LOST, TIMED_OUT
from .histograms import (
    CONTENTION,
    HOLD,
    HOLD_BUCKETS,
    LOSSES,
    TIMEOUTS,
    WAIT,
    WAIT_BUCKETS,
    HistogramTally,
    TallyingSink,
)
from .prometheus_files import MultiProcessPrometheusSink

__all__ = [
    "HOLD_BUCKETS",
    "WAIT_BUCKETS",
    "CensusCollector",
    "HistogramTally",
    "MultiProcessPrometheusSink",
    "PrometheusSink",
    "default_sink",
    "exposition",
]

logger = logging.getLogger("django_redis_lock")


class PrometheusSink(TallyingSink):
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
        if registry is not None:
            registry.register(self)

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


class CensusCollector:
    """The held and waiting gauges, from a census of Redis at each scrape (``registry/census.py``):
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


def exposition() -> tuple[bytes, str]:
    """What a scrape of this process serves, and its content type (``metrics/views.py``):
    ``prometheus_client``'s default registry, where :func:`default_sink` counts, with the
    census; under ``PROMETHEUS_MULTIPROC_DIR``, the sums of every process's files, as its
    ``MultiProcessCollector`` reads them, with a census of its own."""
    if values.ValueClass is values.MutexValue:
        registry = REGISTRY
    else:
        registry = CollectorRegistry()
        MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        CensusCollector(registry=registry)
    return generate_latest(registry), CONTENT_TYPE_LATEST
