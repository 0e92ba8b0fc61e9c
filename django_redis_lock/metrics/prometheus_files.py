"""The Prometheus exporter of a multi-process server (gunicorn, uWSGI), when
``PROMETHEUS_MULTIPROC_DIR`` is set: the figures go into ``prometheus_client``'s files, one per
process, which its ``MultiProcessCollector`` sums at the scrape.

Why not ``prometheus_client``'s ``Histogram``: its ``observe()`` writes two values to the file,
each under a lock (1.5 to 2.6 µs an event on the benchmark VM), and an acquisition has two. Here
an event is an append (``buffer.py``); a timer adds them up each second into counts per bucket
(``histograms.py``) and writes each count that changed once: the values the ``Histogram`` and
``Counter`` would write, made by ``prometheus_client.values.ValueClass`` under the same keys
(the metric's name, the sample's name, its labels, with ``le`` for a bucket). That layout is the
one thing taken from ``prometheus_client`` beyond its documented API; a test writes the same
events both ways and compares what the collector reads
(tests/metrics/test_metrics_buffer.py), in the oldest ``prometheus_client`` we admit and the
newest.
"""

from __future__ import annotations

import math
from typing import Any

from prometheus_client import values
from prometheus_client.utils import floatToGoString

from .buffer import CONTENDED, LOST, TIMED_OUT, Event
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

__all__ = ["MultiProcessPrometheusSink"]

Spec = tuple[str, str, tuple[str, ...]]  # name, help, label names (histograms.py)


def _file_value(kind: str, spec: Spec, sample: str, labels: tuple[str, ...], le: str = "") -> Any:
    name, documentation, label_names = spec
    if le:
        label_names, labels = (*label_names, "le"), (*labels, le)
    return values.ValueClass(kind, name, name + sample, label_names, labels, documentation)


class _FileHistogram:
    """One label set's histogram in this process's file: its buckets (not cumulative: the
    collector adds them up) and its sum."""

    __slots__ = ("buckets", "total")

    def __init__(self, spec: Spec, bounds: tuple[float, ...], labels: tuple[str, ...]) -> None:
        self.buckets = [
            _file_value("histogram", spec, "_bucket", labels, le)
            for le in map(floatToGoString, (*bounds, math.inf))  # as its Histogram names them
        ]
        self.total = _file_value("histogram", spec, "_sum", labels)

    def add(self, tally: HistogramTally) -> None:
        for value, count in zip(self.buckets, tally.counts, strict=True):
            if count:
                value.inc(count)
        self.total.inc(tally.total)


class MultiProcessPrometheusSink(TallyingSink):
    """The instruments of one process of a multi-process server, written every ``every``
    seconds (and every 1,000 events, and at a normal exit) to ``prometheus_client``'s files: a
    scrape sees an event within about ``every`` seconds; a process killed loses at most those.
    Made before a fork (a server's preloaded app), it carries on in each child."""

    limit = 1_000

    def __init__(self, every: float = 1.0) -> None:
        if values.ValueClass is values.MutexValue:
            raise ValueError(
                "prometheus_client is not in multi-process mode (set PROMETHEUS_MULTIPROC_DIR "
                "before it is imported): use PrometheusSink."
            )
        super().__init__()
        # This process's values, made once per label set (each one reads its file when made).
        self._histograms: dict[tuple[Any, ...], _FileHistogram] = {}
        self._counters: dict[tuple[Any, ...], Any] = {}
        self.start_settling(every)

    def take(self, events: list[Event]) -> None:
        # Added up into waits, holds and counts: what has happened since the last write.
        super().take(events)
        try:
            for spec, bounds, tallies in (
                (WAIT, WAIT_BUCKETS, self.waits),
                (HOLD, HOLD_BUCKETS, self.holds),
            ):
                for labels, tally in tallies.items():
                    self._histogram(spec, bounds, labels).add(tally)
            for spec, what in ((CONTENTION, CONTENDED), (TIMEOUTS, TIMED_OUT), (LOSSES, LOST)):
                for labels, count in self.counts[what].items():
                    self._counter(spec, labels).inc(count)
        finally:  # never offered twice; if a write failed, buffer.py logs the batch
            self.forget()

    def forget(self) -> None:
        """Drop what was added up and not written."""
        self.waits, self.holds = {}, {}
        self.counts = {CONTENDED: {}, TIMED_OUT: {}, LOST: {}}

    def forked(self) -> None:
        self.forget()
        super().forked()

    def _histogram(
        self, spec: Spec, bounds: tuple[float, ...], labels: tuple[str, ...]
    ) -> _FileHistogram:
        key = (spec[0], *labels)
        histogram = self._histograms.get(key)
        if histogram is None:
            histogram = self._histograms[key] = _FileHistogram(spec, bounds, labels)
        return histogram

    def _counter(self, spec: Spec, labels: tuple[str, ...]) -> Any:
        key = (spec[0], *labels)
        counter = self._counters.get(key)
        if counter is None:
            counter = self._counters[key] = _file_value("counter", spec, "_total", labels)
        return counter
