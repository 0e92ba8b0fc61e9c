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
"""

from __future__ import annotations

from typing import Any

from opentelemetry import metrics

__all__ = ["OpenTelemetrySink", "default_sink"]


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

    def waited(self, kind: str, group: str, outcome: str, seconds: float) -> None:
        self.wait.record(seconds, {"kind": kind, "group": group, "outcome": outcome})
        if outcome == "timed_out":
            self.timeouts.add(1, {"kind": kind, "group": group})

    def held(self, kind: str, group: str, seconds: float) -> None:
        self.hold.record(seconds, {"kind": kind, "group": group})

    def contended(self, kind: str, group: str) -> None:
        self.contention.add(1, {"kind": kind, "group": group})

    def lost(self, kind: str, group: str, reason: str) -> None:
        self.losses.add(1, {"kind": kind, "group": group, "reason": reason})


_default: OpenTelemetrySink | None = None


def default_sink() -> OpenTelemetrySink:
    """The sink on the global meter provider (made once)."""
    global _default
    if _default is None:
        _default = OpenTelemetrySink()
    return _default
