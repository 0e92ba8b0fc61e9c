"""What a lock tells the world about itself: its log lines, signals and metric events, in one
place.

The lock's bookkeeping calls one function here at each moment of a hold's life (contended,
acquired, gave up, released, lost), so every primitive built on it reports the same way.

Metrics hook in as *sinks*: with none on, ``sinks`` is empty and an event costs one truthiness
check. The exporters (``metrics/``) add themselves when ``DJANGO_REDIS_LOCK_METRICS`` names them
(``metrics/setup.py``, from the app's ``ready()``); tests and custom setups may
:func:`add_sink` their own. The lock's path never imports an exporter.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Protocol

from .. import signals
from ..core.durations import readable
from ..core.labels import ACQUIRED, DONE, ERROR, TIMED_OUT, bounded, reason_kind
from ..core.lease import decode_lease

__all__ = [
    "Reported",
    "Sink",
    "acquire_failed",
    "acquired",
    "add_sink",
    "contended",
    "contention_observed",
    "done_elsewhere",
    "gave_up",
    "limits_differ",
    "lost",
    "owner_of",
    "released",
    "remove_sink",
    "sinks",
]

logger = logging.getLogger("django_redis_lock")


class Reported(Protocol):
    """What is reported about: a lock (the signals' ``lock``; its class is their sender)."""

    @property
    def name(self) -> str: ...

    @property
    def label(self) -> str | None: ...

    @property
    def group(self) -> str: ...  # for metrics: its name's template (core/labels.py)


class Sink(Protocol):
    """An exporter: where the metric events go. ``kind``: "lock", "semaphore"...; ``group``:
    the lock's group (``core/labels.py``), already bounded."""

    def waited(self, kind: str, group: str, outcome: str, seconds: float) -> None: ...

    def held(self, kind: str, group: str, seconds: float) -> None: ...

    def contended(self, kind: str, group: str) -> None: ...

    def lost(self, kind: str, group: str, reason: str) -> None: ...


sinks: list[Sink] = []


def add_sink(sink: Sink) -> None:
    if sink not in sinks:
        sinks.append(sink)


def remove_sink(sink: Sink) -> None:
    if sink in sinks:
        sinks.remove(sink)


def _labels(lock: Reported) -> tuple[str, str]:
    return type(lock).__name__.lower(), bounded(lock.group)


def _waited(lock: Reported, outcome: str, seconds: float) -> None:
    kind, group = _labels(lock)
    for sink in sinks:
        sink.waited(kind, group, outcome, seconds)


def owner_of(value: Any, name: str) -> dict[str, Any] | None:
    """The holder a lease value names, for people (None: unknown or unreadable)."""
    if value is None:
        return None
    try:
        return decode_lease(value).describe(name)
    except ValueError:
        return None


def contention_observed() -> bool:
    """Whether anyone listens for :func:`contended` (worth reading the holder's record)."""
    # `receivers`, not has_listeners(): only a cheap "maybe" is needed here.
    return bool(signals.lock_contended.receivers) or logger.isEnabledFor(logging.INFO)


def contended(lock: Reported, max_wait: float, holder: Any) -> None:
    """``lock`` is held by someone else, and we wait for it (``holder``: their lease value)."""
    if sinks:
        kind, group = _labels(lock)
        for sink in sinks:
            sink.contended(kind, group)
    if not contention_observed():
        return  # (on every contended acquisition: nothing to read or format for nobody)
    owner = owner_of(holder, lock.name)
    if logger.isEnabledFor(logging.INFO):
        described = owner or {}
        logger.info(
            "Waiting %s for lock %r held by %s/%s",
            "for ever" if max_wait == math.inf else f"up to {readable(max_wait)}", lock.name,
            described.get("host", "?"), described.get("pid", "?"),
        )  # fmt: skip
    signals.lock_contended.send(
        sender=type(lock), lock=lock, name=lock.name, label=lock.label, owner=owner
    )


def _not_acquired(lock: Reported, waited: float, outcome: str) -> None:
    if signals.lock_not_acquired.receivers:
        signals.lock_not_acquired.send(
            sender=type(lock), lock=lock, name=lock.name, label=lock.label, waited=waited,
            outcome=outcome,
        )  # fmt: skip


def gave_up(lock: Reported, max_wait: float) -> None:
    """An acquisition that could wait ended without the lock. INFO, not WARNING: the caller
    is told (``LockNotAcquired``, or a guard's own handling, such as a command's exit status),
    and handles it; a WARNING would reach stderr through logging's last-resort handler in a
    project without ``LOGGING``, which a cron job mails, even with ``--verbosity 0``."""
    if sinks:
        _waited(lock, TIMED_OUT, max_wait)
    if max_wait > 0:
        logger.info("Gave up on lock %r after waiting %s", lock.name, readable(max_wait))
    _not_acquired(lock, max_wait, TIMED_OUT)


def acquire_failed(lock: Reported, waited: float) -> None:
    """An acquisition ended in an error (Redis unreachable...), after ``waited`` seconds: the
    caller gets the error; the metrics and ``lock_not_acquired`` are told here."""
    if sinks:
        _waited(lock, ERROR, waited)
    _not_acquired(lock, waited, ERROR)


def done_elsewhere(lock: Reported, waited: float) -> None:
    """An acquisition that asked for the holder's result (``want_result``) got it instead of
    the lock: the work is done, by another (a duplicate submission, a task's copy). Not a
    wait that ran out, so not counted as one."""
    _not_acquired(lock, waited, DONE)


def acquired(lock: Reported, waited: float, fence: int | None) -> None:
    """``lock`` is ours (``waited``: 0.0 for a re-entry)."""
    if sinks:
        _waited(lock, ACQUIRED, waited)
    logger.debug("Acquired lock %r after %.3fs", lock.name, waited)
    if signals.lock_acquired.receivers:
        signals.lock_acquired.send(
            sender=type(lock), lock=lock, name=lock.name, label=lock.label, waited=waited,
            fencing_token=fence,
        )  # fmt: skip


def released(lock: Reported, held: float) -> None:
    if sinks:
        kind, group = _labels(lock)
        for sink in sinks:
            sink.held(kind, group, held)
    logger.debug("Released lock %r after %.3fs", lock.name, held)
    if signals.lock_released.receivers:
        signals.lock_released.send(
            sender=type(lock), lock=lock, name=lock.name, label=lock.label, held=held
        )


def lost(lock: Reported, held: float, reason: str) -> None:
    """A hold ended without our release: loudly (ERROR log, ``lock_lost``). Called once per
    hold (the caller sees to that)."""
    if sinks:
        kind, group = _labels(lock)
        for sink in sinks:
            sink.lost(kind, group, reason_kind(reason))
    logger.error(
        "Lost lock %r (label %r) after holding it %s: %s. Work done under it may have "
        "overlapped another holder's.",
        lock.name, lock.label, readable(held), reason,
    )  # fmt: skip
    signals.lock_lost.send(
        sender=type(lock), lock=lock, name=lock.name, label=lock.label, held=held,
        reason=reason,
    )  # fmt: skip


_limits_told: set[tuple[str, int, int]] = set()


def limits_differ(lock: Reported, ours: int, theirs: int) -> None:
    """A semaphore's permit was taken under ``ours`` while another holder's was taken under
    ``theirs`` (a rolling deploy that changes the limit): each caller is held to its own, so
    up to the larger number may hold one meanwhile. A WARNING, once per process and pair."""
    if (lock.name, ours, theirs) in _limits_told:
        return
    _limits_told.add((lock.name, ours, theirs))
    logger.warning(
        "Semaphore %r is used with different limits: this process allows %d holders, another "
        "holder took its permit under a limit of %d. Each acquisition is held to its own "
        "limit, so up to %d may hold it until every process uses the same one.",
        lock.name, ours, theirs, max(ours, theirs),
    )  # fmt: skip
