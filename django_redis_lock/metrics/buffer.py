"""Events kept on the lock's path by one append, handed to an exporter in batches.

Why: an acquisition reports two events (its wait, then its hold), and an exporter's own
instruments are slow for that path. ``prometheus_client``'s histogram takes two locks per
observation (about 1.2 µs), the OpenTelemetry SDK's ``record()`` cleans and hashes its attributes
each time (about 5 to 8 µs). Appending a tuple to a ``deque`` costs about 0.1 µs and takes no lock
(``append`` and ``popleft`` are atomic). The exporter adds the events up when it is read (a
scrape, a collection), with :meth:`BufferedSink.settled`. So that a process read seldom or
never keeps no more than about ``limit`` events, the append that passes the limit has them
added up: on the spot where that is cheap (a short pause, once in ``limit`` events), else in a
thread of its own (``settle_in_thread``), so that no acquisition waits for it. An exporter
read from another process (files that a scrape sums) adds its events up on a timer of its own
instead (:meth:`BufferedSink.start_settling`).
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import weakref
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TypeAlias

from ..core.labels import TIMED_OUT

__all__ = ["CONTENDED", "HELD", "LOST", "TIMED_OUT", "WAITED", "BufferedSink", "Event"]

logger = logging.getLogger("django_redis_lock")

# What happened (an Event's ``what``).
WAITED, HELD, CONTENDED, LOST = "waited", "held", "contended", "lost"


# (what, labels, seconds). ``labels``: (kind, group), then a wait's outcome or a loss's reason;
# ``seconds``: a wait's or a hold's duration, 0.0 for the others. A plain tuple: a NamedTuple
# costs 0.3 µs more to make, on the lock's path.
Event: TypeAlias = tuple[str, tuple[str, ...], float]


class BufferedSink:
    """A :class:`~django_redis_lock.primitives.reports.Sink` that appends. :meth:`take` adds the
    events up, always under one lock, in the order they happened: the counters here, in
    ``counts`` (``CONTENDED``, ``TIMED_OUT``, ``LOST`` -> label values -> count), each wait and
    hold through the exporter's :meth:`observe`."""

    limit = 10_000
    settle_in_thread = False

    def __init__(self) -> None:
        self._pending: deque[Event] = deque()
        self._taking = threading.RLock()  # an RLock: see _before_fork
        # The settling thread (settle_in_thread, start_settling): the process it runs in (0:
        # none yet), how to wake it and stop it; start_settling's period, and the limit it
        # restores once that thread runs.
        self._thread_pid, self._wake = 0, threading.Event()
        self._stop: threading.Event | None = None
        self._every, self._limit = 0.0, self.limit
        self.counts: dict[str, dict[tuple[str, ...], int]] = {
            CONTENDED: {}, TIMED_OUT: {}, LOST: {}
        }  # fmt: skip

    # Every acquisition reports a wait and a hold: those two append inline (a shared helper
    # costs a call more, on the lock's path); the rarer events go through _append.

    def waited(self, kind: str, group: str, outcome: str, seconds: float) -> None:
        self._pending.append((WAITED, (kind, group, outcome), seconds))
        if len(self._pending) > self.limit:
            self._overflow()

    def held(self, kind: str, group: str, seconds: float) -> None:
        self._pending.append((HELD, (kind, group), seconds))
        if len(self._pending) > self.limit:
            self._overflow()

    def contended(self, kind: str, group: str) -> None:
        self._append((CONTENDED, (kind, group), 0.0))

    def lost(self, kind: str, group: str, reason: str) -> None:
        self._append((LOST, (kind, group, reason), 0.0))

    def _append(self, event: Event) -> None:
        self._pending.append(event)
        if len(self._pending) > self.limit:
            self._overflow()

    def _overflow(self) -> None:
        if (self._every or self.settle_in_thread) and self._thread_pid != os.getpid():
            self._start_thread()
            if self._every:
                return  # this process's first event (see start_settling): the timer has it
        if not self.settle_in_thread:
            self.settle()
        else:
            self._wake.set()

    def _start_thread(self) -> None:
        # One thread per process, woken by an Event (and each `every` seconds on a timer): a
        # thread per overflow, skipped while the last is alive, could leave the events
        # appended as it ends waiting for another.
        with _timers:
            if self._thread_pid == os.getpid():
                return  # another thread started it
            if self._thread_pid and self._every:  # a fork no hook of ours saw (uWSGI's)
                self._taking = threading.RLock()
            self._thread_pid = os.getpid()
            if self._every:
                self.limit = self._limit
            # New ones, not a fork's copies: those may be held.
            self._wake, self._stop = threading.Event(), threading.Event()
            threading.Thread(
                target=_settling_thread,
                args=(weakref.ref(self), self._wake, self._stop, self._every),
                name="lock-metrics-timer" if self._every else "lock-metrics-settle",
                daemon=True,
            ).start()  # fmt: skip

    def settle(self) -> None:
        """Hand every event appended so far to :meth:`take`."""
        with self.settled():
            pass

    @contextmanager
    def settled(self) -> Iterator[None]:
        """Every event appended so far handed to :meth:`take`; while the block runs, no other
        thread takes any (read the tallies in it)."""
        with self._taking:
            batch = []
            pending = self._pending
            while pending:  # popleft, not a swap: an append racing this one is never lost
                batch.append(pending.popleft())
            if batch:
                try:
                    self.take(batch)
                except Exception:  # a metric must never fail a lock's acquisition or release
                    logger.exception("Lock metrics: %d events dropped", len(batch))
            yield

    def start_settling(self, every: float) -> None:
        """Settle every ``every`` seconds in a thread of this sink's, from this process's next
        event on, and once more when the process exits normally. A process that reports no
        event has no such thread: a server's master that forks its workers. In a process forked
        from this one, the parent's pending events are dropped (the parent adds them up) and
        the child's first event starts a timer there. Stopped by :meth:`close`."""
        if every <= 0:
            raise ValueError(f"every must be a positive number of seconds, not {every!r}")
        self.close()
        with _timers:
            self._every, self._limit = every, self.limit
            self.limit = 0  # so that the next append calls _overflow, which starts the timer
            _install_process_hooks()
            _timed.add(self)

    def close(self) -> None:
        """Stop settling on a timer (:meth:`start_settling`), and settle. Events appended
        after it are added up when read, or past the limit."""
        with _timers:
            if self._stop is not None:
                self._stop.set()
                self._wake.set()  # so that its thread ends now
            self._stop, self._every, self._thread_pid = None, 0.0, 0
            if self.limit == 0:
                self.limit = self._limit
            _timed.discard(self)
        self.settle()

    def forked(self) -> None:
        """In a child process, just after the fork: the events so far are the parent's, and
        so is the timer (its thread is not in the child)."""
        self._taking = threading.RLock()
        self._pending.clear()
        self._stop, self._thread_pid, self.limit = None, 0, 0  # the next event starts a timer

    def take(self, events: list[Event]) -> None:
        for what, labels, seconds in events:
            if what in (WAITED, HELD):
                self.observe(what, labels, seconds)
                if what == WAITED and labels[2] == TIMED_OUT:
                    self._count(TIMED_OUT, labels[:2])
            else:
                self._count(what, labels)

    def _count(self, what: str, labels: tuple[str, ...]) -> None:
        counts = self.counts[what]
        counts[labels] = counts.get(labels, 0) + 1

    def observe(self, what: str, labels: tuple[str, ...], seconds: float) -> None:
        """A wait's (``WAITED``) or a hold's (``HELD``) duration, into the histogram."""
        raise NotImplementedError


