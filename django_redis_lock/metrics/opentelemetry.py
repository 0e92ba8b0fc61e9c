"""The locks' metrics through the OpenTelemetry metrics API (the ``opentelemetry`` extra).

Named by OpenTelemetry's conventions (dotted, in seconds), after its database connection pool
metrics (``db.client.connection.wait_time``...), the closest it has to locks:

    redis_lock.wait.duration   histogram, s   attributes: kind, group, outcome
    redis_lock.hold.duration   histogram, s   kind, group
    redis_lock.contended       counter        kind, group           (observable)
    redis_lock.timeouts        counter        kind, group           (observable)
    redis_lock.lost            counter        kind, group, reason   (observable)

An exporter to Prometheus names them ``redis_lock_wait_duration_seconds``... The meter comes
from the global meter provider unless one is given.

:func:`observe_census` adds the figures about the present, read from Redis at each collection
(``registry/census.py``), after ``db.client.connection.count`` and ``.pending_requests``:

    redis_lock.held      observable gauge, {lock}      kind, group
    redis_lock.waiting   observable gauge, {waiter}    kind, group

Each collection takes a census (a ``SCAN`` of the lock namespace): call it in one process
(a scheduler, a sidecar), not in each web worker.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from opentelemetry import metrics

from ..registry.census import DEFAULT_MAX_KEYS, Census, take_census
from .buffer import CONTENDED, LOST, TIMED_OUT, WAITED, BufferedSink

__all__ = ["OpenTelemetrySink", "default_sink", "observe_census"]


class OpenTelemetrySink(BufferedSink):
    """The instruments on a meter of ``meter_provider``. An event is an append on the lock's
    path (``buffer.py``): the SDK's ``record()`` costs 5 to 8 µs. At each collection, the
    counters' callbacks (observable counters, read from this sink's tallies) first record the
    pending waits and holds into the histograms, so that the collection counts every event
    before it. Recorded then, they carry no exemplar of the span they happened in."""

    # Past 10,000 events between collections, a thread records them: on the spot, that would
    # be a pause of 10,000 record() calls in one acquisition.
    settle_in_thread = True

    def __init__(self, meter_provider: Any = None) -> None:
        super().__init__()
        meter = metrics.get_meter("django_redis_lock", meter_provider=meter_provider)
        self.wait = meter.create_histogram(
            "redis_lock.wait.duration", unit="s", description="Time to acquire a lock."
        )
        self.hold = meter.create_histogram(
            "redis_lock.hold.duration", unit="s", description="Time a lock was held."
        )
        counters = {
            CONTENDED: (
                "redis_lock.contended",
                "Acquisitions that found the lock held and waited.",
            ),
            TIMED_OUT: ("redis_lock.timeouts", "Waits for a lock that ran out."),
            LOST: ("redis_lock.lost", "Leases lost while held."),
        }
        for what, (name, description) in counters.items():
            meter.create_observable_counter(
                name, callbacks=[self._observer(what)], description=description
            )
        self._attributes: dict[tuple[str, tuple[str, ...]], dict[str, str]] = {}

    def _of(self, labels: tuple[str, ...], extra: str = "") -> dict[str, str]:
        """The attributes of a label set, made once (and never mutated: the SDK keeps them)."""
        attributes = self._attributes.get((extra, labels))
        if attributes is None:
            attributes = {"kind": labels[0], "group": labels[1]}
            if extra:
                attributes[extra] = labels[2]
            self._attributes[extra, labels] = attributes
        return attributes

    def observe(self, what: str, labels: tuple[str, ...], seconds: float) -> None:
        if what == WAITED:
            self.wait.record(seconds, self._of(labels, "outcome"))
        else:
            self.hold.record(seconds, self._of(labels))

    def _observer(self, what: str) -> Callable[[Any], Iterable[metrics.Observation]]:
        extra = "reason" if what == LOST else ""

        def callback(options: Any) -> Iterable[metrics.Observation]:
            with self.settled():
                return [
                    metrics.Observation(count, self._of(labels, extra))
                    for labels, count in self.counts[what].items()
                ]

        return callback


_default: OpenTelemetrySink | None = None


def default_sink() -> OpenTelemetrySink:
    """The sink on the global meter provider (made once)."""
    global _default
    if _default is None:
        _default = OpenTelemetrySink()
    return _default


class _RecentCensus:
    """One census for the gauges of one collection (both are asked for back to back)."""

    def __init__(self, take: Callable[[], Census], reuse: float, clock: Callable[[], float]):
        self.take, self.reuse, self.clock = take, reuse, clock
        self.census: Census | None = None
        self.taken_at = -float("inf")

    def get(self) -> Census:
        now = self.clock()
        if self.census is None or now - self.taken_at >= self.reuse:
            self.census, self.taken_at = self.take(), now
        return self.census


def observe_census(
    meter_provider: Any = None, *, using: str | None = None, max_keys: int = DEFAULT_MAX_KEYS,
    reuse: float = 1.0, clock: Callable[[], float] = time.monotonic,
) -> None:  # fmt: skip
    """Register the observable gauges ``redis_lock.held`` and ``redis_lock.waiting``, from a
    census of cache ``using`` at most every ``reuse`` seconds (one serves both gauges)."""
    meter = metrics.get_meter("django_redis_lock", meter_provider=meter_provider)
    recent = _RecentCensus(lambda: take_census(using=using, max_keys=max_keys), reuse, clock)

    def observe(figure: str) -> Callable[[Any], Iterable[metrics.Observation]]:
        def callback(options: Any) -> Iterable[metrics.Observation]:
            return [
                metrics.Observation(getattr(figures, figure), {"kind": kind, "group": group})
                for (kind, group), figures in recent.get().groups().items()
            ]

        return callback

    meter.create_observable_gauge(
        "redis_lock.held", callbacks=[observe("held")], unit="{lock}",
        description="Locks and permits held now.",
    )  # fmt: skip
    meter.create_observable_gauge(
        "redis_lock.waiting", callbacks=[observe("waiting")], unit="{waiter}",
        description="Waiters queued now.",
    )  # fmt: skip
