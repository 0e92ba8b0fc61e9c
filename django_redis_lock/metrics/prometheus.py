"""The locks' metrics in ``prometheus_client`` (the ``prometheus`` extra).

    redis_lock_wait_seconds{kind, group, outcome}   histogram: acquired / timed_out / error
    redis_lock_hold_seconds{kind, group}            histogram: from acquisition to release
    redis_lock_contended_total{kind, group}         acquisitions that had to wait
    redis_lock_timeouts_total{kind, group}          waits that ran out
    redis_lock_lost_total{kind, group, reason}      leases lost: expired / unreachable / ...

Under a multi-process server (gunicorn, uWSGI), set ``PROMETHEUS_MULTIPROC_DIR`` as
``prometheus_client`` documents: these are plain counters and histograms, so its
``MultiProcessCollector`` sums them over the processes.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import REGISTRY, Counter, Histogram

__all__ = ["HOLD_BUCKETS", "WAIT_BUCKETS", "PrometheusSink", "default_sink"]

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

    def waited(self, kind: str, group: str, outcome: str, seconds: float) -> None:
        self.wait.labels(kind, group, outcome).observe(seconds)
        if outcome == "timed_out":
            self.timeouts.labels(kind, group).inc()

    def held(self, kind: str, group: str, seconds: float) -> None:
        self.hold.labels(kind, group).observe(seconds)

    def contended(self, kind: str, group: str) -> None:
        self.contention.labels(kind, group).inc()

    def lost(self, kind: str, group: str, reason: str) -> None:
        self.losses.labels(kind, group, reason).inc()


_default: PrometheusSink | None = None


def default_sink() -> PrometheusSink:
    """The sink in ``prometheus_client``'s default registry (made once: a registry takes each
    name once)."""
    global _default
    if _default is None:
        _default = PrometheusSink()
    return _default
