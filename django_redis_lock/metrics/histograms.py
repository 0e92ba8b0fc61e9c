"""The Prometheus instruments' names and buckets, and their histograms kept as a count per bucket:
what both Prometheus exporters add their events up into (``prometheus.py`` for one process,
``prometheus_files.py`` for a multi-process server).
"""

from __future__ import annotations

from bisect import bisect_left

from .buffer import WAITED, BufferedSink

__all__ = [
    "CONTENTION",
    "HOLD",
    "HOLD_BUCKETS",
    "LOSSES",
    "TIMEOUTS",
    "WAIT",
    "WAIT_BUCKETS",
    "HistogramTally",
    "TallyingSink",
]

# Seconds: a lock's wait is from a millisecond (a handoff) to its longest wait.
WAIT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
HOLD_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600)

# Each instrument's name, help and labels, for both exporters.
_LABELS = ("kind", "group")
WAIT = ("redis_lock_wait_seconds", "Time to acquire a lock, by outcome.", (*_LABELS, "outcome"))
HOLD = ("redis_lock_hold_seconds", "Time a lock was held, to its release.", _LABELS)
CONTENTION = ("redis_lock_contended", "Acquisitions that found the lock held and waited.", _LABELS)
TIMEOUTS = ("redis_lock_timeouts", "Waits for a lock that ran out.", _LABELS)
LOSSES = ("redis_lock_lost", "Leases lost while held, by reason.", (*_LABELS, "reason"))


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


class TallyingSink(BufferedSink):
    """A :class:`BufferedSink` that adds the waits and holds up into a :class:`HistogramTally`
    per label set: ``waits`` (by kind, group, outcome) and ``holds`` (by kind, group)."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: dict[tuple[str, ...], HistogramTally] = {}
        self.holds: dict[tuple[str, ...], HistogramTally] = {}

    def observe(self, what: str, labels: tuple[str, ...], seconds: float) -> None:
        if what == WAITED:
            HistogramTally.of(self.waits, labels, WAIT_BUCKETS).observe(seconds)
        else:
            HistogramTally.of(self.holds, labels, HOLD_BUCKETS).observe(seconds)
