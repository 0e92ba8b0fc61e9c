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

Under a multi-process server (gunicorn, uWSGI), set ``PROMETHEUS_MULTIPROC_DIR`` as
``prometheus_client`` documents: the counters and histograms are plain ones, so its
``MultiProcessCollector`` sums them over the processes; add a :class:`CensusCollector` to the
registry the scrape view serves (docs/metrics.md).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from prometheus_client import REGISTRY, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from redis.exceptions import RedisError

from ..census import DEFAULT_MAX_KEYS, take_census

__all__ = ["HOLD_BUCKETS", "WAIT_BUCKETS", "CensusCollector", "PrometheusSink", "default_sink"]

logger = logging.getLogger("django_redis_lock")

# Seconds: a lock's wait is from a millisecond (a handoff) to its longest wait.
WAIT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
HOLD_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600)


class PrometheusSink:
    """The instruments, registered in ``registry`` (by default ``prometheus_client``'s)."""

    def __init__(self, registry: Any = REGISTRY) -> None:
        labels = ("kind", "group")
        self.wait = Histogram(
            "redis_lock_wait_seconds", "Time to acquire a lock, by outcome.",
            (*labels, "outcome"), buckets=WAIT_BUCKETS, registry=registry,
        )  # fmt: skip
        self.hold = Histogram(
            "redis_lock_hold_seconds", "Time a lock was held, to its release.", labels,
            buckets=HOLD_BUCKETS, registry=registry,
        )  # fmt: skip
        self.contention = Counter(
            "redis_lock_contended", "Acquisitions that found the lock held and waited.", labels,
            registry=registry,
        )  # fmt: skip
        self.timeouts = Counter(
            "redis_lock_timeouts", "Waits for a lock that ran out.", labels, registry=registry
        )
        self.losses = Counter(
            "redis_lock_lost", "Leases lost while held, by reason.", (*labels, "reason"),
            registry=registry,
        )  # fmt: skip

        # Each label set's child, found once: labels() checks and locks on every call, and an
        # acquisition reports two events (the goal is a few µs per acquisition).
        self._children: dict[tuple[Any, ...], Any] = {}

    def _child(self, metric: Any, *labels: str) -> Any:
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def waited(self, kind: str, group: str, outcome: str, seconds: float) -> None:
        self._child(self.wait, kind, group, outcome).observe(seconds)
        if outcome == "timed_out":
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


_default: PrometheusSink | None = None


def default_sink() -> PrometheusSink:
    """The sink in ``prometheus_client``'s default registry, with a :class:`CensusCollector`
    (made once: a registry takes each name once)."""
    global _default
    if _default is None:
        _default = PrometheusSink()
        CensusCollector()
    return _default
