"""The locks' metrics through the OpenTelemetry metrics API (the ``opentelemetry`` extra).

Named by OpenTelemetry's conventions (dotted, in seconds), after its database connection pool
metrics (``db.client.connection.wait_time``...), the closest it has to locks:

    redis_lock.wait.duration   histogram, s   attributes: kind, group, outcome
    redis_lock.hold.duration   histogram, s   kind, group
    redis_lock.contended       counter        kind, group
    redis_lock.timeouts        counter        kind, group
    redis_lock.lost            counter        kind, group, reason

An exporter to Prometheus names them ``redis_lock_wait_duration_seconds``... The meter comes
from the global meter provider unless one is given.

:func:`observe_census` adds the figures about the present, read from Redis at each collection
(``census.py``), after ``db.client.connection.count`` and ``.pending_requests``:

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

from ..census import DEFAULT_MAX_KEYS, Census, take_census

__all__ = ["OpenTelemetrySink", "default_sink", "observe_census"]


class OpenTelemetrySink:
    def __init__(self, meter_provider: Any = None) -> None:
        meter = metrics.get_meter("django_redis_lock", meter_provider=meter_provider)
        self.wait = meter.create_histogram(
            "redis_lock.wait.duration", unit="s", description="Time to acquire a lock."
        )
        self.hold = meter.create_histogram(
            "redis_lock.hold.duration", unit="s", description="Time a lock was held."
        )
        self.contention = meter.create_counter(
            "redis_lock.contended", description="Acquisitions that found the lock held and waited."
        )
        self.timeouts = meter.create_counter(
            "redis_lock.timeouts", description="Waits for a lock that ran out."
        )
        self.losses = meter.create_counter(
            "redis_lock.lost", description="Leases lost while held."
        )

        self._attributes: dict[tuple[str, ...], dict[str, str]] = {}

    def _of(self, kind: str, group: str, extra: str = "", value: str = "") -> dict[str, str]:
        """The attributes of a label set, made once (and never mutated: the SDK keeps them)."""
        key = (kind, group, extra, value)
        attributes = self._attributes.get(key)
        if attributes is None:
            attributes = {"kind": kind, "group": group, **({extra: value} if extra else {})}
            self._attributes[key] = attributes
        return attributes

    def waited(self, kind: str, group: str, outcome: str, seconds: float) -> None:
        self.wait.record(seconds, self._of(kind, group, "outcome", outcome))
        if outcome == "timed_out":
            self.timeouts.add(1, self._of(kind, group))

    def held(self, kind: str, group: str, seconds: float) -> None:
        self.hold.record(seconds, self._of(kind, group))

    def contended(self, kind: str, group: str) -> None:
        self.contention.add(1, self._of(kind, group))

    def lost(self, kind: str, group: str, reason: str) -> None:
        self.losses.add(1, self._of(kind, group, "reason", reason))


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