def _settling_thread(
    sink_ref: weakref.ref[BufferedSink], wake: threading.Event, stop: threading.Event,
    every: float,
) -> None:  # fmt: skip
    # Settles when woken, and each `every` seconds if given. A weak reference, and a bounded
    # wait: a sink nobody uses any more ends its thread.
    while True:
        woken = wake.wait(every or 60)
        sink = sink_ref()
        if sink is None or stop.is_set():
            return
        if woken or every:
            wake.clear()  # before the settle: an event appended during it wakes us again
            sink.settle()
        del sink


# The sinks that settle on a timer (start_settling), for the process hooks below; _timers
# guards the starting and stopping of their timers, and _forking a fork, from before to after.
_timed: weakref.WeakSet[BufferedSink] = weakref.WeakSet()
_timers = threading.Lock()
_forking = threading.Lock()
_held_at_fork: list[BufferedSink] = []
_hooks_installed = False


def _install_process_hooks() -> None:
    global _hooks_installed
    if not _hooks_installed:
        _hooks_installed = True
        atexit.register(_at_exit)
        if hasattr(os, "register_at_fork"):  # not on Windows, which has no fork
            os.register_at_fork(
                before=_before_fork, after_in_parent=_after_fork_in_parent,
                after_in_child=_after_fork_in_child,
            )  # fmt: skip


def _at_exit() -> None:
    for sink in list(_timed):
        sink.settle()


def _before_fork() -> None:
    # No fork while a timer settles: its exporter's own locks, held then, would stay held in the
    # child for ever. Waiting is safe: a settle only writes, and an RLock lets the forking
    # thread through if it is itself the one settling.
    _forking.acquire()
    _held_at_fork[:] = list(_timed)
    for sink in _held_at_fork:
        sink._taking.acquire()


def _after_fork_in_parent() -> None:
    for sink in _held_at_fork:
        sink._taking.release()
    _held_at_fork.clear()
    _forking.release()


def _after_fork_in_child() -> None:
    global _timers, _forking
    _timers, _forking = threading.Lock(), threading.Lock()
    _held_at_fork.clear()
    for sink in list(_timed):
        sink.forked()
